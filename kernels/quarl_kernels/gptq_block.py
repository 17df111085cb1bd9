"""GPTQ's in-block column loop as one Triton kernel (NVFP4 / MXFP4 / INT-k with static group scales).

Inside a lazy block of B (<= 128) columns GPTQ rounds column i, divides its error by
``Hinv[i, i]`` and subtracts ``err * Hinv[i, i:]`` from the columns to its right, then moves to
column i + 1. Each row of W is independent of every other row given H (the error feedback runs
along a row), so one program owns a tile of BN rows and the whole block's B columns in
registers and walks the B columns itself: one launch per lazy block instead of ~20 per column
(quarl.calibrate.gptq_columns explains why the eager loop is launch-bound).

Numerics: the same operations as the eager reference loop, in the same order, each rounded
once to fp32 -- so the result is bit-identical:

* the format's rounding with its frozen scales (``qdq_with_scales``). FP4 (NVFP4 and MXFP4,
  ``FMT=0``): ``x = w / d``; ``m = min(rne(|x| / step) * step, 6)`` with step 0.5 / 1 / 2 below
  2 / 4 / above; ``q = (x < 0 ? -m : m) * d``, where ``d`` is the column's divisor computed by
  the caller with the format's own code (NVFP4: ``e4m3_scale.float() / global_scale``; MXFP4:
  the E8M0 power of two). INT (``FMT=1`` asymmetric, ``2`` symmetric):
  ``rne(clamp(w / s + z, qmin, qmax))``, dequantized as ``(r - z) * s`` (or ``r * s``);
* ``err = (w - q) / Hinv[i, i]`` and ``w[:, j] = w[:, j] - err * Hinv[i, j]`` for j >= i: the
  product is rounded before the subtraction as in the reference's two ops (the K=1 matmul,
  then ``-=``). Launched with ``enable_fp_fusion=False`` so that no multiply-add is contracted
  into an FMA, and every division is ``div_rn`` (Triton's ``/`` is the approximate
  ``div.full.f32``);
* ``rne`` is round-half-to-even (``torch.round``): libdevice ``rint`` on the GPU; under
  ``TRITON_INTERPRET=1`` (no libdevice) the exact fp32 trick ``(|x| + 1.5*2^23) - 1.5*2^23``
  with x's sign, valid for |x| < 2^22 -- INT values are clamped first, FP4 magnitudes beyond
  2^22 saturate to 6 either way;
* signs of zero as PyTorch's (the packer stores -0.0 as its own FP4 code): a negative value
  that rounds to zero gives -0.0, so negation is a multiply by -1 (Triton's ``-m`` is ``0 - m``).

A column is taken out of the register tile as a masked row sum (one non-zero term: exact).
Outputs: the rounded columns into ``Q`` and the scaled errors into ``E``, both ``[N, B]``
views with a row stride; W's block is read from ``W`` in place and not written back (the
caller needs only Q and E: the lazy update of the columns to the right is its GEMM).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

BN = 16  # rows per program: a [16, 128] fp32 tile is 16 registers per thread at 4 warps
RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: (x + M) - M rounds |x| < 2**22 to an integer, ties to even


@triton.jit
def _rne(x, INTERPRET: tl.constexpr):
    if INTERPRET:  # |x| rounded by the fp32 adder, then x's sign (rint(-0.3) is -0.0, as torch.round's)
        r = (tl.abs(x) + RNE_MAGIC) - RNE_MAGIC
        return tl.where((x.to(tl.uint32, bitcast=True) >> 31) == 1, r * -1.0, r)
    else:
        return libdevice.rint(x)


@triton.jit
def _gptq_block_kernel(w_ptr, q_ptr, e_ptr, h_ptr, p_ptr, z_ptr, n, stride_w, stride_q, stride_e, stride_h,
                       qmin, qmax, cnt: tl.constexpr, B: tl.constexpr, BN: tl.constexpr, FMT: tl.constexpr,
                       INTERPRET: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    rmask = rows < n
    cols = tl.arange(0, B)  # [B]
    cmask = cols < cnt
    rows64 = rows.to(tl.int64)
    W = tl.load(w_ptr + rows64[:, None] * stride_w + cols[None, :], mask=rmask[:, None] & cmask[None, :],
                other=0.0)  # [BN, B] fp32
    for i in range(cnt):
        wc = tl.sum(tl.where(cols[None, :] == i, W, 0.0), axis=1)  # [BN]: column i, exactly
        p = tl.load(p_ptr + i * n + rows, mask=rmask, other=1.0)  # [BN] divisor (FP4) or scale (INT)
        if FMT == 0:
            x = tl.math.div_rn(wc, p)
            a = tl.abs(x)
            step = tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))
            m = tl.minimum(_rne(tl.math.div_rn(a, step), INTERPRET) * step, 6.0)
            q = tl.where(x < 0, m * -1.0, m) * p  # not -m: Triton negates as 0 - m, which loses -0.0
        else:
            t = tl.math.div_rn(wc, p)
            if FMT == 1:
                z = tl.load(z_ptr + i * n + rows, mask=rmask, other=0.0)
                t = t + z
            r = _rne(tl.minimum(tl.maximum(t, qmin), qmax), INTERPRET)
            if FMT == 1:
                q = (r - z) * p
            else:
                q = r * p
        d = tl.load(h_ptr + i * stride_h + i)  # Hinv[i, i]
        err = tl.math.div_rn(wc - q, d)  # [BN]
        hrow = tl.load(h_ptr + i * stride_h + cols, mask=cmask & (cols >= i), other=0.0)  # [B] Hinv[i, i:]
        prod = err[:, None] * hrow[None, :]  # rounded on its own: no FMA (enable_fp_fusion=False)
        W = W - prod
        tl.store(q_ptr + rows64 * stride_q + i, q, mask=rmask)
        tl.store(e_ptr + rows64 * stride_e + i, err, mask=rmask)


def gptq_block(W1: torch.Tensor, Hinv1: torch.Tensor, P: torch.Tensor, Z: torch.Tensor | None, Q1: torch.Tensor,
               E1: torch.Tensor, fmt: int, qmin: float = 0.0, qmax: float = 0.0) -> None:
    """One lazy block. ``W1`` [N, cnt] (row stride free, unit column stride), ``Hinv1`` [cnt, cnt]
    (upper Cholesky factor, same), ``P``/``Z`` [cnt, N] contiguous per-column divisors or scales /
    zero points, ``Q1``/``E1`` [N, cnt] outputs. ``fmt``: 0 FP4, 1 INT asymmetric, 2 INT symmetric."""
    n, cnt = W1.shape
    if cnt > 128 or W1.stride(1) != 1 or Hinv1.stride(1) != 1 or Q1.stride(1) != 1 or E1.stride(1) != 1:
        raise ValueError(f"gptq_block: needs <= 128 columns with unit column strides, got {tuple(W1.shape)}")
    if not (P.is_contiguous() and P.shape == (cnt, n)):
        raise ValueError(f"gptq_block: per-column parameters must be contiguous [{cnt}, {n}], got {tuple(P.shape)}")
    _gptq_block_kernel[(triton.cdiv(n, BN),)](
        W1, Q1, E1, Hinv1, P, Z if Z is not None else P, n, W1.stride(0), Q1.stride(0), E1.stride(0),
        Hinv1.stride(0), float(qmin), float(qmax), cnt=cnt, B=128, BN=BN, FMT=fmt,
        INTERPRET=os.environ.get("TRITON_INTERPRET", "0") == "1", num_warps=4, enable_fp_fusion=False,
    )
