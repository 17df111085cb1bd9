"""In-register dequantization of 4-bit weights to BF16 for Triton GEMM kernels.

All three weight-only formats share one packed view: a row of K 4-bit codes is
K/8 little-endian int32 *words*, code ``t`` of a word in bits ``4t..4t+3``.
That is compressed-tensors' int4 ``pack_to_int32`` layout as-is, and also the
FP4 layout (``uint8 [N, K/2]``, even column in the low nibble) reinterpreted
as ``int32 [N, K/8]`` -- so one loader serves NVFP4, MXFP4 and INT4 and no
weight is ever repacked or copied.

A word decodes to 8 BF16 values in four *pairs* ``(code j, code j+4)``: those
two codes sit at the same offset of the word's two 16-bit halves, so one
32-bit integer op places both, and one packed ``bf16x2`` FMA scales both
(the trick Marlin-style kernels use; here without any offline permutation,
the pairs are re-interleaved in registers). Per pair:

  FP4 (E2M1, s e1 e0 m): sign bit -> bf16 bit 15, (e1 e0 m) -> bf16 bits 8..6.
      The bf16 then holds ``e2m1 * 2**-126`` *exactly* (code 0bx001, 0.5, lands
      on a bf16 subnormal, which bf16 FMA keeps), and a single ``bf16x2``
      multiply by ``S = block_scale * 2**110`` gives ``w * 2**-16`` exactly.
      4 integer ops + 1 FMA per pair.
  INT4 (u in 0..15, zero point z): ``0x4300 | u`` is the bf16 ``128 + u``;
      ``(128 + u) - (128 + z)`` is exact, then one multiply by the group scale
      rounded to bf16. 2 integer ops + 2 FMAs per pair.

Exactness. For NVFP4 the kernel's weights are ``e2m1 * e4m3 * 2**-16`` --
exact in bf16 (at most 6 significant bits) -- and the tensor factor
``2**16 / weight_global_scale`` is applied once to the fp32 accumulator, so
the kernel is *more* accurate than the reference (which rounds
``e2m1 * e4m3 / gs`` to bf16 per element). MXFP4 is exact for block
exponents in [2**-110, 2**17] (weights below ~1e-33 flush to 0). INT4 rounds
the fp32 group scale to bf16 first (<= 2**-9 relative per weight, ~30x below
the int4 step), the single deviation from the fp32 reference.

Two implementations produce bit-identical tiles: ``USE_ASM`` (inline PTX,
sm_80+, the fast path) and a portable one in plain Triton ops (fp32 math,
no subnormal tricks), which also runs under ``TRITON_INTERPRET=1`` on CPU
and is what the CPU tests exercise.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4, FORMAT_IDS  # noqa: F401

# The accumulator factor that undoes the 2**-16 folded into FP4 tile scales.
FP4_ACC_FACTOR = 65536.0
# E2M1 value * 2**-126 (the bf16 bit placement) times S must give w * 2**-16.
_FP4_S_EXP = 110  # S = scale * 2**110
_MX_MAX_EXP = 144  # largest E8M0 exponent whose S = 2**(e-17) is a finite bf16

# ---------------------------------------------------------------------------
# Inline PTX. Operands: $0..$7 = the 8 decoded bf16 in *pair order* (code 0, 4,
# 1, 5, 2, 6, 3, 7), $8 = word, $9 = S (bf16), [$10 = 128 + zero, INT4 only].
# "mov.b32 {lo, hi}, h" splits a bf16x2 register into code j (lo) and j+4 (hi);
# outputs $2j, $2j+1 stay the two halves of one register, so the 16-byte shared
# store of a word's 8 values needs no byte permutes.
#
# FP4 pair j: isolate the two codes (A = w & 0x000F000F << 4j, after w >> 8 for
# j >= 2), then ONE multiply copies each code to bits 6..9 and 12..15 of its half
# (A * 0x1040, or * 0x104 for codes at bits 4..7; no carries, the copies do not
# overlap); masking with 0x81C081C0 keeps sign -> bit 15 and (e1 e0 m) -> bits 8..6.
_FP4_PAIR = """
    and.b32 a{j}, {src}, {mask};
    mul.lo.u32 a{j}, a{j}, {mul};
    and.b32 a{j}, a{j}, 0x81C081C0;
    fma.rn.bf16x2 a{j}, a{j}, s2, nz;
    mov.b32 {{$%d, $%d}}, a{j};"""


def _fp4_asm() -> str:
    body = []
    for j in range(4):
        src = "$8" if j < 2 else "w8"
        mask, mul = ("0x000F000F", "0x1040") if j % 2 == 0 else ("0x00F000F0", "0x104")
        body.append(_FP4_PAIR.format(j=j, src=src, mask=mask, mul=mul) % (2 * j, 2 * j + 1))
    return (
        "{\n .reg .b32 s2, nz, w8, a<4>;\n"
        " mov.b32 s2, {$9, $9};\n mov.b32 nz, 0x80008000;\n shr.u32 w8, $8, 8;"
        + "".join(body)
        + "\n}"
    )


# INT4 pair j: t = ((w >> 4j) & 0x000F000F) | 0x43004300 is the bf16 pair (128 + u);
# subtracting 128 + zero is exact, then one rounding multiply by the scale.
_INT4_PAIR = """
    {shift}
    lop3.b32 t{j}, u{j}, 0x000F000F, 0x43004300, 0xEA;
    fma.rn.bf16x2 t{j}, t{j}, one, nzp;
    fma.rn.bf16x2 t{j}, t{j}, s2, nz;
    mov.b32 {{$%d, $%d}}, t{j};"""


def _int4_asm() -> str:
    body = []
    for j in range(4):
        shift = "mov.b32 u0, $8;" if j == 0 else f"shr.u32 u{j}, $8, {4 * j};"
        body.append(_INT4_PAIR.format(j=j, shift=shift) % (2 * j, 2 * j + 1))
    return (
        "{\n .reg .b32 s2, nzp, one, nz, u<4>, t<4>;\n"
        " mov.b32 s2, {$9, $9};\n mov.b32 nzp, {$10, $10};\n xor.b32 nzp, nzp, 0x80008000;\n"
        " mov.b32 one, 0x3F803F80;\n mov.b32 nz, 0x80008000;"
        + "".join(body)
        + "\n}"
    )


FP4_ASM = tl.constexpr(_fp4_asm())
INT4_ASM = tl.constexpr(_int4_asm())


# ---------------------------------------------------------------------------
@triton.jit
def _e2m1_times(code, s32):
    """Portable: E2M1 ``code`` (int32, 0..15) times fp32 ``s32`` -> bf16, exact."""
    mag = code & 7
    # 2**(e-1) * (1 + m/2) for e >= 1 via the exponent field; 0 / 0.5 for e == 0
    normal = ((mag << 22) + 0x3F000000).to(tl.float32, bitcast=True)
    val = tl.where(mag < 2, mag.to(tl.float32) * 0.5, normal)
    val = tl.where((code & 8) != 0, -val, val)
    return (val * s32).to(tl.bfloat16)


@triton.jit
def _decode_fp4_word(w, s, USE_ASM: tl.constexpr):
    """int32 word [..] and bf16 S [..] -> 8 bf16 ``e2m1(code) * S * 2**-126``, pair order."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            FP4_ASM,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,h",
            [w, s],
            dtype=(tl.bfloat16,) * 8,
            is_pure=True,
            pack=1,
        )
    else:
        s32 = s.to(tl.float32) * 1.1754943508222875e-38  # * 2**-126, exact (normal result)
        return (  # pair order: codes 0, 4, 1, 5, 2, 6, 3, 7
            _e2m1_times(w & 15, s32),
            _e2m1_times((w >> 16) & 15, s32),
            _e2m1_times((w >> 4) & 15, s32),
            _e2m1_times((w >> 20) & 15, s32),
            _e2m1_times((w >> 8) & 15, s32),
            _e2m1_times((w >> 24) & 15, s32),
            _e2m1_times((w >> 12) & 15, s32),
            _e2m1_times((w >> 28) & 15, s32),
        )


