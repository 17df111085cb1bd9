"""One K step of the one-row GEMV (``gemv.py``'s kernel): the weights' loads, their decode to fp32 in registers
(inline PTX, with a portable plain-Triton decode that computes the same bits), x's loads and the FFMAs.

Why a module of its own: these are the per-weight instructions the GEMV's speed is made of (``gemv.py``'s
docstring counts them: ~4.6 issue slots a weight at one row against a budget of ~4.4 for HBM speed on an H200),
separate from the program / launch structure around them (tiles, split K, PDL, groups), which changes on its own.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
def _ptx_fp32x8(ASM: tl.constexpr, w, b):
    """One of the decodes above (``ASM``: $0..$7 out, $8 the word, $9 the scale / zero bits) -> its 8 fp32 values."""
    d = tl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w, b], dtype=(tl.int32,) * 8, is_pure=True,
                                  pack=1)
    return (d[0].to(tl.float32, bitcast=True), d[1].to(tl.float32, bitcast=True),
            d[2].to(tl.float32, bitcast=True), d[3].to(tl.float32, bitcast=True),
            d[4].to(tl.float32, bitcast=True), d[5].to(tl.float32, bitcast=True),
            d[6].to(tl.float32, bitcast=True), d[7].to(tl.float32, bitcast=True))


@triton.jit
def _decode_fp4_fp32(w, s_bits, USE_ASM: tl.constexpr):
    """int32 words [..] and S bits [..] (fp32 ``scale * 2**110``) -> 8 fp32 ``e2m1 * scale * 2**-16``."""
    if USE_ASM:
        return _ptx_fp32x8(FP4_GEMV_ASM, w, s_bits)
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
        return _ptx_fp32x8(INT4_GEMV_ASM, w, z_bits)
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
def _l2_first_tile(wp_ptr, rows, kw0, KW, stride_wn, BKW: tl.constexpr):
    """``prefetch.global.L2`` of the 128-byte lines of a tile's words (row-major: a row's BKW words from ``kw0``, one
    line per 32): the bytes a program reads first start for L2 while it waits on the kernel before, with no register
    held across the wait (what ``QUARL_KERNELS_GEMV_W_EARLY=1``'s loads cost: a program an SM). A hint: no fault, no
    result; clamped inside the rows (``rows`` are already < N). The scale bytes (an eighth as many) are not
    prefetched: their pointers cost the registers that keep the programs an SM."""
    NL: tl.constexpr = max(BKW // 32, 1)  # lines per row
    wl = wp_ptr + rows * stride_wn + kw0  # [BN] each row's first word of the tile
    for j in tl.static_range(NL):
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l",
                                  [wl + tl.minimum(j * 32, KW - 1 - kw0)], dtype=tl.int32, is_pure=False, pack=1)
