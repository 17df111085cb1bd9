"""The LoRA A GEMM of a decode step in one launch, as split partials that the base GEMM's last pass finishes.

A packed adapter group (``quarl.engine.lora``: q/k/v share ``A = [A_q; A_k; A_v]``) computes ``a = x @ A^T``
(x [M, K] bf16, A [R, K] bf16, R = G * r <= 192) once per layer and group, then each projection's base kernel
adds ``scaling * a_j @ B_j^T`` in its last pass (``launch.Epilogue``). cuBLAS runs that A GEMM as two kernels
at decode sizes: 224 of a 7B NVFP4+LoRA decode step's kernels and 0.68 ms of its 4.35 ms at batch 1 on an H200
(RESULTS.md "Issue 17: LoRA B and bias in the GEMM's last pass"). Here it is one launch, and the sum that
cuBLAS's second kernel does moves into the epilogue that runs anyway: the programs (S K-ranges x R blocks x
M blocks) write fp32 partials ``[S, M, R]``; each projection's epilogue sums its columns' S partials in split
order and rounds them once to the activation dtype, then multiplies by B as before. That is what ``F.linear``
returns (FP32 accumulation, one rounding to bf16) up to the order of the FP32 sum.

Shapes in the comments: BM rows (16: tl.dot's smallest tile; decode rows past M are masked), BR adapter
columns, BK of K per step. ``S`` is chosen so that the launch has enough programs to stream A (it is read once:
R * K * 2 bytes, 0.7 MB for q/k/v at 7B) while an epilogue program's sum stays short (at most ``MAX_SPLITS``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels.launch import interpreting

BM, BR, BK = 16, 32, 128
MAX_SPLITS = 32
MAX_M = 64  # decode rows; a prefill's A GEMM (thousands of rows) stays on cuBLAS, which reuses A across rows


@triton.jit
def _lora_a_kernel(x_ptr, w_ptr, out_ptr, M, K, R, K_PER_SPLIT, stride_xm, stride_wr, s_out, m_out,
                   BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, INTERPRET: tl.constexpr):
    # program (split s, adapter columns block, row block): partial[s, rows, cols] = x[rows, ks] @ A[cols, ks]^T
    pid_s = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)  # [BM]
    cols = pid_r * BR + tl.arange(0, BR)  # [BR]
    r_ok = rows < M
    c_ok = cols < R
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    acc = tl.zeros([BM, BR], dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK):
        kk = k0 + tl.arange(0, BK)  # [BK]
        k_ok = kk < k_hi
        x = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wr + kk[None, :], mask=c_ok[:, None] & k_ok[None, :], other=0.0)
        if INTERPRET:  # the interpreter's bf16 dot is wrong; bf16 x bf16 products are exact in fp32 anyway
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))  # [BM, BK] @ [BK, BR], fp32 accumulate
    tl.store(out_ptr + pid_s * s_out + rows[:, None] * m_out + cols[None, :], acc,
             mask=r_ok[:, None] & c_ok[None, :])


def splits_for(k: int) -> int:
    """How many K ranges: one per BK step up to ``MAX_SPLITS`` (each split a whole number of BK steps)."""
    steps = triton.cdiv(k, BK)
    per = triton.cdiv(steps, min(steps, MAX_SPLITS))
    return triton.cdiv(steps, per)


def lora_a_partials(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` and ``w [R, K]`` (the same dtype, unit K stride) -> fp32 partials ``[S, M, R]`` whose sum over
    S (in order) is ``x @ w^T``; finish them with ``launch.Epilogue(a=partials[..., cols])``."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"lora_a_partials: need x [M, K] and w [R, K] with unit K strides, got "
                         f"{tuple(x.shape)} {x.stride()} / {tuple(w.shape)} {w.stride()}")
    m, k = x.shape
    r = w.shape[0]
    s = splits_for(k)
    per = triton.cdiv(triton.cdiv(k, BK), s) * BK
    out = torch.empty(s, m, r, device=x.device, dtype=torch.float32)
    if m == 0 or r == 0:
        return out.zero_()
    _lora_a_kernel[(s, triton.cdiv(r, BR), triton.cdiv(m, BM))](
        x, w, out, m, k, r, per, x.stride(0), w.stride(0), out.stride(0), out.stride(1),
        BM=BM, BR=BR, BK=BK, INTERPRET=interpreting(), num_warps=4)
    return out


__all__ = ["MAX_M", "MAX_SPLITS", "lora_a_partials", "splits_for"]
