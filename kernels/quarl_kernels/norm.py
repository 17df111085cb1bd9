"""Fused RMSNorm (+ residual add, + AQN noise, + FP8 1x128 output) as one Triton kernel.

One launch computes what a Hugging Face decoder does between two projections::

    h = residual + x                          # optional: the residual stream, rounded to x.dtype
    y = (w + Z) * (h * rsqrt(mean(h^2) + eps))     # Qwen2RMSNorm / LlamaRMSNorm numerics
    q, s = quantize_act_1x128(y)              # optional: FP8 E4M3 + one fp32 scale per 128

where PyTorch runs ~8 kernels for the norm alone (to-fp32, pow, mean, add-eps,
rsqrt, mul, cast, mul-weight), one for the add and ~6 for the quantizer.

Numerics, op for op as HF's module (``quarl_kernels.fused_ops.rms_norm_reference``
is the written-out oracle, and it equals the HF module bit for bit):

* ``h = residual + x`` is computed in fp32 and rounded to the input dtype --
  exactly PyTorch's bf16/fp16 add;
* variance in fp32 over the last dim (``sum(h*h) * (1/N)``: PyTorch's mean also
  multiplies by the reciprocal), ``rsqrt``, ``h * rstd`` in fp32, rounded to the
  input dtype, then ``weight * that`` rounded again. The only difference from
  PyTorch is the order of the fp32 sum (a tree here, PyTorch's reduction
  kernel's order there), so ``rstd`` may differ in its last fp32 bit and an
  output occasionally rounds to the neighbouring bf16 value (GPU test: <= 1 ulp
  of the normalized value, on a small fraction of elements);
* AQN (QeRL Eq. 10): with ``noise`` Z (fp32 ``[N]``) the weight used is
  ``(w.float() + Z).to(w.dtype)`` -- the value ``quarl.rl.aqn.AQN.perturb``
  writes into the norm in place -- so passing Z equals perturbing the module;
* FP8 output: ``quarl.quant.formats.fp8.quantize_act_1x128`` applied to ``y``
  (the rounded output) -- ``scale = amax / 448`` (eps if 0), ``q = clamp(y /
  scale, +-448)`` cast RNE to E4M3 -- bit for bit. One wrinkle is PyTorch's own:
  on CUDA ``amax / 448.0`` (a CPU-scalar divisor) is computed as ``amax *
  fp32(1/448)`` (ATen ``div_true_kernel_cuda``), on CPU as a true division; the
  kernel follows the reference of the device it runs for (``SCALE_RECIP``).

Layout: rows of ``N`` contiguous elements (any row stride); a program owns a
``[BLOCK_M, BLOCK_N]`` tile, ``BLOCK_N = next_pow2(N)`` so a row is reduced in
registers in one pass (rows up to ``MAX_N``), ``BLOCK_M`` rows so that short
rows (Qwen3's per-head ``q_norm`` / ``k_norm``, N = 128) still fill a tile.
Decode is launch-bound (one 7 KB row at hidden 3584), so one pass, no split.

All math is fp32 with an explicit rounding after each op that PyTorch rounds
(:mod:`quarl_kernels.rounding`); FMA contraction is disabled at launch so the
compiler cannot merge a product into the sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.rounding import FP8_MAX, FP32_EPS, INV_FP8_MAX, round_to, round_to_fp8

ACT_GROUP = 128  # Jet-RL / DeepSeek-V3 activation block
MAX_N = 32768  # one row per tile in registers; longer rows take the reference path
_TILE = 4096  # elements per program


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, z_ptr, y_ptr, h_ptr, q_ptr, s_ptr,
    M, N, stride_xm, stride_rm, stride_ym, stride_hm, stride_qm, stride_sm,
    eps, inv_n,
    HAS_RES: tl.constexpr, HAS_NOISE: tl.constexpr, FP8: tl.constexpr, SCALE_RECIP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl.enter(PDL)  # reads the residual stream the kernel before wrote
    dt: tl.constexpr = y_ptr.dtype.element_ty
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BM]
    cols = tl.arange(0, BLOCK_N)  # [BN]
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]  # [BM, BN]

    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # h = residual + x, one bf16 rounding, as PyTorch's add
        r = tl.load(r_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        hq = round_to(r + x, dt, INTERPRET)
        tl.store(h_ptr + rows[:, None] * stride_hm + cols[None, :], hq, mask=mask)
        x = hq.to(tl.float32)

    var = tl.sum(x * x, axis=1) * inv_n  # [BM] fp32
    rstd = tl.math.rsqrt(var + eps)
    normed = round_to(x * rstd[:, None], dt, INTERPRET).to(tl.float32)  # hidden_states.to(input_dtype)

    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)  # [BN] read at every launch: AQN writes in place
    if HAS_NOISE:  # AQN: (w.float() + Z).to(w.dtype), what AQN.perturb writes
        z = tl.load(z_ptr + cols, mask=col_ok, other=0.0)
        w = round_to(w.to(tl.float32) + z, dt, INTERPRET)
    y = round_to(w.to(tl.float32)[None, :] * normed, dt, INTERPRET)  # [BM, BN]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y, mask=mask)

    if FP8:  # quantize_act_1x128(y): one scale per row per 128 columns (N % 128 == 0)
        NB: tl.constexpr = BLOCK_N // 128
        yg = tl.reshape(y.to(tl.float32), (BLOCK_M, NB, 128))  # [BM, NB, 128]
        amax = tl.max(tl.abs(yg), axis=2)  # [BM, NB]
        if SCALE_RECIP:  # CUDA PyTorch: amax / 448.0 == amax * fp32(1/448)
            scale = amax * INV_FP8_MAX
        else:
            scale = tl.math.div_rn(amax, FP8_MAX)
        scale = tl.where(scale == 0.0, FP32_EPS, scale)
        qf = tl.math.div_rn(yg, scale[:, :, None])
        qf = tl.clamp(qf, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        q8 = tl.reshape(round_to_fp8(qf, INTERPRET), (BLOCK_M, BLOCK_N))
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q8, mask=mask)
        blk = tl.arange(0, NB)
        tl.store(s_ptr + rows[:, None] * stride_sm + blk[None, :], scale,
                 mask=row_ok[:, None] & (blk < N // 128)[None, :])


def tile_config(m: int, n: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)`` for ``m`` rows of ``n``: a whole row per tile,
    rows stacked up to ~``_TILE`` elements, ~8-16 fp32 values per thread."""
    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(triton.next_power_of_2(m), _TILE // block_n))
    return block_m, block_n, min(16, max(1, block_m * block_n // 512))


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``[..., n]`` -> a ``[M, n]`` view with unit column stride (a copy only if none exists)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             noise: torch.Tensor | None = None, fp8_out: bool = False):
    """Launch the kernel. ``x``, ``residual`` ``[..., N]`` (same dtype bf16/fp16), ``weight`` ``[N]`` of
    x's dtype, ``noise`` fp32 ``[N]``. Returns ``(y, h, q, scale)``: ``h`` None without ``residual``,
    ``q`` (float8_e4m3fn ``[..., N]``) and ``scale`` (fp32 ``[..., N/128]``) None without ``fp8_out``.
    Callers check applicability (``quarl_kernels.fused_ops``); this only launches."""
    n = x.shape[-1]
    x2 = _rows(x, n)  # [M, N]
    m = x2.shape[0]
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    h = torch.empty_like(y) if residual is not None else None
    r2 = _rows(residual, n) if residual is not None else x2
    q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn) if fp8_out else None
    s = torch.empty((*x.shape[:-1], n // ACT_GROUP), device=x.device, dtype=torch.float32) if fp8_out else None
    if m == 0:
        return y, h, q, s
    y2, h2 = y.view(-1, n), (h.view(-1, n) if h is not None else y.view(-1, n))
    q2 = q.view(-1, n) if q is not None else y2
    s2 = s.view(-1, n // ACT_GROUP) if s is not None else y2
    z = noise.contiguous() if noise is not None else weight
    bm, bn, warps = tile_config(m, n)
    _rms_norm_kernel[(triton.cdiv(m, bm),)](
        x2, r2, weight.contiguous(), z, y2, h2, q2, s2,
        m, n, x2.stride(0), r2.stride(0), y2.stride(0), h2.stride(0), q2.stride(0), s2.stride(0),
        float(eps), 1.0 / n,
        HAS_RES=residual is not None, HAS_NOISE=noise is not None, FP8=fp8_out, SCALE_RECIP=x.is_cuda,
        BLOCK_M=bm, BLOCK_N=bn, INTERPRET=_interpreting(),
        num_warps=warps, enable_fp_fusion=False, **pdl.kwargs(x.device),
    )
    return y, h, q, s
