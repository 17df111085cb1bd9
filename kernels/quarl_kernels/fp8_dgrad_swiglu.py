"""The down projection's DGrad with SwiGLU's backward and the gate / up operands' quantizers in its epilogue (Jet-RL's
FP8 MLP backward, one kernel instead of a GEMM and a quantizer pass). An experiment, opt-in until measured.

Why. In the fused FP8 MLP's backward (``quarl.quant.fp8_swiglu``) the down projection's DGrad writes ``dh = dY Wd``
[M, I] in BF16 (DeepGEMM), and SwiGLU's backward pass reads dh, g and u back to code dg and du in 1x128 groups both
ways (``fp8_swiglu`` / ``fp8_quant_regs``). At Qwen2.5-7B width and 16k tokens the two took 1.89 + 2.40 ms of a
~26.7 ms layer on an H100 in the actor update (RESULTS.md "Session 32": in the layer the quantizer pass runs ~1.4x
slower than alone, latency-bound at 255 registers and one program a multiprocessor). Here a program computes one
[128 tokens, 128 columns] tile of dh in registers and, before anything is written, loads the same tile of g and u,
computes dg and du and codes them: a tile's rows are exactly 1x128 groups along I (the gate / up DGrads' operand) and
its columns exactly 1x128 groups along the tokens (their WGrads' operand), so no group crosses programs. dh is never
written or read (1.2 GB a layer less traffic at that shape), and the quantizer pass is gone -- if the GEMM part runs
near DeepGEMM's speed.

    K loop   acc += (Q(dY)[m-tile, k-block] . Wd^T[n-tile, k-block]^T) * s_dY[m, k] * s_W[n-tile, k]   fp32
             (an FP8 tensor-core dot per 128-wide K block, promoted into the FP32 accumulator by its scales:
             DeepGEMM's 1D2D arithmetic, per block in K order)
    epilogue dh = bf16(acc), split into four [128, 32] column chunks (registers):
             pass 1, each chunk: g, u loaded, (dg, du) = fp8_swiglu.grad_values(g, u, dh); their 1x128 column groups
                     (a column's 128 tokens) coded and stored transposed; the row amax gathered
             pass 2, each chunk: dg, du again (g, u from L2), coded with the tile's row scales, stored row-major

Numerics: the codes are ``fp8_swiglu``'s for the same dh (the same ``grad_values`` and ``_codes_by_recip`` functions);
dh itself is an FP32 sum of the same FP8 products as DeepGEMM's / cuBLAS's but in this kernel's order, so it can
differ from theirs in the last bit of a BF16 value, and a code next to it by a step (tests compare against the
GEMM + quantizer path within the fp8_swiglu tolerance).

Layouts (``quarl.quant.fp8_linear``'s): dY codes [Mp, Kp] with 1x128 scales [Mp, Kp/128] (any strides); Wd^T tiles
[Np, Kp] (K contiguous) with 128x128 scales [Np/128, Kp/128]; g, u [M, N] with unit column stride (one layout); the
outputs as ``fp8_swiglu.swiglu_grad_operands`` returns them, given as ``out`` or allocated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels import fp8_quant as fq
from quarl_kernels import fp8_swiglu as fs
from quarl_kernels.fp8_quant import _scale
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.rounding import round_to

GROUP = fq.GROUP
# (K stages in flight, warps, programs grouped along M for L2 reuse); the first is the default. Not yet measured on
# a GPU. Compiled for sm_90 (tests): 201 registers at 8 warps, 121 at 16, no spills -- with the epilogue on the whole
# [128, 128] tile at once instead of four column chunks it spilled 576-640 bytes
SETTINGS = ((3, 8, 8), (4, 8, 8), (3, 8, 16), (3, 16, 8))


@triton.jit
def _store_cols(qt_ptr, st_ptr, x, pid_m, cols, c_ok, RT, stride_qtk, stride_stk, stride_stg,
                SCALE_RECIP: tl.constexpr, INTERPRET: tl.constexpr):
    """``x`` [128 tokens, 128 columns]: each column one 1x128 group along the tokens -- its scale from the column's
    amax, its codes stored transposed, qt[col, token]."""
    sc = _scale(tl.max(tl.abs(x), axis=0), SCALE_RECIP)  # [128]
    tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, sc, mask=c_ok)
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)
    qc = tl.trans(fs._codes_by_recip(x, sc[None, :], INTERPRET))  # [128 columns, 128 tokens]
    tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc, mask=c_ok[:, None] & (rows < RT)[None, :])


@triton.jit
def _halves(x):
    """[R, W] -> its column halves ([R, W/2], [R, W/2]): columns 0..W/2-1, then W/2..W-1."""
    r: tl.constexpr = x.shape[0]
    w: tl.constexpr = x.shape[1]
    return tl.split(tl.permute(tl.reshape(x, [r, 2, w // 2]), [0, 2, 1]))


@triton.jit
def _chunk_grads(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET: tl.constexpr):
    """dg and du of one [128, C] column chunk (columns c0..) from dh's chunk and g, u loaded: fp32 values of g's
    dtype, padding 0; -> (dg, du, cols)."""
    cw: tl.constexpr = dh_c.shape[1]
    cols = (c0 + tl.arange(0, cw)).to(tl.int64)
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * stride_gm + cols[None, :]
    g = tl.load(g_ptr + offs, mask=ok, other=0.0)
    u = tl.load(u_ptr + offs, mask=ok, other=0.0)
    dg, du = fs.grad_values(g, u, dh_c, INTERPRET)
    return dg, du, cols


@triton.jit
def _cols_chunk(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, qt_ptr, st_ptr, qt2_ptr, st2_ptr, pid_m, CQ, RT,
                stride_qtk, stride_stk, stride_stg, SCALE_RECIP: tl.constexpr, INTERPRET: tl.constexpr):
    """Pass 1 over a column chunk: dg's and du's 1x128 column groups (a column's 128 tokens are all in the tile) coded
    and stored transposed; -> the chunk's row amax of |dg| and |du| ([128] each)."""
    dg, du, cols = _chunk_grads(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
    c_ok = cols < CQ
    _store_cols(qt_ptr, st_ptr, dg, pid_m, cols, c_ok, RT, stride_qtk, stride_stk, stride_stg, SCALE_RECIP, INTERPRET)
    _store_cols(qt2_ptr, st2_ptr, du, pid_m, cols, c_ok, RT, stride_qtk, stride_stk, stride_stg, SCALE_RECIP,
                INTERPRET)
    return tl.max(tl.abs(dg), axis=1), tl.max(tl.abs(du), axis=1)


@triton.jit
def _row_amax(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET: tl.constexpr):
    """Pass 1 without the column groups: the chunk's row amax of |dg| and |du|."""
    dg, du, _ = _chunk_grads(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
    return tl.max(tl.abs(dg), axis=1), tl.max(tl.abs(du), axis=1)


@triton.jit
def _rows_chunk(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, q_ptr, q2_ptr, sg, su, CQ, RQ, stride_qm,
                INTERPRET: tl.constexpr):
    """Pass 2 over a column chunk: dg and du again (g, u re-read: L2), coded with the tile's row scales ``sg`` /
    ``su`` ([128]) and stored row-major."""
    dg, du, cols = _chunk_grads(dh_c, c0, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
    m = (rows < RQ)[:, None] & (cols < CQ)[None, :]
    tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], fs._codes_by_recip(dg, sg[:, None], INTERPRET), mask=m)
    tl.store(q2_ptr + rows[:, None] * stride_qm + cols[None, :], fs._codes_by_recip(du, su[:, None], INTERPRET), mask=m)


@triton.jit
def _dgrad_swiglu_kernel(
    a_ptr, sa_ptr, b_ptr, sb_ptr, g_ptr, u_ptr,
    q_ptr, s_ptr, q2_ptr, s2_ptr, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
    M, N, K, MA, stride_am, stride_sam, stride_sak, stride_bn, stride_sbn, stride_sbk, stride_gm,
    RQ, CQ, RT, stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: tl.constexpr, COLS: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
    SCALE_RECIP: tl.constexpr, INTERPRET: tl.constexpr, DH_ONLY: tl.constexpr = False,
):
    # programs over [RT / 128 token tiles] x [CQ / 128 column tiles], GROUP_M token tiles side by side (they share
    # Wd^T's column tile in L2)
    pid = tl.program_id(0)
    n_m = tl.cdiv(RT, 128)
    n_n = CQ // 128
    group = pid // (GROUP_M * n_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * n_n)) % size_m
    pid_n = (pid % (GROUP_M * n_n)) // size_m
    rows = (pid_m * 128 + tl.arange(0, 128)).to(tl.int64)  # [128] tokens
    cols = (pid_n * 128 + tl.arange(0, 128)).to(tl.int64)  # [128] columns of dh (I)
    kk = tl.arange(0, 128)
    a_ok = rows < MA  # dY's rows (Mp: the quantizer's padded rows are zero codes)
    acc = tl.zeros([128, 128], dtype=tl.float32)
    for kb in tl.range(0, tl.cdiv(K, 128), num_stages=STAGES):
        k0 = kb * 128
        a = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + kk)[None, :], mask=a_ok[:, None], other=0.0)  # [128, 128]
        b = tl.load(b_ptr + cols[:, None] * stride_bn + (k0 + kk)[None, :])  # [128 columns, 128 K]: Wd^T's tile
        sa = tl.load(sa_ptr + rows * stride_sam + kb * stride_sak, mask=a_ok, other=0.0)  # [128]
        sb = tl.load(sb_ptr + pid_n * stride_sbn + kb * stride_sbk)  # the tile's scale
        part = tl.dot(a, tl.trans(b))  # [128 tokens, 128 columns], exact products, FP32 sums
        acc = tl.fma(part, (sa * sb)[:, None], acc)
    if DH_ONLY:  # the GEMM alone, dh stored at q_ptr in its dtype (:func:`dgrad_only`: to time the parts apart)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], round_to(acc, q_ptr.dtype.element_ty, INTERPRET),
                 mask=(rows < M)[:, None] & (cols < N)[None, :])
        return
    # the epilogue in four [128, 32] column chunks (a whole [128, 128] dg and du beside dh and g spilled registers):
    # pass 1 codes each chunk's column groups and gathers the row amax, pass 2 recomputes dg, du and codes the rows
    dh = round_to(acc, g_ptr.dtype.element_ty, INTERPRET)  # the GEMM's output dtype, nearest even
    h0, h1 = _halves(dh)
    d0, d1 = _halves(h0)
    d2, d3 = _halves(h1)
    c0 = pid_n * 128
    if COLS:
        ag0, au0 = _cols_chunk(d0, c0, g_ptr, u_ptr, rows, M, N, stride_gm, qt_ptr, st_ptr, qt2_ptr, st2_ptr, pid_m,
                               CQ, RT, stride_qtk, stride_stk, stride_stg, SCALE_RECIP, INTERPRET)
        ag1, au1 = _cols_chunk(d1, c0 + 32, g_ptr, u_ptr, rows, M, N, stride_gm, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
                               pid_m, CQ, RT, stride_qtk, stride_stk, stride_stg, SCALE_RECIP, INTERPRET)
        ag2, au2 = _cols_chunk(d2, c0 + 64, g_ptr, u_ptr, rows, M, N, stride_gm, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
                               pid_m, CQ, RT, stride_qtk, stride_stk, stride_stg, SCALE_RECIP, INTERPRET)
        ag3, au3 = _cols_chunk(d3, c0 + 96, g_ptr, u_ptr, rows, M, N, stride_gm, qt_ptr, st_ptr, qt2_ptr, st2_ptr,
                               pid_m, CQ, RT, stride_qtk, stride_stk, stride_stg, SCALE_RECIP, INTERPRET)
    else:  # the row amax alone (no transposed operands asked)
        ag0, au0 = _row_amax(d0, c0, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
        ag1, au1 = _row_amax(d1, c0 + 32, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
        ag2, au2 = _row_amax(d2, c0 + 64, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
        ag3, au3 = _row_amax(d3, c0 + 96, g_ptr, u_ptr, rows, M, N, stride_gm, INTERPRET)
    if ROWS:
        r_ok = rows < RQ
        sg = _scale(tl.maximum(tl.maximum(ag0, ag1), tl.maximum(ag2, ag3)), SCALE_RECIP)  # [128] row scales
        su = _scale(tl.maximum(tl.maximum(au0, au1), tl.maximum(au2, au3)), SCALE_RECIP)
        tl.store(s_ptr + rows * stride_sm + pid_n * stride_sg, sg, mask=r_ok)
        tl.store(s2_ptr + rows * stride_sm + pid_n * stride_sg, su, mask=r_ok)
        _rows_chunk(d0, c0, g_ptr, u_ptr, rows, M, N, stride_gm, q_ptr, q2_ptr, sg, su, CQ, RQ, stride_qm, INTERPRET)
        _rows_chunk(d1, c0 + 32, g_ptr, u_ptr, rows, M, N, stride_gm, q_ptr, q2_ptr, sg, su, CQ, RQ, stride_qm,
                    INTERPRET)
        _rows_chunk(d2, c0 + 64, g_ptr, u_ptr, rows, M, N, stride_gm, q_ptr, q2_ptr, sg, su, CQ, RQ, stride_qm,
                    INTERPRET)
        _rows_chunk(d3, c0 + 96, g_ptr, u_ptr, rows, M, N, stride_gm, q_ptr, q2_ptr, sg, su, CQ, RQ, stride_qm,
                    INTERPRET)


def launch_spec(a, sa, b, sb, g, u, one: tuple, two: tuple, rows: int, cols: int, t_rows: int | None,
                setting: tuple) -> fq.Launch:
    """The launch of :func:`_dgrad_swiglu_kernel` (module docstring's layouts); ``one`` / ``two``: dg's / du's ``(q, s,
    qt, st)`` (q / s None: no row groups; qt / st None: no transposed operands, ``t_rows`` then None)."""
    m, n = g.shape
    ka = a.shape[1]
    if (ka % GROUP or b.shape[1] != ka or b.shape[0] < cols or b.stride(1) != 1 or a.stride(1) != 1
            or g.stride() != u.stride() or g.stride(1) != 1 or cols % GROUP or cols < n):
        raise ValueError(f"fp8_dgrad_swiglu: dY [Mp, K] and Wd^T tiles [>= cols, K] with K a multiple of 128 and unit "
                         f"column stride, g and u of one layout [M, N <= cols] (got a {tuple(a.shape)} "
                         f"{a.stride()}, b {tuple(b.shape)} {b.stride()}, g {tuple(g.shape)} {g.stride()}, u "
                         f"{u.stride()}, cols {cols})")
    if one[0] is None and t_rows is None:
        raise ValueError("fp8_dgrad_swiglu: nothing asked (no row groups and no t_rows)")
    if rows < m or (t_rows is not None and (t_rows % GROUP or t_rows < rows)):
        raise ValueError(f"fp8_dgrad_swiglu: rows={rows} >= M={m} and t_rows={t_rows} a multiple of {GROUP} >= rows")
    extent = t_rows if t_rows is not None else _round(rows)
    q, s, qt, st = one
    q2, s2, qt2, st2 = two
    if q is None:  # placeholders for pointers a pass does not use
        q, s, q2, s2 = qt, st, qt2, st2
    if qt is None:
        qt, st, qt2, st2 = q, s, q2, s2
    stages, warps, group_m = setting
    return fq.Launch(
        _dgrad_swiglu_kernel, ((extent // GROUP) * (cols // GROUP),),
        (a, sa, b, sb, g, u, q, s, q2, s2, qt, st, qt2, st2, m, n, ka, a.shape[0], a.stride(0), sa.stride(0),
         sa.stride(1), b.stride(0), sb.stride(0), sb.stride(1), g.stride(0), rows, cols, extent, q.stride(0),
         s.stride(0), s.stride(1), qt.stride(0), st.stride(0), st.stride(1)),
        {"ROWS": one[0] is not None, "COLS": t_rows is not None, "GROUP_M": group_m, "STAGES": stages,
         "SCALE_RECIP": g.is_cuda, "INTERPRET": _interpreting()},
        warps)


def _round(n: int) -> int:
    return -(-n // GROUP) * GROUP


def dgrad_swiglu_operands(a, sa, b, sb, g, u, rows: int, cols: int, t_rows: int | None = None, *,
                          row_groups: bool = True, out: tuple | None = None, setting: tuple | None = None):
    """``dh = a b^T`` (a = Q(dY) [Mp, K] with 1x128 scales ``sa``, b = Wd^T's tiles [>= cols, K] with 128x128 scales
    ``sb``) and SwiGLU's backward for ``g``, ``u`` [M, N] -> ``(dg's (q, s, qt, st), du's)``, the operands
    ``fp8_swiglu.swiglu_grad_operands(dh, g, u, rows, cols, t_rows, row_groups=..., out=...)`` returns for that dh;
    dh is never written. ``setting``: an entry of :data:`SETTINGS` (default the first)."""
    if out is None:
        one = fq._act_outputs(g, rows, cols, t_rows, row_groups)
        two = fq._act_outputs(g, rows, cols, t_rows, row_groups)
    else:
        one, two = fs._checked_out(out, g, rows, cols, t_rows, row_groups)
    if g.shape[0] == 0:
        for t in (*one, *two):
            if t is not None:
                (t.view(torch.uint8).zero_() if t.dtype == torch.float8_e4m3fn
                 else t.fill_(torch.finfo(torch.float32).eps))
        return one, two
    fq._launch(launch_spec(a, sa, b, sb, g, u, one, two, rows, cols, t_rows, setting or SETTINGS[0]))
    return one, two


def dgrad_only_spec(a, sa, b, sb, dh: torch.Tensor, setting: tuple | None = None) -> fq.Launch:
    """The launch of the kernel's GEMM alone into ``dh`` [m, n] (:func:`dgrad_only`)."""
    m, n = dh.shape
    cols = _round(n)
    stages, warps, group_m = setting or SETTINGS[0]
    return fq.Launch(
        _dgrad_swiglu_kernel, ((_round(m) // GROUP) * (cols // GROUP),),
        (a, sa, b, sb, dh, dh, dh, sa, dh, sa, dh, sa, dh, sa, m, n, a.shape[1], a.shape[0], a.stride(0), sa.stride(0),
         sa.stride(1), b.stride(0), sb.stride(0), sb.stride(1), n, m, cols, _round(m), dh.stride(0), 1, 1, 1, 1, 1),
        {"ROWS": False, "COLS": False, "GROUP_M": group_m, "STAGES": stages, "SCALE_RECIP": a.is_cuda,
         "INTERPRET": _interpreting(), "DH_ONLY": True},
        warps)


def dgrad_only(a, sa, b, sb, m: int, n: int, dtype=torch.bfloat16, setting: tuple | None = None) -> torch.Tensor:
    """The kernel's GEMM alone: ``dh = a b^T`` [m, n] in ``dtype`` (the layouts of :func:`dgrad_swiglu_operands`) -- its
    K loop and rounding without the epilogue, for benchmarks and tests that time or check the two parts apart."""
    dh = torch.empty(m, n, device=a.device, dtype=dtype)
    fq._launch(dgrad_only_spec(a, sa, b, sb, dh, setting))
    return dh


__all__ = ["SETTINGS", "dgrad_only", "dgrad_only_spec", "dgrad_swiglu_operands", "launch_spec"]
