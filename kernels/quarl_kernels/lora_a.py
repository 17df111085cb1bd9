"""The LoRA A GEMM of a decode step inside the base projection's GEMV launch.

A packed adapter group (``quarl.engine.lora``: q/k/v share ``A = [A_q; A_k; A_v]``) computes ``a = x @ A^T``
(x [M, K] bf16, A [R, K] bf16, R = G * r) once per layer and group; each projection's base kernel then adds
``scaling * a_j @ B_j^T`` in its last pass (``launch.Epilogue``). On cuBLAS that A GEMM is two kernels at decode
sizes: 224 of a 7B NVFP4+LoRA decode step's kernels and 0.73 ms of its 4.64 ms at batch 1 on an H100 (RESULTS.md
"Issue 17: the LoRA A GEMM as one launch of split partials is slower").

Why inside the GEMV, not a launch of its own. The first try (session 8) was one Triton launch of fp32 split
partials over 28 K ranges: it removed cuBLAS's two kernels but was 3-5 % slower per step, because a launch of
a few dozen tiny programs is pure latency, and each projection's last pass then summed 28 partials one
dependent load after another. Here the group's first projection launches its GEMV (``gemv._gemv_kernel``)
with :func:`programs` extra programs in front of its weight tiles: each computes ``BR`` adapter rows over one
K range of at most ``MAX_K_PER_SPLIT`` (so K <= 4096 is one range: 7B's q/k/v, o, gate/up; down's 18944 is
five) and writes fp32 partials ``[S, M, R]``. At 2..16 rows the mma.sync launch carries them the same way
(``mma_decode._lora_a_rows``: a row per warp, about ``MMA_SPLITS`` K ranges). They are scheduled first and overlap the weight stream, so the A
product costs no launch and almost no time: A is 0.7 MB for 7B's q/k/v against 7.2 MB of NVFP4 q weights.
Each projection's last pass sums its columns' S partials in split order and rounds once to the activation
dtype -- what ``F.linear`` returns (fp32 accumulation, one rounding) up to the order of the fp32 sum.

:func:`fill_partials` is the same result without the kernel, for a launch that cannot carry the programs (a
route other than the GEMV): ``F.linear``'s output in split 0, zeros in the others.
"""

from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

BR = 4  # adapter rows per program: [BR, BK] bf16 = 4 KB per K step over 128 threads, 16-byte loads
BK = 512  # K per step
MAX_K_PER_SPLIT = 4096  # K range per program: <= 8 steps, so a program streams <= 32 KB of A
MMA_SPLITS = 4  # K ranges (about) at 2..16 rows: k_per_split
MAX_M = 16  # decode rows the engine asks for it at: the GEMV's (M = 1) and the mma.sync kernel's token tiles 8, 16


class LoraA(typing.NamedTuple):
    """``out = x @ w^T`` as fp32 split partials, computed inside a base launch (``launch.Epilogue.lora_a``)."""

    w: torch.Tensor  # [R, K] the group's stacked A, in x's dtype, unit K stride
    out: torch.Tensor  # [S, M, R] fp32, S = splits_for(K, M): the launch writes every element

    def check(self, m: int, k: int) -> None:
        r = self.w.shape[0]
        s = splits_for(k, m)
        if self.w.dim() != 2 or self.w.shape[1] != k or self.w.stride(1) != 1:
            raise ValueError(f"LoraA: w must be [R, {k}] with unit K stride, got {tuple(self.w.shape)} "
                             f"strides {self.w.stride()}")
        if self.out.shape != (s, m, r) or self.out.dtype != torch.float32 or not self.out.is_contiguous():
            raise ValueError(f"LoraA: out must be contiguous fp32 [{s}, {m}, {r}] (splits_for({k}, {m}) = {s}), got "
                             f"{self.out.dtype} {tuple(self.out.shape)}")


