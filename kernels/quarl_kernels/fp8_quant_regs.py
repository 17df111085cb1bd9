"""Both groupings of an FP8 activation operand from one read, X^T transposed by register order alone (Gluon; Jet-RL).

``fp8_quant.quantize_act`` makes X (or dY) in 1x128 groups along K and X^T along the tokens (1x128 groups, or
128x128 tiles for ``fp8_wgrad=tiles``). Its Triton kernels let the compiler place X^T's transpose: a layout change
through shared memory. Under Nsight Compute (H100, session 31, X [16384, 18944] at the best one-read setting) that
change has 5.7-5.9-way bank conflicts on 75 % of its shared-memory wavefronts, and the tile's loads use 16 of each
32-byte sector per request. The kernels ran at 42-68 % of their issue slots and 48-60 % of DRAM bandwidth -- ~60 % of
the copy rate.

Here the layout is chosen by hand so that the transpose needs no data movement at all. A program quantizes one
[128 tokens, 128 columns] tile; each thread holds ``TPT`` consecutive tokens x ``CPT`` consecutive columns, the 32
lanes of a warp along the columns (32 x CPT = 128 when CPT = 4), the warps along the tokens::

    LR = Blocked(size_per_thread [TPT, CPT], threads_per_warp [1, 32], warps [128 / TPT, 1], order [1, 0])
    LT = the same, order [0, 1]

* Loads (in LR, columns fastest): a warp reads a row's 128 columns as one contiguous 256-byte request per
  instruction (CPT = 4: an 8-byte vector a thread); a thread issues all its TPT loads before any arithmetic.
* 1x128 groups along K: a row's amax is within the thread (CPT) and across the warp's lanes (shuffles) -- no shared
  memory; a thread stores its CPT codes of a row as one 4-byte word, a warp 128 contiguous bytes.
* X^T: a column's amax (or the tile's) is within the thread (TPT tokens) and across the warps (the one reduction
  through shared memory, 128 values a warp); the codes are converted to LT -- the same element-to-thread map in
  another register order, so no instruction moves data between threads -- in which the TPT tokens of a column are a
  thread's contiguous run: one TPT-byte store per (thread, column) into X^T's row.

Three uses of the design (each timed or switchable by its caller; RESULTS.md "Session 31"): a run-time candidate of
``fp8_quant.quantize_act`` wherever X^T is wanted (:func:`launch_spec`; 2-6 % on 4 of 5 7B operands); the MLP
forward's ``h = silu(g) * u`` quantized from g and u without writing h (``SWIGLU``, ``quarl.quant.fp8_swiglu``: 1.56x
the glue + quantizer); SwiGLU's backward pass, dg and du from one read of dh, g, u (:func:`swiglu_bwd_spec`, a candidate
of ``fp8_swiglu``'s merged choice, ~10 % faster than its Triton pass). What still holds them below the copy rate
(~30 instructions an element, two 8-warp programs a multiprocessor at 118-128 registers) is the next step's question.

Numerics are ``fp8_quant``'s, bit for bit: ``scale = amax * fp32(1/448)`` (CUDA PyTorch's ``amax / 448``), eps for an
all-zero group, codes ``RN(x / scale)`` by ``group_div`` (the group's reciprocal once, div.rn's fast path an element)
cast RNE with saturation to E4M3. Gluon kernels do not run in Triton's CPU interpreter: the CPU tests compile them for
sm_90 (registers, spills, the instructions above); the GPU test compares their bytes with eager PyTorch's.

History: session 26's Gluon kernel (``benchmarks/kernels/fp8_quant_gluon.py``, removed in session 31: four tokens a
thread, X^T stored as 32-bit words, ``div_rn`` per element) ran at half the split settings' speed (H200); this one
differs in the per-element division (``group_div``, session 30), the load pattern (a row a warp instruction) and the
run of tokens a thread holds (16 bytes of X^T a store).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from quarl_kernels import fp8_quant, fp8_swiglu, group_div

GROUP = 128
# (tokens a thread, warps): TPT x 4 elements a thread, 128 / TPT warps cover the tile's 128 tokens. H100, session 31
# (7B operands, 16k tokens): (16, 8) 2-6 % faster than the best Triton setting on 4 of 5 operands, (8, 16) 1.3-1.5x
# slower than it; (32, 4) 1.07-1.35x slower and spilling without X^T (255 registers): dropped. Persistent forms (one
# program a multiprocessor walking tiles, the next tile prefetched into registers or by cp.async into a ring of 3-4
# tiles in shared memory) were 1.1-1.7x slower than (16, 8) at 161-255 registers, one program a multiprocessor
# (RESULTS.md "Session 31"); removed. The fused SwiGLU forward: (16, 8) 0.84 ms at 7B width against (8, 16)'s 1.08
# (which spills 8 bytes with 1x128 X^T groups): (16, 8) alone.
SETTINGS = ((16, 8), (8, 16))
SWIGLU_SETTINGS = ((16, 8),)
SWIGLU_BWD_SETTINGS = ((16, 8), (8, 16))  # SwiGLU's backward: ("regs", *setting) candidates of fp8_swiglu's choice


@gluon.jit
def _scale(amax):
    return fp8_quant._scale(amax, True)  # CUDA PyTorch's amax / 448.0 == amax * fp32(1/448); eps for 0


@gluon.jit
def _codes(x, s):
    """E4M3 codes of fp32 ``x`` with scale ``s`` (broadcastable): ``RN(x / s)`` cast with saturation."""
    sn, y, m = group_div.divisor_parts(s)
    return group_div.quotient(x, sn, y, m).to(gl.float8e4nv)  # cvt.rn.satfinite.e4m3x2.f32: the clamp to +-448


@gluon.jit
def _load(x_ptr, pid_m, pid_k, M, K, stride_xm, valid, LR: gl.constexpr):
    """x's tile (pid_m, pid_k) [128 tokens, 128 columns] in LR, in x's dtype (0 = padding; all 0 unless ``valid``)."""
    tok = pid_m * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, LR))
    col = pid_k * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LR))
    t2 = gl.expand_dims(tok, 1).to(gl.int64)  # [128, 1]
    c2 = gl.expand_dims(col, 0).to(gl.int64)  # [1, 128]
    return gl.load(x_ptr + t2 * stride_xm + c2, mask=(t2 < M) & (c2 < K) & valid, other=0.0)


@gluon.jit
def _codes_by_recip(x, s):
    """``fp8_swiglu``'s codes: ``x * RN(1 / s)`` cast with saturation (its clamp to +-448 before the cast changes no
    code: the cast saturates, NaN stays NaN)."""
    return (x * gl.div_rn(1.0, s)).to(gl.float8e4nv)


@gluon.jit
def _silu_mul(g_in, u_in):
    """SwiGLU's forward ``h = silu(g) * u`` in fp32 at eager PyTorch's roundings (``F.silu(g)`` rounded to the input
    dtype, then the product rounded) with fast arithmetic -- ``exp`` as ``ex2.approx``, ``1 / (1 + e)`` approximate --
    as ``fp8_swiglu``'s backward computes ``silu(g)``: a counted few ``h`` one ulp off eager's."""
    dt: gl.constexpr = g_in.dtype
    g = g_in.to(gl.float32)
    s = 1.0 / (1.0 + gl.exp(-g))
    act = (g * s).to(dt).to(gl.float32)
    return (act * u_in.to(gl.float32)).to(dt).to(gl.float32)


@gluon.jit
def _quantize(xin, pid_m, pid_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT,
              stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
              ROWS: gl.constexpr, COLS: gl.constexpr, TILE: gl.constexpr, LR: gl.constexpr, LT: gl.constexpr,
              RECIP: gl.constexpr = False):
    """The row groups (ROWS) and X^T (COLS) of one loaded tile (:func:`_load`), stored; RECIP: codes as ``x * RN(1 /
    s)`` (``fp8_swiglu``'s) instead of the correctly rounded quotient."""
    tok = pid_m * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, LR))  # [128]
    col = pid_k * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LR))  # [128]
    t2 = gl.expand_dims(tok, 1).to(gl.int64)
    c2 = gl.expand_dims(col, 0).to(gl.int64)
    x = xin.to(gl.float32)  # [128, 128]
    ax = gl.abs(x)
    if ROWS:  # 1x128 groups along K: a row's amax within the warp
        rs = _scale(gl.max(ax, axis=1))  # [128]
        if RECIP:
            q = _codes_by_recip(x, gl.expand_dims(rs, 1))
        else:
            q = _codes(x, gl.expand_dims(rs, 1))
        gl.store(q_ptr + t2 * stride_qm + c2, q, mask=(t2 < RQ) & (c2 < CQ))
        gl.store(s_ptr + tok.to(gl.int64) * stride_sm + pid_k * stride_sg, rs, mask=tok < RQ)
    if COLS:
        cmax = gl.max(ax, axis=0)  # [128]: a column's amax over the token group (across the warps)
        if TILE:  # X^T in 128x128 tiles: one scale
            s_tile = _scale(gl.max(cmax, axis=0))
            ct = _codes(x, s_tile)
        else:
            sc = _scale(cmax)  # [128]
            if RECIP:
                ct = _codes_by_recip(x, gl.expand_dims(sc, 0))
            else:
                ct = _codes(x, gl.expand_dims(sc, 0))
        ct = gl.convert_layout(ct, LT)  # the same element-to-thread map: registers renamed, nothing moved
        tokt = pid_m * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, LT))
        colt = pid_k * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LT))
        tt = gl.expand_dims(tokt, 1).to(gl.int64)
        ctt = gl.expand_dims(colt, 0).to(gl.int64)
        gl.store(qt_ptr + ctt * stride_qtk + tt, ct, mask=(ctt < CQ) & (tt < RT))  # X^T[col, tok]: TPT bytes a run
        if TILE:
            gl.store(st_ptr + pid_k * stride_stk + pid_m * stride_stg, s_tile)
        else:
            gl.store(st_ptr + col.to(gl.int64) * stride_stk + pid_m * stride_stg, sc, mask=col < CQ)


