"""Built-in weight formats; importing this package registers each of them."""

from quarl.quant.formats import fp8, intk, mxfp4, nf4, nvfp4  # noqa: F401
