"""SwiGLU's elementwise part computed inside the FP8 quantizers of the projections around it (Jet-RL's training MLP).

In the FP8 flow a Llama / Qwen MLP runs ``g = X Wg^T``, ``u = X Wu^T`` (FP8 GEMMs, BF16 out), ``h = silu(g) * u``,
``Y = h Wd^T``, and every GEMM operand is quantized (``quarl_kernels.fp8_quant``): ``h`` in 1x128 groups (the down
projection's forward A) and ``h^T`` along the tokens (its WGrad B: 1x128 groups or 128x128 tiles); backward,
``dh = dY Wd`` (BF16), then SwiGLU's backward gives ``dg`` and ``du``, each in 1x128 groups (gate's / up's DGrad A)
and along the tokens (their WGrad A). Unfused, the glue writes ``h`` (``dg`` and ``du``) to HBM in BF16 and the
quantizer reads it back, twice for its wide operands (a *split* setting: the row groups, then the transposed pass).
Here the quantizer's two passes compute ``h`` from ``g, u`` -- ``dg, du`` from ``dh, g, u`` -- in registers, so
they never exist in BF16. Bytes per MLP and micro-batch, M tokens, I the intermediate width, 2 bytes an element:

    forward   unfused: glue reads g, u, writes h (6MI); quantizer reads h twice, writes codes (4MI + 2MI)  = 12 MI
              fused:   each pass reads g and u (8MI), codes (2MI)                                          = 10 MI
    backward  unfused: glue reads dh, g, u, writes dg, du (10MI); quantizer reads dg, du twice (8MI),
              writes codes (4MI)                                                                          = 22 MI
              fused:   each pass reads dh, g, u (12MI), codes of both (4MI)                                = 16 MI

(Qwen2.5-32B width, 16k tokens: ~2.7 GB less a layer.) One pass of the backward produces both ``dg`` and ``du``
from one load, so the pair costs one read of the three inputs, not two.

Two passes, as ``fp8_quant``'s split settings: :func:`_swiglu_rows_kernel` computes the values of a token group
chunk by chunk, stores their 1x128 codes along I and, from the column amax of the same values, the transposed
operand's scales (one per column, or one per 128x128 tile); :func:`_swiglu_cols_kernel` recomputes the values, codes
them with those scales and stores them transposed -- no reduction of its own, and each value computed once a pass
(session 27's first version reduced in the transposed pass too, over each tile twice in tile mode).

Numerics. Forward: ``h`` is ``quarl_kernels.act.silu_mul_values`` -- PyTorch's CUDA ``F.silu(g) * u`` (libdevice
``expf``, correctly rounded division, two roundings) -- quantized exactly as ``fp8_quant`` quantizes a BF16 tensor, so
the operands equal the eager ``quantize(F.silu(g) * u)`` (H200: 0 of 3.1e8 codes differed) and the rollout engine's
(``act.silu_mul``, then ``fp8_quant``): the training forward and the rollout run the same bits. Backward: the same
roundings as eager PyTorch's autograd (the mul's backward, then ATen's ``silu_backward``) with fast arithmetic (``ex2.approx``, an approximate
reciprocal, codes by ``x * (1 / scale)``): with the exact functions the two backward passes were compute-bound (H200,
first version: 2.1 and 1.3 TB/s). Its codes differ from the eager reference's on a counted few elements, by one step
(``tests/kernels/test_fp8_swiglu_*``).

Launch settings are chosen by time per shape class as ``fp8_quant``'s are (``fp8_quant.pick_setting``; every setting
gives the same bits): the row pass by (rows per chunk, warps), the transposed pass by (columns per program, warps,
transposed load).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels import fp8_quant as fq
from quarl_kernels.act import silu_mul_values
from quarl_kernels.fp8_quant import _codes, _scale
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.rounding import FP8_MAX, round_to, round_to_fp8

GROUP = fq.GROUP
# (rows per chunk, warps) of the row pass; (columns per program, warps, transposed load) of the transposed pass.
# The first of each is the default (no timing: CPU, decode-sized inputs, QUARL_FP8_TUNE=0). On an H200 (session 27)
# the first row pass (blocks of SUB rows, no transposed scales) took (16, 4) for every operand, and the second (whole
# token groups, the column amax reduced across warps per chunk) (64, 8) -- at 1.8-1.9x the first one's time; the
# amax is now kept elementwise and reduced once, and the 16-warp settings keep more loads in flight per SM
ROW_SETTINGS = ((16, 4), (8, 4), (32, 8), (32, 16), (64, 8), (64, 16), (128, 16))
COL_SETTINGS = ((32, 4, False), (64, 8, False), (16, 2, False), (32, 4, True), (64, 8, True), (16, 2, True))


@triton.jit
def _silu_mul_grads_fast(g, u, dh, dt: tl.constexpr, INTERPRET: tl.constexpr):
    """The gradients of ``silu(g) * u`` (``dh`` the output's) for fp32 values of ``dt`` numbers, rounded to ``dt``
    where eager PyTorch's autograd rounds -- ``du = dh * silu(g)`` (``silu(g)`` in ``dt``, as the forward made it),
    ``dg = silu_backward(dh * u, g)``: ATen's ``dy * s * (1 + g * (1 - s))`` on ``dy = dh * u`` rounded -- with fast
    arithmetic: ``exp`` as ``ex2.approx`` and the divisions as one approximate reciprocal (``s = 1 / (1 + e)``,
    ``silu(g) = g * s``). Returns ``(dg, du)``. With the exact ``expf`` and ``div_rn`` the backward was
    compute-bound (H200, session 27: 2.1 / 1.3 TB/s for the two passes, three correctly rounded divisions an
    element); these values differ from eager PyTorch's in the last fp32 bits, so a BF16 ``dg`` / ``du`` rarely lands
    one ulp away (counted in the tests)."""
    e = tl.exp(-g)
    s = 1.0 / (1.0 + e)
    act = round_to(g * s, dt, INTERPRET).to(tl.float32)  # F.silu(g) in the input dtype
    du = round_to(dh * act, dt, INTERPRET)
    dy = round_to(dh * u, dt, INTERPRET).to(tl.float32)
    dg = round_to(dy * s * tl.fma(g, 1.0 - s, 1.0), dt, INTERPRET)
    return dg, du


@triton.jit
def _values(g_ptr, u_ptr, dh_ptr, offs, mask, BWD: tl.constexpr, INTERPRET: tl.constexpr):
    """SwiGLU at ``offs``: forward ``(h, h)`` (exact: the rollout engine's ``act.silu_mul`` bits), backward
    ``(dg, du)`` (:func:`_silu_mul_grads_fast`), fp32 values of the input dtype; masked elements (padding) give 0
    either way: silu(0) * 0 and every gradient of zeros."""
    dt: tl.constexpr = g_ptr.dtype.element_ty
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if BWD:
        dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        a, b = _silu_mul_grads_fast(g, u, dh, dt, INTERPRET)
        a, b = a.to(tl.float32), b.to(tl.float32)
    else:
        a = silu_mul_values(g, u, dt, INTERPRET).to(tl.float32)
        b = a
    return a, b


@triton.jit
def _scaled_codes(x, s, FAST: tl.constexpr, INTERPRET: tl.constexpr):
    """x / s as E4M3 codes: ``fp8_quant._codes`` (a correctly rounded division, the eager quantizer's bits), or with
    FAST x times 1 / s (one division per group, not per element; differs from x / s in the last fp32 bit, so on the
    rare element next to a rounding boundary by one code)."""
    if FAST:
        q = x * tl.math.div_rn(1.0, s)
        q = tl.clamp(q, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        q = round_to_fp8(q, INTERPRET)
    else:
        q = _codes(x, s, INTERPRET)
    return q


@triton.jit
def _store_rows(q_ptr, s_ptr, x, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg,
                SCALE_RECIP: tl.constexpr, FAST: tl.constexpr, INTERPRET: tl.constexpr):
    """1x128 groups of ``x`` [SUB, 128] along its columns: codes and one scale per row."""
    s = _scale(tl.max(tl.abs(x), axis=1), SCALE_RECIP)  # [SUB]
    tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], _scaled_codes(x, s[:, None], FAST, INTERPRET),
             mask=r_ok[:, None] & c_ok[None, :])
    tl.store(s_ptr + rows * stride_sm + pid_k * stride_sg, s, mask=r_ok)


@triton.jit
def _store_t_scales(st_ptr, amax, cols, c_ok, pid_k, pid_m, stride_stk, stride_stg, COLS: tl.constexpr,
                    SCALE_RECIP: tl.constexpr):
    """The transposed operand's scales from the column amax [128] of one token group: one per column (COLS 1:
    1x128 along the tokens) or one for the 128x128 tile (COLS 2)."""
    if COLS == 1:
        tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, _scale(amax, SCALE_RECIP), mask=c_ok)
    else:
        tl.store(st_ptr + pid_k * stride_stk + pid_m * stride_stg, _scale(tl.max(amax, axis=0), SCALE_RECIP))


@triton.jit
def _swiglu_rows_kernel(
    g_ptr, u_ptr, dh_ptr, q_ptr, s_ptr, q2_ptr, s2_ptr, st_ptr, st2_ptr,
    M, I, stride_m, RQ, CQ, stride_qm, stride_sm, stride_sg, stride_stk, stride_stg,
    BWD: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, SCALE_RECIP: tl.constexpr, BLOCK_M: tl.constexpr,
    SUB: tl.constexpr, INTERPRET: tl.constexpr,
):
    # one program: rows [pid_m*BLOCK_M, +BLOCK_M) x columns [pid_k*128, +128), in [SUB, 128] chunks. ROWS: the 1x128
    # codes and scales along I (backward: dg's in q / s, du's in q2 / s2, from one load of dh, g, u). COLS (then
    # BLOCK_M = 128, a token group): also the transposed operand's scales, from the column amax of the same values
    # (1: one per column, 2: one per 128x128 tile), so that _swiglu_cols_kernel needs no reduction of its own
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]
    c_in = cols < I
    c_ok = cols < CQ
    # |values| maxed elementwise over the chunks, reduced over the rows once after the loop: a reduction along the
    # rows per chunk crosses warps through shared memory (H200, session 27: the row pass 1.8-1.9x slower with it)
    amax_a = tl.zeros([SUB, 128], dtype=tl.float32)
    amax_b = tl.zeros([SUB, 128], dtype=tl.float32)
    for i in tl.range(0, BLOCK_M // SUB):
        rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)  # [SUB]
        a, b = _values(g_ptr, u_ptr, dh_ptr, rows[:, None] * stride_m + cols[None, :],
                       (rows < M)[:, None] & c_in[None, :], BWD, INTERPRET)  # [SUB, 128] each
        if ROWS:
            r_ok = rows < RQ
            _store_rows(q_ptr, s_ptr, a, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg, SCALE_RECIP,
                        BWD, INTERPRET)
            if BWD:
                _store_rows(q2_ptr, s2_ptr, b, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg,
                            SCALE_RECIP, BWD, INTERPRET)
        if COLS > 0:
            amax_a = tl.maximum(amax_a, tl.abs(a))
            if BWD:
                amax_b = tl.maximum(amax_b, tl.abs(b))
    if COLS > 0:
        _store_t_scales(st_ptr, tl.max(amax_a, axis=0), cols, c_ok, pid_k, pid_m, stride_stk, stride_stg, COLS,
                        SCALE_RECIP)
        if BWD:
            _store_t_scales(st2_ptr, tl.max(amax_b, axis=0), cols, c_ok, pid_k, pid_m, stride_stk, stride_stg, COLS,
                            SCALE_RECIP)


@triton.jit
def _t_values(g_ptr, u_ptr, dh_ptr, pid_m, cols, M, I, stride_m, BWD: tl.constexpr, INTERPRET: tl.constexpr,
              T_LOAD: tl.constexpr):
    """:func:`_values` of token group ``pid_m`` at ``cols`` [BC]: [128, BC], or with T_LOAD [BC, 128] (loaded
    through the transposed view, as ``fp8_quant._t_load``)."""
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)
    if T_LOAD:
        offs = cols[:, None] + rows[None, :] * stride_m
        mask = (cols < I)[:, None] & (rows < M)[None, :]
    else:
        offs = rows[:, None] * stride_m + cols[None, :]
        mask = (rows < M)[:, None] & (cols < I)[None, :]
    return _values(g_ptr, u_ptr, dh_ptr, offs, mask, BWD, INTERPRET)


@triton.jit
def _t_store_scaled(qt_ptr, st_ptr, x, pid_m, cols, CQ, RT, stride_qtk, stride_stk, stride_stg, TILE: tl.constexpr,
                    FAST: tl.constexpr, INTERPRET: tl.constexpr, T_LOAD: tl.constexpr):
    """``x`` (:func:`_t_values`') coded with the scales the row pass stored (per column, or per tile) and stored
    transposed: qt[cols, tokens]."""
    if TILE:
        sc = tl.load(st_ptr + (cols // 128) * stride_stk + pid_m * stride_stg)  # [BC], the tile's scale
    else:
        sc = tl.load(st_ptr + cols * stride_stk + pid_m * stride_stg, mask=cols < CQ, other=1.0)  # [BC]
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)
    if T_LOAD:
        qc = _scaled_codes(x, sc[:, None], FAST, INTERPRET)  # [BC, 128]
    else:
        qc = tl.trans(_scaled_codes(x, sc[None, :], FAST, INTERPRET))  # [BC, 128]
    tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc, mask=(cols < CQ)[:, None] & (rows < RT)[None, :])


@triton.jit
def _swiglu_cols_kernel(
    g_ptr, u_ptr, dh_ptr, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
    M, I, stride_m, CQ, RT, stride_qtk, stride_stk, stride_stg,
    BWD: tl.constexpr, BLOCK_C: tl.constexpr, INTERPRET: tl.constexpr, TILE: tl.constexpr, T_LOAD: tl.constexpr,
):
    # the transposed operand(s): a program recomputes [128 tokens, BLOCK_C columns] of h (dg and du), codes them with
    # the scales _swiglu_rows_kernel stored (no reduction here) and stores them transposed
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    cols = (pid_c * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)  # [BC]
    a, b = _t_values(g_ptr, u_ptr, dh_ptr, pid_m, cols, M, I, stride_m, BWD, INTERPRET, T_LOAD)
    _t_store_scaled(qt_ptr, st_ptr, a, pid_m, cols, CQ, RT, stride_qtk, stride_stk, stride_stg, TILE, BWD, INTERPRET,
                    T_LOAD)
    if BWD:
        _t_store_scaled(qt2_ptr, st2_ptr, b, pid_m, cols, CQ, RT, stride_qtk, stride_stk, stride_stg, TILE, BWD,
                        INTERPRET, T_LOAD)


def _check(tensors: tuple, rows: int, cols: int, t_rows: int | None) -> tuple[int, int]:
    m, i = tensors[0].shape
    for t in tensors:
        if t.dim() != 2 or t.shape != (m, i) or t.stride() != tensors[0].stride() or t.dtype != tensors[0].dtype:
            raise ValueError(f"fp8_swiglu: inputs must be 2-D of one shape, strides and dtype, got "
                             f"{[(tuple(x.shape), x.stride(), x.dtype) for x in tensors]}")
    if i and tensors[0].stride(1) != 1:
        raise ValueError(f"fp8_swiglu: inputs need unit column stride, got strides {tensors[0].stride()}")
    if cols % GROUP or cols < i or rows < m or (t_rows is not None and (t_rows % GROUP or t_rows < m)):
        raise ValueError(f"fp8_swiglu: rows={rows} >= M={m}, cols={cols} a multiple of {GROUP} >= I={i}, t_rows="
                         f"{t_rows} a multiple of {GROUP} >= M")
    return m, i


def _row_launch(g, u, dh, outs, rows: int, cols: int, t_rows: int | None, t_tiles: bool, sub: int,
                warps: int) -> fq.Launch:
    (q, s, st), (q2, s2, st2) = outs  # q / s None: no row groups; st None: no transposed operand
    m, i = g.shape
    extent = max(rows if q is not None else 0, t_rows or 0)
    block_m = 128 if t_rows is not None else min(sub, max(16, triton.next_power_of_2(extent)))
    dq, ds = (q, s) if q is not None else (st, st)  # placeholders for pointers a launch does not use
    dst = st if st is not None else ds
    return fq.Launch(
        _swiglu_rows_kernel, (triton.cdiv(extent, block_m), cols // GROUP),
        (g, u, dh if dh is not None else g, dq, ds, q2 if q2 is not None else dq, s2 if s2 is not None else ds,
         dst, st2 if st2 is not None else dst, m, i, g.stride(0), rows, cols,
         dq.stride(0), ds.stride(0), ds.stride(1), dst.stride(0), dst.stride(1)),
        {"BWD": dh is not None, "ROWS": q is not None, "COLS": 0 if t_rows is None else 2 if t_tiles else 1,
         "SCALE_RECIP": g.is_cuda, "BLOCK_M": block_m, "SUB": min(sub, block_m), "INTERPRET": _interpreting()},
        warps)


def _col_launch(g, u, dh, outs, cols: int, t_rows: int, t_tiles: bool, block_c: int, warps: int,
                t_load: bool) -> fq.Launch:
    (qt, st), (qt2, st2) = outs
    m, i = g.shape
    return fq.Launch(
        _swiglu_cols_kernel, (t_rows // GROUP, triton.cdiv(cols, block_c)),
        (g, u, dh if dh is not None else g, qt, st, qt2 if qt2 is not None else qt, st2 if st2 is not None else st,
         m, i, g.stride(0), cols, t_rows, qt.stride(0), st.stride(0), st.stride(1)),
        {"BWD": dh is not None, "BLOCK_C": block_c, "INTERPRET": _interpreting(), "TILE": t_tiles,
         "T_LOAD": bool(t_load)},
        warps)


def _run(g, u, dh, rows: int, cols: int, t_rows: int | None, row_groups: bool, t_tiles: bool,
         setting: tuple | None, t_setting: tuple | None):
    bwd = dh is not None
    m, _ = _check((g, u) + ((dh,) if bwd else ()), rows, cols, t_rows)
    if not row_groups and t_rows is None:
        raise ValueError("fp8_swiglu: nothing asked (row_groups=False and no t_rows)")
    one = fq._act_outputs(g, rows, cols, t_rows, row_groups, t_tiles)  # (q, s, qt, st), None where not asked
    two = fq._act_outputs(g, rows, cols, t_rows, row_groups, False) if bwd else (None,) * 4
    if m == 0:  # no tokens: zero codes, eps scales (the reference's padding)
        for q in (one[0], one[2], two[0], two[2]):
            if q is not None:
                q.view(torch.uint8).zero_()
        for s in (one[1], one[3], two[1], two[3]):
            if s is not None:
                s.fill_(torch.finfo(torch.float32).eps)
        return one, two
    tune = g.is_cuda and max(rows, t_rows or 0) >= fq.TUNE_MIN_ROWS
    # the row pass: row groups (if asked) and the transposed operand's scales (if asked), then the transposed pass
    outs = ((one[0], one[1], one[3]), (two[0], two[1], two[3]))
    make = lambda sub, warps: _row_launch(g, u, dh, outs, rows, cols, t_rows, t_tiles, sub, warps)
    if setting is None:
        key = ("swiglu-rows", bwd, row_groups, t_rows is not None, t_tiles, g.dtype,
               triton.next_power_of_2(max(rows, t_rows or 0)), cols)
        setting = fq._setting(key, ROW_SETTINGS, g, make) if tune else ROW_SETTINGS[0]
    fq._launch(make(*setting))
    if t_rows is not None:
        outs = ((one[2], one[3]), (two[2], two[3]))
        make = lambda bc, warps, tload: _col_launch(g, u, dh, outs, cols, t_rows, t_tiles, bc, warps, tload)
        if t_setting is None:
            key = ("swiglu-cols", bwd, t_tiles, g.dtype, triton.next_power_of_2(t_rows), cols)
            t_setting = fq._setting(key, COL_SETTINGS, g, make) if tune else COL_SETTINGS[0]
        fq._launch(make(*t_setting))
    return one, two


def swiglu_operands(g: torch.Tensor, u: torch.Tensor, rows: int, cols: int, t_rows: int | None = None,
                    t_tiles: bool = False, *, row_groups: bool = True, setting: tuple | None = None,
                    t_setting: tuple | None = None):
    """``h = silu(g) * u`` (``g``, ``u`` [M, I], one dtype and strides, unit column stride) -> ``(q, s, qt, st)``,
    ``fp8_quant.quantize_act``'s operands of ``h`` (row groups [rows, cols]; with ``t_rows`` h^T along the tokens,
    in 1x128 groups or with ``t_tiles`` 128x128 tiles), ``h`` never written. ``setting`` / ``t_setting``: an entry
    of :data:`ROW_SETTINGS` / :data:`COL_SETTINGS`, else chosen by shape on CUDA."""
    one, _ = _run(g, u, None, rows, cols, t_rows, row_groups, bool(t_tiles) and t_rows is not None, setting, t_setting)
    return one


def swiglu_grad_operands(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, rows: int, cols: int,
                         t_rows: int | None = None, *, row_groups: bool = True, setting: tuple | None = None,
                         t_setting: tuple | None = None):
    """SwiGLU's backward (``dh``: the gradient of ``h = silu(g) * u``) -> ``((q, s, qt, st) of dg, (...) of du)``:
    each in 1x128 groups along I ([rows, cols], DGrad's A, with ``row_groups``) and along the tokens (``t_rows``:
    WGrad's A), from one read of ``dh``, ``g``, ``u`` per pass; ``dg`` and ``du`` never written."""
    return _run(g, u, dh, rows, cols, t_rows, row_groups, False, setting, t_setting)


__all__ = ["COL_SETTINGS", "ROW_SETTINGS", "swiglu_grad_operands", "swiglu_operands"]
