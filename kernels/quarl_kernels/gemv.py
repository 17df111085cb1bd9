"""Decode GEMV for weight-only 4-bit weights: ``y = x @ W^T`` for M <= 16 tokens on CUDA cores.

Why a second forward kernel. At small M the product is memory-bound (0.53-0.56
bytes per weight against 2*M flops), so the job is to stream the packed weight at
HBM speed. The tensor-core path (``wo_tensorcore._fwd_kernel``) pays for moving every
dequantized tile into the MMA (Triton 3.6 converts the register tile k16 slice by
k16 slice, a barrier and a wgmma wait each: docs/kernels.md, v1-v5) and stays at
~28% of HBM bandwidth. Here there is no MMA: each program owns ``BN`` output rows
and a K range, streams ``[BN, BKW]`` tiles of 32-bit words (8 codes each, read
straight from the packed layout, no repacking), decodes them in registers to fp32
and accumulates ``w * x`` with FFMAs into a ``[BN, BKW]`` fp32 accumulator per
token; one ``tl.sum`` along K at the end. ``wo_gemm.wo_matmul`` sends M <=
``GEMV_MAX_M`` here.

Cost per weight, issue slots (the budget is ~4.4 for HBM speed on an H200:
~29 NVFP4 weights/clk/SM against 128 thread-instructions/clk/SM, of which
integer ALU ops get half):

  decode   FP4: 1 ALU ``and`` + 1 IMAD (copies a code to two bit positions)
           + 1 ALU ``and`` per *pair* of codes (codes j, j+4 share a 16-bit
           offset), giving both as exact bf16 ``e2m1 * 2**-126``; then per code
           one ``fma.rn.bf16x2`` by ``{0, S}`` that both applies the block scale
           (``S = scale * 2**110``, exact: <= 6 significant bits) and leaves a
           clean fp32 in the register (the low half becomes +0) -- so the bf16 ->
           fp32 split costs no integer op (ptxas folds the low-half broadcast into
           the HFMA2 operand). ~1.1 ALU + 0.5 IMAD + 1 HFMA2.
           INT4: ``(w >> 4j) & 0x000F000F | 0x43004300`` is the bf16 pair
           ``128 + u`` (1-2 ALU per pair); one ``fma.rn.bf16x2`` per code gives
           ``u - 8 - zero`` exactly as fp32. The fp32 group scale multiplies the
           per-word partial sum (exact scale, unlike the tensor-core path's bf16
           rounding of it).
  multiply M FFMAs (fp32 accumulate) -- the term that grows with M.
  x        bf16 pairs loaded as int32 (4 loads per word column and token, L1/L2
           hits), split to fp32 with a shift / mask, amortized over the rows each
           thread holds.

Measured (H200, docs/kernels.md v6): ~4.6 loop instructions per weight at M = 1
(+1.4 per extra token), issued at ~66% of the peak rate with 26% occupancy and
long-scoreboard stalls (ncu) -> 45% of the HBM copy bandwidth, 2.2x cuBLAS BF16
and 1.65x the tensor-core path on the large layers at M = 1; the FFMA term makes
the tensor cores faster again from M = 4 on, hence ``GEMV_MAX_M = 3``.

Layouts. Block scales are loaded once per group (``[BN, NG]`` bytes / floats),
converted at group granularity and broadcast to words in registers. Without a
cp.async pipeline, that broadcast is free only when the group loads get the
words' thread layout; the index arithmetic below is written so that Triton's
alignment analysis makes them match (see ``_gemv_kernel``), else Triton inserts a
shared-memory ``convert_layout`` and two barriers per K step. ``VEC`` sets how many
consecutive words of a row one thread holds (16-byte loads at 4). Loads overlap
the decode in one of three ways (``GemvConfig``): none (occupancy alone), a
register double buffer (``prefetch``; ptxas tends to sink those loads to the end
of the loop body), or a cp.async pipeline ``stages`` deep (``tl.range(...,
num_stages)``: Triton 3.6 pipelines loads that feed no ``tl.dot`` only when the
loop asks for it) -- then every tile reaches registers through shared memory in
whatever layout the math needs, and the INT4 zero points travel as int32 words
(1-byte loads cannot be cp.async'd).

Split-K. When ``cdiv(N, BN)`` programs do not fill the GPU (``waves * SMs``),
the K range is split; each split writes fp32 partials ``[S, M, N]`` and
``launch.splitk_reduce_kernel`` sums them in split order -- deterministic,
unlike atomics -- and casts to the output dtype.

Numerics are those of ``dequant.py`` (FP4 weights exact; MXFP4 exact for E8M0
exponents in [2**-110, 2**17]), with fp32 accumulation in a different order than
the tensor-core path. A portable decode in plain Triton (``USE_ASM=False``)
computes bit-identical weights; it is the test oracle for the PTX and what runs
under ``TRITON_INTERPRET=1``.

Code. One K step (the loads, the decode, x, the FFMAs) is ``gemv_step.py``; the configs and the rules that pick
one are ``gemv_config.py``; here are the kernel's programs (tiles, split K, a LoRA group's weights and its A
programs, the PDL wait / signal) and the launches.
"""

