"""``pdl.py``'s contract for the Gluon kernels (``mma_decode``): :func:`enter` and :func:`leave` as Gluon functions.

Gluon cannot call Triton's ``@triton.jit`` helpers, so the two instructions are written here again. The switch and
the launch attribute are ``pdl.kwargs``, as for the Triton kernels.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["enter", "leave"]


@gluon.jit
def _launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def enter(PDL: gl.constexpr):
    """First statement: signal if ``pdl.EARLY``, then wait for the kernel before (``griddepcontrol.wait``)."""
    if PDL == 2:
        _launch_dependents()
    if PDL != 0:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def leave(PDL: gl.constexpr):
    """After the K loop: signal if ``pdl.LATE``."""
    if PDL == 1:
        _launch_dependents()
