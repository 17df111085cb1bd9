"""Decode GEMM on register-operand tensor cores: ``y = x @ W^T`` for M = 2..64 tokens (Gluon).

Why. At decode sizes the product is memory-bound: the job is to stream the packed
4-bit weight at HBM speed. The Triton tensor-core path (``wo_tensorcore._fwd_kernel``)
moves every dequantized tile through shared memory with barriers before the MMA
and reaches ~25% of HBM at M = 8 (docs/kernels.md, "Where the remaining time
goes", path (2)); the CUDA-core GEMV (``gemv.py``) pays one FFMA per weight and
token. Here the weight is the A operand of ``mma.sync.m16n8k16`` (bf16, fp32
accumulate), decoded by each thread from its *own* packed words straight into
its own A fragment registers -- no shared memory, no barrier, no layout
conversion for the weight. Written in Gluon (``triton.experimental.gluon``),
Triton's explicit-layout dialect, because plain Triton cannot pin the register
layout of a loaded tile.

K order is free. An MMA sums over k, so any permutation of K inside a tile is
fine as long as both operands use it. Gluon's ``DotOperandLayout(k_width=8)``
gives each thread 8 consecutive k of its rows per 32-k block, at lane ``t =
lane % 4`` and block ``j``: logical ``k = 32 j + 8 t + e``. We map logical word
``(j, t)`` to real word ``J t + j`` of the tile (``J = BKW / 4``), so thread
``t`` holds the ``J`` *contiguous* real words ``J t .. J t + J - 1`` of each of
its rows (one 16-byte load at J = 4), and inside a word logical ``e = 2 i + h``
is code ``i + 4 h`` -- the "pair order" of ``dequant.py``, in which the inline
PTX decode emits each 32-bit register as (code i, code i + 4) with no byte
permutes. The activations (B operand, ``x^T``: K x NT tokens) are
loaded with the same permutation: 16-byte loads of 8 natural-order bf16, the
in-word reorder done in registers (PRMT), shared by all rows of a warp.
The token tile NT (the MMA n extent) is 8, 16, 32 or 64 (``token_tile``): one to
eight n8 tiles, each one more register bit of the ``x`` layout.

Layouts are built as explicit linear layouts (``_layouts``): the word tile
``[R, BKW]``, its per-group scale tile, and the ``x`` tile ``[NT, BKW, 8]`` are
placed so that after decode + join / reshape / permute they *are* the dot
operand layouts; ``convert_layout`` then moves no data (checked at compile
time with ``assert_trivial`` where Gluon can prove it, and in the SASS: no
shared memory, no ``BAR`` in the main loop -- ``benchmarks/kernels/
bench_mma_decode.py --compile-report``).

Work split. A CTA of ``W`` warps owns ``R`` output rows (``R / W`` per warp,
``R / (16 W)`` m16 tiles each) and a K range; K steps of ``BKW`` words (8 codes
each). The next step's words and scales are loaded into registers before the
current one is decoded (register double buffer). When ``cdiv(N, R)`` CTAs do
not fill the GPU, K is split over CTAs: fp32 partials ``[S, M, N]`` summed in
split order by ``launch.splitk_reduce_kernel`` (deterministic).

Large M (17..64, NT = 32 / 64). Per thread, a K step holds the B fragments
(``NT * BKW / 8`` registers), the accumulators (``R / W * NT / 32``), the decoded A
fragments (``R / W * BKW / 8``) and the raw words (``R / W * BKW / 32``, twice with
the prefetch). The M <= 16 configs (BKW 16-32) spill at NT = 64, so the large-M
configs take BKW = 8 (or 4: 168-188 registers at NT = 64). Rows per warp set the activation
traffic: every warp loads the whole ``x`` step (L1 hits after the first warp of
the CTA), ``4 * NT / (R / W)`` times the bytes of its weight words -- 8x at NT = 64
with 32 rows per warp, 16x with 16 -- and the in-word PRMT reorder costs one
instruction per ``x`` register per warp: at NT = 64 the x side is as large as the
decode (sm_90: ~5.6-6.4 instructions per weight vs ~4.1-4.6 at NT <= 32). 64 rows
per warp would halve it but needs 128 accumulator registers and spills.

Shared x (``xsmem``, configs 11-13). Instead, the CTA loads each x step once: every
warp loads and reorders (PRMT) its share of the tokens and stores it to a double
buffer ``[2, NT, BK]`` in shared memory; after a barrier every warp reads its B
fragments with 16-byte ``LDS`` at constant offsets (no per-load address math). The
buffer stores a token's values in the order (t, p, j, h) of logical ``k = 32 j +
8 t + 2 p + h``: Triton lowers ``k_width = 8`` at ``BKW = 8`` so that one HMMA takes
the 32-bit pairs (p, j = 0) and (p, j = 1) of a thread as its two B registers, and
with them adjacent each 16-byte load lands in HMMA operand registers (with the
plain (j, t, e) order ptxas adds a register move per B register); 16-byte chunks
are XOR-swizzled by token parity (``SwizzledSharedLayout(8, 1, 2)``) so that the
two tokens of a quarter warp hit different banks. sm_90: 4.5-5.0 instructions per
weight at NT = 64 (vs 5.6-6.4) and 103-168 registers (vs 220-254), for 8-16 KB of
shared memory and, in the SASS, two barriers per K step (the explicit one and one
Triton's membar pass adds before the store: it cannot tell the two buffers apart).
Whether the barriers cost more than the instructions saved is for the GPU
benchmark to say. At M = 64
the ``mma.sync`` work itself (half of wgmma's rate on Hopper) is about as long as
the weight read at full HBM speed, so this regime is bounded near half of HBM.

Numerics are those of ``dequant.py`` (same PTX decode): NVFP4 weights exact
(``e2m1 * e4m3 * 2**-16`` in bf16, ``2**16 / global_scale`` applied to the fp32
accumulator), MXFP4 exact for E8M0 exponents in [2**-110, 2**17], INT4 with the
fp32 group scale rounded to bf16 (<= 2**-9 relative). fp32 accumulation in MMA
order. There is no portable / interpreter path: Gluon compiles for NVIDIA
sm_80+ only; ``mma_decode_supported`` says when this kernel applies and the
callers keep ``wo_gemm`` / the reference otherwise.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from quarl_kernels import lora_a, pdl, pdl_gluon
from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4
from quarl_kernels.group_pass import finish_group
from quarl_kernels.launch import decode_operands, finish_splits, num_sms
from quarl_kernels.mma_decode_config import (  # noqa: F401  re-exported: callers name them mma_decode.*
    LARGE_M_MIN_WEIGHTS,
    MAX_M,
    MIN_M,
    MMA_DECODE_CONFIGS,
    W_EARLY_ENV,
    MmaDecodeConfig,
    candidate_configs,
    default_config,
    preferred,
    split_for,
    token_tile,
    w_early,
)
from quarl_kernels.mma_decode_step import (
    _group_layout,
    _load_step,
    _mma_step,
    _word_layout,
    _x_frag,
    _x_layout,
    _x_operand,
    _x_step,
    _x_unfrag,
    _xcoop_layout,
    _xfrag_layout,
)

# k per lane and step of the LoRA A programs (_lora_a_rows): at 8 the launch needs no more registers than the weight
# tiles alone at the default M <= 16 configs (sm_90 build: 85 vs 80 at NT = 8, 128 vs 121 / 132 vs 132 at NT = 16;
# 16 would take 138-168), so the A programs cost the tiles no occupancy
LORA_A_V = 8




@gluon.jit
def _lora_a_rows(pid, x_ptr, w_ptr, out_ptr, M, K, R, K_PER_SPLIT, stride_xm, stride_wr, s_out, m_out,
                 NT: gl.constexpr, W: gl.constexpr, V: gl.constexpr):
    """A LoRA group's ``x @ A^T`` partials (``quarl_kernels.lora_a``; the GEMV's ``lora_a_program`` for M <= 16):
    program ``pid`` computes ``out[s, :M, rows]`` for K range ``s`` and ``W`` adapter rows, one per warp, on CUDA
    cores. A warp's lanes split (token octet, k): ``NT / 8`` token lanes by ``32 / (NT / 8)`` k lanes, each lane
    ``V`` consecutive k of the warp's row and 8 tokens -- so a lane's activation registers stay at ``8 V`` bf16
    for any token tile (the weight tiles' register budget: ``LORA_A_V``). FFMAs into 8 fp32 per lane, one sum over the k
    lanes at the end; the next step's loads are issued before this step's math."""
    TL: gl.constexpr = NT // 8  # lanes along tokens
    KL: gl.constexpr = 32 // TL  # lanes along k
    BK: gl.constexpr = KL * V
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, V], [TL, 1, KL, 1], [1, W, 1, 1], [3, 2, 1, 0])  # [NT, W, KL, V]
    LX: gl.constexpr = gl.SliceLayout(1, L4)  # x [NT, KL, V]
    LA: gl.constexpr = gl.SliceLayout(0, L4)  # A [W, KL, V]
    LS: gl.constexpr = gl.SliceLayout(3, L4)  # per-lane sums [NT, W, KL]
    splits = gl.cdiv(K, K_PER_SPLIT)
    s = pid % splits
    r0 = (pid // splits) * W
    rows = gl.minimum(r0 + gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA))), R - 1)  # [W]
    toks = gl.minimum(gl.arange(0, NT, layout=gl.SliceLayout(1, gl.SliceLayout(2, LX))), M - 1)  # [NT]
    ka = (gl.arange(0, KL, layout=gl.SliceLayout(1, gl.SliceLayout(0, LA)))[:, None] * V
          + gl.arange(0, V, layout=gl.SliceLayout(0, gl.SliceLayout(0, LA)))[None, :])  # [KL, V]
    kx = (gl.arange(0, KL, layout=gl.SliceLayout(1, gl.SliceLayout(0, LX)))[:, None] * V
          + gl.arange(0, V, layout=gl.SliceLayout(0, gl.SliceLayout(0, LX)))[None, :])  # [KL, V]
    a_ptrs = w_ptr + rows[:, None, None] * stride_wr + ka[None, :, :]  # [W, KL, V]
    x_ptrs = x_ptr + toks[:, None, None] * stride_xm + kx[None, :, :]  # [NT, KL, V]
    k_lo = s * K_PER_SPLIT
    k_hi = gl.minimum(k_lo + K_PER_SPLIT, K)
    a_n = gl.load(a_ptrs + k_lo, mask=(k_lo + ka < k_hi)[None, :, :], other=0.0)
    x_n = gl.load(x_ptrs + k_lo, mask=(k_lo + kx < k_hi)[None, :, :], other=0.0)
    acc = gl.zeros([NT, W, KL], gl.float32, LS)
    for k0 in range(k_lo, k_hi, BK):
        a, xv = a_n, x_n
        k1 = k0 + BK  # the next step (past k_hi at the end: masked to zeros, unused)
        a_n = gl.load(a_ptrs + k1, mask=(k1 + ka < k_hi)[None, :, :], other=0.0)
        x_n = gl.load(x_ptrs + k1, mask=(k1 + kx < k_hi)[None, :, :], other=0.0)
        prod = gl.expand_dims(xv.to(gl.float32), 1) * gl.expand_dims(a.to(gl.float32), 0)  # [NT, W, KL, V]
        acc += gl.sum(prod, axis=3)  # in-lane: bf16 x bf16 is exact in fp32, only the sums round
    out = gl.sum(acc, axis=2)  # [NT, W]
    on = gl.arange(0, NT, layout=gl.SliceLayout(1, gl.SliceLayout(2, LS)))
    orow = r0 + gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(2, LS)))
    gl.store(out_ptr + s * s_out + on[:, None] * m_out + orow[None, :], out, mask=(on[:, None] < M) & (orow[None, :] < R))




@gluon.jit
def _mma_decode_kernel(
    x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    M, N, KW, TILES_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
    la_w_ptr, la_out_ptr, LA_R, LA_PER, LA_PROGS, la_stride_wr, la_s_out, la_m_out,
    wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
    wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
    FMT: gl.constexpr, GROUP: gl.constexpr, HAS_ZP: gl.constexpr,
    R: gl.constexpr, BKW: gl.constexpr, NT: gl.constexpr, W: gl.constexpr,
    PREFETCH: gl.constexpr, EVEN_K: gl.constexpr, XS: gl.constexpr = False,
    HAS_LA: gl.constexpr = False, LA_V: gl.constexpr = 8, NW: gl.constexpr = 1,
    PDL: gl.constexpr = 0, DIAG: gl.constexpr = 0, BLOCKED: gl.constexpr = False, W_EARLY: gl.constexpr = False,
):
    """y[M, N] (or fp32 split partials [S, M, N]) = x[M, K] @ W[N, K]^T, M <= NT.

    x bf16 [M, K]; words int32 [N, K/8]; FP4 scales uint8 [N, G]; INT4 fp32 scales
    [N, G] and int8 zero points [N, G]. Program (pid_n, pid_k) owns rows
    pid_n * R .. + R and K steps pid_k * TILES_PER_SPLIT .. + TILES_PER_SPLIT.
    HAS_LA: the first LA_PROGS programs of axis 0 (split 0 only; the others idle) compute a
    LoRA group's ``x @ A^T`` partials instead (:func:`_lora_a_rows`); the weight tiles follow.
    NW = 2 / 3: the tiles of two or three FP4 weights of one K that read the same x (a LoRA group's q/k/v or
    gate/up: :func:`launch_mma_decode_group`), weight 0's ``T0`` tiles, then weight 1's ``T1``, then weight 2's.
    PDL (``pdl.py``, ``pdl_gluon.py``): wait for the kernel before (which wrote x) first; signal after the K loop.
    DIAG (a diagnostic, ``MmaDecodeConfig.diag``): 1 the decode replaced by a conversion (wrong results by design).
    BLOCKED: every weight's words in ``quarl.quant.packed_layout``'s [64, 8] blocks. W_EARLY (x not staged through
    shared memory): a weight program loads its first step's words and scales before the PDL wait
    (:func:`_mma_decode_tiles`; weights are written by no kernel of a decode step), x after it."""
    EARLY: gl.constexpr = W_EARLY and not XS
    if not EARLY:
        pdl_gluon.enter(PDL)
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    if HAS_LA:
        if pid_n < LA_PROGS:
            if pid_k == 0:
                if EARLY:
                    pdl_gluon.enter(PDL)  # the A programs read x
                _lora_a_rows(pid_n, x_ptr, la_w_ptr, la_out_ptr, M, KW * 8, LA_R, LA_PER, stride_xm, la_stride_wr,
                             la_s_out, la_m_out, NT, W, LA_V)
        else:
            _mma_decode_weights(pid_n - LA_PROGS, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, M, N, KW,
                                TILES_PER_SPLIT, stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
                                wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
                                wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
                                FMT, GROUP, HAS_ZP, R, BKW, NT, W, PREFETCH, EVEN_K, XS, NW, PDL, DIAG, BLOCKED, W_EARLY)
    else:
        _mma_decode_weights(pid_n, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, M, N, KW,
                            TILES_PER_SPLIT, stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
                            wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
                            wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
                            FMT, GROUP, HAS_ZP, R, BKW, NT, W, PREFETCH, EVEN_K, XS, NW, PDL, DIAG, BLOCKED, W_EARLY)


@gluon.jit
def _mma_decode_weights(
    t, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, M, N, KW, TILES_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
    wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
    wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
    FMT: gl.constexpr, GROUP: gl.constexpr, HAS_ZP: gl.constexpr,
    R: gl.constexpr, BKW: gl.constexpr, NT: gl.constexpr, W: gl.constexpr,
    PREFETCH: gl.constexpr, EVEN_K: gl.constexpr, XS: gl.constexpr, NW: gl.constexpr, PDL: gl.constexpr,
    DIAG: gl.constexpr = 0, BLOCKED: gl.constexpr = False, W_EARLY: gl.constexpr = False,
):
    """Weight tile ``t`` of the launch: weight 0's tiles, then (NW >= 2) weight 1's, then (NW == 3) weight 2's."""
    if NW == 1:
        _mma_decode_tiles(t, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, M, N, KW, TILES_PER_SPLIT,
                          stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
                          FMT, GROUP, HAS_ZP, R, BKW, NT, W, PREFETCH, EVEN_K, XS, PDL, DIAG, BLOCKED, W_EARLY)
    else:
        if t < T0:
            _mma_decode_tiles(t, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, M, N, KW, TILES_PER_SPLIT,
                              stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
                              FMT, GROUP, HAS_ZP, R, BKW, NT, W, PREFETCH, EVEN_K, XS, PDL, DIAG, BLOCKED, W_EARLY)
        elif NW == 2 or t < T0 + T1:
            _mma_decode_tiles(t - T0, pid_k, x_ptr, wp1_ptr, s1_ptr, s1_ptr, gs1_ptr, out1_ptr, M, N1, KW,
                              TILES_PER_SPLIT, stride_xm, stride_wn, stride_sn, stride_zn, so1, som1,
                              FMT, GROUP, HAS_ZP, R, BKW, NT, W, PREFETCH, EVEN_K, XS, PDL, DIAG, BLOCKED, W_EARLY)
        else:
            _mma_decode_tiles(t - T0 - T1, pid_k, x_ptr, wp2_ptr, s2_ptr, s2_ptr, gs2_ptr, out2_ptr, M, N2, KW,
                              TILES_PER_SPLIT, stride_xm, stride_wn, stride_sn, stride_zn, so2, som2,
                              FMT, GROUP, HAS_ZP, R, BKW, NT, W, PREFETCH, EVEN_K, XS, PDL, DIAG, BLOCKED, W_EARLY)


@gluon.jit
def _mma_decode_tiles(
    pid_n, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    M, N, KW, TILES_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_os, stride_om,
    FMT: gl.constexpr, GROUP: gl.constexpr, HAS_ZP: gl.constexpr,
    R: gl.constexpr, BKW: gl.constexpr, NT: gl.constexpr, W: gl.constexpr,
    PREFETCH: gl.constexpr, EVEN_K: gl.constexpr, XS: gl.constexpr, PDL: gl.constexpr = 0,
    DIAG: gl.constexpr = 0, BLOCKED: gl.constexpr = False, W_EARLY: gl.constexpr = False,
):
    """One program's weight tile of :func:`_mma_decode_kernel`. ``W_EARLY`` (not XS): the first step's words and
    scales loaded before the PDL wait -- with PREFETCH its first load already is; without, that step is peeled off
    the loop (:func:`_mma_step`, the same operations in the same order: the same bits)."""
    BK: gl.constexpr = BKW * 8
    J: gl.constexpr = BKW // 4
    WPG: gl.constexpr = GROUP // 8  # words per scale group
    WT: gl.constexpr = WPG if WPG < BKW else BKW  # noqa: FURB136  words per group slot inside a step
    NG: gl.constexpr = BKW // WT  # group slots per step
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 8)
    B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 8)
    LW: gl.constexpr = _word_layout(R, BKW, W)
    LG: gl.constexpr = gl.SliceLayout(2, _group_layout(R, BKW, W, WT))
    LX: gl.constexpr = _x_layout(NT, BKW, W)

    # rows past N re-read row N - 1 (never stored): no masks on the weight loads
    rows_w = gl.minimum(pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, LW)), N - 1)  # [R]
    rows_g = gl.minimum(pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, LG)), N - 1)  # [R]
    offs_w = gl.arange(0, BKW, layout=gl.SliceLayout(0, LW))  # [BKW] real word in step
    offs_g = gl.arange(0, NG, layout=gl.SliceLayout(0, LG))  # [NG]
    kw_lo = pid_k * (TILES_PER_SPLIT * BKW)
    kw_hi = gl.minimum(kw_lo + TILES_PER_SPLIT * BKW, KW)
    # activations [NT, BKW, 8]: token n, real word, code c (natural order, 16-byte loads);
    # XS: each warp loads its share of the step once, into shared memory
    LXL: gl.constexpr = _xcoop_layout(NT, BKW, W) if XS else LX
    xn = gl.arange(0, NT, layout=gl.SliceLayout(1, gl.SliceLayout(2, LXL)))
    xw = gl.arange(0, BKW, layout=gl.SliceLayout(0, gl.SliceLayout(2, LXL)))
    xc = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, LXL)))
    # tokens past M re-read token M - 1: their accumulator columns are never stored (no masks)
    xn = gl.minimum(xn, M - 1)
    x_off = (xn[:, None, None] * stride_xm + xw[None, :, None] * 8 + xc[None, None, :])  # [NT, BKW, 8]

    acc = gl.zeros([R, NT], gl.float32, MMA)
    kw_last = kw_lo + ((kw_hi - kw_lo - 1) // BKW) * BKW  # start of the split's last step
    EARLY: gl.constexpr = W_EARLY and not XS
    kw_first = kw_lo
    if PREFETCH:
        nxt = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kw_lo, kw_hi,
                         stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)
        if EARLY:
            pdl_gluon.enter(PDL)
    elif EARLY:  # the first step peeled: its words in flight while the kernel before finishes
        w, sg, zg = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kw_lo, kw_hi,
                               stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)
        pdl_gluon.enter(PDL)
        b = _x_operand(x_ptr, x_off, xw, kw_lo, kw_hi, EVEN_K, NT, BK, J, B_L)
        acc = _mma_step(acc, b, w, sg, zg, FMT, HAS_ZP, LW, R, BKW, WT, J, BK, A_L, DIAG)
        kw_first = kw_lo + BKW
    if XS:  # double buffer [2, NT, BK] of B fragments (_xfrag_layout order), step 0's now
        gl.static_assert(J == 2, "XS: the B register pairing is that of 8-word steps")
        # 16-byte chunk c of token n at c ^ (n % 2): tokens g, g + 1 of a quarter warp hit other banks
        xs = gl.allocate_shared_memory(gl.bfloat16, [2, NT, BK], gl.SwizzledSharedLayout(8, 1, 2, [1, 0]))
        xs.index(0).store(_x_frag(_x_step(x_ptr, x_off, xw, kw_lo, kw_hi, EVEN_K), NT, J))
    for kw0 in range(kw_first, kw_hi, BKW):
        if XS:
            # one barrier per step: buffer s % 2 was written by all warps before it (step s - 1),
            # and every warp finished reading buffer (s + 1) % 2 (step s - 1) before it is rewritten
            gl.thread_barrier()
            buf = ((kw0 - kw_lo) // BKW) % 2
            b = gl.convert_layout(_x_unfrag(xs.index(buf).load(_xfrag_layout(NT, BKW, W)), NT, J, BK), B_L)
            xg = _x_step(x_ptr, x_off, xw, gl.minimum(kw0 + BKW, kw_last), kw_hi, EVEN_K)  # next step's share
        else:  # x^T step first (L1/L2 hits), permuted like the weight tile
            b = _x_operand(x_ptr, x_off, xw, kw0, kw_hi, EVEN_K, NT, BK, J, B_L)

        if PREFETCH:  # this step's raw loads were issued one step ago; issue the next one's
            w, sg, zg = nxt
            nxt = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g,
                             gl.minimum(kw0 + BKW, kw_last), kw_hi,  # the last again at the end: unused
                             stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)
        else:
            w, sg, zg = _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kw0, kw_hi,
                                   stride_wn, stride_sn, stride_zn, FMT, WPG, WT, HAS_ZP, EVEN_K, BLOCKED)
        acc = _mma_step(acc, b, w, sg, zg, FMT, HAS_ZP, LW, R, BKW, WT, J, BK, A_L, DIAG)
        if XS:  # the next step's activations, after this step's MMAs are issued
            xs.index(1 - buf).store(_x_frag(xg, NT, J))

    pdl_gluon.leave(PDL)  # the scaling and stores left: the next kernel may place its programs
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
def mma_decode_supported(x2: torch.Tensor, pw) -> bool:
    """True when ``launch_mma_decode`` can run this call: CUDA bf16 activations with
    MIN_M <= M <= MAX_M (64), a weight in NVFP4 / MXFP4 / INT4 with a group of 8 * 2**i
    weights and K a multiple of 8 (whole packed words)."""
    wpg = pw.group // 8
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and x2.dim() == 2 and MIN_M <= x2.shape[0] <= MAX_M
            and x2.shape[1] == pw.k and pw.fmt in (FMT_NVFP4, FMT_MXFP4, FMT_INT4)
            and pw.group % 8 == 0 and wpg & (wpg - 1) == 0 and pw.k % 8 == 0)


