"""``x / s`` correctly rounded, for many ``x`` sharing one divisor ``s``, without a division per element.

Why. The FP8 quantizers (``fp8_quant``) compute each code as ``RN(x / s)`` -- the correctly rounded fp32 quotient
PyTorch's eager division gives, so that the fused kernels equal the reference bit for bit -- with ``div.rn.f32``.
On sm_90 ptxas emits for every ``div.rn.f32``: ``MUFU.RCP`` of the divisor, one Newton step, the quotient, its
residual and one correction (5 FFMAs), an ``FCHK`` range check and a branch to a slow subroutine, inside a
``BSSY`` / ``BSYNC`` convergence region -- ~10 issue slots an element, recomputing the divisor's reciprocal each
time. In the quantizer's 1x128 row pass that was ~16 of the ~25 instructions an element (SASS of the split
setting at [16384, 18944], compiled on CPU), enough to leave the pass issue-bound below the HBM copy rate.

How. The divisor is a group's scale, so everything that depends on ``s`` alone is done once per group
(:func:`divisor_parts`), and per element only what ``div.rn`` itself does after its reciprocal:

    s = sn / m      m = 2**k chosen from s's exponent so that sn lies in [1, 2) ([2**-22, 1) for a subnormal s)
    y = y0 + y0 (1 - sn y0)        y0 = rcp.approx(sn): div.rn's own reciprocal and Newton step
    xn = x m,  t = RN(xn y),  r = fma(-sn, t, xn),  q = fma(y, r, t)       (per element: 2 FMUL, 2 FFMA)

This is ``div.rn.f32``'s fast path instruction for instruction (MUFU.RCP, FFMA 1 - s y0, FFMA y0 + y0 e, FFMA x y,
FFMA x - s q, FFMA q + y r -- the SASS above), applied to ``xn / sn``, which is the same real number as ``x / s``
(scaling both by a power of two is exact: ``xn`` is exact whenever the quotient is at least ``2**-126``, and
``|x| <= amax = 448 s`` bounds ``|xn| < 898``). The normalization puts every operand where that fast path is valid
(``FCHK``'s purpose: no overflow or underflow in the residual): ``sn`` in [2**-22, 2), and wherever the E4M3 code
can be non-zero (``|x / s| >= 2**-10``) ``xn`` in [2**-32, 898]. Below ``2**-10`` the code is a signed zero, and
``q`` -- within a few ulps of the quotient even if the residual underflowed -- is too; only the sign of an exact
zero needs care (``-0 / s`` is ``-0``, an E4M3 byte 0x80, where ``fma(y, +0, -0)`` gives +0): where ``t == 0`` the
result is ``t``, whose sign is ``x``'s. An infinite scale (an infinite input in the group) gives ``y = 0``: every
finite ``x`` then yields ``t = +-0`` (``x / inf``) and an infinite one NaN (``inf / inf``), as PyTorch; a NaN scale
gives NaN everywhere, as PyTorch.

Checked on the GPU against ``div.rn.f32`` (what PyTorch's division computes) bit for bit
(``tests/kernels/test_fp8_quant_gpu.py``: all 2**23 divisor significands at three exponents against every E4M3
rounding boundary +-4 ulps, all 2**23 dividend significands at every binade of the E4M3 range against hard and
random divisors; then the quantizers against eager PyTorch on zeros, subnormals, extreme and infinite groups), and
the algorithm, with the correctly rounded reciprocal standing in for ``MUFU.RCP``, on CPU in exact arithmetic
(``tests/kernels/test_group_div.py``). Triton's CPU interpreter computes ``fma`` as a
rounded product plus a rounded sum and has no ``rcp.approx``, so under ``INTERPRET`` the quantizers keep
``div_rn`` (NumPy's division: the same correctly rounded quotient).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rcp_approx(s):
    """``MUFU.RCP``: the approximate reciprocal ``div.rn.f32`` starts from (``s`` normal and positive here)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [s], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def divisor_parts(s):
    """Per group: (sn, y, m) for :func:`quotient` -- ``s`` (> 0, fp32, any shape) scaled by ``m = 2**k`` into
    [1, 2) (a subnormal ``s`` into [2**-22, 1)), and ``div.rn``'s reciprocal of ``sn``; ``y = 0`` for ``s = inf``."""
    e = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent (s > 0: no sign bit)
    finite = e != 255
    # m = 2**(127 - e) (2**127 for a subnormal s); a finite scale of fp32 / bf16 data is <= 2**120, so the field
    # 254 - e stays >= 8. inf / NaN: m = 1
    m = tl.where(finite, (tl.maximum(254 - e, 1) << 23).to(tl.float32, bitcast=True), 1.0)
    sn = s * m
    y0 = _rcp_approx(sn)
    y = tl.fma(y0, tl.fma(-sn, y0, 1.0), y0)
    y = tl.where(s == float("inf"), 0.0, y)
    return sn, y, m


@triton.jit
def quotient(x, sn, y, m):
    """``RN(x / s)`` for fp32 ``x`` with ``|x| <= 448.x * s`` (``x`` in a group whose scale is its amax / 448), from
    :func:`divisor_parts` of ``s`` (broadcast against ``x``)."""
    xn = x * m
    t = xn * y
    r = tl.fma(-sn, t, xn)
    q = tl.fma(y, r, t)
    return tl.where(t == 0.0, t, q)  # an exact zero keeps x's sign (-0 / s = -0)
