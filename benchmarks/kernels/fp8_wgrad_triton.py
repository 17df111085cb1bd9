"""A Triton kernel for the weight-gradient GEMM of the Jet-RL FP8 linear, dW = dY^T X with 1x128 groups along
the tokens on *both* operands ("1D1D", DeepSeek-V3's WGrad recipe) -- an experiment, kept with its benchmark
(``probe_fp8_wgrad.py``), not used by the library: **it is slower than cuBLAS** (below).

    A  = dY^T  [M, T]  E4M3, scale sa[t / 128, m]   (M = out features, T = tokens, K-major)
    B  = X^T   [N, T]  E4M3, scale sb[t / 128, n]   (N = in features)
    dW [M, N] = sum over token blocks b of  sa[b, m] * sb[b, n] * (A[m, b] . B[n, b])

Why it was tried: cuBLAS's and DeepGEMM's 1D1D kernels ran at ~1.1x BF16 on Hopper in session 7 while their
"1x128 x 128x128" kernels reach 1.4-1.6x (benchmarks/RESULTS.md "Jet-RL"). A token block's partial product must be
scaled by an *outer product* of two scale vectors before it joins the FP32 accumulator: two FP32 operations per
output element per 128 tokens (the 1D2D kernels need one), ~45 % of the block's tensor-core time on an H100, so a
kernel is fast only if the CUDA-core scaling of one tile overlaps the MMAs of another. Here each program holds one
[BLOCK_M, BLOCK_N] tile; the settings give an SM several small programs (they interleave) or one large one, with
pointer (cp.async) or TMA loads; Triton's automatic warp specialization (tma = 2) compiles for sm_90 but hung on
the GPU at two of three settings tried.

Measured (H200, 2026-11-26, RESULTS.md "Jet-RL", the split quantizers subsection): with the best of seven settings
per shape, the WGrad GEMMs of one layer at 8192 tokens took 5.83 ms (Qwen2.5-7B) and 5.04 ms (Qwen3-8B) against
cuBLAS's 3.96 / 3.90 ms and BF16's 5.04 / 4.25 ms: 0.68x / 0.77x cuBLAS. Results equal cuBLAS's to 6e-8 relative L2.

Numerics: each block's dot product is exact in FP32 for E4M3 inputs (products are exact, sums of 128
fit), scaled and accumulated in FP32 in token order, rounded once to the output dtype. cuBLAS sums
in its own order: the two agree to FP32 rounding (tested against the FP32 product of the dequantized
operands, on CPU through ``TRITON_INTERPRET=1`` and on the GPU against cuBLAS).

Layouts are the quantizers' (``quarl_kernels.fp8_quant.quantize_act(..., t_rows=...)``): codes row-major [rows, T], scales
stored outer-major ([T/128, rows] storage, viewed [rows, T/128] with strides (1, rows)). T must be a
multiple of 128; M and N any size (masked).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from quarl_kernels import fp8_quant as fq
from quarl_kernels.fp8_quant import TUNED, Launch, pick_setting, tuning_on

GROUP = 128  # tokens per scale block
# (BLOCK_M, BLOCK_N, warps, stages, tma); the first is the default (no timing: CPU, QUARL_FP8_TUNE=0, capture).
# tma 0: pointer loads (cp.async pipeline), 1: TMA descriptors. 64 x 128 x 4 warps is one warpgroup, two or three
# programs per SM that interleave MMA and scaling; 128 x 128 x 8 two warpgroups of one program; 64 x 256 and
# 128 x 256 spill (two accumulators of 128 registers, ptxas for sm_90). tma 2 (Triton's automatic warp
# specialization, 12 warps) is no candidate: with it among the candidates the first device call hung; alone,
# (64, 128, 4, 4, 2) ran and (128, 64, 4, 4, 2) hung (probe_fp8_wgrad.py runs each setting alone).
SETTINGS = ((128, 128, 8, 3, 0), (64, 128, 4, 4, 0), (128, 128, 8, 3, 1), (128, 128, 8, 4, 1), (64, 128, 4, 4, 1),
            (64, 128, 4, 5, 1), (128, 64, 4, 4, 1))
GROUP_M = 8  # programs along M sharing a B column panel in L2 (launch order)


@triton.jit
def _wgrad_kernel(
    a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr,
    M, N, T,
    stride_am, stride_bn, stride_sag, stride_sbg, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
):
    # one program: the output tile [BLOCK_M, BLOCK_N] of dW, over all T / 128 token blocks
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n  # grouped order: GROUP_M row panels walk the column panels together
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    rk = tl.arange(0, 128)
    m_ok = rm < M
    n_ok = rn < N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :]  # [BM, 128]
    b_ptrs = b_ptr + rn.to(tl.int64)[:, None] * stride_bn + rk[None, :]  # [BN, 128]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(0, T // 128):
        a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)  # [BM, 128] e4m3
        b = tl.load(b_ptrs, mask=n_ok[:, None], other=0.0)  # [BN, 128] e4m3
        sa = tl.load(sa_ptr + kb * stride_sag + rm, mask=m_ok, other=0.0)  # [BM] fp32
        sb = tl.load(sb_ptr + kb * stride_sbg + rn, mask=n_ok, other=0.0)  # [BN] fp32
        p = tl.dot(a, tl.trans(b))  # [BM, BN] fp32: this token block's exact partial product
        acc += p * (sa[:, None] * sb[None, :])
        a_ptrs += 128
        b_ptrs += 128
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _wgrad_tma_kernel(
    a_desc, b_desc, sa_ptr, sb_ptr, c_ptr,
    M, N, T, stride_sag, stride_sbg, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, WARP_SPEC: tl.constexpr,
):
    # _wgrad_kernel with the operand tiles brought by TMA (host tensor descriptors: bounds handled by the
    # copy engine, no address registers per thread); WARP_SPEC: Triton's automatic warp specialization
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(0, T // 128, warp_specialize=WARP_SPEC):
        a = a_desc.load([pid_m * BLOCK_M, kb * 128])  # [BM, 128] e4m3
        b = b_desc.load([pid_n * BLOCK_N, kb * 128])  # [BN, 128] e4m3
        sa = tl.load(sa_ptr + kb * stride_sag + rm, mask=m_ok, other=0.0)
        sb = tl.load(sb_ptr + kb * stride_sbg + rn, mask=n_ok, other=0.0)
        p = tl.dot(a, tl.trans(b))
        acc += p * (sa[:, None] * sb[None, :])
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _run(la: Launch) -> None:
    # FP contraction on (unlike the quantizers, which must match PyTorch's separately rounded ops): the
    # scaling is one multiply and one FMA per element
    la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps)


def _cuda_ms(la: Launch) -> float:
    return fq._cuda_ms(la, _run)  # the quantizers' timer, with FP contraction on


def _check(a, sa, b, sb):
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"wgrad_1d1d: A and B must be float8_e4m3fn, got {a.dtype} / {b.dtype}")
    (m, t), (n, t2) = a.shape, b.shape
    if t != t2 or t % GROUP:
        raise ValueError(f"wgrad_1d1d: token sizes {t} / {t2} must match and be a multiple of {GROUP}")
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("wgrad_1d1d: A and B must be row-major along the tokens")
    if sa.shape != (m, t // GROUP) or sb.shape != (n, t // GROUP) or sa.stride(0) != 1 or sb.stride(0) != 1:
        raise ValueError(f"wgrad_1d1d: scales must be [rows, T/128] stored outer-major (stride (1, rows)); got "
                         f"{tuple(sa.shape)} {sa.stride()} / {tuple(sb.shape)} {sb.stride()}")


def _wgrad_launch(a, sa, b, sb, c, bm: int, bn: int, warps: int, stages: int, tma: int = 0) -> Launch:
    # tma: 0 = pointer loads (cp.async), 1 = TMA descriptors, 2 = TMA + warp specialization
    m, t = a.shape
    n = b.shape[0]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        ad = TensorDescriptor.from_tensor(a, [bm, 128])
        bd = TensorDescriptor.from_tensor(b, [bn, 128])
        return Launch(_wgrad_tma_kernel, grid,
                      (ad, bd, sa, sb, c, m, n, t, sa.stride(1), sb.stride(1), c.stride(0)),
                      {"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": GROUP_M, "WARP_SPEC": tma == 2,
                       "num_stages": stages}, warps)
    return Launch(_wgrad_kernel, grid,
                  (a, b, sa, sb, c, m, n, t, a.stride(0), b.stride(0), sa.stride(1), sb.stride(1), c.stride(0)),
                  {"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": GROUP_M, "num_stages": stages}, warps)


def wgrad_1d1d(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype,
               setting: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``a`` [M, T] and ``b`` [N, T] E4M3 with 1x128 scales along T (``sa`` [M, T/128], ``sb`` [N, T/128],
    outer-major) -> ``a_deq @ b_deq^T`` [M, N] in ``out_dtype`` (bf16 / fp16 / fp32). ``setting`` (BLOCK_M,
    BLOCK_N, warps, stages) given, else chosen by shape on CUDA (timed once per shape class), else the
    default."""
    _check(a, sa, b, sb)
    m, t = a.shape
    n = b.shape[0]
    c = torch.empty(m, n, device=a.device, dtype=out_dtype)
    if setting is None:
        setting = SETTINGS[0]
        key = ("wgrad", m, n, triton.next_power_of_2(t), out_dtype)
        if key in TUNED:
            setting = TUNED[key]["best"]
        elif tuning_on(a):  # (QUARL_FP8_TUNE=0 or a CUDA-graph capture: the default, not remembered)
            setting = pick_setting(key, SETTINGS, lambda *s: _wgrad_launch(a, sa, b, sb, c, *s), _cuda_ms)
    _run(_wgrad_launch(a, sa, b, sb, c, *setting))
    return c


__all__ = ["SETTINGS", "wgrad_1d1d"]
