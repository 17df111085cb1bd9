"""Large-M path in FP8 (opt-in): FP4 weights expanded to E4M3 128x128 tiles, activations to 1x128 groups, one
FP8 GEMM.

Why this exists. The dense path (``dense.py``) decodes a packed weight to a transient BF16 copy and runs cuBLAS:
the decode writes 2 B per weight, ~55 us for a 7B MLP projection on an H100, which is the 5-18 % that path loses to
cuBLAS on BF16 weights at 2048-4096 rows (benchmarks/RESULTS.md, issue 17). Hopper has no FP4 tensor cores but
FP8 ones at twice the BF16 rate; expanding the weight to E4M3 writes 1 B per weight, and the GEMM itself halves.
This is issue 17's "FP8 path for large batches: NVFP4 weights expanded to FP8 per tile with FP8 tensor-core MMA
where the numerics allow", behind ``QUARL_KERNELS_DENSE_FP8=1`` because it is *not* the weight-only product.

Numerics, stated plainly.

* Weight: each 128x128 tile of the padded ``[Np, Kp]`` weight gets the scale ``2**e * F`` -- ``F`` the format's
  own factor (NVFP4: ``1 / global_scale``; MXFP4: 1), ``e`` the smallest power of two that brings 6 x the tile's
  largest block scale (its largest possible magnitude; the actual one for NVFP4 blocks, whose largest code is
  always 6) to <= 448 -- and each weight the code ``round_e4m3(value / scale)``. Because the scale is a power of
  two, a code is exact whenever the FP4 value times its block scale (e2m1 x e4m3: up to 5 significant bits; MXFP4:
  2) fits E4M3's 4; the rest (NVFP4 values 1.5 / 3 / 6 times a block scale with an odd last mantissa bit, about a
  quarter of the weights) move by half an E4M3 step, <= 2**-4 relative, round-to-nearest-even. MXFP4 is exact
  unless a tile's block exponents span more than E4M3's range (2**-9 .. 448 after the shift).
* Activations: 1x128 groups along K, Jet-RL's / DeepSeek-V3's quantizer (``quarl.quant.fp8_linear``), and the
  GEMM is its ``blockwise_gemm`` (cuBLAS's 1x128 x 128x128 kernel on SM90, DeepGEMM with
  ``QUARL_FP8_GEMM=deepgemm``, FP32 emulation elsewhere), FP32 accumulation, output in the activation dtype.
* So the output differs from the weight-only product by the activations' E4M3 rounding (the larger part) and the
  weight codes' (the CPU test and ``benchmarks/kernels/bench_dense_fp8.py`` state the relative error), where the
  BF16 dense path differs by its output's rounding only. Rollout decode (M below the dense threshold) stays
  weight-only, so a run with this switch on has a larger rollout/trainer log-prob mismatch; the GRPO benchmark
  reports it beside the step times.

Memory and passes: the transient is 1 B per weight (half the BF16 dense path's), made per call. DGrad (``dy @ W``)
needs the transposed tiles (``[Kp, Np]``: Hopper's FP8 GEMMs take both operands K-major), made by the same kernel
with ``TRANS`` when the backward asks. Nothing is kept for the backward (``recent_weights`` is the BF16 path's):
a forward cannot tell whether it is a checkpointed layer's first pass, whose backward comes after the whole model,
or its recompute, so transposed tiles made ahead would mostly be made twice. A checkpointed micro-batch thus
expands each weight three times (forward, recompute, DGrad: 1.56 B a weight each) where the BF16 path decodes it
twice (2.56 B each).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from quarl_kernels import fp8_quant
from quarl_kernels.dequant import _row_group_bytes, load_dequant_tile
from quarl_kernels.env import env_flag, env_int, interpreting
from quarl_kernels.rounding import round_to_fp8

ENV = "QUARL_KERNELS_DENSE_FP8"
TILE = 128
SUB = 32  # rows of a tile decoded and stored at a time (a [32, 128] fp32 chunk: 32 registers a thread at 4 warps)
FP4_FORMATS = (0, 1)  # wo_gemm's FMT codes: NVFP4, MXFP4 (INT4's BF16-rounded group scales would round again)


# Smallest GEMM (2 M N K, in GFLOP) the FP8 variant takes: below it the BF16 dense path serves. Why: one FP8 call
# costs ~170-400 us of host time on the H100 machines (two Triton launches -- the activation quantizer's and the
# expansion's -- with their Python, cuBLASLt ~30 us; the BF16 dense call 66-160 us: benchmarks/kernels/
# dense_host_cost.py, RESULTS "Issue 17, session 18"), so a call whose GEMM takes less GPU time than that only
# moves the wait to the host: a 7B LoRA micro-batch of 6144 rows ran 1.39x *slower* with every projection in FP8
# while its kernels summed 11 % less. 256 GFLOP is ~370 us of cuBLAS BF16 at ~700 TFLOP/s: at 6144 rows it takes
# the 7B MLP projections (834 GFLOP) and leaves q / k / v / o (<= 158) on the BF16 path; at 16384 rows q / o (421)
# go FP8 too.
DEFAULT_MIN_GFLOP = 256
MIN_GFLOP_ENV = "QUARL_KERNELS_DENSE_FP8_MIN_GFLOP"


def min_gflop() -> int:
    """``QUARL_KERNELS_DENSE_FP8_MIN_GFLOP`` (default :data:`DEFAULT_MIN_GFLOP`; 0 = every dense call)."""
    return env_int(MIN_GFLOP_ENV, DEFAULT_MIN_GFLOP, "the smallest GEMM in GFLOP (2 M N K / 1e9) the FP8 dense "
                   "path takes, or 0 for every dense call")


def takes(m: int, pw) -> bool:
    """Whether an ``M``-row call on ``pw`` goes FP8: switched on, an FP4 weight, and a GEMM large enough."""
    return enabled() and supported(pw) and 2 * m * pw.n * pw.k >= min_gflop() * 1e9


def enabled() -> bool:
    """``QUARL_KERNELS_DENSE_FP8``: on -> the dense path runs FP4 weights through this module (default off)."""
    return env_flag(ENV, False)


def supported(pw) -> bool:
    """Formats this path expands (FP4); the rest stay on the BF16 dense path."""
    return pw.fmt in FP4_FORMATS


@triton.jit
def _expand_kernel(
    wp_ptr, s_ptr, gs_ptr, q_ptr, sc_ptr,
    N, KW,
    stride_wn, stride_sn, stride_q, stride_sc0, stride_sc1,
    FMT: tl.constexpr, GROUP: tl.constexpr, USE_ASM: tl.constexpr, BYTES32: tl.constexpr, TRANS: tl.constexpr,
    SUB: tl.constexpr, INTERPRET: tl.constexpr, BLOCKED: tl.constexpr = False,
):
    """One 128x128 tile (pid_n, pid_k) of the padded weight: codes into q (``[Np, Kp]``, or ``[Kp, Np]`` with
    TRANS), the tile's scale into sc[pid_n, pid_k] (strides given by the caller: its transpose with TRANS).

    The tile's exponent comes from its block-scale bytes alone (the largest FP4 magnitude is 6, so the tile's
    largest value is at most 6 x its largest block scale, and equal to it for a block quantized from its own
    amax), so the codes are written in SUB-row chunks as they are decoded: no pass over the whole tile first."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    WPG: tl.constexpr = GROUP // 8  # words per scale group
    NG: tl.constexpr = 16 // WPG  # scale groups in the tile's 16 words
    rows = pid_n * 128 + tl.arange(0, 128)  # [128]
    g0 = pid_k * NG
    g_hi = (KW + WPG - 1) // WPG
    sb = _row_group_bytes(s_ptr, rows, g0, rows < N, g_hi, stride_sn, NG, BYTES32)  # [128, NG] scale bytes
    bmax = tl.max(tl.max(sb, axis=1), axis=0)  # positive E4M3 / E8M0 bytes order as their values
    if FMT == 0:  # NVFP4: bound = 6 * s * 2**-16 in the decoded tile's frame (exact in fp32)
        amax = bmax.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 6.0 * 1.52587890625e-05
        bits = amax.to(tl.int32, bitcast=True)
        # smallest e with amax * 2**-e <= 448 = 1.75 * 2**8, from amax = 1.f * 2**E: e = E - 8, or E - 7 if 1.f > 1.75
        e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
        e = tl.where(amax == 0.0, 0, e)
        factor = 65536.0 / tl.load(gs_ptr).to(tl.float32)  # weight = tile * 2**16 / global scale (dense.py's)
    else:  # MXFP4: bound = 6 * 2**(b - 127) * 2**-16 = 1.5 * 2**(b - 141): e = b - 149
        e = tl.maximum(bmax - 149, -126)
        factor = 65536.0  # weight = tile * 2**16
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**-e, exact
    scale = ((127 + e) << 23).to(tl.float32, bitcast=True) * factor
    offs_kw = pid_k * 16 + tl.arange(0, 16)  # [16] words = 128 weights
    offs_k = pid_k * 128 + tl.arange(0, 128)  # [128]
    k_in = offs_k < KW * 8
    for i in tl.range(0, 128 // SUB):
        offs_n = pid_n * 128 + i * SUB + tl.arange(0, SUB)  # [SUB]
        n_ok = offs_n[:, None] < N  # [SUB, 1]
        tile = load_dequant_tile(
            wp_ptr, s_ptr, s_ptr, offs_n, offs_kw, n_ok, KW,
            stride_wn, stride_sn, stride_sn, FMT, GROUP, False, USE_ASM, False, BYTES32, BLOCKED,
        ).to(tl.float32)  # [SUB, 128]: the exact FP4 value x block scale x 2**-16
        tile = tl.where(n_ok & k_in[None, :], tile, 0.0)  # padding: zero codes
        codes = round_to_fp8(tl.clamp(tile * down, -448.0, 448.0), INTERPRET)  # the one rounding: E4M3, RNE
        if TRANS:
            tl.store(q_ptr + offs_k.to(tl.int64)[:, None] * stride_q + offs_n[None, :], tl.trans(codes))
        else:
            tl.store(q_ptr + offs_n.to(tl.int64)[:, None] * stride_q + offs_k[None, :], codes)
    tl.store(sc_ptr + pid_n * stride_sc0 + pid_k * stride_sc1, scale)


def expand(pw, *, transpose: bool = False, use_asm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``wo_gemm.PackedWeight`` (NVFP4 / MXFP4) -> ``(q, s)``: ``q`` ``[Np, Kp]`` E4M3 and ``s`` ``[Np/128,
    Kp/128]`` fp32 (128x128 tiles, N and K padded to multiples of 128 with zero codes); with ``transpose``, ``q`` is
    ``[Kp, Np]`` (W^T's codes) and ``s`` ``[Kp/128, Np/128]``. ``q * s`` (each tile's scale) is the weight, up to the
    E4M3 rounding the module docstring bounds."""
    if not supported(pw):
        raise ValueError(f"dense_fp8.expand: format code {pw.fmt} is not an FP4 format (NVFP4 / MXFP4); the BF16 "
                         f"dense path (dense.dequantize) serves it")
    n_p, k_p = fp8_quant._round_up(pw.n, TILE), fp8_quant._round_up(pw.k, TILE)
    dev = pw.words.device
    q = torch.empty((k_p, n_p) if transpose else (n_p, k_p), device=dev, dtype=torch.float8_e4m3fn)
    s = torch.empty((k_p // TILE, n_p // TILE) if transpose else (n_p // TILE, k_p // TILE), device=dev,
                    dtype=torch.float32)
    fp8_quant._launch(expand_launch(pw, q, s, transpose, use_asm))
    return q, s


def expand_launch(pw, q: torch.Tensor, s: torch.Tensor, transpose: bool, use_asm: bool = True) -> fp8_quant.Launch:
    """The launch :func:`expand` makes (the SASS test compiles exactly this for sm_90 on a CPU)."""
    gs = pw.gscale if pw.gscale is not None else pw.scale
    ss = (s.stride(1), s.stride(0)) if transpose else (s.stride(0), s.stride(1))  # sc[pid_n, pid_k]
    interpret = interpreting()
    grid = (fp8_quant._round_up(pw.n, TILE) // TILE, fp8_quant._round_up(pw.k, TILE) // TILE)
    return fp8_quant.Launch(
        _expand_kernel, grid,
        (pw.words, pw.scale, gs, q, s, pw.n, pw.k // 8, pw.words.stride(0), pw.scale.stride(0), q.stride(0), *ss),
        {"FMT": pw.fmt, "GROUP": pw.group, "USE_ASM": use_asm and not interpret, "BYTES32": pw.bytes32,
         "TRANS": transpose, "SUB": SUB, "INTERPRET": interpret, "BLOCKED": pw.blocked},
        4,
    )


@functools.cache
def _fp8_linear():
    from quarl.quant import fp8_linear  # the activation quantizer and the blockwise GEMM (lazily: quarl imports us)

    return fp8_linear


def _gemm(a2: torch.Tensor, q: torch.Tensor, s: torch.Tensor, n_out: int) -> torch.Tensor:
    """``a2 [M, R] @ (q * s)^T`` -> ``[M, n_out]`` in ``a2``'s dtype; ``q`` ``[Np, Rp]`` with 128x128 tile scales."""
    f = _fp8_linear()
    m = a2.shape[0]
    mp = fp8_quant._round_up(m, 4) if a2.is_cuda else m  # cuBLAS wants rows in fours
    aq, sa, _, _ = f.quantize_act_gemm(a2, mp, q.shape[1])  # [Mp, Rp] E4M3, 1x128 along R
    y = f.blockwise_gemm(aq, sa, q, s, True, a2.dtype)  # [Mp, Np]
    if mp != m or y.shape[1] != n_out:
        y = y[:m, :n_out].contiguous()
    return y


def matmul(x2: torch.Tensor, pw) -> torch.Tensor:
    """y [M, N] ~= x2 [M, K] @ dequant(W)^T through FP8 tiles and one FP8 GEMM."""
    q, s = expand(pw)
    return _gemm(x2, q, s, pw.n)


def matmul_t(dy2: torch.Tensor, pw) -> torch.Tensor:
    """dx [M, K] ~= dy2 [M, N] @ dequant(W) (DGrad, dy in 1x128 groups along N)."""
    q, s = expand(pw, transpose=True)
    return _gemm(dy2, q, s, pw.k)


__all__ = ["DEFAULT_MIN_GFLOP", "ENV", "MIN_GFLOP_ENV", "enabled", "expand", "expand_launch", "matmul", "matmul_t",
           "min_gflop", "supported", "takes"]
