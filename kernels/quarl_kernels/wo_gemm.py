"""Weight-only 4-bit GEMMs for Hopper: ``y = x @ W^T`` and ``dx = dy @ W``.

Hopper has FP8 but no FP4 tensor cores, so NVFP4 / MXFP4 / INT4 weights are
dequantized in registers (``dequant.load_dequant_tile``) and multiplied on the
BF16 tensor cores; the weight is read once per output tile from its packed
layout and never exists as a BF16 copy in memory.

Kernels
  ``_fwd_kernel``  y[M, N] = x[M, K] @ W[N, K]^T. One kernel for both regimes:
      * decode (M <= 64): one M tile covers all rows (BM = 16/32/64), so each
        weight byte is read exactly once; the winning configs swap the operands
        (acc^T = W x^T: the weight tile feeds wgmma's M=64 side, the tokens its
        N side, so M=1 wastes no tensor-core work).
      * prefill / training (M > 64): tiled MMA with 128- or 256-row token tiles,
        grouped-M launch order for L2 reuse of the weight tiles.
      (``wo_matmul`` sends M <= ``gemv.GEMV_MAX_M`` to the CUDA-core GEMV in
      ``gemv.py`` instead: faster there, docs/kernels.md v6; and M >= ``dense_min_m()``
      to ``dense.py``, a transient BF16 weight for cuBLAS, docs/kernels.md v8.)
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

Config choice: ``default_config`` encodes the measured winners per regime (M,
weight size); ``tune=True`` (or ``QUARL_KERNELS_TUNE=1``) instead times every
candidate in ``DECODE_CONFIGS`` / ``PREFILL_CONFIGS`` / ``BWD_CONFIGS`` once per
(format, M bucket, N, K) and keeps the fastest, in memory and in a JSON file per
GPU model and Triton version (``QUARL_KERNELS_CACHE``), so a later process starts
tuned. Each candidate costs one Triton compile, so the tables hold only configs
that won somewhere.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quarl_kernels import dense, gemv, lora_a
from quarl_kernels.dequant import FMT_INT4, FMT_NVFP4, FP4_ACC_FACTOR, load_dequant_tile, pair_order_rows
from quarl_kernels.group_pass import rope_after
from quarl_kernels.launch import each_in_group
from quarl_kernels.launch import env_flag as _env_flag
from quarl_kernels.launch import finish as _finish
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.launch import num_sms as _num_sms


# ---------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------
# Tiny autotuner: candidates are timed once per key, the winner is cached in memory
# and on disk (JSON, keyed by GPU name and Triton version, so a tuned config is never
# reused on another device or compiler). ``QUARL_KERNELS_CACHE`` names the file
# (default ~/.cache/quarl/kernel_configs.json; "" or "off" keeps it in memory only).
_CHOICE: dict[tuple, Config] = {}
_DISK: dict[str, str] | None = None


def _cache_path() -> str | None:
    raw = os.environ.get("QUARL_KERNELS_CACHE")
    if raw is not None and raw.strip().lower() in ("", "off", "0", "none"):
        return None
    return raw or os.path.join(os.path.expanduser("~"), ".cache", "quarl", "kernel_configs.json")


def _disk_key(full: tuple) -> str:
    dev = full[-1] if isinstance(full[-1], int) else 0
    name = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else "cpu"
    return "|".join([name, triton.__version__, *map(str, full[:-1])])


def _disk_load() -> dict[str, str]:
    global _DISK
    if _DISK is None:
        _DISK = {}
        path = _cache_path()
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    _DISK = {str(k): str(v) for k, v in json.load(f).items()}
            except (OSError, ValueError) as e:  # a corrupt cache must not stop a run: re-tune
                warnings.warn(f"ignoring unreadable kernel config cache {path} ({e}); delete it to silence this",
                              stacklevel=3)
    return _DISK


def _disk_store(key: str, cfg) -> None:
    disk = _disk_load()
    disk[key] = str(cfg)
    path = _cache_path()
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(disk, f, indent=1, sort_keys=True)
        os.replace(tmp, path)  # atomic: concurrent writers never leave a torn file
    except OSError as e:
        warnings.warn(f"could not write kernel config cache {path} ({e}); set QUARL_KERNELS_CACHE to a writable "
                      f"file or 'off'", stacklevel=3)


def _tuning_enabled(tune: bool | None) -> bool:
    if tune is not None:
        return tune
    return os.environ.get("QUARL_KERNELS_TUNE", "0") == "1"


def _time_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


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


def _choose(kind: str, key: tuple, candidates: tuple[Config, ...], run, tune: bool | None,
            default: Config) -> Config:
    full = (kind,) + key
    cfg = _CHOICE.get(full)
    if cfg is not None:
        return cfg
    if not _tuning_enabled(tune):
        return default
    dkey = _disk_key(full)
    saved = _disk_load().get(dkey)
    hit = next((c for c in candidates if str(c) == saved), None)
    if hit is not None:  # tuned before on this GPU and Triton version
        _CHOICE[full] = hit
        return hit
    if torch.cuda.is_current_stream_capturing():  # no timing inside a graph capture
        return default
    best = min(candidates, key=lambda c: _time_ms(lambda: run(c)))
    _CHOICE[full] = best
    _disk_store(dkey, best)
    return best


_DENSE_OOM_WARNED = False


def _dense_oom(pw: PackedWeight) -> None:
    """The dense path could not allocate its transient [N, K] BF16 weight: this call (and any
    later one that hits the same wall) runs the fused kernel, which needs no extra memory."""
    global _DENSE_OOM_WARNED
    if not _DENSE_OOM_WARNED:
        _DENSE_OOM_WARNED = True
        warnings.warn(f"quarl_kernels: no memory for the dense path's transient {pw.n}x{pw.k} BF16 weight "
                      f"({pw.n * pw.k * 2 / 2**20:.0f} MiB); using the fused kernel for such calls (slower at "
                      f"large M). QUARL_KERNELS_DENSE_MIN_M=0 makes that the rule.", stacklevel=3)


MMA_DECODE_MIN_M = 2  # M = 1 stays on the GEMV (47% vs ~43% of HBM on the 7B MLP layers, H200)


_MMA_DECODE_BROKEN: str | None = None  # why the Gluon kernel is off for this process, once it failed


def _import_kernel(name: str):
    """(``quarl_kernels.<name>``, None), or (None, why) when this Triton cannot provide it: Triton < 3.5 has no Gluon,
    and a newer one may have moved its API (the optional Gluon kernels below)."""
    try:
        return importlib.import_module(f"quarl_kernels.{name}"), None
    except (ImportError, AttributeError) as e:
        return None, f"{type(e).__name__}: {e}"


def _build_failure(e: Exception) -> str:
    """A build error's first line, for the once-per-process warning that turns a Gluon kernel off."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _mma_decode():
    """The Gluon register-operand decode kernel module, or None (disabled by
    ``QUARL_KERNELS_MMA_DECODE=0``, a Triton without Gluon, or an earlier failure)."""
    global _MMA_DECODE_BROKEN
    if os.environ.get("QUARL_KERNELS_MMA_DECODE", "1") == "0" or _interpreting() or _MMA_DECODE_BROKEN:
        return None
    mod, _MMA_DECODE_BROKEN = _import_kernel("mma_decode")
    return mod


