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

Numerics: ``h``, ``dg`` and ``du`` are rounded to the input dtype where eager PyTorch rounds them
(``quarl_kernels.act.silu_mul_values`` / ``silu_mul_grads``: PyTorch's CUDA arithmetic, libdevice ``expf``,
correctly rounded divisions), then quantized exactly as ``fp8_quant`` quantizes a BF16 tensor. So the operands equal
the quantization of eager PyTorch's ``F.silu(g) * u`` (and its autograd) wherever the two ``expf`` agree: on CPU
through the interpreter and on the GPU, tests compare them (``tests/kernels/test_fp8_swiglu_*``).

Launch settings are chosen by time per shape class as ``fp8_quant``'s are (``fp8_quant.pick_setting``; every setting
gives the same bits): the row pass by (rows per chunk, warps), the transposed pass by (columns per program, warps,
transposed load).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels import fp8_quant as fq
from quarl_kernels.act import silu_mul_grads, silu_mul_values
from quarl_kernels.fp8_quant import _codes, _scale, _t_colmax, _t_store
from quarl_kernels.launch import interpreting as _interpreting

GROUP = fq.GROUP
# (rows per chunk, warps) of the row pass; (columns per program, warps, transposed load) of the transposed pass.
# The first of each is the default (no timing: CPU, decode-sized inputs, QUARL_FP8_TUNE=0); the others are the
# split settings that won fp8_quant's wide operands on an H200 (RESULTS.md "Session 26"), two rows per chunk fewer
# where three inputs are live
ROW_SETTINGS = ((32, 4), (64, 8), (16, 4), (32, 8))
COL_SETTINGS = ((32, 4, False), (64, 8, False), (16, 2, False), (32, 4, True), (64, 8, True), (16, 2, True))


@triton.jit
def _values(g_ptr, u_ptr, dh_ptr, offs, mask, BWD: tl.constexpr, INTERPRET: tl.constexpr):
    """SwiGLU at ``offs``: forward ``(h, h)``, backward ``(dg, du)``, fp32 values of the input dtype; masked
    elements (padding) give 0 either way: silu(0) * 0 and every gradient of zeros."""
    dt: tl.constexpr = g_ptr.dtype.element_ty
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if BWD:
        dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        a, b = silu_mul_grads(g, u, dh, dt, INTERPRET)
        a, b = a.to(tl.float32), b.to(tl.float32)
    else:
        a = silu_mul_values(g, u, dt, INTERPRET).to(tl.float32)
        b = a
    return a, b


@triton.jit
def _store_rows(q_ptr, s_ptr, x, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg,
                SCALE_RECIP: tl.constexpr, INTERPRET: tl.constexpr):
    """1x128 groups of ``x`` [SUB, 128] along its columns: codes and one scale per row."""
    s = _scale(tl.max(tl.abs(x), axis=1), SCALE_RECIP)  # [SUB]
    tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], _codes(x, s[:, None], INTERPRET),
             mask=r_ok[:, None] & c_ok[None, :])
    tl.store(s_ptr + rows * stride_sm + pid_k * stride_sg, s, mask=r_ok)


