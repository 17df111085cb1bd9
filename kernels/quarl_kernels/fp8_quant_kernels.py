"""The Triton kernels of ``fp8_quant.py``: the 1x128 / 128x1 activation quantizer (``_act_kernel``; X^T by column
chunks or split off into ``_act_t_kernel``) and the 128x128 weight-tile quantizer (``_tile_kernel``), with their
shared scale / code helpers (``_scale``, ``_codes``; ``fp8_swiglu`` and the Gluon forms reuse them).

Why a module of its own: ``fp8_quant.py`` chooses and launches (settings, the run-time tuning, the output checks);
these are the kernels it launches, unchanged (the same sm_90 SASS as when they lived there). ``fp8_quant`` re-exports
every name, so callers go on writing ``fp8_quant._scale``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quarl_kernels import group_div, pdl
from quarl_kernels.rounding import FP8_MAX, FP32_EPS, INV_FP8_MAX, round_to_fp8


@triton.jit
def _scale(amax, SCALE_RECIP: tl.constexpr):
    """amax (fp32) -> scale = amax / 448 as the reference computes it on this device; eps if 0."""
    if SCALE_RECIP:  # CUDA PyTorch: amax / 448.0 == amax * fp32(1/448)
        s = amax * INV_FP8_MAX
    else:
        s = tl.math.div_rn(amax, FP8_MAX)
    return tl.where(s == 0.0, FP32_EPS, s)


@triton.jit
def _codes(x, s, INTERPRET: tl.constexpr):
    """fp32 x / s (correctly rounded), clamped to +-448, cast RNE to E4M3. ``s`` is the group's scale (from the
    amax of the x it divides), given before its broadcast: on the GPU its reciprocal is made once per group and each
    element pays div.rn's fast path without the reciprocal, its range check or its branch (``group_div``); the
    clamp is the cast's own saturation (``satfinite``: |x / s| <= 448.0001 rounds to 448 either way, NaN stays
    NaN). The interpreter divides (NumPy: the same correctly rounded quotient)."""
    if INTERPRET:
        q = tl.clamp(tl.math.div_rn(x, s), -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    else:
        sn, y, m = group_div.divisor_parts(s)
        q = group_div.quotient(x, sn, y, m)
    return round_to_fp8(q, INTERPRET)


@triton.jit
def _act_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_xm, stride_xk,
    RQ, CQ, RT,  # rows of q (Mp), columns of q and rows of qt (Kp), columns of qt (Mt)
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: tl.constexpr, COLS: tl.constexpr, SCALE_RECIP: tl.constexpr,
    BLOCK_M: tl.constexpr, SUB: tl.constexpr, INTERPRET: tl.constexpr, PACK_T: tl.constexpr = False,
    TILE: tl.constexpr = False, T_CHUNK: tl.constexpr = 0, PDL: tl.constexpr = 0,
):
    # PDL (pdl.py; the row groups alone, a decode step's quantizer): wait for the kernel that wrote x first
    pdl.enter(PDL)
    # one program: rows [pid_m*BLOCK_M, +BLOCK_M) x columns [pid_k*128, +128) of x, in chunks of SUB
    # rows (a whole 128x128 tile in registers spills); with COLS, BLOCK_M == 128 (one token group).
    # TILE: X^T in 128x128 tiles, one scale for the program's whole tile (st[pid_k, pid_m]) instead of one per
    # column. T_CHUNK > 0: X^T's pass walks the tile in [128 tokens, T_CHUNK columns] chunks (each transposed
    # row 128 contiguous bytes) instead of [SUB tokens, 128 columns] ones (SUB-byte pieces per row); without
    # TILE each chunk then holds whole token groups, so its columns' scales come from the chunk itself
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]
    c_in = cols < K
    c_ok = cols < CQ
    colmax = tl.zeros([128], dtype=tl.float32)
    for i in tl.range(0, BLOCK_M // SUB):
        rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)  # [SUB]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xk,
                    mask=(rows < M)[:, None] & c_in[None, :], other=0.0).to(tl.float32)  # [SUB, 128]; 0 = padding
        if ROWS:  # 1x128 groups along K: one scale per row
            s = _scale(tl.max(tl.abs(x), axis=1), SCALE_RECIP)  # [SUB]
            q = _codes(x, s[:, None], INTERPRET)
            r_ok = rows < RQ
            tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=r_ok[:, None] & c_ok[None, :])
            tl.store(s_ptr + rows * stride_sm + pid_k * stride_sg, s, mask=r_ok)
        if COLS and (TILE or T_CHUNK == 0):
            colmax = tl.maximum(colmax, tl.max(tl.abs(x), axis=0))
    if COLS and T_CHUNK > 0:  # second pass by column chunks (L2 hits): rows of 128 tokens, stored whole
        rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [128]
        if TILE:
            s_tile = _scale(tl.max(colmax, axis=0), SCALE_RECIP)  # scalar: the tile's
        for j in tl.range(0, 128 // T_CHUNK):
            cc = (pid_k * 128 + j * T_CHUNK + tl.arange(0, T_CHUNK)).to(tl.int64)  # [TC]
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cc[None, :] * stride_xk,
                        mask=(rows < M)[:, None] & (cc < K)[None, :], other=0.0).to(tl.float32)  # [128, TC]
            if TILE:
                qc = tl.trans(_codes(x, s_tile, INTERPRET))  # [TC, 128]
            else:
                sc = _scale(tl.max(tl.abs(x), axis=0), SCALE_RECIP)  # [TC]: whole token groups
                qc = tl.trans(_codes(x, sc[None, :], INTERPRET))  # [TC, 128]
                tl.store(st_ptr + cc * stride_stk + pid_m * stride_stg, sc, mask=cc < CQ)
            tl.store(qt_ptr + cc[:, None] * stride_qtk + rows[None, :], qc,
                     mask=(cc < CQ)[:, None] & (rows < RT)[None, :])
        if TILE:
            tl.store(st_ptr + pid_k * stride_stk + pid_m * stride_stg, s_tile)
    elif COLS:  # 1x128 groups along the tokens (128x1 of x): one scale per column of the tile (TILE: the same
        # tile scale for every column, as a vector so the passes below are the same code)
        if TILE:
            sc = tl.zeros([128], dtype=tl.float32) + _scale(tl.max(colmax, axis=0), SCALE_RECIP)  # [128]
        else:
            sc = _scale(colmax, SCALE_RECIP)  # [128]
        if PACK_T:  # the transposed codes as 32-bit words of 4 tokens each: qt_ptr is qt's int32 view
            # (stride_qtk in words). The codes of tokens 4j..4j+3 of a column are shifted into the bytes of
            # one word by a sum over a size-4 axis (disjoint bit fields: the sum is their OR), so the
            # transpose moves 4-byte words, not single bytes (ncu, H200: the byte transpose made this
            # kernel 4x slower than the row groups alone, bound by L1 / shared-memory traffic)
            shift = (tl.arange(0, 4) * 8)[None, :, None]  # [1, 4, 1]
            for i in tl.range(0, BLOCK_M // SUB):
                quad = (pid_m * BLOCK_M + i * SUB) // 4 + tl.arange(0, SUB // 4)  # [SUB/4] word column
                rows3 = (quad * 4).to(tl.int64)[:, None, None] + tl.arange(0, 4)[None, :, None]  # [SUB/4, 4, 1]
                x3 = tl.load(x_ptr + rows3 * stride_xm + cols[None, None, :] * stride_xk,
                             mask=(rows3 < M) & c_in[None, None, :], other=0.0).to(tl.float32)  # [SUB/4, 4, 128]
                c3 = _codes(x3, sc[None, None, :], INTERPRET).to(tl.uint8, bitcast=True).to(tl.int32)
                words = tl.sum(c3 << shift, axis=1)  # [SUB/4, 128]: token 4j + t in byte t
                tl.store(qt_ptr + cols[None, :] * stride_qtk + quad.to(tl.int64)[:, None], words,
                         mask=c_ok[None, :] & (quad * 4 < RT)[:, None])
        else:
            for i in tl.range(0, BLOCK_M // SUB):  # second pass over the tile: an L2 hit, not HBM
                rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)
                x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xk,
                            mask=(rows < M)[:, None] & c_in[None, :], other=0.0).to(tl.float32)
                qc = tl.trans(_codes(x, sc[None, :], INTERPRET))  # [128 (K), SUB (tokens)]
                tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc,
                         mask=c_ok[:, None] & (rows < RT)[None, :])
        if TILE:
            tl.store(st_ptr + pid_k * stride_stk + pid_m * stride_stg, tl.max(sc, axis=0))
        else:
            tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, sc, mask=c_ok)


@triton.jit
def _t_load(x_ptr, pid_m, cols, M, K, stride_xm, stride_xk, T_LOAD: tl.constexpr):
    """x's token group ``pid_m`` at ``cols`` [BC], fp32: [128, BC], or with T_LOAD [BC, 128] (loaded through the
    transposed view: the compiler places the layout change, :func:`_t_store` transposes nothing)."""
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)
    if T_LOAD:
        x = tl.load(x_ptr + cols[:, None] * stride_xk + rows[None, :] * stride_xm,
                    mask=(cols < K)[:, None] & (rows < M)[None, :], other=0.0).to(tl.float32)  # [BC, 128]
    else:
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xk,
                    mask=(rows < M)[:, None] & (cols < K)[None, :], other=0.0).to(tl.float32)  # [128, BC]
    return x


@triton.jit
def _t_colmax(x, T_LOAD: tl.constexpr):
    """|x|'s max over the token group, per column: [BC]."""
    if T_LOAD:
        m = tl.max(tl.abs(x), axis=1)
    else:
        m = tl.max(tl.abs(x), axis=0)
    return m


