"""Decode GEMM of the FP8 flow: ``y = x @ W^T`` for a few rows, x in 1x128 E4M3 groups, W in 128x128 E4M3 tiles.

Why. Jet-RL's rollout runs the training forward's quantizers and GEMMs (``quarl.quant.fp8_linear``). At decode
(M = batch rows) cuBLAS's blockwise FP8 kernels are tuned for large M: all 36 x 7 projections of a Qwen3-8B
decode step took 1.03-1.14x BF16's time at batch 1-64 on an H100 (benchmarks/RESULTS.md, Jet-RL, "FP8 vs BF16
decode GEMMs"), although the FP8 weight is half the bytes. At these sizes the product is a weight stream: 1 byte
per weight against 2 * M flops.

What it does. One program per (``BN`` output rows, ``BM`` = 16 token rows, K range): per 128-column K block it
loads the E4M3 tile of W ``[BN, 128]`` and x's ``[16, 128]`` (rows past M masked), multiplies them on the tensor
cores (``tl.dot``, FP8 x FP8 -> FP32, a fresh accumulator per block) and adds the block's product times
``s_x[m, kb] * s_w[n / 128, kb]`` to the FP32 accumulator -- the blockwise-scaled GEMM's definition, the one
cuBLAS and DeepGEMM compute, so results agree with them to FP32 summation order (before the output rounding).
``tl.range(..., num_stages)`` pipelines the tile loads (cp.async) so several blocks are in flight per SM. When
``cdiv(N, BN)`` programs do not fill the GPU the K blocks are split; each split writes FP32 partials ``[S, M, N]``
that ``launch.finish`` sums in split order (deterministic) and rounds once.

Layouts are the FP8 linear's own: ``a [Mp, Kp]`` E4M3 with scales ``sa [Mp, Kp/128]`` (any strides),
``b [Np, Kp]`` E4M3 (row-major, K contiguous) with ``sb [Np/128, Kp/128]``; ``Kp`` a multiple of 128 (the linear
pads). Under ``TRITON_INTERPRET=1`` the dot runs on the decoded fp32 values (the interpreter has no FP8 dot);
E4M3 products are exact in FP32, so only the summation order differs from the GPU's.
"""

from __future__ import annotations

import typing

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl
from quarl_kernels.launch import finish, interpreting, num_sms

__all__ = ["GEMV_CONFIGS", "Fp8GemvConfig", "default_config", "fp8_gemv", "split_for"]

BK = 128  # one scale block of K per step
BM = 16  # token rows per program: tl.dot's smallest M


class Fp8GemvConfig(typing.NamedTuple):
    bn: int = 64  # output rows per program (divides 128: a program's rows share one weight scale row)
    stages: int = 4  # K blocks in flight (cp.async pipeline)
    warps: int = 4
    waves: int = 2  # split K until about waves x SMs programs

    def __str__(self) -> str:
        return f"BN{self.bn}s{self.stages}w{self.warps}v{self.waves}"


GEMV_CONFIGS = tuple(Fp8GemvConfig(bn, st, w, v) for bn in (32, 64, 128) for st in (3, 5) for w in (4,) for v in (2, 4))


def default_config(m: int, n: int, k: int) -> Fp8GemvConfig:
    """The launch setting for ``[m, k] x [n, k]^T``, from the sweep of benchmarks/kernels/bench_fp8_gemv.py (H100,
    Qwen3-8B shapes, 2026-11-26): 32-row blocks win at decode rows -- 5 K blocks in flight on the large layers
    (gate/up at 80 % of HBM), 3 on the 1024-row k/v -- and 128-row blocks at 64 rows."""
    if m > 16:
        return Fp8GemvConfig(bn=128, stages=5)
    return Fp8GemvConfig(bn=32, stages=3 if n <= 1024 else 5)


