"""Decode GEMM on Hopper ``wgmma`` fed by a TMA ring: ``y = x @ W^T`` for M = 17..384 tokens (Gluon).

Why. ``wgmma_decode`` (same MMA, same register decode) reaches 24-28 % of HBM at 64 rows
(RESULTS "v11"). Its SASS shows why: every K step each thread loads its share of x from
L2 into registers, permutes it (32 PRMTs), stores it to shared memory, and fences the
store for the tensor cores (``fence.proxy.async``: a ``MEMBAR.ALL.CTA``) before a CTA
barrier -- and ptxas schedules those x loads after the decode, so the store waits out
an L2 round trip each step. The weight words come one step ahead in registers, the
only prefetch. At 64 rows the HBM, tensor-core, issue and shared-memory budgets of a
step are all about equal, so a step that serializes them runs at a quarter of each.

This kernel takes x and the words off the threads' critical path:

* **x is permuted once per call** (``permute_x``: [M, K] -> the logical k order of the
  wgmma A fragment, per K step; module docstring of ``wgmma_decode``), so a K step of
  x is one rectangular TMA box, written by the copy engine straight into the 128-byte
  swizzled layout wgmma reads as its B operand: no registers, no PRMTs, no stores, no
  fence, no CTA barrier.
* **the packed words arrive by TMA too**, ``STAGES`` steps ahead in a shared-memory
  ring (one mbarrier per stage, armed with the byte count of its two boxes); a thread
  reads its own words back (``ld.shared``, the ``mma_decode`` word layout) and decodes
  them in registers into the A fragment, as before.
* **the group scales of the CTA's whole K range are loaded once**, before the loop,
  into shared memory ``[steps, R, NG]`` (a step's scales are 4 bytes a row: too
  small for a TMA box), and read per step with ``ld.shared``.
* **a stage is released by the wgmma wait**: after ``warpgroup_mma_wait(0)`` in step
  s the wgmma of step s is complete, so every warp of the (single) warpgroup has
  issued it -- and has read its words of steps <= s -- and the x boxes are no longer
  read; the TMA for step s + STAGES - 1 then reuses the stage of step s - 1. Waiting
  for step s's own MMA (not s - 1's) keeps the next decode from rewriting the A
  registers of a wgmma in flight: PTX leaves that undefined, and with the overlap the
  7B batch-64 rollout was not reproducible (session 14); the wait cost ~2 %, since
  the 4-5 CTAs of an SM keep its tensor cores busy between one CTA's steps. One warpgroup per CTA
  (4 warps): the loop needs no CTA barrier of its own (Triton's membar pass still puts four around the
  mbarrier / TMA operations, conservatively).

**Wide token tiles (M >= 65, session 15).** Between the decode kernels and the dense path (a transient BF16
weight and cuBLAS, from 256 rows) ``wo_matmul`` ran the Triton tensor-core kernel, 0.4-0.98x cuBLAS at 96-255
rows, and the dense path 0.44-0.6x at 256-512: what a rollout of 128-384 sequences pays every decode step. The
same kernel takes them with token tiles of 128 (``WgmmaRingConfig.tokens``) over a third grid axis: each CTA
decodes its rows' words once per token tile. x is permuted into whole tiles (zero rows past M): a TMA box
partly past the last row was up to 1.5x slower (the zero fill; 96 and 192 rows). Measured (H100, session 15,
``benchmarks/kernels/bench_ring_wide.py``; RESULTS "Issue 17, session 15"): at 96-128 rows 1.1-1.35x cuBLAS
BF16 on the 7B / 14B MLP weights, 0.97x on 5120 x 5120; at 256-384 rows 0.57-0.77x, still 1.0-1.6x the
route it replaced (1.1-3x at 96-192 rows); from ~512 rows the dense path is as fast or faster (``DEFAULT_WIDE_MAX_M = 384``). The time
grows with the token tiles, not with the bytes: one CTA step (decode, wgmma, wait) is latency-bound with 3
CTAs an SM; two warpgroups a CTA sharing each x stage (half the x traffic) and 256-row tiles were slower.

TMA zero-fills what lies outside the tensors: rows past N (words 0 decode to 0); K is a multiple of 64
(``ring_supported``), so every step is whole. Split-K, the epilogue and the numerics are ``wgmma_decode``'s (fp32
partials ``[S, M, N]`` summed in split order; NVFP4 / MXFP4 decoded exactly to bf16).
FP4 formats only: INT4's fp32 scales and zero points stay on ``wgmma_decode``.

``wo_matmul`` takes this kernel for 17..64 rows on FP4 weights of >= 12.6M entries (>= 32M at
<= 32 rows: ``takes``), ahead of ``wgmma_decode``, and for 65..384 rows (``takes_wide``; 65..256 on weights of
4M..12.6M entries) ahead of the dense path; ``QUARL_KERNELS_WGMMA_RING=0`` turns it off,
``QUARL_KERNELS_RING_WIDE_MAX_M=0`` only the wide tiles. Measured
(H100, session 14, ``benchmarks/kernels/bench_wgmma_decode.py --ring``; RESULTS "v12"): 7B gate/up
(18944 x 3584) at 64 rows 35.7 vs 54.3 us (41 vs 25 % of HBM), at 32 rows 29.2 vs 38.4 us; the 7B batch-64
NVFP4+LoRA decode step 8.45 vs 10.27 ms (BF16+LoRA 10.94).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from quarl_kernels import pdl, pdl_gluon
from quarl_kernels.formats import FMT_MXFP4, FMT_NVFP4
from quarl_kernels.launch import decode_operands, env_flag, env_int, finish_splits, num_sms
from quarl_kernels.mma_decode_step import _group_layout, _word_layout
from quarl_kernels.ring_x import permute_x, permute_x_reference, tile_rows
from quarl_kernels.wgmma_decode import LARGE_MIN_WEIGHTS, MAX_M, MIN_M, a_fragment, device_ok, token_tile

ENV = "QUARL_KERNELS_WGMMA_RING"
WIDE_ENV = "QUARL_KERNELS_RING_WIDE_MAX_M"  # most rows the wide token tiles take (0: none)
DEFAULT_WIDE_MAX_M = 384  # the dense path wins from ~512 rows (session 15, phase b)
WIDE_MIN_WEIGHTS = 4 << 20  # smaller weights (7B k / v: 1.8M) stay where they were
WIDE_SMALL_MAX_M = 256  # weights below LARGE_MIN_WEIGHTS (14B k / v: 5.2M) only up to here (384 rows: dense faster)
X_BOX = 64  # bf16 x per TMA box row: 128 bytes, the widest box a 128-byte swizzle takes
SCALE_SMEM = 16 << 10  # bytes of group scales a CTA keeps: caps the K steps of one split
LARGE_MIN_WEIGHTS_NT32 = 32 << 20  # at 17..32 rows: the weights this kernel takes (below, wgmma_decode's as fast)


@gluon.jit
def _w_load(w_desc, row0, kw, KW, bar, dst, pred, R: gl.constexpr, BLOCKED: gl.constexpr):
    """TMA copy of a step's words [R, BKW] into ``dst``: one box of the row-major words, or (BLOCKED, BKW = 8: the
    words in ``quarl.quant.packed_layout``'s [64, 8] blocks, ``w_desc`` over them viewed as [-1, 8]) one [64, 8]
    box per 64-row band -- the band's block of this step is 2 KB in one piece, and the R / 64 boxes land as the
    same [R, 8] rows in shared memory."""
    if BLOCKED:
        for j in gl.static_range(R // 64):
            tma.async_copy_global_to_shared(w_desc, [((row0 // 64 + j) * (KW // 8) + kw // 8) * 64, 0], bar,
                                            dst.slice(j * 64, 64), pred=pred)
    else:
        tma.async_copy_global_to_shared(w_desc, [row0, kw], bar, dst, pred=pred)


@gluon.jit
def _wgmma_ring_kernel(
    x_desc, w_desc, s_ptr, gs_ptr, out_ptr,
    M, N, KW, G, TILES_PER_SPLIT,
    stride_sn, stride_os, stride_om,
    FMT: gl.constexpr, GROUP: gl.constexpr, R: gl.constexpr, BKW: gl.constexpr, NT: gl.constexpr,
    STAGES: gl.constexpr, SMAX: gl.constexpr,  # SMAX: next power of two >= TILES_PER_SPLIT
    MMA_INFLIGHT: gl.constexpr,  # wgmma groups left in flight across a step: 1 (overlap) or 0 (serialized)
    W: gl.constexpr,  # warps: 4 (one warpgroup) or 8 (two, an m64 row tile each, sharing the x stages)
    PDL: gl.constexpr = 0,  # pdl.py: wait for the kernel before first; signal after the K loop
    BLOCKED: gl.constexpr = False,  # words in [64, 8] blocks (quarl.quant.packed_layout), w_desc over [-1, 8]
    W_EARLY: gl.constexpr = False,  # the ring's first weight copies and the scales before the PDL wait, x's after
):
    """y[M, N] (or fp32 split partials [S, M, N]) = x[M, K] @ W[N, K]^T, one warpgroup.

    x_desc: permuted x [M, Kp] bf16, box [NT, BKW * 8]; w_desc: words [N, KW] int32, box
    [R, BKW]; s_ptr: FP4 scale bytes [N, G]. Program (pid_n, pid_k, pid_m) owns rows pid_n * R .. + R,
    K steps pid_k * TILES_PER_SPLIT .. + TILES_PER_SPLIT (at most SMAX) and tokens pid_m * NT .. + NT."""
    BK: gl.constexpr = BKW * 8
    WPG: gl.constexpr = GROUP // 8  # words per scale group
    WT: gl.constexpr = WPG if WPG < BKW else BKW  # noqa: FURB136  words per group slot inside a step
    NG: gl.constexpr = BKW // WT  # group slots per step
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, NT, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    LW: gl.constexpr = _word_layout(R, BKW, W)
    LG: gl.constexpr = gl.SliceLayout(2, _group_layout(R, BKW, W, WT))
    TPR: gl.constexpr = 32 if R // W >= 32 else R // W  # noqa: FURB136  scale-prologue lanes along rows
    LS: gl.constexpr = gl.BlockedLayout([1, 1, NG], [32 // TPR, TPR, 1], [1, W, 1], [2, 1, 0])
    SS3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])  # plain row-major [SMAX, R, NG]
    SS2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])  # the same bytes, indexed per step
    STEP_BYTES: gl.constexpr = NT * BK * 2 + R * BKW * 4

    if not W_EARLY:
        pdl_gluon.enter(PDL)
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    tok0 = gl.program_id(2) * NT  # one token tile below 65 rows; wide tiles (128 / 256) tile larger M
    row0 = pid_n * R
    kw_lo = pid_k * (TILES_PER_SPLIT * BKW)
    nsteps = gl.cdiv(gl.minimum(kw_lo + TILES_PER_SPLIT * BKW, KW) - kw_lo, BKW)

    xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, NT, BK], x_desc.layout)
    ws = gl.allocate_shared_memory(gl.int32, [STAGES, R, BKW], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()  # the barriers' init, before the copy engine signals them
    # the ring's first STAGES - 1 steps, in flight while the scales load
    for i in gl.static_range(STAGES - 1):
        ok = i < nsteps
        mbarrier.expect(bars.index(i), STEP_BYTES, pred=ok)  # x's and the words' bytes, however they are issued
        if not W_EARLY:
            tma.async_copy_global_to_shared(x_desc, [tok0, (kw_lo + i * BKW) * 8], bars.index(i), xs.index(i),
                                            pred=ok)
        _w_load(w_desc, row0, kw_lo + i * BKW, KW, bars.index(i), ws.index(i), ok, R, BLOCKED)

    # group scales of the whole K range -> shared [SMAX, R, NG] (step, row, group slot)
    st_i = gl.arange(0, SMAX, layout=gl.SliceLayout(1, gl.SliceLayout(2, LS)))
    r_i = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, LS)))
    g_i = gl.arange(0, NG, layout=gl.SliceLayout(0, gl.SliceLayout(1, LS)))
    if WT == WPG:  # whole groups in a step
        gi = (kw_lo // WPG + st_i * NG)[:, None, None] + g_i[None, None, :]  # [SMAX, 1, NG]
    else:  # a step inside one group
        gi = ((kw_lo + st_i * BKW)[:, None, None] + g_i[None, None, :] * WT) // WPG
    rows = gl.minimum(row0 + r_i, N - 1)[None, :, None]  # [1, R, 1]: rows past N re-read N - 1 (never stored)
    # a step inside K/8 words has all its groups inside G (K % 64 == 0): one mask per step, so the NG bytes of a
    # row load as one vector
    s_ok = gl.broadcast((st_i < nsteps)[:, None, None], gi)[0]
    sc = gl.load(s_ptr + rows * stride_sn + gi, mask=s_ok, other=0)  # [SMAX, R, NG] u8
    ss = gl.allocate_shared_memory(gl.uint8, [SMAX, R, NG], SS3, sc)._reinterpret(gl.uint8, [SMAX, R, NG], SS2)
    gl.thread_barrier()
    if W_EARLY:  # weights and scales are written by no kernel of a decode step (pdl.py); x is: after the wait
        pdl_gluon.enter(PDL)
        for i in gl.static_range(STAGES - 1):
            tma.async_copy_global_to_shared(x_desc, [tok0, (kw_lo + i * BKW) * 8], bars.index(i), xs.index(i),
                                            pred=i < nsteps)

    acc = gl.zeros([R, NT], gl.float32, MMA)
    for s in range(nsteps):
        st = s % STAGES
        mbarrier.wait(bars.index(st), (s // STAGES) & 1)
        w = ws.index(st).load(LW)  # [R, BKW] this thread's words
        sg = ss.index(s).load(LG)  # [R, NG]
        a = a_fragment(w, sg, sg, FMT, False, LW, R, BKW, WT, A_L)  # wgmma_decode's decode into the A registers
        acc = warpgroup_mma(a, xs.index(st).permute((1, 0)), acc, is_async=True)
        # this step's wgmma (MMA_INFLIGHT = 0; the previous one at 1) is done: every warp issued it (its words
        # read), its x is no longer read, and the next decode may write the A registers
        acc, a = warpgroup_mma_wait(MMA_INFLIGHT, deps=[acc, a])
        if W > 4:  # the other warpgroup may still read step s - 1's stage: both pass here before it is refilled
            gl.thread_barrier()
        nxt = s + STAGES - 1
        ok = nxt < nsteps
        sn = nxt % STAGES
        mbarrier.expect(bars.index(sn), STEP_BYTES, pred=ok)
        tma.async_copy_global_to_shared(x_desc, [tok0, (kw_lo + nxt * BKW) * 8], bars.index(sn), xs.index(sn), pred=ok)
        _w_load(w_desc, row0, kw_lo + nxt * BKW, KW, bars.index(sn), ws.index(sn), ok, R, BLOCKED)
    acc = warpgroup_mma_wait(0, deps=[acc])
    pdl_gluon.leave(PDL)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    if FMT == 0:
        acc = acc * (65536.0 / gl.load(gs_ptr).to(gl.float32))
    else:
        acc = acc * 65536.0
    y = acc.to(out_ptr.dtype.element_ty)
    if R * NT > 64 * 128:
        # 128 outputs a thread: in the MMA layout each has its own 64-bit address (256 registers beside the
        # accumulator's 128: spills); in 8-row vectors along N (the output's contiguous axis) 16 addresses do
        OL: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, W], [0, 1])
        y = gl.convert_layout(y, OL)
    else:
        OL: gl.constexpr = MMA
    offs_r = row0 + gl.arange(0, R, layout=gl.SliceLayout(1, OL))  # [R]
    offs_t = tok0 + gl.arange(0, NT, layout=gl.SliceLayout(0, OL))  # [NT]
    out = out_ptr + pid_k * stride_os + offs_t[None, :] * stride_om + offs_r[:, None]  # [R, NT]
    gl.store(out, y, mask=(offs_r[:, None] < N) & (offs_t[None, :] < M))


# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WgmmaRingConfig:
    rows: int = 64  # output rows per CTA (R): 64 or 128 (one or two m64 tiles of the one warpgroup)
    stages: int = 4  # K steps in flight in the shared-memory ring
    waves: int = 4  # split K until cdiv(N, rows) * split >= waves * SMs
    bkw: int = 8  # K step in words (64 weights): one 128-byte x box a step
    # wgmma groups left in flight across a step. 0 (the default): each step's MMA is waited for before the next
    # decode writes the A registers again. 1 overlaps them, which PTX leaves undefined (a wgmma's register operand
    # rewritten before a wait covers it) and which made the 7B batch-64 rollout irreproducible (session 14, phases
    # h / i: tokens differed after 7-57 steps); kept only to measure what the wait costs (~2 %).
    inflight: int = 0
    # token tile (wgmma n extent): 0 picks 32 / 64 by M (the decode rule, one tile up to 64 rows); 128 or 256 tile
    # M >= 65 over a third grid axis (the weight words are then decoded once per token tile)
    tokens: int = 0
    # 8: two warpgroups a CTA (rows = 128, an m64 tile each) read each x stage, halving x's L2 traffic per weight
    # row (at 128 tokens a 64-row CTA reads 8 bytes of x per byte of weight)
    warps: int = 4

    def __post_init__(self) -> None:
        if self.rows not in (64, 128):
            raise ValueError(f"WgmmaRingConfig: rows must be 64 or 128 (m64 tiles of one warpgroup), got {self.rows}")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"WgmmaRingConfig: stages must be 2..8, got {self.stages}")
        if self.warps not in (4, 8) or (self.warps == 8 and self.rows != 128):
            raise ValueError(f"WgmmaRingConfig: warps must be 4, or 8 with rows=128 (an m64 tile a warpgroup), got "
                             f"warps={self.warps} rows={self.rows}")
        if self.tokens not in (0, 128, 256):
            raise ValueError(f"WgmmaRingConfig: tokens must be 0 (32 / 64 by M), 128 or 256, got {self.tokens}")
        if self.rows * 4 // self.warps * max(self.tokens, 64) > 64 * 256:
            raise ValueError(f"WgmmaRingConfig: rows x tokens = {self.rows} x {self.tokens} on {self.warps} warps needs "
                             "more than 128 fp32 accumulator registers a thread; use 64 rows a warpgroup at 256 tokens")
        if self.bkw != X_BOX // 8:
            raise ValueError(f"WgmmaRingConfig: bkw must be {X_BOX // 8} (one {X_BOX}-wide x box), got {self.bkw}")

    def smax(self, group: int) -> int:
        """Most K steps a split may have: their scales fit the CTA's SCALE_SMEM bytes (a power of two; the
        kernel's buffer is the next power of two of the split's steps)."""
        ng = max(1, self.bkw // min(group // 8, self.bkw))
        return 1 << ((SCALE_SMEM // (self.rows * ng)).bit_length() - 1)

    def tile(self, m: int) -> int:
        """Token tile NT for M rows: ``tokens`` when set, else 32 / 64 (``wgmma_decode.token_tile``) up to 64
        rows and 128 above."""
        return self.tokens or (token_tile(m) if m <= MAX_M else 128)

    def __str__(self) -> str:
        t = f"T{self.tokens}" if self.tokens else ""
        return f"ring-R{self.rows}S{self.stages}W{self.waves}{t}{'w8' if self.warps == 8 else ''}" \
               f"{'i' if self.inflight else ''}"


RING_CONFIGS = (
    WgmmaRingConfig(64, 4),
    WgmmaRingConfig(64, 6),
    WgmmaRingConfig(128, 4),
    WgmmaRingConfig(64, 3),
    WgmmaRingConfig(64, 4, waves=2),
    WgmmaRingConfig(128, 6),
    WgmmaRingConfig(64, 3, inflight=1),  # 6: the 64-row default overlapping its MMAs (not reproducible; measuring)
)

# M >= 65 (rollouts of 128-384 sequences): token tiles of 128 / 256 rows over a grid axis. Session 15's sweeps (H100,
# bench_ring_wide.py, RESULTS "Issue 17, session 15"): entry 0 won every measured point; 256-row tiles (1.1-2.1x) and two
# warpgroups a CTA (w8, 1.1-1.7x) were slower everywhere; kept as measured options.
WIDE_CONFIGS = (
    WgmmaRingConfig(64, 3, waves=2, tokens=128),
    WgmmaRingConfig(64, 3, tokens=128),
    WgmmaRingConfig(64, 4, tokens=128),
    WgmmaRingConfig(128, 3, tokens=128),
    WgmmaRingConfig(64, 3, waves=2, tokens=256),
    WgmmaRingConfig(128, 4, waves=2, tokens=128, warps=8),
)


W_EARLY_ENV = "QUARL_KERNELS_RING_W_EARLY"  # 1: the ring's first weight copies and scales before the PDL wait


def w_early(device) -> bool:
    """``QUARL_KERNELS_RING_W_EARLY=1`` (opt-in; no gain in session 37: the 7B NVFP4+LoRA step at batch 64 on an
    H200 7.38 / 7.38 ms against 7.25 / 7.36 without), with PDL on: a program issues the ring's first
    ``STAGES - 1`` weight copies and loads its scales before its PDL wait, x's copies after (the GEMV's
    ``QUARL_KERNELS_GEMV_W_EARLY`` for 17..64 rows: the bytes that do not depend on the kernel before stream while
    it finishes)."""
    return env_flag(W_EARLY_ENV, False) and pdl.on(device)


def enabled() -> bool:
    """``QUARL_KERNELS_WGMMA_RING`` (on unless 0 / off)."""
    return env_flag(ENV, True)


def default_config(m: int, n: int, k: int | None = None) -> WgmmaRingConfig:
    """The device sweep's winners (bench_wgmma_decode.py --ring, H100, session 14): 4 stages at 32 rows, 3 at 64;
    half the CTAs (waves = 2: fewer split-K partials) on weights below ``LARGE_MIN_WEIGHTS_NT32``."""
    small = k is not None and n * k < LARGE_MIN_WEIGHTS_NT32
    if small:
        return RING_CONFIGS[4]  # R64 S4 W2: 3584 x 3584 at 32 / 64 rows 13.0 / 13.4 us
    return RING_CONFIGS[0] if m <= 32 else RING_CONFIGS[3]  # R64 S4 W4 / R64 S3 W4


def ring_supported(x2: torch.Tensor, pw) -> bool:
    """CUDA bf16 x [M, K] with M >= 17 on sm_90 (above 64 rows with a wide token tile, ``WIDE_CONFIGS``), an
    NVFP4 / MXFP4 weight with K % 64 == 0 whose words and rows are 16-byte aligned for TMA."""
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and x2.dim() == 2 and MIN_M <= x2.shape[0]
            and x2.shape[1] == pw.k and pw.fmt in (FMT_NVFP4, FMT_MXFP4) and pw.k % X_BOX == 0
            and pw.words.stride(1) == 1 and (pw.words.stride(0) * 4) % 16 == 0 and pw.words.data_ptr() % 16 == 0
            and device_ok(x2.device))


def takes(x2: torch.Tensor, pw) -> bool:
    """Whether ``wo_matmul`` routes this call here (when switched on): a supported call (``ring_supported``) on a
    weight of >= ``LARGE_MIN_WEIGHTS`` (at M <= 32: >= ``LARGE_MIN_WEIGHTS_NT32``, where the smaller ones ran as fast
    on ``wgmma_decode``: 3584 x 3584 at 32 rows 13.0 vs 11.4 us, H100, session 14)."""
    floor = LARGE_MIN_WEIGHTS_NT32 if x2.shape[0] <= 32 else LARGE_MIN_WEIGHTS
    return pw.n * pw.k >= floor and ring_supported(x2, pw)


def wide_max_m() -> int:
    """``QUARL_KERNELS_RING_WIDE_MAX_M``: the most rows ``wo_matmul`` sends to the wide token tiles (0: none)."""
    return env_int(WIDE_ENV, DEFAULT_WIDE_MAX_M, "the most rows the ring's wide token tiles take (e.g. 255), or 0")


def takes_wide(x2: torch.Tensor, pw) -> bool:
    """Whether ``wo_matmul`` routes a call of more than ``MAX_M`` rows here (when switched on): up to
    ``wide_max_m()`` rows on a weight of >= ``LARGE_MIN_WEIGHTS`` entries, up to ``WIDE_SMALL_MAX_M`` on one of
    >= ``WIDE_MIN_WEIGHTS`` (``ring_supported``)."""
    m, size = x2.shape[0], pw.n * pw.k
    if not MAX_M < m <= wide_max_m() or size < WIDE_MIN_WEIGHTS or (size < LARGE_MIN_WEIGHTS and m > WIDE_SMALL_MAX_M):
        return False
    return ring_supported(x2, pw)


def wide_config(m: int, n: int, k: int) -> WgmmaRingConfig:
    """The wide configuration for M > 64 rows: 128-row token tiles, 3 stages, half the CTAs (fewer split-K partials),
    the winner at every point of session 15's sweeps (96..512 rows, the 7B / 14B projections)."""
    return WIDE_CONFIGS[0]