@triton.jit
def _swiglu_rows_kernel(
    g_ptr, u_ptr, dh_ptr, q_ptr, s_ptr, q2_ptr, s2_ptr,
    M, I, stride_m, RQ, CQ, stride_qm, stride_sm, stride_sg,
    BWD: tl.constexpr, SCALE_RECIP: tl.constexpr, BLOCK_M: tl.constexpr, SUB: tl.constexpr, INTERPRET: tl.constexpr,
):
    # one program: rows [pid_m*BLOCK_M, +BLOCK_M) x columns [pid_k*128, +128), in [SUB, 128] chunks; backward
    # stores dg's codes in q / s and du's in q2 / s2 (same layouts) from one load of dh, g, u
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]
    c_in = cols < I
    c_ok = cols < CQ
    for i in tl.range(0, BLOCK_M // SUB):
        rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)  # [SUB]
        a, b = _values(g_ptr, u_ptr, dh_ptr, rows[:, None] * stride_m + cols[None, :],
                       (rows < M)[:, None] & c_in[None, :], BWD, INTERPRET)  # [SUB, 128] each
        r_ok = rows < RQ
        _store_rows(q_ptr, s_ptr, a, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg, SCALE_RECIP,
                    INTERPRET)
        if BWD:
            _store_rows(q2_ptr, s2_ptr, b, rows, cols, pid_k, r_ok, c_ok, stride_qm, stride_sm, stride_sg,
                        SCALE_RECIP, INTERPRET)


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
def _swiglu_cols_kernel(
    g_ptr, u_ptr, dh_ptr, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
    M, I, stride_m, CQ, RT, stride_qtk, stride_stk, stride_stg,
    BWD: tl.constexpr, SCALE_RECIP: tl.constexpr, BLOCK_C: tl.constexpr, INTERPRET: tl.constexpr,
    TILE: tl.constexpr, T_LOAD: tl.constexpr,
):
    # the transposed operand(s) alone, one pass (fp8_quant._act_t_kernel's): a program quantizes [128 tokens,
    # BLOCK_C columns] along the tokens and stores the codes transposed. TILE (forward h^T, fp8_wgrad=tiles): a
    # program per 128x128 tile (pid_c counts 128 columns), an amax pass over its column chunks, then the codes
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    if TILE:
        amax = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.range(0, 128 // BLOCK_C):
            cols = (pid_c * 128 + j * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)  # [BC]
            h, _ = _t_values(g_ptr, u_ptr, dh_ptr, pid_m, cols, M, I, stride_m, False, INTERPRET, T_LOAD)
            amax = tl.maximum(amax, _t_colmax(h, T_LOAD))
        s_tile = _scale(tl.max(amax, axis=0), SCALE_RECIP)  # scalar
        sv = tl.zeros([BLOCK_C], dtype=tl.float32) + s_tile
        for j in tl.range(0, 128 // BLOCK_C):
            cols = (pid_c * 128 + j * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
            h, _ = _t_values(g_ptr, u_ptr, dh_ptr, pid_m, cols, M, I, stride_m, False, INTERPRET, T_LOAD)
            _t_store(qt_ptr, h, sv, pid_m, cols, CQ, RT, stride_qtk, INTERPRET, T_LOAD)
        tl.store(st_ptr + pid_c * stride_stk + pid_m * stride_stg, s_tile)
    else:
        cols = (pid_c * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)  # [BC]
        a, b = _t_values(g_ptr, u_ptr, dh_ptr, pid_m, cols, M, I, stride_m, BWD, INTERPRET, T_LOAD)
        sa = _scale(_t_colmax(a, T_LOAD), SCALE_RECIP)  # [BC]
        _t_store(qt_ptr, a, sa, pid_m, cols, CQ, RT, stride_qtk, INTERPRET, T_LOAD)
        tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, sa, mask=cols < CQ)
        if BWD:
            sb = _scale(_t_colmax(b, T_LOAD), SCALE_RECIP)
            _t_store(qt2_ptr, b, sb, pid_m, cols, CQ, RT, stride_qtk, INTERPRET, T_LOAD)
            tl.store(st2_ptr + cols * stride_stk + pid_m * stride_stg, sb, mask=cols < CQ)


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


def _row_launch(g, u, dh, outs, rows: int, cols: int, sub: int, warps: int) -> fq.Launch:
    (q, s), (q2, s2) = outs
    m, i = g.shape
    block_m = min(sub, max(16, triton.next_power_of_2(rows)))
    return fq.Launch(
        _swiglu_rows_kernel, (triton.cdiv(rows, block_m), cols // GROUP),
        (g, u, dh if dh is not None else g, q, s, q2 if q2 is not None else q, s2 if s2 is not None else s,
         m, i, g.stride(0), rows, cols, q.stride(0), s.stride(0), s.stride(1)),
        {"BWD": dh is not None, "SCALE_RECIP": g.is_cuda, "BLOCK_M": block_m, "SUB": min(sub, block_m),
         "INTERPRET": _interpreting()},
        warps)


def _col_launch(g, u, dh, outs, cols: int, t_rows: int, t_tiles: bool, block_c: int, warps: int,
                t_load: bool) -> fq.Launch:
    (qt, st), (qt2, st2) = outs
    m, i = g.shape
    return fq.Launch(
        _swiglu_cols_kernel, (t_rows // GROUP, cols // GROUP if t_tiles else triton.cdiv(cols, block_c)),
        (g, u, dh if dh is not None else g, qt, st, qt2 if qt2 is not None else qt, st2 if st2 is not None else st,
         m, i, g.stride(0), cols, t_rows, qt.stride(0), st.stride(0), st.stride(1)),
        {"BWD": dh is not None, "SCALE_RECIP": g.is_cuda, "BLOCK_C": block_c, "INTERPRET": _interpreting(),
         "TILE": t_tiles, "T_LOAD": bool(t_load)},
        warps)


def _run(g, u, dh, rows: int, cols: int, t_rows: int | None, row_groups: bool, t_tiles: bool,
         setting: tuple | None, t_setting: tuple | None):
    bwd = dh is not None
    m, _ = _check((g, u) + ((dh,) if bwd else ()), rows, cols, t_rows)
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
    if row_groups:
        outs = ((one[0], one[1]), (two[0], two[1]))
        make = lambda sub, warps: _row_launch(g, u, dh, outs, rows, cols, sub, warps)
        if setting is None:
            key = ("swiglu-rows", bwd, g.dtype, triton.next_power_of_2(rows), cols)
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