def _mma_decode_failed(e: Exception) -> None:
    """Gluon is Triton's experimental dialect: if a Triton version cannot compile the kernel,
    say so once and let every later call take the Triton tensor-core kernel instead."""
    global _MMA_DECODE_BROKEN
    _MMA_DECODE_BROKEN = _build_failure(e)
    warnings.warn(f"quarl_kernels: the Gluon decode kernel failed to build ({_MMA_DECODE_BROKEN}); decode at "
                  f"M = 2..64 falls back to the Triton tensor-core kernel (slower). Set "
                  f"QUARL_KERNELS_MMA_DECODE=0 to silence this.", stacklevel=3)


WGMMA_DECODE_ENV = "QUARL_KERNELS_WGMMA_DECODE"  # auto (default: the measured rule) | 1 (every large weight) | 0 (off)
_WGMMA_DECODE_BROKEN: str | None = None  # why the wgmma kernel is off for this process, once it failed


def _wgmma_decode():
    """The Gluon wgmma decode kernel module (M = 17..64 on sm_90), or None: when
    ``QUARL_KERNELS_WGMMA_DECODE=0``, or after a Triton without Gluon / an earlier build failure.
    On by default since the H100 sweep of 2026-11-26 (``wgmma_decode.preferred`` says where)."""
    global _WGMMA_DECODE_BROKEN
    if _interpreting() or _WGMMA_DECODE_BROKEN:
        return None
    raw = os.environ.get(WGMMA_DECODE_ENV)
    if raw is not None and raw.strip().lower() != "auto" and not _env_flag(WGMMA_DECODE_ENV, False):
        return None  # switched off
    mod, _WGMMA_DECODE_BROKEN = _import_kernel("wgmma_decode")
    return mod