@triton.jit
def _fp8_gemv_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, out_ptr, M, N, KB, KB_PER_SPLIT,
                     stride_am, stride_sam, stride_sak, stride_bn, stride_sbn, stride_sbk, stride_os, stride_om,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                     INTERPRET: tl.constexpr, PDL: tl.constexpr = 0):
    pdl.enter(PDL)  # PDL (pdl.py): wait for the quantizer that wrote a first; signal after the K loop
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)  # [BM] token rows
    rn = pid_n * BN + tl.arange(0, BN)  # [BN] output rows
    rk = tl.arange(0, BK)  # [BK]
    m_ok = rm < M
    n_ok = rn < N
    kb_lo = pid_s * KB_PER_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, KB)
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]  # [BM, BK]
    b_rows = b_ptr + rn[:, None].to(tl.int64) * stride_bn + rk[None, :]  # [BN, BK]
    sb_rows = sb_ptr + (rn // BK) * stride_sbn  # [BN]: one weight scale row per 128 output rows
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kb in tl.range(kb_lo, kb_hi, num_stages=STAGES):
        a = tl.load(a_rows + kb * BK, mask=m_ok[:, None], other=0.0)  # [BM, BK] e4m3
        b = tl.load(b_rows + kb * BK, mask=n_ok[:, None], other=0.0)  # [BN, BK] e4m3
        sa = tl.load(sa_ptr + rm * stride_sam + kb * stride_sak, mask=m_ok, other=0.0)  # [BM] fp32
        sb = tl.load(sb_rows + kb * stride_sbk, mask=n_ok, other=0.0)  # [BN] fp32
        if INTERPRET:  # no FP8 dot in the interpreter; E4M3 products are exact in fp32
            d = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            d = tl.dot(a, tl.trans(b))  # [BM, BN] fp32: this block's unscaled product
        acc += d * sa[:, None] * sb[None, :]
    pdl.leave(PDL)  # the stores left: the next kernel may place its programs
    # split: fp32 partials [S, M, N]; unsplit: y itself, rounded once
    tl.store(out_ptr + pid_s * stride_os + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def split_for(cfg: Fp8GemvConfig, m: int, n: int, kb: int, sms: int) -> tuple[int, int]:
    """(split count, K blocks per split): about ``cfg.waves * sms`` programs, >= 1 K block each."""
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, BM)
    split = max(1, min(kb, triton.cdiv(cfg.waves * sms, tiles)))
    per = triton.cdiv(kb, split)
    return triton.cdiv(kb, per), per


def fp8_gemv(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype,
             cfg: Fp8GemvConfig | None = None) -> torch.Tensor:
    """``a [M, K]`` E4M3 (1x128 scales ``sa [M, K/128]``) times ``b [N, K]`` E4M3 (128x128 tiles,
    ``sb [ceil(N/128), K/128]``) transposed -> ``[M, N]`` in ``out_dtype``; K a multiple of 128."""
    m, k = a.shape
    n = b.shape[0]
    if k % BK or b.shape[1] != k or b.stride(1) != 1 or a.stride(1) != 1:
        raise ValueError(f"fp8_gemv: a [M, K] and b [N, K] with K a multiple of {BK} and unit K strides, got "
                         f"{tuple(a.shape)} {a.stride()} / {tuple(b.shape)} {b.stride()}")
    kb = k // BK
    if sa.shape != (m, kb) or sb.shape[1] != kb or sb.shape[0] < triton.cdiv(n, BK):
        raise ValueError(f"fp8_gemv: scales sa [{m}, {kb}] and sb [>= {triton.cdiv(n, BK)}, {kb}], got "
                         f"{tuple(sa.shape)} / {tuple(sb.shape)}")
    cfg = cfg or default_config(m, n, k)
    if BK % cfg.bn:
        raise ValueError(f"fp8_gemv: BN={cfg.bn} must divide {BK} (a program's rows share one weight scale row)")
    y = torch.empty((m, n), device=a.device, dtype=out_dtype)
    if m == 0 or n == 0:
        return y
    split, per = split_for(cfg, m, n, kb, num_sms(a.device))
    out = y if split == 1 else torch.empty((split, m, n), device=a.device, dtype=torch.float32)
    so, som = (0, y.stride(0)) if split == 1 else (out.stride(0), out.stride(1))
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.bn), triton.cdiv(m, BM), split)](
        a, sa, b, sb, out, m, n, kb, per,
        a.stride(0), sa.stride(0), sa.stride(1), b.stride(0), sb.stride(0), sb.stride(1), so, som,
        BM=BM, BN=cfg.bn, BK=BK, STAGES=cfg.stages, INTERPRET=interpreting(),
        num_warps=cfg.warps, num_stages=cfg.stages, **pdl.kwargs(a.device),
    )
    return finish(out, y, split)  # split partials summed in split order, rounded once
