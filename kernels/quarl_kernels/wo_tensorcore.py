"""Weight-only 4-bit tensor-core GEMMs for Hopper (Triton): ``y = x @ W^T`` and ``dx = dy @ W``.

Hopper has FP8 but no FP4 tensor cores, so NVFP4 / MXFP4 / INT4 weights are
dequantized in registers (``dequant.load_dequant_tile``) and multiplied on the
BF16 tensor cores; the weight is read once per output tile from its packed
layout and never exists as a BF16 copy in memory. ``wo_gemm.wo_matmul`` routes a call here when no faster route
(the GEMV, the Gluon decode kernels, the dense path) takes it.

Kernels
  ``_fwd_kernel``  y[M, N] = x[M, K] @ W[N, K]^T. One kernel for both regimes:
      * decode (M <= 64): one M tile covers all rows (BM = 16/32/64), so each
        weight byte is read exactly once; the winning configs swap the operands
        (acc^T = W x^T: the weight tile feeds wgmma's M=64 side, the tokens its
        N side, so M=1 wastes no tensor-core work).
      * prefill / training (M > 64): tiled MMA with 128- or 256-row token tiles,
        grouped-M launch order for L2 reuse of the weight tiles.
      Whenever the tile grid is under two waves, split-K spreads the work over
      every SM: partials go to an fp32 workspace [S, M, N] and a tiny
      ``launch.splitk_reduce_kernel`` sums them in a fixed order (deterministic,
      unlike atomics).
  ``_bwd_kernel``  dx[M, K] = dy[M, N] @ W[N, K], for LoRA training through the
      frozen base: the same tile decode, reduction over N, no weight gradient.

Cost model (the "two numbers", per call): bytes = K*N*bits/8 (+ scales) +
2*M*K + 2*M*N, flops = 2*M*N*K. At M <= 64 the weight bytes dominate (memory
bound: time ~ bytes / HBM bandwidth); at M >= 1024 the BF16 tensor-core rate
does (compute bound), and the in-register decode (~2 integer ops per weight
per M tile) is the overhead to hide behind the MMAs -- which is why prefill
tiles are 128-256 rows tall. docs/kernels.md has the measured numbers (H200:
GEMV ~2x cuBLAS BF16 at M=1, this kernel 0.4-0.6x at M=2048, hence the dense
path there) and what limits them.

Configs: :func:`default_config` encodes the measured winners per regime (M, weight size); the candidate tables
(``DECODE_CONFIGS`` / ``PREFILL_CONFIGS`` / ``BWD_CONFIGS``) hold only configs that won somewhere, since
``tuning.choose`` (``tune=True`` or ``QUARL_KERNELS_TUNE=1``) compiles and times each of them once per key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quarl_kernels.dequant import FMT_INT4, FMT_NVFP4, FP4_ACC_FACTOR, load_dequant_tile, pair_order_rows
from quarl_kernels.launch import finish as _finish
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.launch import num_sms as _num_sms


@triton.jit
def _fwd_kernel(
    x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    M, N, KW, KW_PER_SPLIT,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_zn,
    stride_os, stride_om, stride_on,
    FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr, PAIR_ORDER: tl.constexpr,
    BYTES32: tl.constexpr, SWAP_AB: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BKW: tl.constexpr, GROUP_M: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCKED: tl.constexpr = False,
):
    BK: tl.constexpr = BKW * 8
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    # grouped ordering: GROUP_M consecutive M tiles share each weight tile in L2
    num_in_group = GROUP_M * num_pid_n
    first_m = (pid // num_in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % num_in_group) % group_rows
    pid_n = (pid % num_in_group) // group_rows

    offs_m = pid_m * BM + tl.arange(0, BM)  # [BM]
    offs_n = pid_n * BN + tl.arange(0, BN)  # [BN]
    kw_lo = pid_k * KW_PER_SPLIT
    kw_hi = min(kw_lo + KW_PER_SPLIT, KW)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BM, 1]
    m_ok = offs_m[:, None] < M  # [BM, 1]
    n_ok = offs_n[:, None] < N  # [BN, 1]

    # The dequantized tile must be the MMA's B operand: Triton stores it to shared
    # memory once per K step (one barrier) and wgmma / mma.sync read it there. As the
    # A operand (SWAP_AB, acc^T = W @ x^T) Triton 3.6 keeps it in registers and
    # converts it k16 slice by k16 slice, a barrier and a wgmma wait each (v2 notes).
    if SWAP_AB:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, BKW):
        offs_kw = kw0 + tl.arange(0, BKW)  # [BKW] words
        offs_k = kw0 * 8 + tl.arange(0, BK)  # [BK] elements
        x = tl.load(x_rows + offs_k[None, :] * stride_xk, mask=m_ok & (offs_k[None, :] < kw_hi * 8), other=0.0)
        if PAIR_ORDER:
            x = tl.trans(pair_order_rows(tl.trans(x)))  # [BM, BK], columns in the weight tile's order
        w = load_dequant_tile(
            wp_ptr, s_ptr, z_ptr, offs_n, offs_kw, n_ok, kw_hi,
            stride_wn, stride_sn, stride_zn, FMT, GROUP, HAS_ZP, USE_ASM, PAIR_ORDER, BYTES32, BLOCKED,
        )  # [BN, BK] bf16
        if INTERPRET:  # the CPU interpreter multiplies raw bf16 bits; its fp32 dot is right
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(x), acc)  # [BN, BM]
        else:
            acc = tl.dot(x, tl.trans(w), acc)  # [BM, BN] fp32
    if SWAP_AB:
        acc = tl.trans(acc)  # [BM, BN]

    if FMT == 0:
        acc = acc * (65536.0 / tl.load(gs_ptr).to(tl.float32))
    elif FMT == 1:
        acc = acc * 65536.0
    # y [M, N] in x's dtype, or (split-K) fp32 partials [S, M, N]: the pointer type decides
    out = out_ptr + pid_k * stride_os + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok & (offs_n[None, :] < N))


@triton.jit
def _bwd_kernel(
    dy_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, dx_ptr,
    M, N, KW,
    stride_dym, stride_dyn, stride_wn, stride_sn, stride_zn,
    stride_dxm, stride_dxk,
    FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr, PAIR_ORDER: tl.constexpr,
    BYTES32: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BKW: tl.constexpr, GROUP_M: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCKED: tl.constexpr = False,
):
    """dx[M, K] = dy[M, N] @ W[N, K]: tiles of dx over (M, K), loop over N. With
    PAIR_ORDER the accumulator's columns come in the weight tile's pair order and
    the epilogue stores them through permuted column offsets."""
    BK: tl.constexpr = BKW * 8
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_k = tl.cdiv(KW, BKW)
    num_in_group = GROUP_M * num_pid_k
    first_m = (pid // num_in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % num_in_group) % group_rows
    pid_k = (pid % num_in_group) // group_rows

    offs_m = pid_m * BM + tl.arange(0, BM)  # [BM]
    offs_kw = pid_k * BKW + tl.arange(0, BKW)  # [BKW]
    offs_k = pid_k * BK + tl.arange(0, BK)  # [BK]
    dy_rows = dy_ptr + offs_m.to(tl.int64)[:, None] * stride_dym
    m_ok = offs_m[:, None] < M

    acc = tl.zeros((BM, BK), dtype=tl.float32)
    for n0 in range(0, N, BN):
        offs_n = n0 + tl.arange(0, BN)  # [BN]
        dy = tl.load(dy_rows + offs_n[None, :] * stride_dyn, mask=m_ok & (offs_n[None, :] < N), other=0.0)
        w = load_dequant_tile(
            wp_ptr, s_ptr, z_ptr, offs_n, offs_kw, offs_n[:, None] < N, KW,
            stride_wn, stride_sn, stride_zn, FMT, GROUP, HAS_ZP, USE_ASM, PAIR_ORDER, BYTES32, BLOCKED,
        )  # [BN, BK] bf16
        if INTERPRET:
            acc = tl.dot(dy.to(tl.float32), w.to(tl.float32), acc)
        else:
            acc = tl.dot(dy, w, acc)  # [BM, BK] fp32

    if FMT == 0:
        acc = acc * (65536.0 / tl.load(gs_ptr).to(tl.float32))
    elif FMT == 1:
        acc = acc * 65536.0
    if PAIR_ORDER:  # column 8w + 2j + h of the tile holds k = 8w + j + 4h
        c = offs_k % 8
        offs_k = offs_k - c + c // 2 + (c % 2) * 4
    dx = dx_ptr + offs_m.to(tl.int64)[:, None] * stride_dxm + offs_k[None, :] * stride_dxk
    tl.store(dx, acc.to(dx_ptr.dtype.element_ty), mask=m_ok & (offs_k[None, :] < KW * 8))



@dataclass(frozen=True)
class Config:
    bm: int
    bn: int
    bkw: int  # K tile in 32-bit words (8 weights each)
    warps: int
    stages: int
    group_m: int = 8
    swap: bool = False  # forward only: dequantized tile as the MMA's A operand (acc^T = W @ x^T)
    pair: bool = False  # forward only: pair-order weight tile, x columns permuted to match

    def __str__(self) -> str:
        tag = ("-swap" if self.swap else "") + ("-pair" if self.pair else "")
        return f"BM{self.bm}xBN{self.bn}xBK{self.bkw * 8}w{self.warps}s{self.stages}{tag}"


# Decode: BM is set to cover M; BN x BK sizes the weight tile each CTA streams.
# Candidates: the configs that won at least one (format, shape, M) point on the H200
# (docs/kernels.md v3/v4 has the full sweep, including the ones dropped here).
# ``default_config`` picks among them by M and shape; ``tune=True`` times them all.
DECODE_CONFIGS = (
    Config(16, 128, 16, 4, 4, swap=True),  # M <= 4
    Config(16, 64, 32, 4, 4, swap=True),  # M <= 16
    Config(16, 64, 16, 4, 6, swap=True),  # M <= 64
)
PREFILL_CONFIGS = (
    Config(128, 128, 8, 8, 4),  # M > 256, small weights
    Config(128, 128, 8, 8, 4, swap=True),  # 64 < M <= 256
    Config(256, 128, 8, 8, 3, swap=True),  # M >= 1024, N * K >= 32M
)
BWD_CONFIGS = (
    Config(128, 64, 16, 8, 3),  # fastest at every measured shape (M = 2048)
    Config(128, 128, 16, 8, 3),
)
DECODE_MAX_M = 64


@dataclass(frozen=True)
class PackedWeight:
    """The raw tensors of one packed [N, K] weight, as the kernels read them."""

    fmt: int
    group: int
    n: int
    k: int
    words: torch.Tensor  # int32 [N, K/8]
    scale: torch.Tensor  # [N, G] fp32/bf16 (INT4); FP4: uint8 bytes [N, G] or their int32 view [N, G/4]
    zero: torch.Tensor | None  # INT4 asymmetric: int8 bytes [N, G] or int32 view [N, G/4]; else None
    gscale: torch.Tensor | None  # fp32 [1] (NVFP4) or None
    bytes32: bool = False  # byte tensors above are passed as int32 views (pipelinable loads)
    # ``words`` hold the blocked layout (``quarl.quant.packed_layout``: [64, 8]-word blocks, the [N, KW] view's
    # stride(0) still KW); every kernel reading words takes it as its BLOCKED constexpr
    blocked: bool = False


def _decode_bm(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def _split_k(cfg: Config, m: int, n: int, kw: int, sms: int) -> tuple[int, int]:
    """(split count, words per split): enough CTAs for ~2 waves, >= 2 K tiles each."""
    tiles = triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn)
    if tiles >= 2 * sms:
        return 1, kw
    k_tiles = triton.cdiv(kw, cfg.bkw)
    split = max(1, min(16, triton.cdiv(2 * sms, tiles), k_tiles // 2))
    per = triton.cdiv(k_tiles, split) * cfg.bkw
    return triton.cdiv(kw, per), per


def launch_fwd(
    x2: torch.Tensor, pw: PackedWeight, cfg: Config, *, use_asm: bool = True, pair_order: bool | None = None,
    swap_ab: bool | None = None, epi=None,
) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ W^T with an explicit config (no tuning); ``pair_order`` /
    ``swap_ab`` override the config's ``pair`` / ``swap`` (see docs/kernels.md)."""
    pair_order = cfg.pair if pair_order is None else pair_order
    swap_ab = cfg.swap if swap_ab is None else swap_ab
    m = x2.shape[0]
    kw = pw.k // 8
    y = torch.empty((m, pw.n), device=x2.device, dtype=x2.dtype)
    if m == 0:
        return y
    if m <= DECODE_MAX_M:  # one M tile: every weight byte is read once
        cfg = Config(max(cfg.bm, _decode_bm(m)), cfg.bn, cfg.bkw, cfg.warps, cfg.stages, 1, cfg.swap, cfg.pair)
    split, per = _split_k(cfg, m, pw.n, kw, _num_sms(x2.device))
    out = y if split == 1 else torch.empty((split, m, pw.n), device=x2.device, dtype=torch.float32)
    so, sm_, sn = (0, y.stride(0), y.stride(1)) if split == 1 else out.stride()
    z = pw.zero if pw.zero is not None else pw.scale
    gs = pw.gscale if pw.gscale is not None else pw.scale
    grid = (triton.cdiv(m, cfg.bm) * triton.cdiv(pw.n, cfg.bn), split)
    _fwd_kernel[grid](
        x2, pw.words, pw.scale, z, gs, out,
        m, pw.n, kw, per,
        x2.stride(0), x2.stride(1), pw.words.stride(0), pw.scale.stride(0), z.stride(0),
        so, sm_, sn,
        FMT=pw.fmt, GROUP=pw.group, HAS_ZP=pw.zero is not None, USE_ASM=use_asm, PAIR_ORDER=pair_order,
        BYTES32=pw.bytes32, SWAP_AB=swap_ab,
        BM=cfg.bm, BN=cfg.bn, BKW=cfg.bkw, GROUP_M=cfg.group_m, INTERPRET=_interpreting(), BLOCKED=pw.blocked,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )
    return _finish(out, y, split, epi)