def _wgmma_decode_failed(e: Exception) -> None:
    global _WGMMA_DECODE_BROKEN
    _WGMMA_DECODE_BROKEN = _build_failure(e)
    warnings.warn(f"quarl_kernels: the Gluon wgmma decode kernel failed to build ({_WGMMA_DECODE_BROKEN}); decode "
                  f"at M = 17..64 falls back to the mma.sync kernel. Unset QUARL_KERNELS_WGMMA_DECODE to silence "
                  f"this.", stacklevel=3)


_WGMMA_RING_BROKEN: str | None = None  # why the TMA-ring kernel is off for this process, once it failed


def _wgmma_ring():
    """The TMA-ring wgmma decode kernel module (``wgmma_ring.py``; M = 17..64 on sm_90), or None when
    ``QUARL_KERNELS_WGMMA_RING=0``, without Gluon's Hopper TMA API, or after a build failure. On by default since
    the H100 run of session 14 (1.3-1.5x ``wgmma_decode`` on the 7B MLP weights at 64 rows)."""
    global _WGMMA_RING_BROKEN
    if _interpreting() or _WGMMA_RING_BROKEN or not _env_flag("QUARL_KERNELS_WGMMA_RING", True):
        return None
    mod, _WGMMA_RING_BROKEN = _import_kernel("wgmma_ring")
    return mod


def _wgmma_ring_failed(e: Exception) -> None:
    global _WGMMA_RING_BROKEN
    _WGMMA_RING_BROKEN = _build_failure(e)
    warnings.warn(f"quarl_kernels: the TMA-ring wgmma kernel failed to build ({_WGMMA_RING_BROKEN}); decode at "
                  f"M = 17..64 falls back to wgmma_decode. Set QUARL_KERNELS_WGMMA_RING=0 to silence this.",
                  stacklevel=3)


def _gemv(x2: torch.Tensor, pw: PackedWeight, tune: bool | None, epi) -> torch.Tensor:
    """The CUDA-core GEMV route (``gemv.py``) with its measured (or tuned) config."""
    gkey = (pw.fmt, pw.group, x2.shape[0], pw.n, pw.k, x2.device.index)
    gdefault = gemv.default_gemv_config(pw.fmt, x2.shape[0], pw.n, pw.k)
    gcfg = _choose("gemv", gkey, gemv.GEMV_CONFIGS, lambda c: gemv.launch_gemv(x2, pw, c), tune, gdefault)
    return gemv.launch_gemv(x2, pw, gcfg, epi=epi)


