"""Large-M path: dequantize the packed weight to a transient BF16 copy, then cuBLAS.

Why this exists. At prefill / training sizes (M >= ~1k tokens) a weight-only
GEMM is compute-bound: the BF16 tensor cores, not HBM, set the time. The fused
kernel (``wo_tensorcore._fwd_kernel``) must then hide ~2 integer ops per weight per
M tile plus a shared-memory store of the decoded tile behind the wgmma issue,
and in Triton 3.6 it does not (0.4-0.6x cuBLAS at M = 2048 on the H200,
docs/kernels.md). Decoding the weight *once* into a BF16 buffer costs one pass
over memory -- 0.56 B read + 2 B written per weight, ~40 us for a 7B MLP
projection on an H200 -- after which cuBLAS runs at its own speed. At
M = 2048 that is ~10% over cuBLAS instead of ~2x; at decode sizes it would be
~4x *slower* than the fused kernels (which read 0.56 B per weight instead of
4.6), so ``wo_gemm.wo_matmul`` takes this path only from ``dense_min_m()``
tokens up (measured crossover, ``benchmarks/kernels/bench_dispatch.py``).

Trade-off, stated plainly: the BF16 copy of *one* layer's weight lives for the
duration of one matmul (``[N, K]`` bf16: 136 MB for Qwen2.5-7B's gate/up, 283
MB for 32B's), allocated from PyTorch's caching allocator and released right
after -- never a BF16 copy of the model. Under autograd the last ``recent_weights.capacity()``
transients (one decoder layer's) are kept for the backward that follows a checkpointed recompute
(``recent_weights.py``). ``QUARL_KERNELS_DENSE_MIN_M=0`` disables the path (every M then runs the
fused kernels, zero transient memory), and
a call that finds no memory for the transient falls back to the fused kernel by
itself (``wo_gemm.wo_matmul``, with one warning). ``QUARL_KERNELS_DENSE_FP8=1`` (opt-in) sends FP4
weights through ``dense_fp8.py`` instead: E4M3 tiles (1 B a weight) and an FP8 GEMM, faster and *not*
the weight-only product (its docstring states the error). ``QUARL_KERNELS_MIXED_GEMM=1`` (opt-in) sends
the forwards where the fused register-A kernel is measured faster as called (``mixed_gemm.takes``: 2048..8192
rows on weights of >= 8192 rows, Hopper) to it: no transient, the same weight values (docs/kernels.md v17).

Numerics. The decode is the fused kernels' own (``dequant.load_dequant_tile``);
for NVFP4 the exact ``e2m1 * e4m3 * 2**-16`` tile is multiplied by
``2**16 / global_scale`` in fp32 and rounded once to BF16, i.e. the reference
dequantize's BF16 weight (up to the last fp32 bit of the reciprocal, which moves
a BF16 rounding in ~1e-6 of the weights). MXFP4 is exact. INT4 uses the fused
kernels' BF16-rounded group scale (<= 2**-9 relative, docs/kernels.md).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from quarl_kernels import dense_fp8, mixed_gemm, recent_weights
from quarl_kernels.dequant import load_dequant_tile
from quarl_kernels.launch import env_int

DEFAULT_DENSE_MIN_M = 256  # measured crossover (H200, docs/kernels.md "v8"); env QUARL_KERNELS_DENSE_MIN_M


def dense_min_m() -> int:
    """Smallest M that takes the dequantize-then-cuBLAS path (0 = never)."""
    return env_int("QUARL_KERNELS_DENSE_MIN_M", DEFAULT_DENSE_MIN_M,
                   "a token count (e.g. 1024), or 0 to disable the dequantize-then-cuBLAS path")


def use_dense(m: int) -> bool:
    t = dense_min_m()
    return t > 0 and m >= t


@triton.jit
def _dequant_kernel(
    wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    N, KW,
    stride_wn, stride_sn, stride_zn, stride_on,
    FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr, BYTES32: tl.constexpr,
    BN: tl.constexpr, BKW: tl.constexpr, BLOCKED: tl.constexpr = False,
):
    """out [N, K] bf16 = dequant(W); one [BN, 8*BKW] tile per program (BLOCKED: words in [64, 8] blocks)."""
    BK: tl.constexpr = BKW * 8
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    offs_kw = tl.program_id(1) * BKW + tl.arange(0, BKW)  # [BKW] words
    n_ok = offs_n[:, None] < N  # [BN, 1]
    tile = load_dequant_tile(
        wp_ptr, s_ptr, z_ptr, offs_n, offs_kw, n_ok, KW,
        stride_wn, stride_sn, stride_zn, FMT, GROUP, HAS_ZP, USE_ASM, False, BYTES32, BLOCKED,
    )  # [BN, BK] bf16; FP4 formats carry a 2**-16 factor
    if FMT == 0:  # NVFP4: exact e2m1*e4m3*2**-16, times 2**16 / global scale, one rounding
        w = (tile.to(tl.float32) * (65536.0 / tl.load(gs_ptr).to(tl.float32))).to(tl.bfloat16)
    elif FMT == 1:  # MXFP4: a power-of-two factor, exact
        w = (tile.to(tl.float32) * 65536.0).to(tl.bfloat16)
    else:
        w = tile
    offs_k = tl.program_id(1) * BK + tl.arange(0, BK)  # [BK]
    out = out_ptr + offs_n.to(tl.int64)[:, None] * stride_on + offs_k[None, :]
    tl.store(out, w, mask=n_ok & (offs_k[None, :] < KW * 8))


def dequantize(pw, *, use_asm: bool = True, bn: int = 32, bkw: int = 16, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """BF16 ``[N, K]`` copy of a ``wo_gemm.PackedWeight`` (the transient of the dense path); into ``out`` (``[N, K]``
    bf16, unit column stride) when given."""
    kw = pw.k // 8
    if out is None:
        out = torch.empty((pw.n, pw.k), device=pw.words.device, dtype=torch.bfloat16)
    elif out.shape != (pw.n, pw.k) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        raise ValueError(f"dequantize: out must be bf16 [{pw.n}, {pw.k}] with unit column stride, got {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    z = pw.zero if pw.zero is not None else pw.scale
    gs = pw.gscale if pw.gscale is not None else pw.scale
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    grid = (triton.cdiv(pw.n, bn), triton.cdiv(kw, bkw))
    _dequant_kernel[grid](
        pw.words, pw.scale, z, gs, out,
        pw.n, kw,
        pw.words.stride(0), pw.scale.stride(0), z.stride(0), out.stride(0),
        FMT=pw.fmt, GROUP=pw.group, HAS_ZP=pw.zero is not None, USE_ASM=use_asm and not interpret,
        BYTES32=pw.bytes32, BN=bn, BKW=bkw, BLOCKED=pw.blocked, num_warps=4,
    )
    return out


def _weight(pw) -> torch.Tensor:
    """The transient BF16 ``[N, K]``: decoded here, or the one a training forward just made for the backward that
    follows (``recent_weights``: activation checkpointing recomputes a layer right before its backward)."""
    return recent_weights.get((pw.words, pw.scale, pw.zero, pw.gscale), lambda: dequantize(pw))


def plain_dense(x2: torch.Tensor, pw) -> bool:
    """Whether :func:`dense_matmul` runs this call as ``x2 @ W_bf16^T`` on the decoded weight (not FP8 tiles, not
    the register-A kernel) -- and :func:`dense_matmul_t` its backward as ``dy @ W_bf16`` -- when the dense path takes
    it: a caller holding the decoded weight may run that product itself, bit for bit."""
    return not dense_fp8.takes(x2.shape[0], pw) and not mixed_gemm.takes(x2, pw)


def dense_matmul(x2: torch.Tensor, pw) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T through a transient BF16 weight and cuBLAS -- or, each when switched on,
    FP8 tiles and an FP8 GEMM, or the fused register-A kernel (``mixed_gemm.takes``: no transient)."""
    if dense_fp8.takes(x2.shape[0], pw):
        return dense_fp8.matmul(x2, pw)
    if mixed_gemm.takes(x2, pw):
        return mixed_gemm.mixed_matmul(x2, pw)
    return x2 @ _weight(pw).T


def dense_matmul_t(dy2: torch.Tensor, pw) -> torch.Tensor:
    """dx [M, K] = dy2 [M, N] @ dequant(W)."""
    if dense_fp8.takes(dy2.shape[0], pw):
        return dense_fp8.matmul_t(dy2, pw)
    return dy2 @ _weight(pw)


__all__ = ["DEFAULT_DENSE_MIN_M", "dense_matmul", "dense_matmul_t", "dense_min_m", "dequantize", "plain_dense",
           "use_dense"]