def routed(x2: torch.Tensor, pw) -> WgmmaRingConfig | None:
    """The configuration ``wo_matmul`` runs this call with here, or None when it goes elsewhere: 17..64 rows by
    ``takes`` / ``default_config``, more by ``takes_wide`` / ``wide_config``."""
    m = x2.shape[0]
    if MIN_M <= m <= MAX_M and takes(x2, pw):
        return default_config(m, pw.n, pw.k)
    if m > MAX_M and takes_wide(x2, pw):
        return wide_config(m, pw.n, pw.k)
    return None


def split_for(cfg: WgmmaRingConfig, n: int, kw: int, sms: int, group: int, mtiles: int = 1) -> tuple[int, int]:
    """(split count, K steps per split): about ``waves * sms`` CTAs over the row and ``mtiles`` token tiles, and
    no more steps a split than the CTA's scale buffer holds."""
    tiles = triton.cdiv(n, cfg.rows) * mtiles
    steps = triton.cdiv(kw, cfg.bkw)
    split = max(1, min(64, triton.cdiv(cfg.waves * sms, tiles), steps), triton.cdiv(steps, cfg.smax(group)))
    per = triton.cdiv(steps, split)
    return triton.cdiv(steps, per), per


def _x_layout(nt: int):
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


def _w_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def launch_wgmma_ring(x2: torch.Tensor, pw, cfg: WgmmaRingConfig, epi=None, xp: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T (``ring_supported`` must hold); ``epi`` as ``launch_wgmma_decode``;
    ``xp``: ``permute_x(x2, cfg.bkw, rows)`` when the caller has it already (weights of one group share it; ``rows``
    ``tile_rows(M, cfg.tile(M))`` or M itself -- then the last token tile's box is TMA-zero-filled, slower).
    Blocked words (``pw.blocked``) come in one [64, 8] TMA box per 64-row band a step."""
    if not ring_supported(x2, pw):
        raise ValueError(
            f"launch_wgmma_ring: needs CUDA bf16 x [M, {pw.k}] on an sm_90 GPU with M >= {MIN_M}, an "
            f"NVFP4 / MXFP4 weight with K % {X_BOX} == 0 and 16-byte aligned words; got {x2.dtype} "
            f"{tuple(x2.shape)} on {x2.device}, format {pw.fmt} (use wgmma_decode.launch_wgmma_decode)")
    m = x2.shape[0]
    nt = cfg.tile(m)
    mtiles = triton.cdiv(m, nt)
    kw = pw.k // 8
    split, per = split_for(cfg, pw.n, kw, num_sms(x2.device), pw.group, mtiles)
    ops = decode_operands(x2, pw, split, int4=False)
    xp = permute_x(ops.x2, cfg.bkw, tile_rows(m, nt)) if xp is None else xp
    x_desc = TensorDescriptor.from_tensor(xp, [nt, cfg.bkw * 8], _x_layout(nt))
    if pw.blocked and (cfg.bkw != 8 or cfg.rows % 64):
        raise ValueError(f"launch_wgmma_ring: blocked words take 8-word steps of 64-row bands, got {cfg}")
    w_desc = TensorDescriptor.from_tensor(pw.words.view(-1, 8), [64, 8], _w_layout()) if pw.blocked else \
        TensorDescriptor.from_tensor(pw.words, [cfg.rows, cfg.bkw], _w_layout())
    grid = (triton.cdiv(pw.n, cfg.rows), split, mtiles)
    _wgmma_ring_kernel[grid](
        x_desc, w_desc, ops.scale, ops.gscale, ops.out,
        m, pw.n, kw, ops.scale.shape[1], per,
        ops.scale.stride(0), *ops.out_strides,
        FMT=pw.fmt, GROUP=pw.group, R=cfg.rows, BKW=cfg.bkw, NT=nt, STAGES=cfg.stages, SMAX=triton.next_power_of_2(per),
        MMA_INFLIGHT=cfg.inflight, W=cfg.warps, BLOCKED=pw.blocked, W_EARLY=w_early(x2.device),
        num_warps=cfg.warps, **pdl.kwargs(x2.device),
    )
    return finish_splits(ops, split, epi)


__all__ = ["ENV", "LARGE_MIN_WEIGHTS", "LARGE_MIN_WEIGHTS_NT32", "RING_CONFIGS", "WIDE_CONFIGS", "WgmmaRingConfig",
           "default_config",
           "enabled", "launch_wgmma_ring", "permute_x", "permute_x_reference", "ring_supported", "routed", "split_for", "takes",
           "takes_wide", "tile_rows", "wide_config", "wide_max_m"]
