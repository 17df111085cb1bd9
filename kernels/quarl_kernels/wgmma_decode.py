"""Decode GEMM on Hopper ``wgmma``: ``y = x @ W^T`` for M = 17..64 tokens, register-decoded weight (Gluon).

Why. At 17..64 tokens the 4-bit weight is still the dominant traffic, but the MMA
work grows with the token tile: ``mma_decode`` (``mma.sync.m16n8k16``, weight = A,
tokens = N) spends as long in its MMAs at M = 64 as the weight takes to stream
at full HBM speed, and reached 14-19% of HBM there (docs/kernels.md v10). Hopper's
``wgmma`` runs the same product at twice mma.sync's rate, asynchronously: a
warpgroup (4 warps) issues ``wgmma.m64nNTk16`` and keeps decoding the next K step
while the tensor cores work. Here the weight tile is wgmma's *register* A operand,
decoded by each thread from its own packed words straight into its own A
fragment registers (the ``mma_decode`` idea, which Triton's tensor-core path
cannot express), and the activations ``x^T`` are the B operand in shared memory.

Operands. ``NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1])``: each
warpgroup owns 64 rows per m64 tile (``R / (16 W)`` m64 tiles per warpgroup).
The A fragment for 16-bit types (``DotOperandLayout(0, ., k_width=2)``) gives
thread (g = lane / 4, t = lane % 4) of warp w rows ``g, g + 8 (+ 16 w)`` and, per
k16 slab, the k pairs ``(2t, 2t + 1)`` and ``(2t + 8, 2t + 9)``:
    A [R, BK] linear layout: reg k1 | r8 | k8 k16 k32.. | r64..   lane k2 k4 r1 r2 r4   warp r16 r32 (r64)
B is ``x^T`` [BK, NT]: a [NT, BK] tile (K contiguous per token, 128-byte swizzled
``NVMMASharedLayout``) seen through ``permute((1, 0))`` -- wgmma's K-major B.

K order is free (as in ``mma_decode``): an MMA sums over k, so any permutation of
K inside a step is fine as long as A and B use the same one. Thread t reads the
``J = BKW / 4`` contiguous words ``J t .. J t + J - 1`` of each of its rows (one
16-byte load at J = 4), and the PTX decode of ``dequant.py`` emits each word as
four bf16x2 registers in *pair order* (code r, code r + 4), r = 0..3. Register r
of word j must be one A register, i.e. a logical k pair (2t + 8 h', + 1) of some
slab; we set, for code ``c = r + 4 h`` of real word ``J t + j``,

    logical k = 32 j + 16 r1 + 8 r0 + 2 t + h        (r = r0 + 2 r1)

-- bit for bit the A layout above (h = k1, t = lane's k2 k4, r0 = k8, r1 = k16, j = k32..),
so the decoded values *are* the A fragment (``convert_layout`` moves no data;
``assert_trivial`` proves it at compile time). x is written to shared memory in
the same logical order: each thread loads one token's 4 x 16 bytes at words
``J t + j`` (t = 0..3) and stores 64 contiguous logical bytes (4 x 16-byte stores)
after an in-register reorder (one PRMT per 32-bit output: each bf16x2 logical pair
is real codes (r, r + 4) of one word). That reorder is done once per CTA and step,
shared by all ``R`` rows (an ``NT / R`` fraction of the decode's work).

Pipeline. Per K step of ``BKW`` words (8 codes each) a CTA of ``W`` warps
(``W / 4`` warpgroups) owning ``R`` rows: (1) issue the global loads of the next
step's words, scales and activations into registers (register double buffer);
(2) decode this step's words into A registers; (3) issue ``wgmma`` async on
``A`` and the x buffer of this step; (4) ``warpgroup_mma_wait(0)``: this step's
wgmma has finished (its A registers and x buffer are free); (5) store the
next step's x into the next buffer, ``fence.proxy.async``, one CTA barrier. Until
session 14 step (4) waited for the previous step's wgmma only, so the decode of step
s + 1 overlapped wgmma s -- but that decode rewrites the A registers wgmma s still
reads, which PTX leaves undefined, and ``wgmma_ring``'s same overlap made 7B rollouts
irreproducible; other CTAs on the SM (3 at 158 registers) fill the tensor cores instead. x buffers: ``NBUF`` = 2 with one
warpgroup; 3 with two (a warpgroup's wait covers only its own wgmma: the buffer
rewritten at step s was last read at step s - 2, which every warpgroup has waited
for before the barrier of step s - 1). When ``cdiv(N, R)`` CTAs do not fill the GPU,
K is split over CTAs: fp32 partials ``[S, M, N]`` summed in split order by
``launch.splitk_reduce_kernel`` (deterministic).

Registers per thread (the budget that picks the configs): accumulators
``R NT / (32 W)``, A fragments ``R BKW / (8 W)`` (twice: step s is still read by
the tensor cores while step s + 1 is decoded), raw words ``R BKW / (32 W)``
(twice with the prefetch), x ``NT BKW / (8 W)`` (bounded by the layout's
replication). ``benchmarks/kernels/bench_wgmma_decode.py --dry-run`` compiles
every candidate for sm_90 here (no GPU) and reports registers, spills and HGMMA.

Numerics are ``mma_decode``'s (same PTX decode, same scale handling): NVFP4
weights exact (``e2m1 * e4m3 * 2**-16`` in bf16, ``2**16 / global_scale`` applied to
the fp32 accumulator), MXFP4 exact for E8M0 exponents in [2**-110, 2**17], INT4 with
the fp32 group scale rounded to bf16. fp32 accumulation in wgmma order. Gluon
compiles for NVIDIA only and wgmma needs sm_90: ``wgmma_decode_supported`` says
when this kernel applies; ``wo_matmul`` takes it only behind
``QUARL_KERNELS_WGMMA_DECODE=1`` (``enabled``) until a device run shows it wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from quarl_kernels import pdl, pdl_gluon
from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4
from quarl_kernels.launch import decode_operands, env_flag, finish_splits, num_sms
from quarl_kernels.mma_decode_config import split_for  # the same rule: about waves * SMs CTAs
from quarl_kernels.mma_decode_step import (
    _decode_step,
    _group_layout,
    _load_step,
    _log2,
    _word_layout,
    _x_step,
)

MIN_M = 17  # below, mma_decode's n8 / n16 tiles waste no MMA work
MAX_M = 64
ENV = "QUARL_KERNELS_WGMMA_DECODE"


# ---------------------------------------------------------------------------
# Layouts (linear layouts, as in mma_decode): the word tile [R, BKW] and group tile
# are mma_decode's (thread (g, t) of warp w: rows g, g + 8 (+ 16 W i) + 16 w, words
# J t .. J t + J - 1), which with W = 4 per warpgroup match the wgmma A fragment.
@gluon.constexpr_function
def _xw_layout(NT, BKW, W):
    """Activations [NT, BKW, 8] (token, real word, code), 16-byte loads: a thread holds one
    (token, j) unit -- words J t + j for t = 0..3, all 8 codes (32 values, the 64 logical
    bytes it stores) -- units spread over lanes (j first), then warps, then registers;
    replicated where the CTA has more threads than units."""
    J = BKW // 4
    reg = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, J, 0], [0, 2 * J, 0]]
    free = [[0, 1 << i, 0] for i in range(_log2(J))] + [[1 << i, 0, 0] for i in range(_log2(NT))]
    lane = (free[:5] + [[0, 0, 0]] * 5)[:5]
    nw = _log2(W)
    warp = (free[5:5 + nw] + [[0, 0, 0]] * nw)[:nw]
    reg += free[5 + nw:]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [NT, BKW, 8])


@gluon.jit
def _x_logical(xt, NT: gl.constexpr, J: gl.constexpr):
    """[NT, BKW, 8] natural order (real word J t + j, code c = 4 h + 2 r1 + r0) -> [NT, BK] in
    logical order k = 32 j + 16 r1 + 8 r0 + 2 t + h (the A fragment's, module docstring)."""
    x6 = gl.reshape(xt, [NT, 4, J, 2, 2, 2])  # [n, t, j, h, r1, r0]
    return gl.reshape(gl.permute(x6, [0, 2, 4, 5, 1, 3]), [NT, 32 * J])  # [n, j, r1, r0, t, h]


@gluon.jit
def a_fragment(w, sg, zg, FMT: gl.constexpr, HAS_ZP: gl.constexpr, LW: gl.constexpr, R: gl.constexpr,
               BKW: gl.constexpr, WT: gl.constexpr, A_L: gl.constexpr):
    """One K step's words [R, BKW] and group values -> the wgmma A fragment [R, 8 BKW] bf16 in logical k order
    (module docstring): ``mma_decode``'s PTX decode, then a reshape / permute that moves no data
    (``assert_trivial``). Shared with ``wgmma_ring``."""
    J: gl.constexpr = BKW // 4
    p0, p1, p2, p3, p4, p5, p6, p7 = _decode_step(w, sg, zg, FMT, HAS_ZP, LW, R, BKW, WT)
    # [R, BKW, a, b, c] = p[a + 2b + 4c]: code r + 4h with h = a, r0 = b, r1 = c
    q = gl.join(gl.join(gl.join(p0, p1), gl.join(p2, p3)), gl.join(gl.join(p4, p5), gl.join(p6, p7)))
    q = gl.reshape(q, [R, 4, J, 2, 2, 2])  # [R, t, j, h, r0, r1]: real word J t + j
    a = gl.reshape(gl.permute(q, [0, 2, 5, 4, 1, 3]), [R, BKW * 8])  # [R, j, r1, r0, t, h]: logical k
    return gl.convert_layout(a, A_L, assert_trivial=True)


@gluon.jit
def _wgmma_decode_kernel(
    x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    M, N, KW, TILES_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
    FMT: gl.constexpr, GROUP: gl.constexpr, HAS_ZP: gl.constexpr,
    R: gl.constexpr, BKW: gl.constexpr, NT: gl.constexpr, W: gl.constexpr,
    PREFETCH: gl.constexpr, EVEN_K: gl.constexpr, NBUF: gl.constexpr, PDL: gl.constexpr = 0,
    BLOCKED: gl.constexpr = False,  # the words in quarl.quant.packed_layout's [64, 8] blocks
):
    """y[M, N] (or fp32 split partials [S, M, N]) = x[M, K] @ W[N, K]^T, M <= NT.

    x bf16 [M, K]; words int32 [N, K/8]; FP4 scales uint8 [N, G]; INT4 fp32 scales
    [N, G] and int8 zero points [N, G]. Program (pid_n, pid_k) owns rows
    pid_n * R .. + R and K steps pid_k * TILES_PER_SPLIT .. + TILES_PER_SPLIT."""
    BK: gl.constexpr = BKW * 8
    J: gl.constexpr = BKW // 4
    WPG: gl.constexpr = GROUP // 8  # words per scale group
    WT: gl.constexpr = WPG if WPG < BKW else BKW  # noqa: FURB136  words per group slot inside a step
    NG: gl.constexpr = BKW // WT  # group slots per step
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, NT, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    XS_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128 if BK >= 64 else 2 * BK, element_bitwidth=16,
                                              rank=2)
    LW: gl.constexpr = _word_layout(R, BKW, W)
    LG: gl.constexpr = gl.SliceLayout(2, _group_layout(R, BKW, W, WT))
    LX: gl.constexpr = _xw_layout(NT, BKW, W)

    pdl_gluon.enter(PDL)  # pdl.py: wait for the kernel before first; signal after the K loop
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    # rows past N re-read row N - 1 (never stored): no masks on the weight loads
    rows_w = gl.minimum(pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, LW)), N - 1)  # [R]
    rows_g = gl.minimum(pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, LG)), N - 1)  # [R]
    offs_w = gl.arange(0, BKW, layout=gl.SliceLayout(0, LW))  # [BKW] real word in step
    offs_g = gl.arange(0, NG, layout=gl.SliceLayout(0, LG))  # [NG]
    kw_lo = pid_k * (TILES_PER_SPLIT * BKW)
    kw_hi = gl.minimum(kw_lo + TILES_PER_SPLIT * BKW, KW)
    kw_last = kw_lo + ((kw_hi - kw_lo - 1) // BKW) * BKW  # start of the split's last step
    # activations [NT, BKW, 8]: token n, real word, code (natural order, 16-byte loads);
    # tokens past M re-read token M - 1: their accumulator columns are never stored
    xn = gl.minimum(gl.arange(0, NT, layout=gl.SliceLayout(1, gl.SliceLayout(2, LX))), M - 1)
    xw = gl.arange(0, BKW, layout=gl.SliceLayout(0, gl.SliceLayout(2, LX)))
    xc = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, LX)))
    x_off = xn[:, None, None] * stride_xm + xw[None, :, None] * 8 + xc[None, None, :]  # [NT, BKW, 8]

    # x^T ring [NBUF, NT, BK] in logical k order; step 0's now
    xs = gl.allocate_shared_memory(gl.bfloat16, [NBUF, NT, BK], XS_L)
    xs.index(0).store(_x_logical(_x_step(x_ptr, x_off, xw, kw_lo, kw_hi, EVEN_K), NT, J))
    fence_async_shared()
    gl.thread_barrier()
    if PREFETCH:
        nxt = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kw_lo, kw_hi,
                         stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)

    acc = gl.zeros([R, NT], gl.float32, MMA)
    for kw0 in range(kw_lo, kw_hi, BKW):
        step = (kw0 - kw_lo) // BKW
        kn = gl.minimum(kw0 + BKW, kw_last)  # the next step (the last again at the end: unused)
        xg = _x_step(x_ptr, x_off, xw, kn, kw_hi, EVEN_K)  # [NT, BKW, 8] next step's x, stored after the MMA issue
        if PREFETCH:  # this step's raw loads were issued one step ago; issue the next one's
            w, sg, zg = nxt
            nxt = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kn, kw_hi,
                             stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)
        else:
            w, sg, zg = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kw0, kw_hi,
                                   stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)
        a = a_fragment(w, sg, zg, FMT, HAS_ZP, LW, R, BKW, WT, A_L)
        acc = warpgroup_mma(a, xs.index(step % NBUF).permute((1, 0)), acc, is_async=True)
        # this step's wgmma is done before the next decode rewrites its A registers (PTX leaves a wgmma's register
        # operand rewritten in flight undefined; wgmma_ring's overlap of the two made rollouts irreproducible)
        acc, a = warpgroup_mma_wait(0, deps=[acc, a])
        xs.index((step + 1) % NBUF).store(_x_logical(xg, NT, J))
        fence_async_shared()
        gl.thread_barrier()
    acc = warpgroup_mma_wait(0, deps=[acc])
    pdl_gluon.leave(PDL)

    if FMT == 0:
        acc = acc * (65536.0 / gl.load(gs_ptr).to(gl.float32))
    elif FMT == 1:
        acc = acc * 65536.0
    offs_r = pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, MMA))  # [R]
    offs_t = gl.arange(0, NT, layout=gl.SliceLayout(0, MMA))  # [NT]
    # y [M, N] in x's dtype, or (split-K) fp32 partials [S, M, N]: the pointer type decides
    out = out_ptr + pid_k * stride_os + offs_t[None, :] * stride_om + offs_r[:, None]  # [R, NT]
    gl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(offs_r[:, None] < N) & (offs_t[None, :] < M))


# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WgmmaDecodeConfig:
    rows: int  # output rows per CTA (R): rows / warps / 16 m64 tiles per warpgroup
    bkw: int  # K step in 32-bit words (8 codes each); thread t reads bkw / 4 contiguous words per row
    warps: int = 4  # 4 (one warpgroup) or 8 (two, sharing each x step)
    prefetch: bool = True  # register double buffer of the next step's words and scales
    waves: int = 4  # split K until cdiv(N, rows) * split >= waves * SMs

    def __post_init__(self) -> None:
        tiles = self.rows // (16 * self.warps) if self.warps in (4, 8) else 0
        if tiles < 1 or self.rows != 16 * self.warps * tiles or tiles & (tiles - 1):
            raise ValueError(f"WgmmaDecodeConfig: rows = {self.rows} must be 64 * 2**i per warpgroup of 4 warps "
                             f"(warps = 4 or 8), got warps = {self.warps}")
        if self.bkw not in (8, 16):
            raise ValueError(f"WgmmaDecodeConfig: bkw must be 8 or 16 words (k32 / k64 slabs per thread), "
                             f"got {self.bkw}")

    @property
    def nbuf(self) -> int:
        """x buffers in shared memory: 2 for one warpgroup, 3 for two (module docstring)."""
        return 2 if self.warps == 4 else 3

    def __str__(self) -> str:
        return f"wg-R{self.rows}xBK{self.bkw * 8}w{self.warps}{'p' if self.prefetch else ''}W{self.waves}"