from __future__ import annotations

import typing

import torch
import triton
import triton.language as tl

from quarl_kernels import lora_a, pdl
from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4

# The configs, their rules and switches (re-exported: callers name them as gemv.*)
from quarl_kernels.gemv_config import (  # noqa: F401
    DEFAULTS_ENV,
    GEMV_CONFIGS,
    GEMV_GROUP_MAX_M,
    GEMV_LIMIT_M,
    GEMV_MAX_M,
    L2_FIRST,
    LARGE_WEIGHTS,
    LONG_K,
    M1_ENV,
    MAX_WAVE_SPLIT,
    SLOTS_PER_SM,
    SPLIT_ENV,
    W_EARLY_ENV,
    WHOLE_WAVES_ENV,
    GemvConfig,
    _gemv_split,
    default_gemv_config,
    effective_tile,
    gemv_supported,
    h200_defaults,
    m1_overrides,
    split_overrides,
    w_early,
    whole_waves_split,
)
from quarl_kernels.gemv_step import _fma_step, _l2_first_tile, _load_tile, _x_step
from quarl_kernels.group_pass import finish_group
from quarl_kernels.launch import finish, interpreting, num_sms
from quarl_kernels.lora_a import lora_a_program


@triton.jit(do_not_specialize=["stride_sn_u", "stride_zn_u"])
def _gemv_kernel(
    x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    N, KW, KW_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
    xb_ptr, la_w_ptr, la_out_ptr, LA_R, LA_PER, LA_PROGS, la_stride_wr, la_s_out, la_m_out,
    wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
    wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
    M: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr,
    BN: tl.constexpr, BKW: tl.constexpr, VEC: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
    EVEN_K: tl.constexpr, ZW: tl.constexpr, HAS_LA: tl.constexpr = False,
    LA_BR: tl.constexpr = 4, LA_BK: tl.constexpr = 512, NW: tl.constexpr = 1,
    PDL: tl.constexpr = 0, DIAG: tl.constexpr = 0,
    BLOCKED: tl.constexpr = False, W_EARLY: tl.constexpr = False,
):
    """y[M, N] (or fp32 split partials [S, M, N]) = x[M, K] @ W[N, K]^T for small M.

    x comes as int32 [M, K/2] (bf16 pairs); FP4 scales / INT4 zero points as bytes
    [N, G]; INT4 scales as floats [N, G]. Each split's K range is a multiple of BKW
    words; with EVEN_K so is KW (no masks in the loop). HAS_LA: the first LA_PROGS
    programs of axis 0 (split 0 only; the others idle) compute a LoRA group's
    ``x @ A^T`` partials instead (``lora_a``: x as bf16 ``xb``), the weight tiles follow.
    NW = 2 / 3: the tiles of two or three weights of the same K and format that read the same x (a LoRA
    group's q/k/v, gate/up: ``launch_gemv_group``), weight 0's ``T0`` tiles first, then weight 1's ``T1``,
    then weight 2's, each into its own partials -- one launch instead of NW.
    PDL (``pdl.py``): wait for the kernel before (which wrote x) first; signal after the K loop. DIAG (a diagnostic,
    ``GemvConfig.diag``): 1 the decode replaced by a bitcast, 2 the math too (wrong results by design). BLOCKED: the
    words (of every weight of the launch) in ``quarl.quant.packed_layout``'s [64, 8] blocks. W_EARLY (without
    cp.async stages): a weight program loads its first weight tile *before* the PDL wait (``_gemv_tiles``); no
    kernel of a decode step writes weights, and the wait still precedes every read of x and every store. W_EARLY == 2
    (``QUARL_KERNELS_GEMV_W_EARLY=l2``, row-major words): the first tile's lines prefetched to L2 before the wait
    instead -- no registers held across it."""
    EARLY: tl.constexpr = W_EARLY == 1 and STAGES <= 1
    L2_TILE: tl.constexpr = W_EARLY == 2 and USE_ASM and not BLOCKED  # gemv_config.L2_FIRST; see _gemv_tiles
    if not (EARLY or L2_TILE):
        pdl.enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if HAS_LA:
        if pid_n < LA_PROGS:
            if pid_k == 0:
                if EARLY or L2_TILE:
                    pdl.enter(PDL)  # the A programs read x
                lora_a_program(pid_n, xb_ptr, la_w_ptr, la_out_ptr, KW * 8, LA_R, LA_PER, stride_xm * 2,
                               la_stride_wr, la_s_out, la_m_out, M, LA_BR, LA_BK)
        else:
            _gemv_weights(pid_n - LA_PROGS, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, N, KW, KW_PER_SPLIT,
                          stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
                          wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
                          wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
                          M, FMT, GROUP, HAS_ZP, USE_ASM, BN, BKW, VEC, PREFETCH, STAGES, EVEN_K, ZW, NW, PDL, DIAG, BLOCKED, W_EARLY)
    else:
        _gemv_weights(pid_n, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, N, KW, KW_PER_SPLIT,
                      stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
                      wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
                      wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
                      M, FMT, GROUP, HAS_ZP, USE_ASM, BN, BKW, VEC, PREFETCH, STAGES, EVEN_K, ZW, NW, PDL, DIAG, BLOCKED, W_EARLY)