def k_per_split(k: int, m: int = 1) -> int:
    """K per range, a whole number of ``BK`` steps (the last range may be shorter). One row (the GEMV): ranges of up
    to ``MAX_K_PER_SPLIT``, so that 7B's K = 3584 is one. More rows (the mma.sync launch, shorter than a 4096-long
    A range takes on a row per warp: H100 profile, RESULTS): about ``MMA_SPLITS`` ranges where K has the steps."""
    want = triton.cdiv(max(k, 1), MAX_K_PER_SPLIT)
    if m > 1:
        want = max(want, min(MMA_SPLITS, triton.cdiv(max(k, 1), BK)))
    return triton.cdiv(triton.cdiv(max(k, 1), BK), want) * BK


def splits_for(k: int, m: int = 1) -> int:
    """K ranges of the partials (``S``) for ``m`` rows: see :func:`k_per_split`."""
    return triton.cdiv(max(k, 1), k_per_split(k, m))


def programs(r: int, k: int, m: int = 1) -> int:
    """Extra programs a GEMV launch carries for ``LoraA`` of ``r`` rows over ``k``: row blocks x K ranges."""
    return triton.cdiv(r, BR) * splits_for(k, m)


def new_partials(x2: torch.Tensor, w: torch.Tensor) -> LoraA:
    """An output buffer for ``x2 [M, K] @ w [R, K]^T`` (what the launch fills)."""
    return LoraA(w, torch.empty(splits_for(w.shape[1], x2.shape[0]), x2.shape[0], w.shape[0], device=x2.device,
                                dtype=torch.float32))


def fill_partials(x2: torch.Tensor, la: LoraA) -> None:
    """The partials without the kernel: ``F.linear``'s rounded output in split 0, zeros in the rest (so their sum,
    rounded again, is that output exactly)."""
    la.out[1:].zero_()
    la.out[0].copy_(F.linear(x2, la.w))


@triton.jit
def lora_a_program(pid, xb_ptr, w_ptr, out_ptr, K, R, K_PER_SPLIT, stride_xm, stride_wr, s_out, m_out,
                   M: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """Program ``pid`` of :func:`programs`: ``out[s, :, rows] = x[:, ks] @ A[rows, ks]^T`` for its K range ``s``
    and its ``BR`` adapter rows; FFMAs into a ``[BR, BK]`` fp32 accumulator per token, one sum at the end."""
    splits = tl.cdiv(K, K_PER_SPLIT)
    s = pid % splits
    rows = (pid // splits) * BR + tl.arange(0, BR)  # [BR]
    r_ok = rows < R
    rr = tl.minimum(rows, R - 1)  # rows past R re-read row R - 1 (never stored): no row masks on loads
    k_lo = s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    accs = ()
    for m in tl.static_range(M):
        accs = accs + (tl.zeros((BR, BK), dtype=tl.float32),)
    for k0 in tl.range(k_lo, k_hi, BK):
        kk = k0 + tl.arange(0, BK)  # [BK]
        k_ok = kk < k_hi
        w = tl.load(w_ptr + rr[:, None] * stride_wr + kk[None, :], mask=k_ok[None, :], other=0.0)  # [BR, BK]
        w = w.to(tl.float32)
        new = ()
        for m in tl.static_range(M):
            xv = tl.load(xb_ptr + m * stride_xm + kk, mask=k_ok, other=0.0).to(tl.float32)  # [BK], L2 hits
            new = new + (accs[m] + w * xv[None, :],)  # bf16 x bf16 is exact in fp32: only the sums round
        accs = new
    for m in tl.static_range(M):
        tl.store(out_ptr + s * s_out + m * m_out + rows, tl.sum(accs[m], axis=1), mask=r_ok)


__all__ = ["BK", "BR", "MAX_K_PER_SPLIT", "MAX_M", "MMA_SPLITS", "LoraA", "fill_partials", "k_per_split", "lora_a_program", "new_partials",
           "programs", "splits_for"]
