"""Decode GEMV for weight-only 4-bit weights: ``y = x @ W^T`` for M <= 16 tokens on CUDA cores.

Why a second forward kernel. At small M the product is memory-bound (0.53-0.56
bytes per weight against 2*M flops), so the job is to stream the packed weight at
HBM speed. The tensor-core path (``wo_gemm._fwd_kernel``) pays for moving every
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
    LARGE_WEIGHTS,
    LONG_K,
    M1_ENV,
    W_EARLY_ENV,
    GemvConfig,
    _gemv_split,
    default_gemv_config,
    effective_tile,
    gemv_supported,
    h200_defaults,
    m1_overrides,
    w_early,
)
from quarl_kernels.group_pass import finish_group
from quarl_kernels.launch import finish, interpreting, num_sms
from quarl_kernels.lora_a import lora_a_program

# ---------------------------------------------------------------------------
# Inline PTX: $0..$7 = the fp32 values of codes 0..7 of the word $8 (natural order).
#
# FP4 ($9 = S as fp32 bits: {lo 16 bits: 0, hi: bf16 S}). Pair j holds codes j (low
# half) and j + 4 (high half) as bf16 ``e2m1 * 2**-126`` (see dequant.py for the
# and / mul / and placement). ``fma.rn.bf16x2 d, a, {0, S}, 0``: the high half of d
# is ``a.hi * S`` (exact), the low half ``a.lo * 0 + 0 = +0`` -- so d *is* the fp32
# of code j + 4. For code j, the low half is first broadcast ({l, l}).
_FP4_GEMV_PAIR = """
    and.b32 a, {src}, {mask};
    mul.lo.u32 a, a, {mul};
    and.b32 a, a, 0x81C081C0;
    fma.rn.bf16x2 ${hi}, a, $9, z;
    mov.b32 {{l, h}}, a;
    mov.b32 a, {{l, l}};
    fma.rn.bf16x2 ${lo}, a, $9, z;"""


def _fp4_gemv_asm() -> str:
    body = []
    for j in range(4):
        src = "$8" if j < 2 else "w8"
        mask, mul = ("0x000F000F", "0x1040") if j % 2 == 0 else ("0x00F000F0", "0x104")
        body.append(_FP4_GEMV_PAIR.format(src=src, mask=mask, mul=mul, lo=j, hi=j + 4))
    return "{\n .reg .b32 w8, a, z;\n .reg .b16 l, h;\n mov.b32 z, 0;\n shr.u32 w8, $8, 8;" + "".join(body) + "\n}"


# INT4 ($9 = Z as fp32 bits: {lo: 0, hi: bf16 -(136 + zero)}). Pair j is the bf16 pair
# (128 + u_j, 128 + u_{j+4}); ``fma.rn.bf16x2 d, t, {0, 1.0}, Z`` gives the high half
# ``128 + u - 136 - zero = u - 8 - zero`` exactly and a +0 low half.
_INT4_GEMV_PAIR = """
    {shift}
    lop3.b32 a, a, 0x000F000F, 0x43004300, 0xEA;
    fma.rn.bf16x2 ${hi}, a, one, $9;
    mov.b32 {{l, h}}, a;
    mov.b32 a, {{l, l}};
    fma.rn.bf16x2 ${lo}, a, one, $9;"""


def _int4_gemv_asm() -> str:
    body = []
    for j in range(4):
        shift = "mov.b32 a, $8;" if j == 0 else f"shr.u32 a, $8, {4 * j};"
        body.append(_INT4_GEMV_PAIR.format(shift=shift, lo=j, hi=j + 4))
    return "{\n .reg .b32 a, one;\n .reg .b16 l, h;\n mov.b32 one, 0x3F800000;" + "".join(body) + "\n}"


FP4_GEMV_ASM = tl.constexpr(_fp4_gemv_asm())
INT4_GEMV_ASM = tl.constexpr(_int4_gemv_asm())


# ---------------------------------------------------------------------------
@triton.jit
def _e2m1_value(code):
    """Portable: E2M1 ``code`` (int32, 0..15) -> its fp32 value."""
    mag = code & 7
    normal = ((mag << 22) + 0x3F000000).to(tl.float32, bitcast=True)  # 2**(e-1) * (1 + m/2), e >= 1
    val = tl.where(mag < 2, mag.to(tl.float32) * 0.5, normal)
    return tl.where((code & 8) != 0, -val, val)


@triton.jit
def _decode_fp4_fp32(w, s_bits, USE_ASM: tl.constexpr):
    """int32 words [..] and S bits [..] (fp32 ``scale * 2**110``) -> 8 fp32 ``e2m1 * scale * 2**-16``."""
    if USE_ASM:
        d = tl.inline_asm_elementwise(FP4_GEMV_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w, s_bits],
                                      dtype=(tl.int32,) * 8, is_pure=True, pack=1)
        return (d[0].to(tl.float32, bitcast=True), d[1].to(tl.float32, bitcast=True),
                d[2].to(tl.float32, bitcast=True), d[3].to(tl.float32, bitcast=True),
                d[4].to(tl.float32, bitcast=True), d[5].to(tl.float32, bitcast=True),
                d[6].to(tl.float32, bitcast=True), d[7].to(tl.float32, bitcast=True))
    else:
        s = s_bits.to(tl.float32, bitcast=True) * 1.1754943508222875e-38  # * 2**-126: scale * 2**-16, exact
        return (_e2m1_value(w & 15) * s, _e2m1_value((w >> 4) & 15) * s,
                _e2m1_value((w >> 8) & 15) * s, _e2m1_value((w >> 12) & 15) * s,
                _e2m1_value((w >> 16) & 15) * s, _e2m1_value((w >> 20) & 15) * s,
                _e2m1_value((w >> 24) & 15) * s, _e2m1_value((w >> 28) & 15) * s)


@triton.jit
def _decode_int4_fp32(w, z_bits, USE_ASM: tl.constexpr):
    """int32 words [..] and Z bits [..] (fp32 ``-(136 + zero)``) -> 8 fp32 ``u - 8 - zero``."""
    if USE_ASM:
        d = tl.inline_asm_elementwise(INT4_GEMV_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w, z_bits],
                                      dtype=(tl.int32,) * 8, is_pure=True, pack=1)
        return (d[0].to(tl.float32, bitcast=True), d[1].to(tl.float32, bitcast=True),
                d[2].to(tl.float32, bitcast=True), d[3].to(tl.float32, bitcast=True),
                d[4].to(tl.float32, bitcast=True), d[5].to(tl.float32, bitcast=True),
                d[6].to(tl.float32, bitcast=True), d[7].to(tl.float32, bitcast=True))
    else:
        z = z_bits.to(tl.float32, bitcast=True) + 128.0
        return (((w & 15).to(tl.float32) + z), (((w >> 4) & 15).to(tl.float32) + z),
                (((w >> 8) & 15).to(tl.float32) + z), (((w >> 12) & 15).to(tl.float32) + z),
                (((w >> 16) & 15).to(tl.float32) + z), (((w >> 20) & 15).to(tl.float32) + z),
                (((w >> 24) & 15).to(tl.float32) + z), (((w >> 28) & 15).to(tl.float32) + z))


@triton.jit
def _load_tile(wp_ptr, s_ptr, z_ptr, rows, kw0, kw_hi, ar, ag,
               stride_wn, stride_sn, stride_zn,
               FMT: tl.constexpr, WPG: tl.constexpr, ONE_GROUP: tl.constexpr, HAS_ZP: tl.constexpr,
               EVEN_K: tl.constexpr, ZW: tl.constexpr, BLOCKED: tl.constexpr = False, VEC: tl.constexpr = 1):
    """Raw loads of one K step at word ``kw0``: words [BN, BKW] i32 and the tile's
    group values: FP4 scale bytes (i32), INT4 fp32 scales and zero points (i32) --
    [BN] when the tile sits inside one group, else [BN, NG]. With ``ZW`` the INT4
    zero points come as their int32 view [N, G/4] (4-byte loads can be cp.async'd).
    BLOCKED: the words in ``quarl.quant.packed_layout``'s [64, 8] blocks (``stride_wn`` = KW)."""
    offs_kw = kw0 + ar  # [BKW] words
    if BLOCKED:  # kw0 % 8 == 0 (BKW % 8 == 0, VEC <= 8): a thread's VEC words lie in one block row, contiguous
        # and VEC-aligned -- which the alignment analysis cannot derive through the signed // and %, so it is told
        # (else the 16-byte loads become 4-byte ones)
        wrow = (rows // 64) * (stride_wn * 64) + (rows % 64) * 8  # [BN]
        wcol = tl.max_contiguous(tl.multiple_of((kw0 // 8) * 512 + (ar // 8) * 512 + ar % 8, VEC), VEC)  # [BKW]
        wptr = wp_ptr + wrow[:, None] + wcol[None, :]
    else:
        wptr = wp_ptr + rows[:, None] * stride_wn + offs_kw[None, :]
    if EVEN_K:
        w = tl.load(wptr)  # [BN, BKW]
    else:
        w = tl.load(wptr, mask=(offs_kw < kw_hi)[None, :], other=0)
    if ONE_GROUP:
        g = kw0 // WPG  # one group: a [BN] vector
        sp = s_ptr + rows * stride_sn + g
        zp = z_ptr + rows * stride_zn + (g // 4 if ZW else g)
        zshift = (g % 4) * 8
        g_ok = g * WPG < kw_hi
    else:
        offs_g = kw0 // WPG + ag  # [NG]; ag has contiguity VEC / WPG, like the words per thread
        sp = s_ptr + rows[:, None] * stride_sn + offs_g[None, :]
        zp = z_ptr + rows[:, None] * stride_zn + (offs_g // 4 if ZW else offs_g)[None, :]
        zshift = ((offs_g % 4) * 8)[None, :]
        g_ok = (offs_g * WPG < kw_hi)[None, :]
    # K % GROUP == 0: a group is wholly live or wholly past kw_hi (only without EVEN_K)
    if FMT == 2:
        if EVEN_K:
            sg = tl.load(sp).to(tl.float32)
        else:
            sg = tl.load(sp, mask=g_ok, other=0).to(tl.float32)
        if HAS_ZP:
            if EVEN_K:
                zg = tl.load(zp).to(tl.int32)
            else:
                zg = tl.load(zp, mask=g_ok, other=0).to(tl.int32)
            if ZW:  # the int8 byte of the word, sign-extended
                zg = (((zg >> zshift) & 0xFF) ^ 0x80) - 0x80
        else:
            zg = tl.zeros(sg.shape, tl.int32)
    else:
        if EVEN_K:
            sg = tl.load(sp).to(tl.int32)
        else:
            sg = tl.load(sp, mask=g_ok, other=0).to(tl.int32)
        zg = sg
    return w, sg, zg


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
    kernel of a decode step writes weights, and the wait still precedes every read of x and every store."""
    EARLY: tl.constexpr = W_EARLY and STAGES <= 1
    if not EARLY:
        pdl.enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if HAS_LA:
        if pid_n < LA_PROGS:
            if pid_k == 0:
                if EARLY:
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
def _x_step(x_ptr, offs_kw, kw_hi, stride_xm, M: tl.constexpr, EVEN_K: tl.constexpr):
    """x of one K step for each of the M tokens: 4 int32 bf16 pairs per word [BKW] (masked past ``kw_hi``)."""
    xs = ()
    for m in tl.static_range(M):
        xr = x_ptr + m * stride_xm + offs_kw * 4  # [BKW] pointers to pair 0 of each word
        if EVEN_K:
            xs = xs + ((tl.load(xr), tl.load(xr + 1), tl.load(xr + 2), tl.load(xr + 3)),)
        else:
            k_ok = offs_kw < kw_hi
            xs = xs + ((tl.load(xr, mask=k_ok, other=0), tl.load(xr + 1, mask=k_ok, other=0),
                        tl.load(xr + 2, mask=k_ok, other=0), tl.load(xr + 3, mask=k_ok, other=0)),)
    return xs


@triton.jit
def _fma_step(accs, xs, w, sg, zg, M: tl.constexpr, FMT: tl.constexpr, USE_ASM: tl.constexpr, BN: tl.constexpr,
              BKW: tl.constexpr, NG: tl.constexpr, ONE_GROUP: tl.constexpr, DIAG: tl.constexpr):
    """One K step of :func:`_gemv_tiles`: the tile's words ``w`` [BN, BKW] decoded with their group values (``sg``,
    ``zg``) and accumulated against ``xs`` into each token's ``accs`` [BN, BKW] fp32."""
    # per-group values -> per word [BN, BKW] (a register broadcast)
    if FMT == 0:  # NVFP4: S = e4m3 * 2**110 (exact in bf16: the fp32's low half is 0)
        sv = (sg.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 1.298074214633707e33)
        sv = sv.to(tl.int32, bitcast=True)
    elif FMT == 1:  # MXFP4: S = 2**(e - 17) from the E8M0 byte
        sv = (tl.minimum(sg, 144) + 110) << 23
    else:  # INT4: Z = -(136 + zero) (zero: the int8 byte, sign-extended)
        sv = (-136.0 - zg.to(tl.float32)).to(tl.int32, bitcast=True)
    if ONE_GROUP:
        sw = tl.broadcast_to(sv[:, None], (BN, BKW))
        scw = tl.broadcast_to(sg[:, None], (BN, BKW))
    else:
        sw = tl.broadcast_to(sv[:, :, None], (BN, NG, BKW // NG)).reshape(BN, BKW)
        scw = tl.broadcast_to(sg[:, :, None], (BN, NG, BKW // NG)).reshape(BN, BKW)
    if (DIAG & 3) == 1:  # diagnostic: no decode (the words as floats), the FFMAs and loads as they are
        d0 = (w ^ sw).to(tl.float32, bitcast=True)  # the scale bytes still loaded
        d1, d2, d3, d4, d5, d6, d7 = d0, d0, d0, d0, d0, d0, d0
    elif FMT == 2:
        d0, d1, d2, d3, d4, d5, d6, d7 = _decode_int4_fp32(w, sw, USE_ASM)
    else:
        d0, d1, d2, d3, d4, d5, d6, d7 = _decode_fp4_fp32(w, sw, USE_ASM)
    new = ()
    for m in tl.static_range(M):
        x01, x23, x45, x67 = xs[m]  # [BKW] i32 bf16 pairs -> fp32 (low half = even element)
        # FP4 weights carry their scale: FFMA straight into the accumulator. INT4: a per-word
        # partial first (starts with an FMUL), then one FFMA by the fp32 group scale.
        if FMT == 2:
            p = d0 * (x01 << 16).to(tl.float32, bitcast=True)[None, :]
        else:
            p = accs[m] + d0 * (x01 << 16).to(tl.float32, bitcast=True)[None, :]
        p += d1 * (x01 & -65536).to(tl.float32, bitcast=True)[None, :]
        p += d2 * (x23 << 16).to(tl.float32, bitcast=True)[None, :]
        p += d3 * (x23 & -65536).to(tl.float32, bitcast=True)[None, :]
        p += d4 * (x45 << 16).to(tl.float32, bitcast=True)[None, :]
        p += d5 * (x45 & -65536).to(tl.float32, bitcast=True)[None, :]
        p += d6 * (x67 << 16).to(tl.float32, bitcast=True)[None, :]
        p += d7 * (x67 & -65536).to(tl.float32, bitcast=True)[None, :]
        if FMT == 2:
            new = new + (accs[m] + scw * p,)
        else:
            new = new + (p,)
    if (DIAG & 3) == 2:  # diagnostic: the loads alone (one add per word keeps them), no decode, no x, no FFMAs
        new = ()
        for m in tl.static_range(M):
            new = new + (accs[m] + (w ^ sw).to(tl.float32, bitcast=True),)
    return new


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
    EARLY: tl.constexpr = W_EARLY and STAGES <= 1
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
    split, per = _gemv_split(cfg, sum(tiles) * cfg.bn, kw, num_sms(x2.device))  # one split for the whole group

    def buffers(n):
        y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
        out = y if split == 1 else torch.empty((split, m, n), device=x2.device, dtype=torch.float32)
        return y, out, (0, y.stride(0)) if split == 1 else (out.stride(0), out.stride(1))

    y, out, (so, som) = buffers(pw.n)
    la = epi.lora_a if epi is not None else None  # a LoRA group's x @ A^T, computed by programs of this launch
    if la is not None:
        la.check(m, k)
        la_progs = lora_a.programs(la.w.shape[0], k, m)
        la_args = (x2c, la.w, la.out, la.w.shape[0], lora_a.k_per_split(k, m), la_progs, la.w.stride(0),
                   la.out.stride(0), la.out.stride(1))
    else:
        la_progs, la_args = 0, (x32, x32, x32, 0, 0, 0, 0, 0, 0)
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
                       launch_pdl=la.constexprs["PDL"] != pdl.OFF)
    return finish(la.out, la.y, la.split, epi)  # split partials summed (+ bias / LoRA epilogue)


def launch_gemv_group(x2: torch.Tensor, pws: list, cfg: GemvConfig, epis: list, *, use_asm: bool = True,
                      gate_act: bool = False, rope=None) -> list[torch.Tensor]:
    """:func:`launch_gemv` for two or three FP4 weights that read the same ``x2`` (a LoRA group's q/k/v or gate/up):
    one launch of all their tiles (and ``epis[0].lora_a``'s A programs), then the weights' last passes with their
    ``epis[j]`` (one launch for all: ``group_pass.finish_group``; ``rope``, a ``group_pass.RopeCache``: q/k/v's decode-step
    RoPE and K/V write there too, ``[q_rot]`` returned). ``gate_act``: the second weight's pass writes ``silu(y_0) * y_1`` (``launch.Epilogue.gate``)."""
    la = gemv_launch(x2, pws[0], cfg, use_asm=use_asm, epi=epis[0], more=tuple(pws[1:]))
    la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps, num_stages=la.num_stages,
                       launch_pdl=la.constexprs["PDL"] != pdl.OFF)
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