@triton.jit
def _gemv_weights(
    t, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, N, KW, KW_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
    wp1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, T0, so1, som1,
    wp2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, T1, so2, som2,
    M: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr,
    BN: tl.constexpr, BKW: tl.constexpr, VEC: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
    EVEN_K: tl.constexpr, ZW: tl.constexpr, NW: tl.constexpr, PDL: tl.constexpr, DIAG: tl.constexpr = 0,
    BLOCKED: tl.constexpr = False, W_EARLY: tl.constexpr = False,
):
    """Weight tile ``t`` of the launch: weight 0's tiles, then (NW >= 2) weight 1's, then (NW == 3) weight 2's."""
    if NW == 1:
        _gemv_tiles(t, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, N, KW, KW_PER_SPLIT,
                    stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
                    M, FMT, GROUP, HAS_ZP, USE_ASM, BN, BKW, VEC, PREFETCH, STAGES, EVEN_K, ZW, PDL, DIAG, BLOCKED, W_EARLY)
    else:
        if t < T0:
            _gemv_tiles(t, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, N, KW, KW_PER_SPLIT,
                        stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
                        M, FMT, GROUP, HAS_ZP, USE_ASM, BN, BKW, VEC, PREFETCH, STAGES, EVEN_K, ZW, PDL, DIAG, BLOCKED, W_EARLY)
        elif NW == 2 or t < T0 + T1:
            _gemv_tiles(t - T0, pid_k, x_ptr, wp1_ptr, s1_ptr, s1_ptr, gs1_ptr, out1_ptr, N1, KW, KW_PER_SPLIT,
                        stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, so1, som1,
                        M, FMT, GROUP, HAS_ZP, USE_ASM, BN, BKW, VEC, PREFETCH, STAGES, EVEN_K, ZW, PDL, DIAG, BLOCKED, W_EARLY)
        else:
            _gemv_tiles(t - T0 - T1, pid_k, x_ptr, wp2_ptr, s2_ptr, s2_ptr, gs2_ptr, out2_ptr, N2, KW, KW_PER_SPLIT,
                        stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, so2, som2,
                        M, FMT, GROUP, HAS_ZP, USE_ASM, BN, BKW, VEC, PREFETCH, STAGES, EVEN_K, ZW, PDL, DIAG, BLOCKED, W_EARLY)




