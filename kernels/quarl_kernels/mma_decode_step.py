"""The layouts and one K step of the mma.sync decode kernel (``mma_decode.py``), and the pieces of them the other
Gluon decode kernels share (``wgmma_decode``, ``wgmma_ring``, ``mixed_gemm``): the word / group / x layouts, a K step's
loads, the packed words decoded into A-fragment registers (inline PTX), x^T permuted into the B operand, the MMA.

Why a module of its own: these are the per-weight instructions and the register layouts four kernels are built from;
each kernel's program structure (tiles, split K, groups, PDL, TMA rings) stays in its own module. ``mma_decode.py``'s
docstring explains the layouts (the K order inside a tile, pair order, ``J = BKW / 4``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from quarl_kernels.dequant import _fp4_asm, _int4_asm

FP4_ASM = gl.constexpr(_fp4_asm())  # word, bf16 S -> 8 bf16 in pair order (codes 0, 4, 1, 5, 2, 6, 3, 7)
INT4_ASM = gl.constexpr(_int4_asm())  # word, bf16 S, bf16 (128 + 8 + zero) -> 8 bf16, pair order


# ---------------------------------------------------------------------------
# Layouts. Bit-level maps (linear layouts): each basis vector says which tensor
# coordinate one bit of (register, lane, warp) index moves. All derive from the
# mma.sync A / B fragment with k_width = 8 (see the module docstring):
#   A [R, BK]:  reg k1 k2 k4 | r8 | k32.. | r(16W)..   lane k8 k16 r1 r2 r4   warp r16..
#   B [BK, NT]: reg k1 k2 k4 | k32.. | n8              lane k8 k16 n1 n2 n4   warp -
@gluon.constexpr_function
def _log2(v):
    assert v > 0 and v & (v - 1) == 0, f"{v} is not a power of two"
    return v.bit_length() - 1


@gluon.constexpr_function
def _word_layout(R, BKW, W):
    """Packed words [R, BKW] (real word order): thread (g, t) of warp w holds rows
    g, g + 8 (+ 16 W i) + 16 w and the J = BKW / 4 contiguous words J t .. J t + J - 1."""
    J = BKW // 4
    reg = [[0, 1 << i] for i in range(_log2(J))] + [[8, 0]] + [[16 * W << i, 0] for i in range(_log2(R // (16 * W)))]
    lane = [[0, J], [0, 2 * J], [1, 0], [2, 0], [4, 0]]
    warp = [[16 << i, 0] for i in range(_log2(W))]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [R, BKW])


@gluon.constexpr_function
def _group_layout(R, BKW, W, WT):
    """[R, BKW / WT, WT]: the word layout with the word index split into (group, word in
    group); a SliceLayout(2, .) of it holds one value per (row, group) a thread needs."""
    J = BKW // 4
    lw = _log2(WT)

    def word(v):  # word-index basis 2**p -> (group, word-in-group) basis
        p = _log2(v)
        return [0, 1 << (p - lw), 0] if p >= lw else [0, 0, 1 << p]

    reg = ([word(1 << i) for i in range(_log2(J))] + [[8, 0, 0]]
           + [[16 * W << i, 0, 0] for i in range(_log2(R // (16 * W)))])
    lane = [word(J), word(2 * J), [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = [[16 << i, 0, 0] for i in range(_log2(W))]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [R, BKW // WT, WT])


@gluon.constexpr_function
def _x_layout(NT, BKW, W):
    """Activations [NT, BKW, 8] (token, real word, code in word), 16-byte loads:
    thread (g, t) holds tokens g, g + 8, .. (NT / 8 of them) and words J t .. J t + J - 1, all 8 codes."""
    J = BKW // 4
    reg = ([[0, 0, 1], [0, 0, 2], [0, 0, 4]] + [[0, 1 << i, 0] for i in range(_log2(J))]
           + [[8 << i, 0, 0] for i in range(_log2(NT // 8))])
    lane = [[0, J, 0], [0, 2 * J, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = [[0, 0, 0] for _ in range(_log2(W))]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [NT, BKW, 8])


@gluon.constexpr_function
def _xcoop_layout(NT, BKW, W):
    """Activations [NT, BKW, 8] split over the CTA (XS): as ``_x_layout``, with the
    token octets spread over the warps first (replicated where W > NT / 8)."""
    J = BKW // 4
    lw = min(_log2(W), _log2(NT // 8))
    reg = ([[0, 0, 1], [0, 0, 2], [0, 0, 4]] + [[0, 1 << i, 0] for i in range(_log2(J))]
           + [[8 << i, 0, 0] for i in range(lw, _log2(NT // 8))])
    lane = [[0, J, 0], [0, 2 * J, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = [[8 << i, 0, 0] for i in range(lw)] + [[0, 0, 0] for _ in range(_log2(W) - lw)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [NT, BKW, 8])


@gluon.constexpr_function
def _xfrag_layout(NT, BKW, W):
    """B fragments as read from shared memory (XS): [NT, 32 J] per token in the order
    (t, p, j, h) of logical k = 32 j + 8 t + 2 p + h -- thread (g, t) reads tokens
    g + 8 i, 8 J contiguous values (two 16-byte loads at J = 2) whose 32-bit pairs
    (p, j = 0), (p, j = 1) are the two B registers of one HMMA as Triton lowers
    k_width = 8 (checked in the SASS: no register moves before the HMMAs)."""
    J = BKW // 4
    reg = [[0, 1 << i] for i in range(_log2(8 * J))] + [[8 << i, 0] for i in range(_log2(NT // 8))]
    lane = [[0, 8 * J], [0, 16 * J], [1, 0], [2, 0], [4, 0]]
    warp = [[0, 0] for _ in range(_log2(W))]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [NT, 32 * J])


# ---------------------------------------------------------------------------
@gluon.jit
def _load_step(wp_ptr, s_ptr, z_ptr, rows_w, offs_w, rows_g, offs_g, kw0, kw_hi,
               stride_wn, stride_sn, stride_zn,
               FMT: gl.constexpr, WPG: gl.constexpr, WT: gl.constexpr, HAS_ZP: gl.constexpr,
               EVEN_K: gl.constexpr, BLOCKED: gl.constexpr = False):
    """Raw loads of one K step at word ``kw0``: words [R, BKW] i32 and the step's group
    values [R, NG] (FP4: scale bytes; INT4: fp32 scales, zero-point bytes). BLOCKED: the words in
    ``quarl.quant.packed_layout``'s [64, 8] blocks (``stride_wn`` = KW): a step's tile is whole 2 KB blocks."""
    kw = kw0 + offs_w  # [BKW]
    if BLOCKED:
        kk = kw[None, :]
        band = (rows_w[:, None] // 64) * (stride_wn * 64) + (rows_w[:, None] % 64) * 8  # [R, 1]
        wptr = wp_ptr + band + (kk // 8) * 512 + kk % 8  # [R, BKW]
    else:
        wptr = wp_ptr + rows_w[:, None] * stride_wn + kw[None, :]  # [R, BKW]
    if WT == WPG:  # whole groups in a step: contiguous group indices (vector loads)
        gi = kw0 // WPG + offs_g  # [NG]
    else:  # the step lies inside one group
        gi = (kw0 + offs_g * WT) // WPG  # [NG]
    sptr = s_ptr + rows_g[:, None] * stride_sn + gi[None, :]  # [R, NG]
    zptr = z_ptr + rows_g[:, None] * stride_zn + gi[None, :]
    if EVEN_K:
        w = gl.load(wptr)
        sg = gl.load(sptr)
        if HAS_ZP:
            zg = gl.load(zptr)
        else:
            zg = sg
    else:  # K tail: words past kw_hi read as 0, their groups too (K % 8 == 0: whole words)
        w = gl.load(wptr, mask=(kw < kw_hi)[None, :], other=0)
        g_ok = (gi * WPG < kw_hi)[None, :]
        sg = gl.load(sptr, mask=g_ok, other=0)
        if HAS_ZP:
            zg = gl.load(zptr, mask=g_ok, other=0)
        else:
            zg = sg
    return w, sg, zg


@gluon.jit
def _x_step(x_ptr, x_off, xw, kw0, kw_hi, EVEN_K: gl.constexpr):
    """Activations of the K step at word ``kw0``: [NT, BKW, 8] bf16, natural order."""
    xp = x_ptr + kw0 * 8 + x_off
    if EVEN_K:
        return gl.load(xp)
    else:  # K tail: activations past kw_hi are 0 (the words there decode to finite values)
        return gl.load(xp, mask=((kw0 + xw) < kw_hi)[None, :, None], other=0.0)


@gluon.jit
def _x_frag(xt, NT: gl.constexpr, J: gl.constexpr):
    """[NT, BKW, 8] natural order -> [NT, 32 J] in shared-memory order (XS): real word
    J t + j, code i + 4 h is logical k = 32 j + 8 t + 2 i + h (the weight's pair order),
    stored at (t, p = i, j, h) (PRMTs in registers)."""
    # [NT, 4 (t), J (j), 2 (h), 4 (i)] -> [NT, 4 (t), 4 (i), J (j), 2 (h)]
    return gl.reshape(gl.permute(gl.reshape(xt, [NT, 4, J, 2, 4]), [0, 1, 4, 2, 3]), [NT, 32 * J])


@gluon.jit
def _x_unfrag(b2, NT: gl.constexpr, J: gl.constexpr, BK: gl.constexpr):
    """[NT, 32 J] in (t, p, j, h) order -> [BK, NT] in logical k order (B operand)."""
    b5 = gl.permute(gl.reshape(b2, [NT, 4, 4, J, 2]), [0, 3, 1, 2, 4])  # [NT, J, 4 (t), 4 (p), 2 (h)]
    return gl.permute(gl.reshape(b5, [NT, BK]), [1, 0])


@gluon.jit
def _per_word(v, LW: gl.constexpr, R: gl.constexpr, BKW: gl.constexpr, WT: gl.constexpr):
    """Group values [R, NG] (SliceLayout(2, group layout)) -> per word [R, BKW] in LW."""
    NG: gl.constexpr = BKW // WT
    v3 = gl.broadcast(gl.expand_dims(v, 2), gl.full([R, NG, WT], 0, v.dtype, v.type.layout.parent))[0]
    return gl.convert_layout(gl.reshape(v3, [R, BKW]), LW)


@gluon.jit
def _decode_step(w, sg, zg, FMT: gl.constexpr, HAS_ZP: gl.constexpr, LW: gl.constexpr, R: gl.constexpr,
                 BKW: gl.constexpr, WT: gl.constexpr):
    """One K step's words [R, BKW] and group scales / zeros -> the 8 codes of every word as bf16
    [R, BKW] each, in pair order (code r + 4 h at output 2 r + h; the PTX of ``dequant.py``).
    Shared by this kernel and ``wgmma_decode``."""
    # group values -> bf16 per group, then per word (register broadcast)
    if FMT == 0:  # NVFP4: S = e4m3 * 2**110 (exact in bf16)
        s_g = (sg.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 1.298074214633707e33).to(gl.bfloat16)
    elif FMT == 1:  # MXFP4: S = 2**(e - 17) from the E8M0 byte
        e = gl.minimum(sg.to(gl.int32), 144)
        s_g = ((e + 110) << 7).to(gl.int16).to(gl.bfloat16, bitcast=True)
    else:  # INT4: bf16 scale, and 128 + 8 + zero for the magic-number subtraction
        s_g = sg.to(gl.bfloat16)
    s = _per_word(s_g, LW, R, BKW, WT)  # [R, BKW]
    if FMT == 2:
        if HAS_ZP:
            z_g = (zg.to(gl.int32) + 136).to(gl.float32).to(gl.bfloat16)
        else:
            z_g = gl.full(sg.shape, 136.0, gl.bfloat16, sg.type.layout)
        z = _per_word(z_g, LW, R, BKW, WT)
        p0, p1, p2, p3, p4, p5, p6, p7 = gl.inline_asm_elementwise(
            INT4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, s, z],
            dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        p0, p1, p2, p3, p4, p5, p6, p7 = gl.inline_asm_elementwise(
            FP4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s],
            dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    return p0, p1, p2, p3, p4, p5, p6, p7


@gluon.jit
def _x_operand(x_ptr, x_off, xw, kw0, kw_hi, EVEN_K: gl.constexpr, NT: gl.constexpr, BK: gl.constexpr,
               J: gl.constexpr, B_L: gl.constexpr):
    """The MMA's B operand [BK, NT] of the step at word ``kw0``: x^T loaded, permuted like the weight tile."""
    xt = _x_step(x_ptr, x_off, xw, kw0, kw_hi, EVEN_K)  # [NT, BKW, 8]
    # [NT, 4 (t), J (j), 2 (h), 4 (i)] -> [NT, J, 4, 4, 2]: logical k = 32 j + 8 t + 2 i + h
    xt = gl.permute(gl.reshape(xt, [NT, 4, J, 2, 4]), [0, 2, 1, 4, 3])
    return gl.convert_layout(gl.permute(gl.reshape(xt, [NT, BK]), [1, 0]), B_L)  # [BK, NT]


@gluon.jit
def _mma_step(acc, b, w, sg, zg, FMT: gl.constexpr, HAS_ZP: gl.constexpr, LW: gl.constexpr, R: gl.constexpr,
              BKW: gl.constexpr, WT: gl.constexpr, J: gl.constexpr, BK: gl.constexpr, A_L: gl.constexpr,
              DIAG: gl.constexpr):
    """One K step: the words ``w`` decoded with their group values into the A operand, ``acc += a @ b``."""
    if (DIAG & 3) == 1:  # diagnostic: one conversion instead of the decode (wrong results), the rest the same
        pz = (w ^ _per_word(sg.to(gl.int32), LW, R, BKW, WT)).to(gl.bfloat16)  # the scale bytes still loaded
        p0, p1, p2, p3, p4, p5, p6, p7 = pz, pz, pz, pz, pz, pz, pz, pz
    else:
        p0, p1, p2, p3, p4, p5, p6, p7 = _decode_step(w, sg, zg, FMT, HAS_ZP, LW, R, BKW, WT)
    # [R, BKW, a, b, c] = p[a + 2b + 4c] -> [R, BKW, 8] in pair order (e = a + 2b + 4c)
    q = gl.join(gl.join(gl.join(p0, p1), gl.join(p2, p3)), gl.join(gl.join(p4, p5), gl.join(p6, p7)))
    q = gl.reshape(gl.permute(q, [0, 1, 4, 3, 2]), [R, 4, J, 8])  # real word = J t + j
    a = gl.convert_layout(gl.reshape(gl.permute(q, [0, 2, 1, 3]), [R, BK]), A_L)  # logical k = 32 j + 8 t + e
    return mma_v2(a, b, acc)
