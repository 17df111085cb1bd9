"""SwiGLU's backward computed inside the FP8 quantizers of the gate and up projections (Jet-RL's training MLP).

In the FP8 flow a Llama / Qwen MLP runs ``g = X Wg^T``, ``u = X Wu^T``, ``h = silu(g) * u``, ``Y = h Wd^T`` with every
GEMM operand quantized (``quarl_kernels.fp8_quant``). Backward, ``dh = dY Wd`` (BF16), SwiGLU's backward gives ``dg``
and ``du``, and each is quantized in 1x128 groups along I (gate's / up's DGrad A operand) and along the tokens (their
WGrad A operand). Unfused, the glue writes ``dg`` and ``du`` to HBM in BF16 and the quantizer reads each back twice
(a *split* setting: the row groups, then the transposed pass). Here the quantizer's two passes compute both from
``dh, g, u`` in registers -- one load of the three gives both gradients -- so they never exist in BF16. Bytes per
MLP and micro-batch (M tokens, I the intermediate width, 2 bytes an element): unfused 10 MI (glue: reads dh, g, u,
writes dg, du) + 8 MI (two reads of each) + 4 MI (codes) = 22 MI; fused 2 x 6 MI (each pass reads dh, g, u) + 4 MI
= 16 MI (Qwen2.5-32B width, 16k tokens: ~2.7 GB less a layer).

Two passes, as ``fp8_quant``'s split settings: :func:`_swiglu_rows_kernel` computes a token group's gradients chunk by
chunk, stores their 1x128 codes along I and, from the column amax of the same values, the transposed operands'
scales; :func:`_swiglu_cols_kernel` recomputes them, codes them with those scales (no reduction of its own) and
stores them transposed.

Numerics: eager PyTorch's roundings (``du = dh * silu(g)`` with ``silu(g)`` in the input dtype, ``dg =
silu_backward(dh * u, g)`` on the rounded ``dh * u``, each rounded to the input dtype) with fast arithmetic:
``ex2.approx`` for ``exp``, one approximate reciprocal for both divisions, codes as ``x * (1 / scale)``. With
PyTorch's exact ``expf`` and three correctly rounded divisions an element the passes were compute-bound (H200, session
27: 2.1 and 1.3 TB/s). So a counted few codes (H200, 7B width: 2.3e3 of 6.2e8) are one step off the quantization of
eager PyTorch's ``dg`` / ``du``; scales equal (``tests/kernels/test_fp8_swiglu_*``).

The forward's ``h = silu(g) * u``: fused the same way in Triton (session 27, commit 3d653a8) it measured 0.84x the
compiled glue + quantizer it replaced (H200, 32B width: 1.90 against 1.60 ms; PyTorch-exact ``expf`` / ``div_rn`` paid
twice) and was dropped; it is quantized from g and u by Gluon kernels instead -- ``fp8_quant_regs``' SWIGLU form
(session 31) or ``fp8_swiglu_staged``'s forward form (session 34), chosen by time in :func:`swiglu_forward_operand`.

Launch settings are chosen by time per shape class as ``fp8_quant``'s (``fp8_quant.pick_setting``; every setting
gives the same bits): the row pass by (rows per chunk, warps), the transposed pass by (columns per program, warps,
transposed load).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from quarl_kernels import fp8_quant as fq
from quarl_kernels.fp8_quant import _scale
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.rounding import FP8_MAX, round_to, round_to_fp8

GROUP = fq.GROUP
# (rows per chunk, warps) of the row pass; (columns per program, warps, transposed load) of the transposed pass.
# The first of each is the default (no timing: CPU, decode-sized inputs, QUARL_FP8_TUNE=0). On an H200 (session 27,
# 16k tokens) the row pass took (8, 4) at both widths, the transposed pass (64, 8, True); a row pass that reduced the
# column amax across warps per chunk (instead of elementwise, once) was 1.8-1.9x slower
ROW_SETTINGS = ((16, 4), (8, 4), (32, 8), (32, 16), (64, 8), (64, 16), (128, 16))
COL_SETTINGS = ((32, 4, False), (64, 8, False), (16, 2, False), (32, 4, True), (64, 8, True), (16, 2, True))
# (rows per chunk, warps, columns per transposed chunk) of the merged pass (session 30): the row pass's program then
# codes its own tile transposed, re-reading dh, g, u from L2 -- one read of the three from HBM instead of two. H100,
# 7B width, 16k tokens, two calls (the pair 1.845 / 1.847 ms): (32, 8, 32) 1.756 / 1.764, (32, 8, 64) 1.771,
# (16, 4, 32) 1.958 / 1.963; slower and dropped: (16, 8, 64) 1.97, (8, 4, 32) 2.18, (8, 4, 16) 2.21, (64, 16, 64) 2.23,
# (64, 8, 32) 2.34, (32, 16, 32) 2.42. (32, 8, 64) dropped in session 32: dh's own row stride (g and u the column
# blocks of one stacked GEMM output) made it spill 8 bytes, and it never won
MERGED_SETTINGS = ((32, 8, 32), (16, 4, 32))


staged_module = fq.staged_module  # quarl_kernels.fp8_swiglu_staged (Gluon, session 33), or None


def regs_settings(g: torch.Tensor) -> tuple:
    """The Gluon merged candidates (none on CPU, without Gluon or with ``QUARL_FP8_REGS=0``): ``("regs", tokens a
    thread, warps)`` -- ``quarl_kernels.fp8_quant_regs``' kernel for the same pass (session 31: dh, g, u read once,
    both gradients' codes from registers, X^T by register order) -- and ``("staged", tokens a row chunk, warps)``,
    ``quarl_kernels.fp8_swiglu_staged`` (session 33: the tile's dg / du staged in shared memory, ~120 registers; BF16
    inputs only; its TMA form ``("tma", ...)`` too: ``fp8_quant.staged_settings``). All give the
    same bits."""
    if not (g.is_cuda and fq.regs_wanted()):
        return ()
    fr, stg = fq.regs_module(), staged_module()
    return (tuple(("regs", *st) for st in fr.SWIGLU_BWD_SETTINGS)
            + (fq.staged_settings(g, stg.SETTINGS) if stg is not None else ()))


def forward_settings(g: torch.Tensor, t_rows: int | None) -> tuple:
    """The candidates for the forward's operand ``h = silu(g) * u`` (:func:`swiglu_forward_operand`):
    ``fp8_quant_regs``' SWIGLU form ``("regs", tokens a thread, warps)`` -- the default, the only one without X^T or
    with ``QUARL_FP8_REGS=0`` -- and, with X^T and BF16 inputs, ``fp8_swiglu_staged``'s forward form ``("staged",
    tokens a row chunk, warps, X^T's columns a step)`` (and its TMA form). All give the same
    bits."""
    fr, stg = fq.regs_module(), staged_module()
    regs = tuple(("regs", *st) for st in fr.SWIGLU_SETTINGS)
    if t_rows is None or stg is None or g.dtype != torch.bfloat16 or not (g.is_cuda and fq.regs_wanted()):
        return regs
    return regs + fq.staged_settings(g, stg.FWD_SETTINGS)


def swiglu_forward_operand(g: torch.Tensor, u: torch.Tensor, out: tuple, rows: int, cols: int, t_rows: int | None,
                           tiles: bool, setting: tuple | None = None) -> tuple:
    """The down projection's input operand ``h = silu(g) * u`` (g, u [M, I] of one layout, unit column stride) quantized
    from g and u into ``out`` = ``fp8_quant._act_outputs``' ``(q, s, qt, st)`` -- h never written. ``setting``: an
    entry of :func:`forward_settings`, else on CUDA chosen by time (``fp8_quant.run_setting``: back to back, then in
    situ) from 1024 tokens on; returns the setting launched. Needs Gluon (``fp8_quant.regs_module()``)."""
    fr = fq.regs_module()

    def make(*st):
        if st[0] in ("staged", "tma"):
            return staged_module().fwd_spec(g, u, *out, rows, cols, t_rows, tiles, *st[1:], tma=st[0] == "tma")
        return fr.launch_spec(g, *out, rows, cols, t_rows, tiles, *st[1:], u=u)

    cands = forward_settings(g, t_rows)
    if setting is None and len(cands) > 1 and g.is_cuda and max(rows, t_rows or 0) >= fq.TUNE_MIN_ROWS:
        key = ("swiglu-fwd", out[0] is not None, tiles, g.dtype, triton.next_power_of_2(max(rows, t_rows)), cols)
        return fq.run_setting(key, cands, g, make)
    setting = setting or cands[0]
    fq._launch(make(*setting))
    return setting


@triton.jit
def _grads(g_ptr, u_ptr, dh_ptr, offs, doffs, mask, INTERPRET: tl.constexpr):
    """``(dg, du)`` at ``offs`` of g and u and ``doffs`` of dh: the gradients of ``silu(g) * u`` for the output
    gradient ``dh``, fp32 values of the input dtype, rounded where eager PyTorch's autograd rounds -- ``du = dh *
    silu(g)`` (``silu(g)`` in the input dtype, as the forward made it), ``dg = silu_backward(dh * u, g)``: ATen's
    ``dy * s * (1 + g * (1 - s))`` on ``dy = dh * u`` rounded, with the ``1 + g * (1 - s)`` as the fma nvcc makes of
    it -- in fast arithmetic: ``exp`` as ``ex2.approx``, ``s = 1 / (1 + e)`` approximate, ``silu(g) = g * s``. Masked
    elements (padding) give 0."""
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0)
    dh = tl.load(dh_ptr + doffs, mask=mask, other=0.0)
    return grad_values(g, u, dh, INTERPRET)


@triton.jit
def grad_values(g_in, u_in, dh_in, INTERPRET: tl.constexpr):
    """:func:`_grads`' arithmetic on loaded values (input dtype): ``(dg, du)`` in fp32. Also called from the Gluon
    backward pass (``fp8_quant_regs``), so both give the same bits by construction."""
    dt: tl.constexpr = g_in.dtype
    g = g_in.to(tl.float32)
    u = u_in.to(tl.float32)
    dh = dh_in.to(tl.float32)
    e = tl.exp(-g)
    s = 1.0 / (1.0 + e)
    act = round_to(g * s, dt, INTERPRET).to(tl.float32)  # F.silu(g) in the input dtype
    du = round_to(dh * act, dt, INTERPRET).to(tl.float32)
    dy = round_to(dh * u, dt, INTERPRET).to(tl.float32)
    dg = round_to(dy * s * tl.fma(g, 1.0 - s, 1.0), dt, INTERPRET).to(tl.float32)
    return dg, du


@triton.jit
def _codes_by_recip(x, s, INTERPRET: tl.constexpr):
    """E4M3 codes of ``x`` with scales ``s`` (broadcast): ``x * (1 / s)`` -- one division per group, not per
    element (``fp8_quant._codes`` divides each element, correctly rounded: the same codes but on the rare element
    within an fp32 ulp of a rounding boundary) -- clamped to +-448, cast RNE."""
    q = tl.clamp(x * tl.math.div_rn(1.0, s), -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    return round_to_fp8(q, INTERPRET)


@triton.jit
def _store_rows(q_ptr, s_ptr, x, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg,
                SCALE_RECIP: tl.constexpr, INTERPRET: tl.constexpr):
    """1x128 groups of ``x`` [SUB, 128] along its columns: codes and one scale per row."""
    s = _scale(tl.max(tl.abs(x), axis=1), SCALE_RECIP)  # [SUB]
    tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], _codes_by_recip(x, s[:, None], INTERPRET),
             mask=r_ok[:, None] & c_ok[None, :])
    tl.store(s_ptr + rows * stride_sm + pid_k * stride_sg, s, mask=r_ok)


@triton.jit
def _swiglu_rows_kernel(
    g_ptr, u_ptr, dh_ptr, q_ptr, s_ptr, q2_ptr, s2_ptr, st_ptr, st2_ptr, qt_ptr, qt2_ptr,
    M, I, stride_m, stride_dm, RQ, CQ, RT, stride_qm, stride_sm, stride_sg, stride_stk, stride_stg, stride_qtk,
    ROWS: tl.constexpr, COLS: tl.constexpr, SCALE_RECIP: tl.constexpr, BLOCK_M: tl.constexpr, SUB: tl.constexpr,
    INTERPRET: tl.constexpr, T_CHUNK: tl.constexpr = 0,
):
    # one program: rows [pid_m*BLOCK_M, +BLOCK_M) x columns [pid_k*128, +128), in [SUB, 128] chunks. ROWS: dg's 1x128
    # codes and scales along I in q / s, du's in q2 / s2. COLS (then BLOCK_M = 128, a token group): also the scales
    # of dg^T and du^T (one per column: 1x128 along the tokens) from the column amax of the same values. T_CHUNK > 0
    # (session 30, with COLS): also dg^T / du^T's codes, the transposed pass's work done here on the same tile again
    # by [128 tokens, T_CHUNK columns] chunks -- dh, g, u re-read from L2 rather than from HBM by a second launch
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]
    c_in = cols < I
    c_ok = cols < CQ
    # |values| maxed elementwise over the chunks and reduced over the rows once, after the loop: a reduction along
    # the rows per chunk crosses warps through shared memory (H200: the row pass 1.8-1.9x slower with it)
    amax_g = tl.zeros([SUB, 128], dtype=tl.float32)
    amax_u = tl.zeros([SUB, 128], dtype=tl.float32)
    for i in tl.range(0, BLOCK_M // SUB):
        rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)  # [SUB]
        dg, du = _grads(g_ptr, u_ptr, dh_ptr, rows[:, None] * stride_m + cols[None, :],
                        rows[:, None] * stride_dm + cols[None, :], (rows < M)[:, None] & c_in[None, :],
                        INTERPRET)  # [SUB, 128] each
        if ROWS:
            r_ok = rows < RQ
            _store_rows(q_ptr, s_ptr, dg, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg, SCALE_RECIP,
                        INTERPRET)
            _store_rows(q2_ptr, s2_ptr, du, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg,
                        SCALE_RECIP, INTERPRET)
        if COLS:
            amax_g = tl.maximum(amax_g, tl.abs(dg))
            amax_u = tl.maximum(amax_u, tl.abs(du))
    if COLS:
        tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, _scale(tl.max(amax_g, axis=0), SCALE_RECIP),
                 mask=c_ok)
        tl.store(st2_ptr + cols * stride_stk + pid_m * stride_stg, _scale(tl.max(amax_u, axis=0), SCALE_RECIP),
                 mask=c_ok)
    if COLS and T_CHUNK > 0:
        tl.debug_barrier()  # the scales just stored, read back below by other threads of the program
        rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]: the token group
        for j in tl.range(0, 128 // T_CHUNK):
            cc = (pid_k * 128 + j * T_CHUNK + tl.arange(0, T_CHUNK)).to(tl.int64)  # [TC]
            dg, du = _grads(g_ptr, u_ptr, dh_ptr, rows[:, None] * stride_m + cc[None, :],
                            rows[:, None] * stride_dm + cc[None, :], (rows < M)[:, None] & (cc < I)[None, :],
                            INTERPRET)  # [128, TC] each
            _t_store(qt_ptr, st_ptr, dg, pid_m, cc, CQ, RT, stride_qtk, stride_stk, stride_stg, INTERPRET, False)
            _t_store(qt2_ptr, st2_ptr, du, pid_m, cc, CQ, RT, stride_qtk, stride_stk, stride_stg, INTERPRET, False)


@triton.jit
def _t_store(qt_ptr, st_ptr, x, pid_m, cols, CQ, RT, stride_qtk, stride_stk, stride_stg, INTERPRET: tl.constexpr,
             T_LOAD: tl.constexpr):
    """``x`` (one token group at ``cols``) coded with the column scales the row pass stored, stored transposed:
    qt[cols, tokens]."""
    sc = tl.load(st_ptr + cols * stride_stk + pid_m * stride_stg, mask=cols < CQ, other=1.0)  # [BC]
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)
    if T_LOAD:  # x is [BC, 128] already
        qc = _codes_by_recip(x, sc[:, None], INTERPRET)
    else:
        qc = tl.trans(_codes_by_recip(x, sc[None, :], INTERPRET))  # [BC, 128]
    tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc, mask=(cols < CQ)[:, None] & (rows < RT)[None, :])


@triton.jit
def _swiglu_cols_kernel(
    g_ptr, u_ptr, dh_ptr, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
    M, I, stride_m, stride_dm, CQ, RT, stride_qtk, stride_stk, stride_stg,
    BLOCK_C: tl.constexpr, INTERPRET: tl.constexpr, T_LOAD: tl.constexpr,
):
    # dg^T and du^T: a program recomputes [128 tokens, BLOCK_C columns] of dg and du (T_LOAD: loaded through the
    # transposed view, [BLOCK_C, 128], fp8_quant._t_load's), codes them with the row pass's scales, stores them
    # transposed
    pid_m = tl.program_id(0)
    cols = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)  # [BC]
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]
    if T_LOAD:
        offs = cols[:, None] + rows[None, :] * stride_m
        doffs = cols[:, None] + rows[None, :] * stride_dm
        mask = (cols < I)[:, None] & (rows < M)[None, :]
    else:
        offs = rows[:, None] * stride_m + cols[None, :]
        doffs = rows[:, None] * stride_dm + cols[None, :]
        mask = (rows < M)[:, None] & (cols < I)[None, :]
    dg, du = _grads(g_ptr, u_ptr, dh_ptr, offs, doffs, mask, INTERPRET)
    _t_store(qt_ptr, st_ptr, dg, pid_m, cols, CQ, RT, stride_qtk, stride_stk, stride_stg, INTERPRET, T_LOAD)
    _t_store(qt2_ptr, st2_ptr, du, pid_m, cols, CQ, RT, stride_qtk, stride_stk, stride_stg, INTERPRET, T_LOAD)


def _check(tensors: tuple, rows: int, cols: int, t_rows: int | None) -> tuple[int, int]:
    """``tensors`` = (dh, g, u): 2-D, one shape and dtype, unit column stride; g and u of one row stride (column
    blocks of one stacked GEMM output, or two tensors), dh's its own."""
    m, i = tensors[0].shape
    for t in tensors:
        if t.dim() != 2 or t.shape != (m, i) or t.dtype != tensors[0].dtype or (i and t.stride(1) != 1):
            raise ValueError(f"fp8_swiglu: inputs must be 2-D of one shape and dtype with unit column stride, got "
                             f"{[(tuple(x.shape), x.stride(), x.dtype) for x in tensors]}")
    if tensors[1].stride() != tensors[2].stride():
        raise ValueError(f"fp8_swiglu: g and u must have one layout, got strides {tensors[1].stride()} and "
                         f"{tensors[2].stride()}")
    if cols % GROUP or cols < i or rows < m or (t_rows is not None and (t_rows % GROUP or t_rows < m)):
        raise ValueError(f"fp8_swiglu: rows={rows} >= M={m}, cols={cols} a multiple of {GROUP} >= I={i}, t_rows="
                         f"{t_rows} a multiple of {GROUP} >= M")
    return m, i