@gluon.jit
def _regs_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_xm, RQ, CQ, RT,
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: gl.constexpr, TILE: gl.constexpr, TPT: gl.constexpr, u_ptr=None, SWIGLU: gl.constexpr = False,
    COLS: gl.constexpr = True,
):
    # one program: the tile tokens [pid_m*128, +128) x columns [pid_k*128, +128) of x. SWIGLU: x is the gate
    # projection's output g, u_ptr the up projection's u (same strides), and the operand quantized is h = silu(g) * u
    # -- never written in BF16 (the down projection's input, Jet-RL's MLP forward). COLS False: the row groups alone
    # (a forward without autograd: no X^T for a weight gradient), RT then the rows to cover
    LR: gl.constexpr = gl.BlockedLayout([TPT, 4], [1, 32], [128 // TPT, 1], [1, 0])  # columns fastest: loads, q
    LT: gl.constexpr = gl.BlockedLayout([TPT, 4], [1, 32], [128 // TPT, 1], [0, 1])  # tokens fastest: X^T's store
    pid_m = gl.program_id(0)
    pid_k = gl.program_id(1)
    x = _load(x_ptr, pid_m, pid_k, M, K, stride_xm, True, LR)
    if SWIGLU:  # padding: silu(0) * 0 = 0
        x = _silu_mul(x, _load(u_ptr, pid_m, pid_k, M, K, stride_xm, True, LR))
    _quantize(x, pid_m, pid_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT, stride_qm, stride_sm, stride_sg,
              stride_qtk, stride_stk, stride_stg, ROWS, COLS, TILE, LR, LT)


@gluon.jit
def _swiglu_bwd_kernel(
    g_ptr, u_ptr, dh_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, q2_ptr, s2_ptr, qt2_ptr, st2_ptr,
    M, K, stride_m, stride_dm, RQ, CQ, RT,
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: gl.constexpr, TPT: gl.constexpr,
):
    # SwiGLU's backward (``fp8_swiglu``'s merged pass, bit for bit): one [128 tokens, 128 columns] tile of dh, g, u
    # read once; dg's and du's row groups (ROWS) and X^T in 1x128 groups along the tokens from registers, dg first
    LR: gl.constexpr = gl.BlockedLayout([TPT, 4], [1, 32], [128 // TPT, 1], [1, 0])
    LT: gl.constexpr = gl.BlockedLayout([TPT, 4], [1, 32], [128 // TPT, 1], [0, 1])
    pid_m = gl.program_id(0)
    pid_k = gl.program_id(1)
    g = _load(g_ptr, pid_m, pid_k, M, K, stride_m, True, LR)
    u = _load(u_ptr, pid_m, pid_k, M, K, stride_m, True, LR)
    dh = _load(dh_ptr, pid_m, pid_k, M, K, stride_dm, True, LR)
    dg, du = fp8_swiglu.grad_values(g, u, dh, False)  # the Triton passes' arithmetic (the same bits); padding: 0
    _quantize(dg, pid_m, pid_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT, stride_qm, stride_sm, stride_sg,
              stride_qtk, stride_stk, stride_stg, ROWS, True, False, LR, LT, True)
    _quantize(du, pid_m, pid_k, q2_ptr, s2_ptr, qt2_ptr, st2_ptr, RQ, CQ, RT, stride_qm, stride_sm, stride_sg,
              stride_qtk, stride_stk, stride_stg, ROWS, True, False, LR, LT, True)


def swiglu_bwd_spec(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, one: tuple, two: tuple, rows: int, cols: int,
                    t_rows: int, tpt: int, warps: int):
    """The launch (``fp8_quant.Launch``) of :func:`_swiglu_bwd_kernel`: ``one`` / ``two`` are dg's / du's ``(q, s, qt,
    st)`` as ``fp8_swiglu.swiglu_grad_operands`` allocates them (q / s None: no row groups); dh, g, u of one shape,
    dtype with unit column stride, g and u of one row stride (dh its own)."""
    m, k = g.shape
    if (g.stride(1) != 1 or dh.stride(1) != 1 or g.stride() != u.stride() or t_rows is None or t_rows % GROUP
            or warps * tpt != GROUP):
        raise ValueError(f"fp8_quant_regs: SwiGLU's backward needs dh, g, u with unit column stride, g and u of one "
                         f"layout, t_rows a multiple of 128 and warps x tokens a thread = 128 (strides "
                         f"{dh.stride()}, {g.stride()}, {u.stride()}, t_rows {t_rows}, tpt {tpt}, warps {warps})")
    (q, s, qt, st), (q2, s2, qt2, st2) = one, two
    if q is None:  # placeholders for the row groups' pointers
        q, s, q2, s2 = qt, st, qt2, st2
    return fp8_quant.Launch(
        _swiglu_bwd_kernel, (t_rows // GROUP, cols // GROUP),
        (g, u, dh, q, s, qt, st, q2, s2, qt2, st2, m, k, g.stride(0), dh.stride(0), rows, cols, t_rows, q.stride(0),
         s.stride(0), s.stride(1), qt.stride(0), st.stride(0), st.stride(1)),
        {"ROWS": one[0] is not None, "TPT": tpt},
        warps)


def launch_spec(x: torch.Tensor, q, s, qt, st, rows: int, cols: int, t_rows: int | None, tiles: bool, tpt: int,
                warps: int, u: torch.Tensor | None = None):
    """:func:`launch`'s launch as an ``fp8_quant.Launch`` (for ``fp8_quant.quantize_act``'s run-time choice, which
    times it beside the Triton settings)."""
    m, k = x.shape
    if u is not None and (u.shape != x.shape or u.dtype != x.dtype or u.stride() != x.stride()):
        raise ValueError(f"fp8_quant_regs: u must match x ({tuple(x.shape)}, {x.dtype}, strides {x.stride()}), got "
                         f"{tuple(u.shape)}, {u.dtype}, {u.stride()}")
    if (x.stride(1) != 1 or (qt is None) != (t_rows is None) or (q is None and qt is None) or (t_rows or 0) % GROUP
            or warps * tpt != GROUP):
        raise ValueError(f"fp8_quant_regs: needs x with unit column stride, t_rows a multiple of 128 with X^T (None "
                         f"without), an output, and warps x tokens a thread = 128 (x strides {x.stride()}, t_rows "
                         f"{t_rows}, X^T {qt is not None}, tpt {tpt}, warps {warps})")
    dq, ds = (q, s) if q is not None else (qt, st)  # placeholders for the pointers a pass does not use
    dqt, dst = (qt, st) if qt is not None else (q, s)
    extent = t_rows if t_rows is not None else rows  # the tokens the programs cover
    return fp8_quant.Launch(
        _regs_kernel, (triton.cdiv(extent, GROUP), cols // GROUP),
        (x, dq, ds, dqt, dst, m, k, x.stride(0), rows, cols, extent, dq.stride(0), ds.stride(0), ds.stride(1),
         dqt.stride(0), dst.stride(0), dst.stride(1)),
        {"ROWS": q is not None, "TILE": tiles and qt is not None, "TPT": tpt, "u_ptr": u if u is not None else x,
         "SWIGLU": u is not None, "COLS": qt is not None},
        warps)


def launch(x: torch.Tensor, q, s, qt, st, rows: int, cols: int, t_rows: int, tiles: bool, tpt: int, warps: int,
           u: torch.Tensor | None = None):
    """:func:`_regs_kernel` on ``fp8_quant.quantize_act``'s outputs (``q`` / ``s`` None: X^T alone; ``qt`` / ``st``
    None: the row groups alone, ``t_rows`` then None); needs ``x`` with unit column stride and ``warps == 128 //
    tpt``. ``u``: quantize ``silu(x) * u`` (x the gate projection's output; u of x's shape, dtype and strides)."""
    fp8_quant._launch(launch_spec(x, q, s, qt, st, rows, cols, t_rows, tiles, tpt, warps, u))


def launch_setting(x: torch.Tensor, q, s, qt, st, rows: int, cols: int, t_rows: int, tiles: bool, setting: tuple,
                   u: torch.Tensor | None = None):
    """:func:`launch` at a :data:`SETTINGS` entry (with ``u``: an entry of :data:`SWIGLU_SETTINGS`)."""
    launch(x, q, s, qt, st, rows, cols, t_rows, tiles, *setting, u=u)


def compile_sm90(tiles: bool = False, rows: bool = True, tpt: int = 16, swiglu: bool = False, cols: bool = True):
    """The kernel built for sm_90 on any machine (bf16 input, sizes divisible by 16 as at the 7B shapes): the CPU
    tests' view of its registers, spills and instructions."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "qt_ptr": "*fp8e4nv", "st_ptr": "*fp32",
           "M": "i32", "K": "i32", "stride_xm": "i32", "RQ": "i32", "CQ": "i32", "RT": "i32", "stride_qm": "i32",
           "stride_sm": "i32", "stride_sg": "i32", "stride_qtk": "i32", "stride_stk": "i32", "stride_stg": "i32"}
    sig["u_ptr"] = "*bf16"
    const = {"ROWS": rows, "TILE": tiles and cols, "TPT": tpt, "SWIGLU": swiglu, "COLS": cols}
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k not in ("stride_sm", "stride_sg", "stride_stk", "stride_stg")}  # the scales' strides: 1 or any
    sig.update({k: "constexpr" for k in const})
    src = GluonASTSource(fn=_regs_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": GROUP // tpt})


__all__ = ["SETTINGS", "SWIGLU_BWD_SETTINGS", "SWIGLU_SETTINGS", "compile_sm90", "launch", "launch_setting",
           "launch_spec", "swiglu_bwd_spec"]