# Candidates (per thread: accumulators rows * NT / (32 warps), A rows * bkw / (8 warps) x2 in
# flight, words rows * bkw / (32 warps) x2 with the prefetch).
WGMMA_DECODE_CONFIGS = (
    WgmmaDecodeConfig(128, 8, 4),  # 0: 2 m64 tiles per warpgroup, 8-byte word loads
    WgmmaDecodeConfig(64, 16, 4),  # 1: 1 m64 tile, 16-byte word loads
    WgmmaDecodeConfig(128, 16, 4),  # 2: 2 m64 tiles, 16-byte loads (NT = 32: 64 A + 32 acc registers)
    WgmmaDecodeConfig(256, 8, 8),  # 3: 2 warpgroups x 2 m64 tiles share each x step (x traffic = weight's at NT = 64)
    WgmmaDecodeConfig(128, 8, 8),  # 4: 2 warpgroups x 1 m64 tile
    WgmmaDecodeConfig(128, 8, 4, prefetch=False),  # 5: occupancy alone hides the word loads
    WgmmaDecodeConfig(128, 8, 4, waves=2),  # 6: fewer, longer splits
    WgmmaDecodeConfig(256, 16, 8),  # 7: 2 warpgroups x 2 m64 tiles, 16-byte loads
)
_CANDIDATES = {32: (0, 1, 2, 3, 4, 5, 6, 7), 64: (0, 1, 3, 4, 5, 6)}
# The device sweep's winners (bench_wgmma_decode.py, H100, 2026-11-26; RESULTS "v11"): at NT = 32
# config 2 was fastest on every large NVFP4 layer, at NT = 64 config 1 on 10 of the 12 large layers.
_DEFAULTS = {32: 2, 64: 1}
# Large weights only: at 512 x 3584 (1.8M) the Triton tensor-core kernel won (0.78-0.83x), at
# 3584 x 3584 (12.8M) this kernel did (0.95-1.23x the dispatch of the day).
LARGE_MIN_WEIGHTS = 12 << 20
# Two NVFP4 rules measured on single calls in session 14 (phase n: 14B k / v at 64 rows 11.3 vs 13.6 us on the Triton
# tensor-core kernel; 14B q / o at 32 rows 16.5 us with config 1 vs 20.2 with config 2) and in the engine in session 19
# (phases i, j, H100: the 14B NVFP4+LoRA decode step's kernels ~4 % faster at batch 32, 0.3-0.7 % at 64; 7B unchanged):
# at 33..64 rows NVFP4 weights from here up take this kernel too: 5 << 20 is exactly the measured 14B k / v (1024 x
# 5120); the 8B-class k / v (1024 x 4096, 4.2M) were not measured and stay on the Triton tensor-core kernel
MID_MIN_WEIGHTS = 5 << 20
WIDE_N_NT32 = 5120  # at 17..32 rows NVFP4 weights with N >= this (14B / 32B q / o) take config 1 (R64xBK128); 3584
# (7B q / o) measured faster on config 2, 4096 not measured


