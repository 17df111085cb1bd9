"""``pdl.py``'s contract for the Gluon kernels (``mma_decode``): the same three steps as Gluon functions.

Gluon cannot call Triton's ``@triton.jit`` helpers, so the instructions are written here again: ``signal`` first,
``prefetch_block`` (only constant data: the weight) and ``wait`` before the first load of the kernel before's
results and the first store. The switch and the launch attribute are ``pdl.on`` / ``launch_pdl``, as for Triton.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["prefetch_block", "signal", "wait"]


@gluon.jit
def signal(PDL: gl.constexpr):
    """``griddepcontrol.launch_dependents``: the next kernel may place its programs."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def wait(PDL: gl.constexpr):
    """``griddepcontrol.wait``: the kernel before has completed, its writes visible."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def prefetch_block(ptr, nbytes):
    """One ``cp.async.bulk.prefetch.L2`` of ``nbytes`` (a multiple of 16) from ``ptr`` (16-byte aligned): scalars, so
    one request a warp."""
    gl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.b32 $0, 0;", "=r,l,r",
                              [ptr, nbytes], dtype=gl.int32, is_pure=False, pack=1)