@triton.jit
def _int4_times(u, z32, s32):
    return ((u.to(tl.float32) - z32) * s32).to(tl.bfloat16)


@triton.jit
def _decode_int4_word(w, s, z, USE_ASM: tl.constexpr):
    """int32 word, bf16 scale S and bf16 ``128 + zero`` -> 8 bf16 ``(u - zero) * S``, pair order."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            INT4_ASM,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h",
            [w, s, z],
            dtype=(tl.bfloat16,) * 8,
            is_pure=True,
            pack=1,
        )
    else:
        s32 = s.to(tl.float32)
        z32 = z.to(tl.float32) - 128.0
        return (  # pair order: codes 0, 4, 1, 5, 2, 6, 3, 7
            _int4_times(w & 15, z32, s32),
            _int4_times((w >> 16) & 15, z32, s32),
            _int4_times((w >> 4) & 15, z32, s32),
            _int4_times((w >> 20) & 15, z32, s32),
            _int4_times((w >> 8) & 15, z32, s32),
            _int4_times((w >> 24) & 15, z32, s32),
            _int4_times((w >> 12) & 15, z32, s32),
            _int4_times((w >> 28) & 15, z32, s32),
        )


@triton.jit
def _row_group_bytes(ptr, rows, g0, row_ok, g_hi, stride_n, NG: tl.constexpr, AS_WORDS: tl.constexpr):
    """Bytes ``t[n, g0 : g0 + NG]`` of a byte tensor [N, G] (FP4 scales, INT4 zero
    points) as int32 0..255, shape [BN, NG]; ``g0`` is a multiple of NG, groups
    >= ``g_hi`` are not read.

    With ``AS_WORDS`` the tensor comes as its int32 view [N, G/4]: each row's distinct
    words are loaded once (4-byte loads pipeline through cp.async; a byte gather is
    one request per group, which outnumbered the weight loads 2:1 for NVFP4, v2
    notes) and the bytes are pulled out in registers."""
    if AS_WORDS:
        if NG >= 4:
            NW: tl.constexpr = NG // 4
            offs_w = g0 // 4 + tl.arange(0, NW)  # [NW]
            wd = tl.load(ptr + rows[:, None] * stride_n + offs_w[None, :],
                         mask=row_ok[:, None] & (offs_w * 4 < g_hi)[None, :], other=0)  # [BN, NW]
            b = (wd[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF  # [BN, NW, 4]
            return b.reshape(rows.shape[0], NG)
        else:  # the NG bytes sit inside one word
            wd = tl.load(ptr + rows * stride_n + g0 // 4, mask=row_ok, other=0)  # [BN]
            return (wd[:, None] >> (((g0 % 4) + tl.arange(0, NG)) * 8)[None, :]) & 0xFF
    else:
        offs_g = g0 + tl.arange(0, NG)
        return tl.load(ptr + rows[:, None] * stride_n + offs_g[None, :],
                       mask=row_ok[:, None] & (offs_g < g_hi)[None, :], other=0).to(tl.int32) & 0xFF


@triton.jit
def word_offsets(rows, kws, stride_wn, BLOCKED: tl.constexpr):
    """Offsets [R, W] of words ``kws`` [W] of rows ``rows`` [R] in row-major words ``[N, KW]`` (``stride_wn`` = KW)
    or, BLOCKED, in ``quarl.quant.packed_layout``'s [64, 8]-word blocks: a 64-row band is ``64 * KW`` words, a
    block 512, a block row 8 contiguous words (32 bytes)."""
    if BLOCKED:
        return ((rows // 64) * (stride_wn * 64) + (rows % 64) * 8)[:, None] + ((kws // 8) * 512 + kws % 8)[None, :]
    return rows[:, None] * stride_wn + kws[None, :]


@triton.jit
def load_dequant_tile(
    wp_ptr, s_ptr, z_ptr,
    offs_n, offs_kw, n_ok, kw_hi,
    stride_wn, stride_sn, stride_zn,
    FMT: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, USE_ASM: tl.constexpr,
    PAIR_ORDER: tl.constexpr, BYTES32: tl.constexpr, BLOCKED: tl.constexpr = False,
):
    """Load and dequantize a weight tile: rows ``offs_n`` [BN], words ``offs_kw`` [BKW]
    (contiguous, starting at a multiple of BKW) -> bf16 [BN, 8*BKW] (times 2**-16 for
    the FP4 formats). ``n_ok`` [BN, 1] masks rows, words >= ``kw_hi`` are off.

    Scales (and INT4 zero points) are contiguous along their group axis; byte-typed
    ones (FP4 scales, zero points) come as int32 views when ``BYTES32``.
    With ``PAIR_ORDER`` the 8 columns of each word come as codes 0, 4, 1, 5, 2, 6, 3, 7
    (no register permutes); the other operand's K rows must then go through
    ``pair_order_rows``. Otherwise columns are in natural K order.

    Masked-off elements decode from word 0 (finite values); callers zero the
    matching activations so they contribute nothing.
    """
    WPG: tl.constexpr = GROUP // 8  # words per scale group
    BKW: tl.constexpr = offs_kw.shape[0]
    BN: tl.constexpr = offs_n.shape[0]
    NG: tl.constexpr = BKW // WPG if WPG <= BKW else 1  # scale groups the tile touches
    mask = n_ok & (offs_kw[None, :] < kw_hi)
    w = tl.load(wp_ptr + word_offsets(offs_n, offs_kw, stride_wn, BLOCKED), mask=mask, other=0)  # [BN, BKW] i32
    g0 = tl.min(offs_kw, axis=0) // WPG  # first group of the tile (a multiple of NG)
    g_hi = (kw_hi + WPG - 1) // WPG  # groups at or past this one hold no live word
    row_ok = n_ok.reshape(BN) & (g0 < g_hi)  # [BN]
    # Per-group values [BN, NG] first, converted once per group, then repeated per word.
    # (A [BN, BKW] gather here would also make Triton lay the tile out N-fastest, which
    # turns the operand's shared-memory stores into 2-byte ones.)
    if FMT == 0:  # NVFP4: e4m3 block scale bits, global scale applied by the caller
        sb = _row_group_bytes(s_ptr, offs_n, g0, row_ok, g_hi, stride_sn, NG, BYTES32)
        s_e4m3 = sb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        s_g = (s_e4m3 * 1.298074214633707e33).to(tl.bfloat16)  # * 2**110, exact
    elif FMT == 1:  # MXFP4: E8M0 exponent e -> S = 2**(e - 17) built from bits
        e = tl.minimum(_row_group_bytes(s_ptr, offs_n, g0, row_ok, g_hi, stride_sn, NG, BYTES32), 144)
        s_g = ((e + 110) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:  # INT4: (u - 8 - zp) * scale; z carries 128 + 8 + zp for the bf16 magic-number trick
        offs_g = g0 + tl.arange(0, NG)
        s_g = tl.load(s_ptr + offs_n[:, None] * stride_sn + offs_g[None, :],
                      mask=row_ok[:, None] & (offs_g < g_hi)[None, :], other=0).to(tl.float32).to(tl.bfloat16)
        if HAS_ZP:
            zb = _row_group_bytes(z_ptr, offs_n, g0, row_ok, g_hi, stride_zn, NG, BYTES32)
            z_g = (((zb ^ 128) - 128) + 136).to(tl.float32).to(tl.bfloat16)  # int8 byte, sign-extended
        else:
            z_g = tl.full((BN, NG), 136, tl.int32).to(tl.float32).to(tl.bfloat16)
    REP: tl.constexpr = BKW // NG  # words per group inside this tile
    s = tl.broadcast_to(s_g[:, :, None], (BN, NG, REP)).reshape(BN, BKW)
    if FMT == 2:
        z = tl.broadcast_to(z_g[:, :, None], (BN, NG, REP)).reshape(BN, BKW)
        p0, p1, p2, p3, p4, p5, p6, p7 = _decode_int4_word(w, s, z, USE_ASM)
    else:
        p0, p1, p2, p3, p4, p5, p6, p7 = _decode_fp4_word(w, s, USE_ASM)
    # p0..p7 = codes 0, 4, 1, 5, 2, 6, 3, 7 of each word
    if PAIR_ORDER:  # tile[8w + 2j + h] = code j + 4h: each register pair stays together
        lo = tl.interleave(tl.interleave(p0, p4), tl.interleave(p2, p6))  # codes 0..3
        hi = tl.interleave(tl.interleave(p1, p5), tl.interleave(p3, p7))  # codes 4..7
        tile = tl.interleave(lo, hi)
    else:  # natural order: tile[8w + t] = code t
        even = tl.interleave(tl.interleave(p0, p1), tl.interleave(p4, p5))  # codes 0, 2, 4, 6
        odd = tl.interleave(tl.interleave(p2, p3), tl.interleave(p6, p7))  # codes 1, 3, 5, 7
        tile = tl.interleave(even, odd)
    if USE_ASM:
        # An opaque identity: keeps Triton 3.6's OptimizeDotOperands from hoisting the
        # shared-memory store of the MMA operand above the interleave reshapes, which
        # builds an illegal 3-D NVMMA layout and aborts compilation. Costs no SASS.
        tile = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tile], dtype=tl.bfloat16, is_pure=True, pack=2)
    return tile


@triton.jit
def pair_order_rows(t):
    """Permute the rows of a [8*W, C] tile within each group of 8 into pair order
    (0, 4, 1, 5, 2, 6, 3, 7) -- what x^T needs to meet a PAIR_ORDER weight tile."""
    R: tl.constexpr = t.shape[0]
    C: tl.constexpr = t.shape[1]
    return tl.permute(t.reshape(R // 8, 2, 4, C), (0, 2, 1, 3)).reshape(R, C)