def _checked_out(out: tuple, g: torch.Tensor, rows: int, cols: int, t_rows: int | None, row_groups: bool):
    """``out`` = (dg's (q, s, qt, st), du's): each checked as ``fp8_quant.quantize_act``'s ``out``, and each pair one
    layout (the kernels take one set of output strides for both)."""
    if len(out) != 2:
        raise ValueError("fp8_swiglu: out must be (dg's (q, s, qt, st), du's)")
    one, two = (fq._checked_act_out(g, rows, cols, t_rows, row_groups, False, o) for o in out)
    for a, b in zip(one, two, strict=True):
        if a is not None and a.stride() != b.stride():
            raise ValueError(f"fp8_swiglu: dg's and du's outputs need one layout, got strides {a.stride()} and "
                             f"{b.stride()}")
    return one, two


def _row_launch(dh, g, u, outs, rows: int, cols: int, t_rows: int | None, sub: int, warps: int,
                qts: tuple | None = None, t_chunk: int = 0) -> fq.Launch:
    """The row pass; with ``qts`` (dg^T's and du^T's code tensors) and ``t_chunk``, the merged pass that also stores
    them (:func:`_swiglu_rows_kernel`'s ``T_CHUNK``)."""
    (q, s, st), (q2, s2, st2) = outs  # q / s None: no row groups; st None: no transposed operands
    m, i = g.shape
    extent = max(rows if q is not None else 0, t_rows or 0)
    block_m = 128 if t_rows is not None else min(sub, max(16, triton.next_power_of_2(extent)))
    dq, ds, dq2, ds2 = (q, s, q2, s2) if q is not None else (st, st, st2, st2)  # placeholders for unused pointers
    dst, dst2 = (st, st2) if st is not None else (ds, ds2)
    qt, qt2 = qts if qts is not None else (dq, dq2)
    return fq.Launch(
        _swiglu_rows_kernel, (triton.cdiv(extent, block_m), cols // GROUP),
        (g, u, dh, dq, ds, dq2, ds2, dst, dst2, qt, qt2, m, i, g.stride(0), dh.stride(0), rows, cols, t_rows or 0,
         dq.stride(0), ds.stride(0), ds.stride(1), dst.stride(0), dst.stride(1), qt.stride(0)),
        {"ROWS": q is not None, "COLS": t_rows is not None, "SCALE_RECIP": g.is_cuda, "BLOCK_M": block_m,
         "SUB": min(sub, block_m), "INTERPRET": _interpreting(), "T_CHUNK": t_chunk if qts is not None else 0},
        warps)


def _col_launch(dh, g, u, outs, cols: int, t_rows: int, block_c: int, warps: int, t_load: bool) -> fq.Launch:
    (qt, st), (qt2, st2) = outs
    m, i = g.shape
    return fq.Launch(
        _swiglu_cols_kernel, (t_rows // GROUP, triton.cdiv(cols, block_c)),
        (g, u, dh, qt, st, qt2, st2, m, i, g.stride(0), dh.stride(0), cols, t_rows, qt.stride(0), st.stride(0),
         st.stride(1)),
        {"BLOCK_C": block_c, "INTERPRET": _interpreting(), "T_LOAD": bool(t_load)},
        warps)


def swiglu_grad_operands(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, rows: int, cols: int,
                         t_rows: int | None = None, *, row_groups: bool = True, setting: tuple | None = None,
                         t_setting: tuple | None = None, merged: tuple | None = None, out: tuple | None = None):
    """SwiGLU's backward (``dh``: the gradient of ``h = silu(g) * u``; the three [M, I] of one dtype with unit column
    stride, g and u of one row stride) -> ``(dg's (q, s, qt, st), du's)``, ``fp8_quant.quantize_act``'s operands
    (``out``: ``(one, two)``, those eight tensors given -- e.g. dg's and du's row groups as the column blocks of one
    stacked DGrad operand; the same shapes, dtypes, and for each pair of dg / du tensors one layout): with
    ``row_groups``
    1x128 groups along I ([rows, cols], DGrad's A), with ``t_rows`` along the tokens ([cols, t_rows], WGrad's A);
    entries not asked for are None. ``dg`` and ``du`` are never written. ``setting`` / ``t_setting``: an entry of
    :data:`ROW_SETTINGS` / :data:`COL_SETTINGS`, else chosen by shape on CUDA; ``merged``: an entry of
    :data:`MERGED_SETTINGS` or of :func:`regs_settings` (one launch for both passes; needs ``t_rows``), else on CUDA the
    merged launches are timed
    against the chosen pair and the faster kept. Every setting gives the same bits."""
    m, _ = _check((dh, g, u), rows, cols, t_rows)
    if not row_groups and t_rows is None:
        raise ValueError("fp8_swiglu: nothing asked (row_groups=False and no t_rows)")
    if out is None:
        one = fq._act_outputs(g, rows, cols, t_rows, row_groups)  # dg's (q, s, qt, st), None where not asked
        two = fq._act_outputs(g, rows, cols, t_rows, row_groups)  # du's
    else:
        one, two = _checked_out(out, g, rows, cols, t_rows, row_groups)
    if m == 0:  # no tokens: zero codes, eps scales (the reference's padding)
        for t in (*one, *two):
            if t is not None:
                (t.view(torch.uint8).zero_() if t.dtype == torch.float8_e4m3fn
                 else t.fill_(torch.finfo(torch.float32).eps))
        return one, two
    tune = g.is_cuda and max(rows, t_rows or 0) >= fq.TUNE_MIN_ROWS
    # the row pass (row groups if asked, the transposed operands' scales if asked), then the transposed pass -- or
    # both in one merged launch (MERGED_SETTINGS), where that times faster than the best pair
    outs = ((one[0], one[1], one[3]), (two[0], two[1], two[3]))
    make = lambda sub, warps: _row_launch(dh, g, u, outs, rows, cols, t_rows, sub, warps)
    def make_merged(*st):
        if st[0] == "regs":
            return fq.regs_module().swiglu_bwd_spec(dh, g, u, one, two, rows, cols, t_rows, *st[1:])
        if st[0] in ("staged", "tma"):
            return staged_module().spec(dh, g, u, one, two, rows, cols, t_rows, *st[1:], tma=st[0] == "tma")
        return _row_launch(dh, g, u, outs, rows, cols, t_rows, *st[:2], qts=(one[2], two[2]), t_chunk=st[2])

    if merged is not None:
        if t_rows is None:
            raise ValueError("fp8_swiglu: a merged setting makes the transposed operands: give t_rows")
        fq._launch(make_merged(*merged))
        return one, two
    size = (g.dtype, triton.next_power_of_2(max(rows, t_rows or 0)), cols)
    if setting is None:
        key = ("swiglu-rows", row_groups, t_rows is not None, *size)
        setting = fq._setting(key, ROW_SETTINGS, g, make) if tune else ROW_SETTINGS[0]
    if t_rows is None:
        fq._launch(make(*setting))
        return one, two
    t_outs = ((one[2], one[3]), (two[2], two[3]))
    make_t = lambda bc, warps, tload: _col_launch(dh, g, u, t_outs, cols, t_rows, bc, warps, tload)
    if t_setting is None:
        key = ("swiglu-cols", g.dtype, triton.next_power_of_2(t_rows), cols)
        t_setting = fq._setting(key, COL_SETTINGS, g, make_t) if tune else COL_SETTINGS[0]
    pair = (make(*setting), make_t(*t_setting))
    if tune and MERGED_SETTINGS and os.environ.get("QUARL_FP8_SWIGLU_MERGE", "1") != "0":
        # the pair just chosen against the merged launches, timed the same way

        def make_m(*st):
            return pair if st == ("pair",) else make_merged(*st)

        fq.run_setting(("swiglu-merge", row_groups, *size, setting, t_setting),
                       (("pair",), *MERGED_SETTINGS, *regs_settings(g)), g, make_m)
        return one, two
    fq._launch(pair)
    return one, two


__all__ = ["COL_SETTINGS", "MERGED_SETTINGS", "ROW_SETTINGS", "forward_settings", "regs_settings",
           "swiglu_forward_operand", "swiglu_grad_operands"]
