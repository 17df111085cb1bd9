"""quarl_kernels: Triton GPU kernels for quarl (Hopper first; sm_80+ where it applies).

Importing this package

  * defines the ``torch.ops.quarl.*`` custom ops (``ops``) -- usable on any
    device: CUDA runs Triton, everything else the reference path;
  * lists the weight-only 4-bit GEMMs (``registration.kernel_specs``) that
    ``quarl.quant.dispatch.load_kernels`` registers on first CUDA use, so a frozen ``QuantLinear`` in NVFP4 / MXFP4 / INT4 on
    a CUDA bf16 input runs them automatically (one token through the
    CUDA-core GEMV in ``gemv``, 2..64 through the register-decode MMA kernels
    ``mma_decode`` / ``wgmma_decode``, larger M through ``wo_gemm`` and the
    dense path; ``wo_gemm.wo_matmul`` picks). ``QUARL_KERNELS=reference``
    switches them off.

Triton itself is imported only when a CUDA kernel first runs, so this package
imports (and its ops trace) on CPU-only installs.
"""

from quarl_kernels import ops
from quarl_kernels.registration import applies, kernel_specs

KERNELS = [k["name"] for k in kernel_specs()]

__all__ = ["KERNELS", "applies", "kernel_specs", "ops"]