def launch_bwd(
    dy2: torch.Tensor, pw: PackedWeight, cfg: Config, *, use_asm: bool = True, pair_order: bool = False
) -> torch.Tensor:
    """dx [M, K] = dy2 [M, N] @ W with an explicit config."""
    m = dy2.shape[0]
    kw = pw.k // 8
    dx = torch.empty((m, pw.k), device=dy2.device, dtype=dy2.dtype)
    if m == 0:
        return dx
    bm = min(cfg.bm, _decode_bm(m))
    z = pw.zero if pw.zero is not None else pw.scale
    gs = pw.gscale if pw.gscale is not None else pw.scale
    grid = (triton.cdiv(m, bm) * triton.cdiv(kw, cfg.bkw),)
    _bwd_kernel[grid](
        dy2, pw.words, pw.scale, z, gs, dx,
        m, pw.n, kw,
        dy2.stride(0), dy2.stride(1), pw.words.stride(0), pw.scale.stride(0), z.stride(0),
        dx.stride(0), dx.stride(1),
        FMT=pw.fmt, GROUP=pw.group, HAS_ZP=pw.zero is not None, USE_ASM=use_asm, PAIR_ORDER=pair_order,
        BYTES32=pw.bytes32,
        BM=bm, BN=cfg.bn, BKW=cfg.bkw, GROUP_M=cfg.group_m, INTERPRET=_interpreting(), BLOCKED=pw.blocked,
        num_warps=cfg.warps if bm >= 64 else 4, num_stages=cfg.stages,
    )
    return dx



def _m_bucket(m: int) -> int:
    return _decode_bm(m) if m <= DECODE_MAX_M else min(triton.next_power_of_2(m), 4096)


def default_config(kind: str, m: int, n: int, k: int) -> Config:
    """The measured winner for this regime (H200 sweep, docs/kernels.md)."""
    if kind == "bwd":
        return BWD_CONFIGS[0]
    if m <= DECODE_MAX_M:
        return DECODE_CONFIGS[0 if m <= 4 else 1 if m <= 16 else 2]
    if m >= 1024 and n * k >= (32 << 20):
        return PREFILL_CONFIGS[2]
    return PREFILL_CONFIGS[1 if m <= 256 else 0]


__all__ = [
    "BWD_CONFIGS",
    "DECODE_CONFIGS",
    "DECODE_MAX_M",
    "FMT_INT4",
    "FMT_NVFP4",
    "FP4_ACC_FACTOR",
    "PREFILL_CONFIGS",
    "Config",
    "PackedWeight",
    "default_config",
    "launch_bwd",
    "launch_fwd",
]