def mode() -> str:
    """``QUARL_KERNELS_WGMMA_DECODE``: unset or ``auto`` -> "auto" (the measured rule of
    :func:`preferred`), 1 / true / on / yes -> "on" (every large weight at M = 17..64),
    0 / false / off / no / "" -> "off"; anything else is an error naming the variable."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip().lower() == "auto":
        return "auto"
    return "on" if env_flag(ENV, False) else "off"


def enabled() -> bool:
    """Whether ``wo_matmul`` may take this kernel (any mode but "off")."""
    return mode() != "off"


def token_tile(m: int) -> int:
    """Token tile NT (wgmma n extent) for M tokens: 32 or 64."""
    if not MIN_M <= m <= MAX_M:
        raise ValueError(f"wgmma_decode: M = {m} tokens is outside {MIN_M}..{MAX_M} (use mma_decode)")
    return 32 if m <= 32 else 64


def preferred(m: int, n: int, k: int, fmt: int | None = None, forced: bool = False) -> bool:
    """Whether ``wo_matmul`` should take this kernel for an [M, K] x [N, K]^T call of format ``fmt``.

    Large weights at M = 17..64; in "auto" mode not NVFP4 at NT = 64 with N > K, where the
    mma.sync kernel was as fast or faster on the H100 (0.98x at 18944 x 3584, 0.86x at
    27648 x 5120; wgmma won 1.01-1.23x at N <= K, and 1.20-1.42x for MXFP4 / INT4 at every
    large shape). ``forced`` (mode "on") drops that exception. NVFP4 weights of ``MID_MIN_WEIGHTS`` up to
    ``LARGE_MIN_WEIGHTS`` at NT = 64 too (the 14B k / v projections: faster here than on the Triton kernel)."""
    if not MIN_M <= m <= MAX_M:
        return False
    if fmt == FMT_NVFP4 and token_tile(m) == 64 and MID_MIN_WEIGHTS <= n * k < LARGE_MIN_WEIGHTS:
        return True
    if n * k < LARGE_MIN_WEIGHTS:
        return False
    return forced or not (fmt == FMT_NVFP4 and token_tile(m) == 64 and n > k)


def candidate_configs(m: int) -> tuple[WgmmaDecodeConfig, ...]:
    """The ``WGMMA_DECODE_CONFIGS`` entries worth trying at M tokens (all run at any M)."""
    return tuple(WGMMA_DECODE_CONFIGS[i] for i in _CANDIDATES[token_tile(m)])


def default_config(m: int, n: int, fmt: int | None = None) -> WgmmaDecodeConfig:
    """Config for M tokens and N output rows without tuning: ``_DEFAULTS`` per token tile, except NVFP4 at NT = 32
    with N >= ``WIDE_N_NT32`` (config 1: the 14B / 32B q / o projections, measured faster there)."""
    nt = token_tile(m)
    if fmt == FMT_NVFP4 and nt == 32 and n >= WIDE_N_NT32:
        return WGMMA_DECODE_CONFIGS[1]
    return WGMMA_DECODE_CONFIGS[_DEFAULTS[nt]]


def device_ok(device: torch.device) -> bool:
    """wgmma is sm_90 (Hopper) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def wgmma_decode_supported(x2: torch.Tensor, pw) -> bool:
    """True when ``launch_wgmma_decode`` can run this call: CUDA bf16 activations on an sm_90
    GPU with MIN_M <= M <= MAX_M (17..64), a weight in NVFP4 / MXFP4 / INT4 with a group of
    8 * 2**i weights and K a multiple of 8 (whole packed words)."""
    wpg = pw.group // 8
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and x2.dim() == 2 and MIN_M <= x2.shape[0] <= MAX_M
            and x2.shape[1] == pw.k and pw.fmt in (FMT_NVFP4, FMT_MXFP4, FMT_INT4)
            and pw.group % 8 == 0 and wpg & (wpg - 1) == 0 and pw.k % 8 == 0 and device_ok(x2.device))