@triton.jit
def _t_store(qt_ptr, x, sc, pid_m, cols, CQ, RT, stride_qtk, INTERPRET: tl.constexpr, T_LOAD: tl.constexpr):
    """The codes of x (:func:`_t_load`'s) with column scales ``sc`` [BC], stored transposed: qt[cols, tokens]
    (``tl.trans`` of the byte codes, or nothing to transpose with T_LOAD)."""
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)
    if T_LOAD:
        qc = _codes(x, sc[:, None], INTERPRET)  # [BC, 128]
    else:
        qc = tl.trans(_codes(x, sc[None, :], INTERPRET))  # [BC, 128]
    tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc, mask=(cols < CQ)[:, None] & (rows < RT)[None, :])


@triton.jit
def _act_t_kernel(
    x_ptr, qt_ptr, st_ptr,
    M, K, stride_xm, stride_xk, CQ, RT, stride_qtk, stride_stk, stride_stg,
    SCALE_RECIP: tl.constexpr, BLOCK_C: tl.constexpr, INTERPRET: tl.constexpr, TILE: tl.constexpr = False,
    T_LOAD: tl.constexpr = False,
):
    # X^T alone, one pass: a program loads the [128 tokens, BLOCK_C columns] tile once (no second pass, no
    # row groups), reduces it along the tokens and stores its transposed codes. With the row groups in their
    # own launch (_act_kernel, COLS=False) this reads x twice from HBM instead of once; a "split" launch
    # setting (ACT_SETTINGS) is kept only where the two launches time faster than the dual kernel.
    # T_LOAD (session 26): the tile loaded through the transposed view, no tl.trans of the codes (_t_store)
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    if TILE:  # X^T in 128x128 tiles: a program per tile (pid_c counts 128 columns), one scale for it, so an
        # amax pass over its column chunks before the codes pass (L2 hits)
        amax = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.range(0, 128 // BLOCK_C):
            cols = (pid_c * 128 + j * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)  # [BC]
            amax = tl.maximum(amax, _t_colmax(_t_load(x_ptr, pid_m, cols, M, K, stride_xm, stride_xk, T_LOAD), T_LOAD))
        s_tile = _scale(tl.max(amax, axis=0), SCALE_RECIP)  # scalar
        sv = tl.zeros([BLOCK_C], dtype=tl.float32) + s_tile  # [BC], every column the tile's scale
        for j in tl.range(0, 128 // BLOCK_C):
            cols = (pid_c * 128 + j * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
            x = _t_load(x_ptr, pid_m, cols, M, K, stride_xm, stride_xk, T_LOAD)
            _t_store(qt_ptr, x, sv, pid_m, cols, CQ, RT, stride_qtk, INTERPRET, T_LOAD)
        tl.store(st_ptr + pid_c * stride_stk + pid_m * stride_stg, s_tile)
    else:
        cols = (pid_c * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)  # [BC]
        x = _t_load(x_ptr, pid_m, cols, M, K, stride_xm, stride_xk, T_LOAD)
        sc = _scale(_t_colmax(x, T_LOAD), SCALE_RECIP)  # [BC]
        _t_store(qt_ptr, x, sc, pid_m, cols, CQ, RT, stride_qtk, INTERPRET, T_LOAD)
        tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, sc, mask=cols < CQ)


@triton.jit
def _tile_kernel(
    w_ptr, q_ptr, qt_ptr, s_ptr,
    N, K, stride_wn, stride_wk, stride_qn, stride_qtk, stride_sn, stride_sk,
    TRANS: tl.constexpr, SCALE_RECIP: tl.constexpr, SUB: tl.constexpr, INTERPRET: tl.constexpr,
):
    # one program: the 128x128 tile (pid_n, pid_k) of the padded [Np, Kp] weight, in passes of
    # SUB-row chunks (amax, codes, and with TRANS the transposed codes)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)
    amax = tl.zeros([SUB, 128], dtype=tl.float32)
    for i in tl.range(0, 128 // SUB):
        rows = (pid_n * 128 + i * SUB + tl.arange(0, SUB)).to(tl.int64)
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                    mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.abs(w.to(tl.float32)))
    s = _scale(tl.max(tl.max(amax, axis=1), axis=0), SCALE_RECIP)  # scalar
    for i in tl.range(0, 128 // SUB):
        rows = (pid_n * 128 + i * SUB + tl.arange(0, SUB)).to(tl.int64)
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                    mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
        q = _codes(w.to(tl.float32), s, INTERPRET)  # [SUB, 128]
        tl.store(q_ptr + rows[:, None] * stride_qn + cols[None, :], q)
    if TRANS:  # W^T's 128x128 tiles are W's transposed (DGrad's B operand, same bits): a third pass
        # over the tile (L2 hits) with codes of its own. Not the same codes stored twice in one loop:
        # for fp32 input ptxas (CUDA 12.8, Triton 3.6's) miscompiles that loop -- the bytes it stages
        # through shared memory for the transposed store are read from registers before this
        # iteration writes them: W^T's rows k = 1 mod 4 (by the SASS) got stale codes (H100, 2026-11-25;
        # docs/kernels.md "The W^T bug"); tests/kernels/test_fp8_quant_interpreter.py checks the SASS
        for i in tl.range(0, 128 // SUB):
            rows = (pid_n * 128 + i * SUB + tl.arange(0, SUB)).to(tl.int64)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                        mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
            qc = tl.trans(_codes(w.to(tl.float32), s, INTERPRET))  # [128 (K), SUB (N)]
            tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc)
    tl.store(s_ptr + pid_n * stride_sn + pid_k * stride_sk, s)