@triton.jit
def _gemv_tiles(
    pid_n, pid_k, x_ptr, wp_ptr, s_ptr, z_ptr, gs_ptr, out_ptr,
    N, KW, KW_PER_SPLIT,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_sn_u, stride_zn_u, stride_os, stride_om,
    M: tl.constexpr, FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr,
    BN: tl.constexpr, BKW: tl.constexpr, VEC: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
    EVEN_K: tl.constexpr, ZW: tl.constexpr, PDL: tl.constexpr = 0, DIAG: tl.constexpr = 0,
    BLOCKED: tl.constexpr = False, W_EARLY: tl.constexpr = False,
):
    """One program's weight tile of :func:`_gemv_kernel`: output rows ``pid_n * BN + [0, BN)``, K split ``pid_k``.
    ``W_EARLY == 2``: the first tile's lines prefetched to L2 before the wait (:func:`gemv_step._l2_first_tile`).
    ``W_EARLY`` (no cp.async stages): the first tile's weights are loaded before the PDL wait, its step peeled off
    the loop (the same operations in the same order: the same bits)."""
    WPG: tl.constexpr = GROUP // 8  # words per scale group
    ONE_GROUP: tl.constexpr = BKW <= WPG  # the tile lies inside one group
    NG: tl.constexpr = 1 if ONE_GROUP else BKW // WPG  # groups per tile (tiles start on a group boundary)
    GV: tl.constexpr = 1 if ONE_GROUP else max(VEC // WPG, 1)  # groups per thread
    NARROW: tl.constexpr = GV == 1 and not ONE_GROUP
    offs_n = pid_n * BN + tl.arange(0, BN)  # [BN]
    rows = tl.minimum(offs_n, N - 1)  # rows past N re-read row N - 1 (never stored): no load masks
    kw_lo = pid_k * KW_PER_SPLIT
    kw_hi = min(kw_lo + KW_PER_SPLIT, KW)
    # The same index ranges, written so that Triton's alignment analysis sees exactly VEC
    # contiguous words (GV groups) per thread: the word and the group loads then get the
    # same thread layout, and the per-group scales broadcast to words in registers.
    ar = tl.arange(0, BKW)
    ar = (ar // VEC) * VEC + ar % VEC  # [BKW]
    ag = tl.arange(0, NG)
    if STAGES <= 1:
        ag = (ag // GV) * GV + ag % GV  # [NG]
    # With one group per thread (GV == 1) the identity above still reads as contiguous:
    # the group loads then use copies of the row strides that Triton does not specialize
    # (unknown alignment -> one element per thread, the words' thread layout).
    if NARROW and STAGES <= 1:
        stride_sn = stride_sn_u
        stride_zn = stride_zn_u

    accs = ()
    for m in tl.static_range(M):
        accs = accs + (tl.zeros((BN, BKW), dtype=tl.float32),)
    kw_last = kw_lo + ((kw_hi - kw_lo - 1) // BKW) * BKW  # start of the split's last tile
    EARLY: tl.constexpr = W_EARLY == 1 and STAGES <= 1
    L2_TILE: tl.constexpr = W_EARLY == 2 and USE_ASM and not BLOCKED  # gemv_config.L2_FIRST
    if L2_TILE:  # the first tile's lines on their way into L2 while the kernel before finishes; nothing held
        _l2_first_tile(wp_ptr, rows, kw_lo, KW, stride_wn, BKW)
        pdl.enter(PDL)
    kw_first = kw_lo
    if PREFETCH:
        nxt = _load_tile(wp_ptr, s_ptr, z_ptr, rows, kw_lo, kw_hi, ar, ag, stride_wn, stride_sn, stride_zn,
                         FMT, WPG, ONE_GROUP, HAS_ZP, EVEN_K, ZW, BLOCKED, VEC)
        if EARLY:
            pdl.enter(PDL)
    elif EARLY:  # the first step peeled: its weights in flight while the kernel before finishes
        w, sg, zg = _load_tile(wp_ptr, s_ptr, z_ptr, rows, kw_lo, kw_hi, ar, ag, stride_wn, stride_sn, stride_zn,
                               FMT, WPG, ONE_GROUP, HAS_ZP, EVEN_K, ZW, BLOCKED, VEC)
        pdl.enter(PDL)
        xs = _x_step(x_ptr, kw_lo + ar, kw_hi, stride_xm, M, EVEN_K)
        accs = _fma_step(accs, xs, w, sg, zg, M, FMT, USE_ASM, BN, BKW, NG, ONE_GROUP, DIAG)
        kw_first = kw_lo + BKW
    for kw0 in tl.range(kw_first, kw_hi, BKW, num_stages=STAGES):
        # x first (L1/L2 hits, independent of the decode below): 4 bf16 pairs per word and token
        xs = _x_step(x_ptr, kw0 + ar, kw_hi, stride_xm, M, EVEN_K)
        if PREFETCH:  # the next tile (the last one again at the end: in bounds, unused)
            w, sg, zg = nxt
            nxt = _load_tile(wp_ptr, s_ptr, z_ptr, rows, min(kw0 + BKW, kw_last), kw_hi, ar, ag,
                             stride_wn, stride_sn, stride_zn, FMT, WPG, ONE_GROUP, HAS_ZP, EVEN_K, ZW,
                             BLOCKED, VEC)
        else:
            w, sg, zg = _load_tile(wp_ptr, s_ptr, z_ptr, rows, kw0, kw_hi, ar, ag, stride_wn, stride_sn, stride_zn,
                                   FMT, WPG, ONE_GROUP, HAS_ZP, EVEN_K, ZW, BLOCKED, VEC)
        accs = _fma_step(accs, xs, w, sg, zg, M, FMT, USE_ASM, BN, BKW, NG, ONE_GROUP, DIAG)

    pdl.leave(PDL)  # the sums and stores left: the next kernel may place its programs
    if FMT == 0:
        factor = 65536.0 / tl.load(gs_ptr).to(tl.float32)
    elif FMT == 1:
        factor = 65536.0
    else:
        factor = 1.0
    for m in tl.static_range(M):
        y = tl.sum(accs[m], axis=1) * factor  # [BN]
        tl.store(out_ptr + pid_k * stride_os + m * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


# ---------------------------------------------------------------------------
class GemvLaunch(typing.NamedTuple):
    """One GEMV launch as :func:`launch_gemv` makes it (the sm_90 build tests compile exactly these arguments)."""

    kernel: object  # _gemv_kernel
    grid: tuple
    args: tuple  # positional runtime arguments
    constexprs: dict
    num_warps: int
    num_stages: int
    out: torch.Tensor  # where the kernel writes: y, or fp32 partials [S, M, N]
    y: torch.Tensor  # [M, N]
    split: int
    rest: tuple = ()  # (out, y) of the group's other weights (launch_gemv_group)
    # Triton's FP contraction (FFMA from a multiply and an add), on as at any default launch: the sm_90 build tests
    # compile with it too (``tests/kernels/sm90_sass.compile_launch``) -- it changes the registers (the one-row
    # configs: 96 with it, 119 without)
    fp_fusion: bool = True


def gemv_launch(x2: torch.Tensor, pw, cfg: GemvConfig, *, use_asm: bool = True, epi=None,
                more: tuple = ()) -> GemvLaunch:
    """The launch :func:`launch_gemv` runs (buffers allocated, nothing launched); ``more``: up to two more
    weights of ``pw``'s K, format and group read from the same x in the same launch (:func:`launch_gemv_group`)."""
    m, k = x2.shape
    if len(more) > 2 or any(p.k != pw.k or p.fmt != pw.fmt or p.group != pw.group for p in more) or \
            (more and pw.fmt == FMT_INT4):
        raise ValueError("gemv_launch: more takes up to two FP4 weights of the first one's K, format and group")
    if not 1 <= m <= GEMV_LIMIT_M:
        raise ValueError(f"launch_gemv: M={m} rows; the GEMV serves 1..{GEMV_LIMIT_M} (use wo_gemm.launch_fwd)")
    if x2.dtype != torch.bfloat16 or k != pw.k:
        raise ValueError(f"launch_gemv: x must be bf16 [M, {pw.k}], got {x2.dtype} {tuple(x2.shape)}")
    kw = k // 8
    x2c = x2.contiguous()
    x32 = x2c.view(torch.int32)  # [M, K/2] bf16 pairs
    zw = False
    if pw.fmt == FMT_INT4:
        s = pw.scale  # [N, G] float
        zw = cfg.stages > 1 and pw.zero is not None and pw.zero.dtype == torch.int32  # [N, G/4] words
        z = (pw.zero if zw else pw.zero.view(torch.int8)) if pw.zero is not None else s
    else:
        s = pw.scale.view(torch.uint8)  # [N, G] e4m3 / e8m0 bytes
        z = s
    gs = pw.gscale if pw.gscale is not None else s
    if pw.group % 8 or (pw.group // 8) & (pw.group // 8 - 1):
        raise ValueError(f"launch_gemv: group size {pw.group} must be 8 * a power of two (use wo_gemm.launch_fwd)")
    bn, bkw, vec = effective_tile(cfg, pw.group)
    if any(p.blocked != pw.blocked for p in more) or (pw.blocked and bkw % 8):
        raise ValueError(f"launch_gemv: blocked words need every weight of a launch blocked and K steps of whole "
                         f"8-word blocks; got blocked {[p.blocked for p in (pw, *more)]}, {bkw}-word steps")
    cfg = GemvConfig(bn, bkw, vec, cfg.warps, cfg.prefetch and cfg.stages <= 1, cfg.waves, cfg.stages, cfg.diag)
    tiles = [triton.cdiv(p.n, cfg.bn) for p in (pw, *more)]
    la = epi.lora_a if epi is not None else None  # a LoRA group's x @ A^T, computed by programs of this launch
    la_progs = lora_a.programs(la.w.shape[0], k, m) if la is not None else 0
    named = split_overrides().get((sum(p.n for p in (pw, *more)), k)) if m == 1 else None  # SPLIT_ENV
    split, per = _gemv_split(cfg, sum(tiles) * cfg.bn, kw, num_sms(x2.device), named, la_progs,
                             whole_waves=m == 1 and pw.fmt != FMT_INT4)  # one split for the whole group

    def buffers(n):
        y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
        out = y if split == 1 else torch.empty((split, m, n), device=x2.device, dtype=torch.float32)
        return y, out, (0, y.stride(0)) if split == 1 else (out.stride(0), out.stride(1))

    y, out, (so, som) = buffers(pw.n)
    if la is not None:
        la.check(m, k)
        la_args = (x2c, la.w, la.out, la.w.shape[0], lora_a.k_per_split(k, m), la_progs, la.w.stride(0),
                   la.out.stride(0), la.out.stride(1))
    else:
        la_args = (x32, x32, x32, 0, 0, 0, 0, 0, 0)
    rest, w_args = [], []
    for j in range(2):  # the group's other weights (or placeholders that no program reads)
        if j < len(more):
            p = more[j]
            yj, oj, (soj, somj) = buffers(p.n)
            rest.append((oj, yj))
            w_args += [p.words, p.scale.view(torch.uint8), p.gscale if p.gscale is not None else s, oj, p.n,
                       tiles[0] if j == 0 else tiles[1], soj, somj]
        else:
            w_args += [pw.words, s, gs, out, 0, 0, 0, 0]
    args = (x32, pw.words, s, z, gs, out, pw.n, kw, per,
            x32.stride(0), pw.words.stride(0), s.stride(0), z.stride(0), s.stride(0), z.stride(0), so, som, *la_args,
            *w_args)
    const = {"M": m, "FMT": pw.fmt, "GROUP": pw.group, "HAS_ZP": pw.fmt == FMT_INT4 and pw.zero is not None,
             "USE_ASM": use_asm and not interpreting(), "BN": bn, "BKW": bkw, "VEC": vec, "PREFETCH": cfg.prefetch,
             "STAGES": cfg.stages, "EVEN_K": kw % bkw == 0, "ZW": zw, "HAS_LA": la is not None, "LA_BR": lora_a.BR,
             "LA_BK": lora_a.BK, "NW": 1 + len(more), "PDL": pdl.mode(x2.device), "DIAG": cfg.diag,
             "BLOCKED": pw.blocked}
    const["W_EARLY"] = const["PDL"] != pdl.OFF and w_early()
    grid = (la_progs + sum(tiles), split)  # the A programs first: scheduled in the first wave
    return GemvLaunch(_gemv_kernel, grid, args, const, cfg.warps, cfg.stages, out, y, split, tuple(rest))


def launch_gemv(x2: torch.Tensor, pw, cfg: GemvConfig, *, use_asm: bool = True, epi=None) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T on CUDA cores; ``pw`` is a ``wo_gemm.PackedWeight``.

    M must be 1..``GEMV_LIMIT_M`` (each M compiles its own kernel: the token loop is
    unrolled); x2 must be bf16 (its rows are read as int32 pairs). ``epi``: what the last pass adds
    (``launch.Epilogue``); its ``lora_a`` (a LoRA group's ``x @ A^T``) is computed by extra programs of this
    launch (``lora_a.lora_a_program``), ahead of the weight tiles."""
    la = gemv_launch(x2, pw, cfg, use_asm=use_asm, epi=epi)
    la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps, num_stages=la.num_stages,
                       enable_fp_fusion=la.fp_fusion, launch_pdl=la.constexprs["PDL"] != pdl.OFF)
    return finish(la.out, la.y, la.split, epi)  # split partials summed (+ bias / LoRA epilogue)


def launch_gemv_group(x2: torch.Tensor, pws: list, cfg: GemvConfig, epis: list, *, use_asm: bool = True,
                      gate_act: bool = False, rope=None) -> list[torch.Tensor]:
    """:func:`launch_gemv` for two or three FP4 weights that read the same ``x2`` (a LoRA group's q/k/v or gate/up):
    one launch of all their tiles (and ``epis[0].lora_a``'s A programs), then the weights' last passes with their
    ``epis[j]`` (one launch for all: ``group_pass.finish_group``; ``rope``, a ``group_pass.RopeCache``: q/k/v's decode-step
    RoPE and K/V write there too, ``[q_rot]`` returned). ``gate_act``: the second weight's pass writes ``silu(y_0) * y_1`` (``launch.Epilogue.gate``)."""
    la = gemv_launch(x2, pws[0], cfg, use_asm=use_asm, epi=epis[0], more=tuple(pws[1:]))
    la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps, num_stages=la.num_stages,
                       enable_fp_fusion=la.fp_fusion, launch_pdl=la.constexprs["PDL"] != pdl.OFF)
    return finish_group([(la.out, la.y), *la.rest], la.split, epis, gate_act, rope)


def group_supported(x2: torch.Tensor, pws: list) -> bool:
    """True when :func:`launch_gemv_group` runs these weights: 2-3 FP4 weights of one K, format and group, and an
    x the GEMV serves by default (one row: ``GEMV_GROUP_MAX_M``)."""
    p0 = pws[0]
    return (2 <= len(pws) <= 3 and x2.shape[0] <= GEMV_GROUP_MAX_M and p0.fmt != FMT_INT4
            and all(p.k == p0.k and p.fmt == p0.fmt and p.group == p0.group for p in pws)
            and all(gemv_supported(x2, p) for p in pws))


__all__ = [
    "FMT_INT4", "FMT_MXFP4", "FMT_NVFP4", "GEMV_CONFIGS", "GEMV_GROUP_MAX_M", "GEMV_LIMIT_M", "GEMV_MAX_M",
    "GemvConfig", "GemvLaunch", "default_gemv_config", "effective_tile", "gemv_launch", "gemv_supported",
    "group_supported", "launch_gemv", "launch_gemv_group",
]