def launch_mma_decode(x2: torch.Tensor, pw, cfg: MmaDecodeConfig, epi=None) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T on mma.sync with register-decoded weights.

    ``pw`` is a ``wo_gemm.PackedWeight`` (byte tensors as bytes or int32 views);
    ``x2`` bf16 [M, K] with 1 <= M <= 64 (``mma_decode_supported``); ``cfg`` from
    ``default_config`` / ``candidate_configs`` (any entry runs at any M).
    ``epi``: a ``launch.Epilogue`` (bias / LoRA branch added in the last pass), or None; its ``lora_a`` (a LoRA
    group's ``x @ A^T``) is computed by extra programs of this launch (:func:`_lora_a_rows`), ahead of the tiles."""
    ops, split, epi = _launch(x2, [pw], cfg, epi)
    return finish_splits(ops[0], split, epi)


def launch_mma_decode_group(x2: torch.Tensor, pws: list, cfg: MmaDecodeConfig, epis: list,
                            gate_act: bool = False, rope=None) -> list[torch.Tensor]:
    """:func:`launch_mma_decode` for two or three FP4 weights that read the same ``x2`` (a LoRA group's q/k/v or
    gate/up, :func:`group_supported`): one launch of all their tiles (and ``epis[0].lora_a``'s A programs), then
    the weights' last passes (one launch: ``group_pass.finish_group``, with ``rope`` as there). ``gate_act``: the second weight's pass writes ``silu(y_0) * y_1``."""
    ops, split, e0 = _launch(x2, pws, cfg, epis[0])
    return finish_group([(o.out, o.y) for o in ops], split, [e0, *epis[1:]], gate_act, rope)


def group_supported(x2: torch.Tensor, pws: list) -> bool:
    """True when :func:`launch_mma_decode_group` runs these weights: 2-3 FP4 weights of one K, format and group the
    kernel takes at this M, at most 16 rows (the token tiles the LoRA A programs serve)."""
    p0 = pws[0]
    return (2 <= len(pws) <= 3 and 2 <= x2.shape[0] <= 16 and p0.fmt != FMT_INT4
            and all(p.k == p0.k and p.fmt == p0.fmt and p.group == p0.group for p in pws)
            and all(mma_decode_supported(x2, p) for p in pws))


def _launch(x2: torch.Tensor, pws: list, cfg: MmaDecodeConfig, epi):
    """One launch over ``pws``' tiles (one K split for all); -> (their DecodeOperands, split, epi for weight 0)."""
    pw = pws[0]
    if any(p.blocked != pw.blocked for p in pws):
        raise ValueError(f"launch_mma_decode: one launch reads one word layout; got blocked {[p.blocked for p in pws]}")
    if not all(mma_decode_supported(x2, p) for p in pws):
        raise ValueError(
            f"launch_mma_decode: needs CUDA bf16 x [M, {pw.k}] with {MIN_M} <= M <= {MAX_M}, K % 8 == 0 and a "
            f"group of 8 * 2**i weights; got {x2.dtype} {tuple(x2.shape)} on {x2.device}, group {pw.group} "
            f"(use wo_gemm.launch_fwd)")
    m = x2.shape[0]
    kw = pw.k // 8
    tiles = [triton.cdiv(p.n, cfg.rows) for p in pws]
    split, per = split_for(cfg, sum(tiles) * cfg.rows, kw, num_sms(x2.device))
    ops = [decode_operands(x2, p, split, int4=p.fmt == FMT_INT4) for p in pws]
    la = epi.lora_a if epi is not None else None  # a LoRA group's x @ A^T, computed by programs of this launch
    nt = token_tile(m)
    if la is not None and nt > 16:  # past lora_a.MAX_M: the A programs' registers would crowd these tiles
        lora_a.fill_partials(x2, la)
        la, epi = None, epi._replace(lora_a=None)
    if la is not None:
        la.check(m, pw.k)
        la_progs = triton.cdiv(la.w.shape[0], cfg.warps) * lora_a.splits_for(pw.k, m)  # a row per warp
        la_args = (la.w, la.out, la.w.shape[0], lora_a.k_per_split(pw.k, m), la_progs, la.w.stride(0),
                   la.out.stride(0), la.out.stride(1))
    else:
        la_progs, la_args = 0, (ops[0].x2, ops[0].out, 0, 0, 0, 0, 0, 0)
    o0 = ops[0]
    w_args = []
    for j in (1, 2):  # the group's other weights (or placeholders that no program reads)
        if j < len(pws):
            o = ops[j]
            w_args += [pws[j].words, o.scale, o.gscale, o.out, pws[j].n, tiles[j - 1], *o.out_strides]
        else:
            w_args += [pw.words, o0.scale, o0.gscale, o0.out, 0, 0, 0, 0]
    grid = (la_progs + sum(tiles), split)  # the A programs first: scheduled in the first wave
    _mma_decode_kernel[grid](
        o0.x2, pw.words, o0.scale, o0.zero, o0.gscale, o0.out,
        m, pw.n, kw, per,
        o0.x2.stride(0), pw.words.stride(0), o0.scale.stride(0), o0.zero.stride(0), *o0.out_strides,
        *la_args, *w_args,
        FMT=pw.fmt, GROUP=pw.group, HAS_ZP=pw.fmt == FMT_INT4 and pw.zero is not None,
        R=cfg.rows, BKW=cfg.bkw, NT=nt, W=cfg.warps,
        PREFETCH=cfg.prefetch, EVEN_K=kw % cfg.bkw == 0, XS=cfg.xsmem,
        HAS_LA=la is not None, LA_V=LORA_A_V, NW=len(pws), DIAG=cfg.diag, BLOCKED=pw.blocked,
        W_EARLY=w_early(x2.device), num_warps=cfg.warps, **pdl.kwargs(x2.device),
    )
    return ops, split, epi


__all__ = [
    "LARGE_M_MIN_WEIGHTS",
    "LORA_A_V",
    "MAX_M",
    "MIN_M",
    "MMA_DECODE_CONFIGS",
    "MmaDecodeConfig",
    "candidate_configs",
    "default_config",
    "group_supported",
    "launch_mma_decode",
    "launch_mma_decode_group",
    "mma_decode_supported",
    "preferred",
    "token_tile",
]