def wo_matmul(x2: torch.Tensor, pw: PackedWeight, *, tune: bool | None = None, epi=None,
              xp: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T, config picked by M regime (and tuning).

    By M: 1 token runs the CUDA-core GEMV (``gemv.py``), 2..64 the Gluon
    register-operand ``mma.sync`` kernel (``mma_decode.py``; 17..64 on large weights the
    Hopper ``wgmma`` ones: ``wgmma_ring.py`` where ``wgmma_ring.takes``, else ``wgmma_decode.py`` where
    ``wgmma_decode.preferred``), 65..``wgmma_ring.wide_max_m()`` the ring's wide token tiles on FP4 weights of
    >= ``wgmma_ring.WIDE_MIN_WEIGHTS``, M >= ``dense.dense_min_m()``
    dequantizes to a transient BF16 weight for cuBLAS (``dense.py``), the rest the
    tensor-core kernel below (which also covers any call the others do not support).

    ``epi`` (a ``launch.Epilogue``): a bias and / or a LoRA branch ``scaling * a @ b^T`` added in the
    launch's last pass (the split-K reduction, or one in-place pass when unsplit); tuning times the
    GEMM alone. Its ``lora_a`` (a LoRA group's ``x @ A^T`` as split partials) is computed by extra programs of
    the GEMV / mma.sync launch, and by ``F.linear`` before any other route. ``xp``: ``x2`` permuted for the
    TMA-ring kernel (``wgmma_ring.permute_x``), when a group's caller made it once for several weights."""
    m = x2.shape[0]
    wr = _wgmma_ring() if m >= 17 else None
    rcfg = wr.routed(x2, pw) if wr is not None else None
    if rcfg is not None:  # the TMA-ring kernel: 17..64 rows, and up to wide_max_m() rows with wide token tiles
        try:
            return wr.launch_wgmma_ring(x2, pw, rcfg, epi=_without_lora_a(x2, epi), xp=xp)
        except triton.compiler.errors.CompilationError as e:
            _wgmma_ring_failed(e)
    if dense.use_dense(m):
        epi = _without_lora_a(x2, epi)
        try:
            return _finish(None, dense.dense_matmul(x2, pw), 1, epi)
        except torch.cuda.OutOfMemoryError:  # no room for the transient BF16 weight: the fused kernel needs none
            _dense_oom(pw)
    wd = _wgmma_decode() if 17 <= m <= 64 else None
    if wd is not None and wd.preferred(m, pw.n, pw.k, pw.fmt, forced=wd.mode() == "on") and \
            wd.wgmma_decode_supported(x2, pw):
        wkey = (pw.fmt, pw.group, wd.token_tile(m), pw.n, pw.k, x2.device.index)
        try:
            wcfg = _choose("wgmma", wkey, wd.candidate_configs(m), lambda c: wd.launch_wgmma_decode(x2, pw, c), tune,
                           wd.default_config(m, pw.n, pw.fmt))
            return wd.launch_wgmma_decode(x2, pw, wcfg, epi=_without_lora_a(x2, epi))
        except triton.compiler.errors.CompilationError as e:
            _wgmma_decode_failed(e)
    md = _mma_decode()
    if (md is not None and MMA_DECODE_MIN_M <= m and md.preferred(m, pw.n, pw.k)
            and md.mma_decode_supported(x2, pw)):
        mkey = (pw.fmt, pw.group, _decode_bm(m), pw.n, pw.k, x2.device.index)
        mdefault = md.default_config(m, pw.n)  # measured winners per token tile (docs/kernels.md v9-v10)
        try:
            mcfg = _choose("mma", mkey, md.candidate_configs(m), lambda c: md.launch_mma_decode(x2, pw, c), tune,
                           mdefault)
            return md.launch_mma_decode(x2, pw, mcfg, epi=epi)
        except triton.compiler.errors.CompilationError as e:
            _mma_decode_failed(e)
    if gemv.gemv_supported(x2, pw):
        return _gemv(x2, pw, tune, epi)
    cands = DECODE_CONFIGS if m <= DECODE_MAX_M else PREFILL_CONFIGS
    key = (pw.fmt, pw.group, _m_bucket(m), pw.n, pw.k, x2.device.index)
    default = default_config("fwd", m, pw.n, pw.k)
    cfg = _choose("fwd", key, cands, lambda c: launch_fwd(x2, pw, c), tune, default)
    return launch_fwd(x2, pw, cfg, epi=_without_lora_a(x2, epi))


def wo_matmul_group(x2: torch.Tensor, pws: list, epis: list, *, gate_act: bool = False, rope=None
                    ) -> list[torch.Tensor]:
    """``[wo_matmul(x2, pws[j], epi=epis[j])]`` for weights that read the same ``x2`` (a LoRA group's q/k/v or
    gate/up); ``gate_act``: the second output is ``silu(y_0) * y_1`` (``launch.Epilogue.gate``). One launch for all of
    them where :func:`group_route` names one (the GEMV at one row; the mma.sync kernel at 2..16 rows),
    else one call each. ``rope`` (a ``group_pass.RopeCache``; q/k/v at a decode step): ``[q_rot]`` comes back, k and v
    written into the caches (``group_pass.finish_group``)."""
    m, p0 = x2.shape[0], pws[0]
    route = group_route(x2, pws)
    if route == "gemv":
        gkey = (p0.fmt, p0.group, m, p0.n, p0.k, x2.device.index)
        cfg = _choose("gemv", gkey, gemv.GEMV_CONFIGS, lambda c: gemv.launch_gemv(x2, p0, c), None,
                      gemv.default_gemv_config(p0.fmt, m, p0.n, p0.k))
        return gemv.launch_gemv_group(x2, pws, cfg, epis, gate_act=gate_act, rope=rope)
    if route == "mma":
        md = _mma_decode()
        try:  # the first weight's measured config for all (the largest of q/k/v; gate and up are alike)
            return md.launch_mma_decode_group(x2, pws, md.default_config(m, p0.n), epis, gate_act=gate_act, rope=rope)
        except triton.compiler.errors.CompilationError as e:
            _mma_decode_failed(e)
    xp = _ring_x(x2, pws)
    ys = each_in_group(epis, gate_act, lambda j, e: wo_matmul(x2, pws[j], epi=e, xp=xp))
    return ys if rope is None else rope_after(ys, rope)


def _ring_x(x2: torch.Tensor, pws: list) -> torch.Tensor | None:
    """x2 permuted once for the TMA-ring kernel when it takes two or more of a group's weights (gate and up), else
    None (each call permutes its own)."""
    wr = _wgmma_ring() if x2.shape[0] >= 17 else None
    cfgs = [c for c in (wr.routed(x2, p) for p in pws) if c is not None] if wr is not None else []
    if len(cfgs) < 2:
        return None
    rows = max(wr.tile_rows(x2.shape[0], c.tile(x2.shape[0])) for c in cfgs)  # tiles are powers of two
    return wr.permute_x(x2.contiguous(), cfgs[0].bkw, rows)  # every config's K step is one 64-wide x box (bkw 8)


GROUP_ENV = "QUARL_GEMV_GROUP"  # 0: a LoRA group's projections as one launch each, not one launch for the group
MMA_GROUP_ENV = "QUARL_MMA_GROUP"  # 0: no group launch at 2..16 rows (mma.sync; 7B batch 8: 4.77 vs 4.97 ms a step)
GROUP_MAX_M = 16  # rows up to which a group's weights share a launch: the GEMV at 1, the mma.sync kernel at 2..16


def group_route(x2: torch.Tensor, pws: list) -> str | None:
    """Which one launch serves a LoRA group's weights on ``x2``: "gemv" (one row), "mma" (2..16 rows;
    ``QUARL_MMA_GROUP=0`` turns it off), or None (one launch each)."""
    m = x2.shape[0]
    if not _env_flag(GROUP_ENV, True) or dense.use_dense(m) or any(p.blocked != pws[0].blocked for p in pws):
        return None  # (one launch reads one word layout)
    if gemv.group_supported(x2, pws):
        return "gemv"
    md = _mma_decode() if MMA_DECODE_MIN_M <= m and _env_flag(MMA_GROUP_ENV, True) else None
    if md is not None and md.group_supported(x2, pws) and all(md.preferred(m, p.n, p.k) for p in pws):
        return "mma"
    return None


def _without_lora_a(x2: torch.Tensor, epi):
    """``epi`` for a route whose launch cannot carry a LoRA group's A programs (``epi.lora_a``: only the GEMV and
    the mma.sync kernel do): the partials filled here with ``F.linear``, the rest of ``epi`` unchanged."""
    if epi is None or epi.lora_a is None:
        return epi
    lora_a.fill_partials(x2, epi.lora_a)
    return epi._replace(lora_a=None)


def dense_route(x2: torch.Tensor, pw: PackedWeight) -> bool:
    """Whether :func:`wo_matmul` runs this call as the dense path's plain BF16 product (``dense.plain_dense``): not
    the TMA ring's rows, M >= ``dense.dense_min_m()``. Its backward then goes the same way (:func:`wo_matmul_t`)."""
    m = x2.shape[0]
    wr = _wgmma_ring() if m >= 17 else None
    if wr is not None and wr.routed(x2, pw) is not None:
        return False
    return dense.use_dense(m) and dense.plain_dense(x2, pw)


def wo_matmul_t(dy2: torch.Tensor, pw: PackedWeight, *, tune: bool | None = None) -> torch.Tensor:
    """dx [M, K] = dy2 [M, N] @ dequant(W) (large M: ``dense.py``, as in ``wo_matmul``)."""
    if dense.use_dense(dy2.shape[0]):
        try:
            return dense.dense_matmul_t(dy2, pw)
        except torch.cuda.OutOfMemoryError:
            _dense_oom(pw)
    key = (pw.fmt, pw.group, _m_bucket(dy2.shape[0]), pw.n, pw.k, dy2.device.index)
    default = default_config("bwd", dy2.shape[0], pw.n, pw.k)
    cfg = _choose("bwd", key, BWD_CONFIGS, lambda c: launch_bwd(dy2, pw, c), tune, default)
    return launch_bwd(dy2, pw, cfg)


__all__ = [
    "BWD_CONFIGS",
    "DECODE_CONFIGS",
    "FMT_INT4",
    "FMT_NVFP4",
    "FP4_ACC_FACTOR",
    "PREFILL_CONFIGS",
    "Config",
    "PackedWeight",
    "default_config",
    "dense_route",
    "launch_bwd",
    "launch_fwd",
    "wo_matmul",
    "wo_matmul_t",
]