def launch_wgmma_decode(x2: torch.Tensor, pw, cfg: WgmmaDecodeConfig, epi=None) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T on wgmma with register-decoded weights.

    ``pw`` is a ``wo_gemm.PackedWeight``; ``x2`` bf16 [M, K] with 17 <= M <= 64 on an
    sm_90 GPU (``wgmma_decode_supported``); ``cfg`` from ``default_config`` /
    ``candidate_configs``.
    ``epi``: a ``launch.Epilogue`` (bias / LoRA branch added in the last pass), or None."""
    if not wgmma_decode_supported(x2, pw):
        raise ValueError(
            f"launch_wgmma_decode: needs CUDA bf16 x [M, {pw.k}] on an sm_90 GPU with {MIN_M} <= M <= {MAX_M}, "
            f"K % 8 == 0 and a group of 8 * 2**i weights; got {x2.dtype} {tuple(x2.shape)} on {x2.device}, "
            f"group {pw.group} (use mma_decode.launch_mma_decode)")
    m = x2.shape[0]
    kw = pw.k // 8
    split, per = split_for(cfg, pw.n, kw, num_sms(x2.device))
    ops = decode_operands(x2, pw, split, int4=pw.fmt == FMT_INT4)
    grid = (triton.cdiv(pw.n, cfg.rows), split)
    _wgmma_decode_kernel[grid](
        ops.x2, pw.words, ops.scale, ops.zero, ops.gscale, ops.out,
        m, pw.n, kw, per,
        ops.x2.stride(0), pw.words.stride(0), ops.scale.stride(0), ops.zero.stride(0), *ops.out_strides,
        FMT=pw.fmt, GROUP=pw.group, HAS_ZP=pw.fmt == FMT_INT4 and pw.zero is not None,
        R=cfg.rows, BKW=cfg.bkw, NT=token_tile(m), W=cfg.warps,
        PREFETCH=cfg.prefetch, EVEN_K=kw % cfg.bkw == 0, NBUF=cfg.nbuf, BLOCKED=pw.blocked,
        num_warps=cfg.warps, **pdl.kwargs(x2.device),
    )
    return finish_splits(ops, split, epi)


__all__ = [
    "ENV",
    "LARGE_MIN_WEIGHTS",
    "MAX_M",
    "MID_MIN_WEIGHTS",
    "MIN_M",
    "WGMMA_DECODE_CONFIGS",
    "WgmmaDecodeConfig",
    "candidate_configs",
    "default_config",
    "enabled",
    "launch_wgmma_decode",
    "preferred",
    "split_for",
    "token_tile",
    "wgmma_decode_supported",
]
