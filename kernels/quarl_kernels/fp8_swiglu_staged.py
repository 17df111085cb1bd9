"""SwiGLU's backward quantizers with the tile staged in shared memory: one read of dh, g, u, few registers (Gluon).

``fp8_swiglu``'s job -- from ``dh, g, u`` [M, I] (BF16) make dg's and du's FP8 operands in 1x128 groups along I (the
gate / up DGrad's A) and along the tokens (their WGrad's A), dg and du never written in BF16 -- done by a third
design. Why another: session 33 measured the FP8 actor update at the H100's 700 W power cap, the SM clock at ~1.45
GHz (p50) against the ~1.98 GHz of a loop of one kernel. The register-order kernel (``fp8_quant_regs.
swiglu_bwd_spec``) holds a whole [128, 128] tile of five tensors in registers (255 registers, one program of 8 warps
a multiprocessor): latency-bound, it slows with the clock (1.72 ms back to back, 2.05-2.28 ms in the step at 7B width,
16k tokens); the two Triton passes (row groups, then the transposed pass: each reads dh, g, u) stay bandwidth-bound
(1.82 / 1.88 ms) but read the inputs twice. The bytes of one read: 6 MI in + 4 MI of codes = 3.1 GB at 7B width,
~1.15 ms at 2.7 TB/s.

Here a program (8 warps) owns one [128 tokens, 128 columns] tile and works in two phases:

1. **Row chunks** (``R`` tokens at a time, ``R / 8`` rows a warp): load dh, g, u of the chunk, compute dg and du
   (``fp8_swiglu.grad_values``: eager PyTorch's roundings, the same bits as both other designs), code each row's
   1x128 group at once (the row is complete in the chunk: its amax is within a warp) and store it, and write dg and du
   -- BF16 values already, exactly -- into a [128, 128] BF16 buffer each in shared memory (64 KB a program).
2. **X^T from shared memory**: after a barrier, each buffer is read back in the register-order kernel's layout
   (``fp8_quant_regs._quantize`` with ``ROWS=False``: a column's amax over the tile's tokens, the codes transposed by
   register order, 16-byte runs of tokens stored into X^T's rows) -- one tensor at a time, so ~128 registers; or by
   ``NC``-column chunks of the buffer (the three-field :data:`SETTINGS`: 71 registers at NC = 64, three programs a
   multiprocessor; the fastest of all, session 34).

At ~128 registers and 64 KB of shared memory, two programs share a multiprocessor (16 warps, against one program of 8
in the register-order kernel), and phase 1's loads need few registers. Numerics: the row codes are ``_codes_by_recip``
of the same fp32 values; phase 2 reads dg / du back as the BF16 they were rounded to -- every code and scale equals
the register-order kernel's and the Triton passes' (GPU test ``test_every_launch_setting_gives_the_same_bits``,
passed on an H100 in session 33 for the whole-tile settings, in session 34 for the column-chunk ones, also at padded
shapes and into stacked operands; CPU:
compiled for sm_90, registers and spills, ``tests/kernels/test_fp8_quant_regs_compile.py``). Gluon kernels do not run
in Triton's CPU interpreter.

The forward's operand ``h = silu(g) * u`` staged the same way (:func:`fwd_spec`, :data:`FWD_SETTINGS`: 42-70
registers, 32-34 KB of shared memory, four programs a multiprocessor against the register-order SWIGLU form's two):
bit-equal to the register-order form on an H100 (session 34), a candidate of ``fp8_swiglu.swiglu_forward_operand``'s
choice beside it.

**TMA forms** (session 35, ``("tma", R, warps, NC)``, :data:`TMA_SETTINGS`): the same kernels with each input tile
copied into shared memory by one TMA copy (``tma=True``: host-side tensor descriptors, an mbarrier; zeros past the
tensor's edges, as the masked loads gave) and phase 1 reading its row chunks from there -- the whole tile's bytes in
flight at once, where the load form has one chunk in flight a program and none during phase 2. Bit-equal on an H100;
~0.1 ms faster for each SwiGLU kernel at 7B width (numbers at :data:`TMA_SETTINGS`). Tensors TMA cannot read (16-byte
alignment, :func:`tma_ok`) get the load form.

A candidate of ``fp8_swiglu``'s merged choice as ``("staged", R, warps[, NC])`` (:data:`SETTINGS`), timed in the step
by the in-situ choice (``QUARL_FP8_TUNE=situ``). Measured (H100, 7B width, 16k tokens, back to back): session 33's
whole-tile (32, 8) 1.54 ms (1.79 in the step) against the best other kernel's 1.71 / 1.88; session 34's column chunks
(16, 8, 64) 1.40 ms (32B width 2.03 against 2.27) -- still ~1.2x the ~1.15 ms its bytes take at 2.7 TB/s.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from quarl_kernels import fp8_quant, fp8_swiglu
from quarl_kernels.fp8_quant_regs import _codes, _codes_by_recip, _quantize, _scale, _silu_mul

GROUP = 128
# (tokens a row chunk, warps[, X^T's columns a step]); 8 warps only -- phase 2's layout puts 16 tokens a thread over 8
# warps (4 warps would hold 128 fp32 values a thread and spill). H100, session 33 phase d, 16k tokens, ms back to back
# / in the 7B step: (32, 8) 1.537-1.540 / 1.79, (16, 8) 1.704-1.710 / 2.01 -- against the register-order kernel's
# 1.706-1.714 / 2.06, Triton's merged pass 1.723-1.729 / 1.96 and the two passes' 1.816-1.817 / 1.88 (phase c); at 32B
# width (32, 8) 2.222 / 2.63 against 2.484 / 3.05 (register order) and 2.645 (two passes, back to back).
# Three fields: phase 2 by column chunks of the shared tile, so it holds 16 x 2 values a thread instead of 16 x 4 -- 71
# registers at (16, 8, 64) (sm_90, CPU compile): three programs a multiprocessor (198 KB of shared memory) instead of
# two. Session 34 (H100, phase a; its bits checked first by test_fp8_swiglu_gpu.py): 7B width (16, 8, 64) 1.398 ms,
# (32, 8, 64) 1.482, against (32, 8) 1.566 and (16, 8) 1.751 in the same run; 32B width 2.026 / 2.132 / 2.271 / 2.525.
# (16, 8), the slowest staged setting in every run, is dropped (session 33 history)
SETTINGS = ((16, 8, 64), (32, 8, 64), (32, 8))


@gluon.jit
def _chunk_rows(dh_ptr, g_ptr, u_ptr, q_ptr, s_ptr, q2_ptr, s2_ptr, buf_g, buf_u, buf_dh, row0, pid_k, M, K,
                stride_m, stride_dm, RQ, CQ, stride_qm, stride_sm, stride_sg, ROWS: gl.constexpr, R: gl.constexpr,
                LC: gl.constexpr, TMA: gl.constexpr = False):
    """Phase 1 for tokens [row0, row0 + R) of the tile: dg / du, their row groups stored (ROWS), and both written to
    the shared buffers' rows [row0 - tile start, + R) (``buf_g`` / ``buf_u``: those rows' views). TMA: g, u, dh are
    already there (``buf_dh`` too; dg / du then overwrite g / u, each element by the thread that read it)."""
    tok = row0 + gl.arange(0, R, layout=gl.SliceLayout(1, LC))  # [R]
    col = pid_k * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LC))  # [128]
    t2 = gl.expand_dims(tok, 1).to(gl.int64)  # [R, 1]
    c2 = gl.expand_dims(col, 0).to(gl.int64)  # [1, 128]
    if TMA:
        g = buf_g.load(LC)
        u = buf_u.load(LC)
        dh = buf_dh.load(LC)
    else:
        ok = (t2 < M) & (c2 < K)
        g = gl.load(g_ptr + t2 * stride_m + c2, mask=ok, other=0.0)
        u = gl.load(u_ptr + t2 * stride_m + c2, mask=ok, other=0.0)
        dh = gl.load(dh_ptr + t2 * stride_dm + c2, mask=ok, other=0.0)
    dg, du = fp8_swiglu.grad_values(g, u, dh, False)  # [R, 128] fp32 of BF16 values; padding: 0
    if ROWS:  # 1x128 groups along I: a row's amax within its warp
        st_ok = (t2 < RQ) & (c2 < CQ)
        rs = _scale(gl.max(gl.abs(dg), axis=1))  # [R]
        gl.store(q_ptr + t2 * stride_qm + c2, _codes_by_recip(dg, gl.expand_dims(rs, 1)), mask=st_ok)
        gl.store(s_ptr + tok.to(gl.int64) * stride_sm + pid_k * stride_sg, rs, mask=tok < RQ)
        rs2 = _scale(gl.max(gl.abs(du), axis=1))
        gl.store(q2_ptr + t2 * stride_qm + c2, _codes_by_recip(du, gl.expand_dims(rs2, 1)), mask=st_ok)
        gl.store(s2_ptr + tok.to(gl.int64) * stride_sm + pid_k * stride_sg, rs2, mask=tok < RQ)
    buf_g.store(dg.to(gl.bfloat16))  # exact: dg is a BF16 value
    buf_u.store(du.to(gl.bfloat16))


@gluon.jit
def _tma_tile(desc, bar, pid_m, pid_k):
    """Shared memory for the [128, 128] tile (tokens pid_m, columns pid_k) of ``desc``'s tensor, its TMA copy issued
    on ``bar`` (the caller expects the bytes and waits). The descriptor's layout is the unswizzled NVMMA one: the same
    bytes as the kernels' ``SwizzledSharedLayout(1, 1, 1, [1, 0])``, so the caller reinterprets it as that."""
    buf = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    tma.async_copy_global_to_shared(desc, [pid_m * 128, pid_k * 128], bar, buf)
    return buf


@gluon.jit
def _xt_chunk(x_in, pid_m, col0, qt_ptr, st_ptr, CQ, RT, stride_qtk, stride_stk, stride_stg, LH: gl.constexpr,
              LHT: gl.constexpr, NC: gl.constexpr, RECIP: gl.constexpr = True, s_tile=None):
    """X^T of ``x_in`` [128 tokens, NC columns from col0] in LH, stored transposed through LHT (the same
    element-to-thread map, tokens fastest) -- ``fp8_quant_regs._quantize``'s X^T branch on a column chunk: a column's
    amax over the tile's tokens (its scale stored), or with ``s_tile`` the tile's one scale (stored by the caller);
    codes by the reciprocal (RECIP, SwiGLU's backward) or the correctly rounded quotient (the forward's h)."""
    x = x_in.to(gl.float32)
    if s_tile is None:
        sc = _scale(gl.max(gl.abs(x), axis=0))  # [NC]
        sb = gl.expand_dims(sc, 0)
    else:
        sb = s_tile
    q = _codes_by_recip(x, sb) if RECIP else _codes(x, sb)
    ct = gl.convert_layout(q, LHT)  # registers renamed, nothing moved
    tt = gl.expand_dims(pid_m * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, LHT)), 1).to(gl.int64)  # [128, 1]
    ctt = gl.expand_dims(col0 + gl.arange(0, NC, layout=gl.SliceLayout(0, LHT)), 0).to(gl.int64)  # [1, NC]
    gl.store(qt_ptr + ctt * stride_qtk + tt, ct, mask=(ctt < CQ) & (tt < RT))
    if s_tile is None:
        col = col0 + gl.arange(0, NC, layout=gl.SliceLayout(0, LH))
        gl.store(st_ptr + col.to(gl.int64) * stride_stk + pid_m * stride_stg, sc, mask=col < CQ)


@gluon.jit
def _staged_kernel(
    g_ptr, u_ptr, dh_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, q2_ptr, s2_ptr, qt2_ptr, st2_ptr,
    M, K, stride_m, stride_dm, RQ, CQ, RT,
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: gl.constexpr, R: gl.constexpr, NC: gl.constexpr = 128, TMA: gl.constexpr = False,
):
    # one program: the tile tokens [pid_m*128, +128) x columns [pid_k*128, +128); 8 warps. TMA: g_ptr, u_ptr, dh_ptr
    # are tensor descriptors, the three tiles copied at once (96 KB of shared memory: two programs a multiprocessor)
    W: gl.constexpr = gl.num_warps()
    LC: gl.constexpr = gl.BlockedLayout([R // W, 4], [1, 32], [W, 1], [1, 0])  # a row chunk, columns fastest
    LR: gl.constexpr = gl.BlockedLayout([128 // W, 4], [1, 32], [W, 1], [1, 0])  # the tile, as fp8_quant_regs
    LT: gl.constexpr = gl.BlockedLayout([128 // W, 4], [1, 32], [W, 1], [0, 1])  # X^T's store order
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # a warp touches 256 contiguous bytes of a row
    pid_m = gl.program_id(0)
    pid_k = gl.program_id(1)
    if TMA:
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, 3 * 128 * 128 * 2)
        buf_g = _tma_tile(g_ptr, bar, pid_m, pid_k)._reinterpret(gl.bfloat16, [128, 128], SL)
        buf_u = _tma_tile(u_ptr, bar, pid_m, pid_k)._reinterpret(gl.bfloat16, [128, 128], SL)
        buf_dh = _tma_tile(dh_ptr, bar, pid_m, pid_k)._reinterpret(gl.bfloat16, [128, 128], SL)
        mbarrier.wait(bar, 0)
        mbarrier.invalidate(bar)
    else:
        buf_g = gl.allocate_shared_memory(gl.bfloat16, [128, 128], SL)
        buf_u = gl.allocate_shared_memory(gl.bfloat16, [128, 128], SL)
        buf_dh = buf_g  # unused
    for c in gl.static_range(128 // R):
        _chunk_rows(dh_ptr, g_ptr, u_ptr, q_ptr, s_ptr, q2_ptr, s2_ptr, buf_g.slice(c * R, R), buf_u.slice(c * R, R),
                    buf_dh.slice(c * R, R), pid_m * 128 + c * R, pid_k, M, K, stride_m, stride_dm, RQ, CQ, stride_qm,
                    stride_sm, stride_sg, ROWS, R, LC, TMA)
    gl.thread_barrier()
    # phase 2: X^T of dg, then of du, from shared memory (the row groups are done: ROWS False here)
    if NC == 128:
        _quantize(buf_g.load(LR), pid_m, pid_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT, stride_qm, stride_sm,
                  stride_sg, stride_qtk, stride_stk, stride_stg, False, True, False, LR, LT, True)
        _quantize(buf_u.load(LR), pid_m, pid_k, q2_ptr, s2_ptr, qt2_ptr, st2_ptr, RQ, CQ, RT, stride_qm, stride_sm,
                  stride_sg, stride_qtk, stride_stk, stride_stg, False, True, False, LR, LT, True)
    else:  # by column chunks: fewer registers (the three-field SETTINGS)
        LH: gl.constexpr = gl.BlockedLayout([128 // W, NC // 32], [1, 32], [W, 1], [1, 0])
        LHT: gl.constexpr = gl.BlockedLayout([128 // W, NC // 32], [1, 32], [W, 1], [0, 1])
        for h in gl.static_range(128 // NC):
            c0 = pid_k * 128 + h * NC
            _xt_chunk(buf_g.slice(h * NC, NC, dim=1).load(LH), pid_m, c0, qt_ptr, st_ptr, CQ, RT, stride_qtk,
                      stride_stk, stride_stg, LH, LHT, NC)
            _xt_chunk(buf_u.slice(h * NC, NC, dim=1).load(LH), pid_m, c0, qt2_ptr, st2_ptr, CQ, RT, stride_qtk,
                      stride_stk, stride_stg, LH, LHT, NC)


@gluon.jit
def _staged_fwd_kernel(
    g_ptr, u_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_m, RQ, CQ, RT,
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: gl.constexpr, TILE: gl.constexpr, R: gl.constexpr, NC: gl.constexpr, SWIGLU: gl.constexpr = True,
    TMA: gl.constexpr = False,
):
    # SwiGLU's forward operand staged the same way (session 33; bit-equal on an H100 in session 34; a candidate of
    # fp8_swiglu.swiglu_forward_operand): h = silu(g) * u by row chunks -- its row groups (ROWS) coded at once, h (BF16
    # values) into shared memory, with TILE the tile's amax accumulated elementwise -- then X^T by NC-column chunks from
    # shared memory: fp8_quant_regs' SWIGLU form's bits (codes as the correctly rounded quotient). SWIGLU False: any
    # BF16 activation x (g_ptr; u_ptr unused) staged the same way -- fp8_quant_regs' plain form's bits (session 35,
    # H100: ACT_SETTINGS)
    W: gl.constexpr = gl.num_warps()
    LC: gl.constexpr = gl.BlockedLayout([R // W, 4], [1, 32], [W, 1], [1, 0])
    LH: gl.constexpr = gl.BlockedLayout([128 // W, NC // 32], [1, 32], [W, 1], [1, 0])
    LHT: gl.constexpr = gl.BlockedLayout([128 // W, NC // 32], [1, 32], [W, 1], [0, 1])
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    pid_m = gl.program_id(0)
    pid_k = gl.program_id(1)
    if TMA:  # g_ptr / u_ptr are tensor descriptors: the whole tile in flight at once, zeros past M and K
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, (2 if SWIGLU else 1) * 128 * 128 * 2)
        buf = _tma_tile(g_ptr, bar, pid_m, pid_k)
        if SWIGLU:
            buf_u = _tma_tile(u_ptr, bar, pid_m, pid_k)._reinterpret(gl.bfloat16, [128, 128], SL)
        mbarrier.wait(bar, 0)
        mbarrier.invalidate(bar)
        buf = buf._reinterpret(gl.bfloat16, [128, 128], SL)
    else:
        buf = gl.allocate_shared_memory(gl.bfloat16, [128, 128], SL)
    col = pid_k * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, LC))
    c2 = gl.expand_dims(col, 0).to(gl.int64)  # [1, 128]
    amax = gl.zeros([R, 128], gl.float32, LC)  # TILE: the tile's |h|, elementwise over the chunks
    for c in gl.static_range(128 // R):
        tok = pid_m * 128 + c * R + gl.arange(0, R, layout=gl.SliceLayout(1, LC))  # [R]
        t2 = gl.expand_dims(tok, 1).to(gl.int64)  # [R, 1]
        ok = (t2 < M) & (c2 < K)
        if TMA:
            if SWIGLU:
                h = _silu_mul(buf.slice(c * R, R).load(LC), buf_u.slice(c * R, R).load(LC))  # [R, 128] fp32
            else:
                h = buf.slice(c * R, R).load(LC).to(gl.float32)
        elif SWIGLU:
            h = _silu_mul(gl.load(g_ptr + t2 * stride_m + c2, mask=ok, other=0.0),
                          gl.load(u_ptr + t2 * stride_m + c2, mask=ok, other=0.0))  # [R, 128] fp32; padding: 0
        else:
            h = gl.load(g_ptr + t2 * stride_m + c2, mask=ok, other=0.0).to(gl.float32)  # x itself
        if ROWS:
            rs = _scale(gl.max(gl.abs(h), axis=1))  # [R]
            gl.store(q_ptr + t2 * stride_qm + c2, _codes(h, gl.expand_dims(rs, 1)), mask=(t2 < RQ) & (c2 < CQ))
            gl.store(s_ptr + tok.to(gl.int64) * stride_sm + pid_k * stride_sg, rs, mask=tok < RQ)
        if TILE:
            amax = gl.maximum(amax, gl.abs(h))
        if SWIGLU or not TMA:  # (TMA put x itself there already; h over g's own rows: this thread read them)
            buf.slice(c * R, R).store(h.to(gl.bfloat16))  # exact: h is a BF16 value
    gl.thread_barrier()
    if TILE:
        s_tile = _scale(gl.max(gl.max(amax, axis=1), axis=0))
        for j in gl.static_range(128 // NC):  # X^T's column chunks
            _xt_chunk(buf.slice(j * NC, NC, dim=1).load(LH), pid_m, pid_k * 128 + j * NC, qt_ptr, st_ptr, CQ, RT,
                      stride_qtk, stride_stk, stride_stg, LH, LHT, NC, False, s_tile)
        gl.store(st_ptr + pid_k * stride_stk + pid_m * stride_stg, s_tile)
    else:
        for j in gl.static_range(128 // NC):  # X^T's column chunks
            _xt_chunk(buf.slice(j * NC, NC, dim=1).load(LH), pid_m, pid_k * 128 + j * NC, qt_ptr, st_ptr, CQ, RT,
                      stride_qtk, stride_stk, stride_stg, LH, LHT, NC, False)


# The TMA tile: [128, 128] BF16 unswizzled (the kernels' row-major shared tile). A TMA box may be 256 elements wide
# without a swizzle; with one, at most the swizzle's 128 bytes
TMA_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


def tma_ok(*ts: torch.Tensor) -> bool:
    """Whether TMA can read these [M, K] BF16 tensors by 128 x 128 boxes: 16-byte aligned bases and row strides,
    unit column stride (``cuTensorMapEncodeTiled``'s rules)."""
    return all(t.dtype == torch.bfloat16 and t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * 2) % 16 == 0
               for t in ts)


def _desc(t: torch.Tensor):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [GROUP, GROUP], TMA_LAYOUT)


def fwd_spec(g: torch.Tensor, u: torch.Tensor | None, q, s, qt, st, rows: int, cols: int, t_rows: int, tiles: bool,
             r: int, warps: int, nc: int, tma: bool = False) -> fp8_quant.Launch:
    """The launch of :func:`_staged_fwd_kernel` on ``fp8_quant.quantize_act``'s outputs for ``h = silu(g) * u`` -- or,
    with ``u`` None, for the activation ``g`` itself (:data:`ACT_SETTINGS`) -- (``q`` / ``s`` None: X^T
    alone), as ``fp8_quant_regs.launch_spec`` (BF16, g and u of one layout, unit column stride; ``t_rows`` a multiple
    of 128; ``tiles``: X^T in 128x128 tiles). BF16 only: the tile is staged as BF16, exact for BF16 values alone.
    ``tma``: the tile read by one TMA copy (:data:`TMA_SETTINGS`) where :func:`tma_ok` allows, else by loads (the same
    bits either way)."""
    if (g.dtype != torch.bfloat16 or g.stride(1) != 1 or u is not None and (g.stride() != u.stride()
            or g.shape != u.shape or u.dtype != g.dtype) or t_rows is None or t_rows % GROUP
            or GROUP % r or r % warps or warps != 8 or nc not in (32, 64, 128) or qt is None):
        raise ValueError(f"fp8_swiglu_staged: the forward needs BF16 g (and u of its layout) with unit column stride, "
                         f"X^T with t_rows a multiple of 128, 8 warps, a row chunk dividing 128 in multiples of them and "
                         f"X^T's column chunk 32, 64 or 128 (dtype {g.dtype}, strides {g.stride()}, "
                         f"{None if u is None else u.stride()}, t_rows {t_rows}, chunk {r}, warps {warps}, columns {nc})")
    m, k = g.shape
    rows_too = q is not None
    if not rows_too:
        q, s = qt, st
    a, b = g, u if u is not None else g
    tma = tma and tma_ok(a, b)
    if tma:  # (one descriptor serves both arguments of the plain form)
        a, b = (_desc(a), _desc(b)) if u is not None else (_desc(a),) * 2
    return fp8_quant.Launch(
        _staged_fwd_kernel, (t_rows // GROUP, cols // GROUP),
        (a, b, q, s, qt, st, m, k, g.stride(0), rows, cols, t_rows, q.stride(0), s.stride(0),
         s.stride(1), qt.stride(0), st.stride(0), st.stride(1)),
        {"ROWS": rows_too, "TILE": bool(tiles), "R": r, "NC": nc, "SWIGLU": u is not None, "TMA": tma},
        warps)


def spec(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, one: tuple, two: tuple, rows: int, cols: int,
         t_rows: int, r: int, warps: int, nc: int = 128, tma: bool = False) -> fp8_quant.Launch:
    """The launch (``fp8_quant.Launch``) of :func:`_staged_kernel` on ``fp8_swiglu.swiglu_grad_operands``' outputs
    (``one`` / ``two``: dg's / du's ``(q, s, qt, st)``; q / s None: no row groups): dh, g, u of one shape and dtype
    with unit column stride, g and u of one row stride (dh its own). BF16 only: dg / du are staged as BF16, exact for
    the BF16 values they are rounded to and for no other input dtype's. ``tma``: the three tiles read by TMA copies
    (:data:`TMA_SETTINGS`) where :func:`tma_ok` allows, else by loads (the same bits)."""
    m, k = g.shape
    if ({dh.dtype, g.dtype, u.dtype} != {torch.bfloat16} or g.stride(1) != 1 or dh.stride(1) != 1
            or g.stride() != u.stride() or t_rows is None or t_rows % GROUP or GROUP % r or r % warps or warps != 8
            or nc not in (32, 64, 128)):
        raise ValueError(f"fp8_swiglu_staged: needs BF16 dh, g, u with unit column stride, g and u of one layout, "
                         f"t_rows a multiple of 128, 8 warps, a row chunk dividing 128 in multiples of them and X^T's "
                         f"column chunk 32, 64 or 128 (dtypes {dh.dtype}, {g.dtype}, {u.dtype}, strides {dh.stride()}, "
                         f"{g.stride()}, {u.stride()}, t_rows {t_rows}, chunk {r}, warps {warps}, columns {nc})")
    (q, s, qt, st), (q2, s2, qt2, st2) = one, two
    rows_too = q is not None
    if not rows_too:  # placeholders for the row groups' pointers
        q, s, q2, s2 = qt, st, qt2, st2
    srcs = (g, u, dh)
    tma = tma and tma_ok(*srcs)
    if tma:
        srcs = tuple(_desc(t) for t in srcs)
    return fp8_quant.Launch(
        _staged_kernel, (t_rows // GROUP, cols // GROUP),
        (*srcs, q, s, qt, st, q2, s2, qt2, st2, m, k, g.stride(0), dh.stride(0), rows, cols, t_rows, q.stride(0),
         s.stride(0), s.stride(1), qt.stride(0), st.stride(0), st.stride(1)),
        {"ROWS": rows_too, "R": r, "NC": nc, "TMA": tma},
        warps)


def compile_sm90(r: int = 16, rows: bool = True, nc: int = 128, tma: bool = False):
    """The kernel built for sm_90 on any machine (bf16 inputs, sizes divisible by 16 as at the 7B shapes): the CPU
    tests' view of its registers, spills and shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src_t = f"tensordesc<bf16[{GROUP}, {GROUP}],{TMA_LAYOUT!r}>" if tma else "*bf16"
    sig = {"g_ptr": src_t, "u_ptr": src_t, "dh_ptr": src_t}
    for p in ("", "2"):
        sig.update({f"q{p}_ptr": "*fp8e4nv", f"s{p}_ptr": "*fp32", f"qt{p}_ptr": "*fp8e4nv", f"st{p}_ptr": "*fp32"})
    order = ("g_ptr", "u_ptr", "dh_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr", "q2_ptr", "s2_ptr", "qt2_ptr", "st2_ptr")
    sig = {k: sig[k] for k in order}
    sig.update({k: "i32" for k in ("M", "K", "stride_m", "stride_dm", "RQ", "CQ", "RT", "stride_qm", "stride_sm",
                                   "stride_sg", "stride_qtk", "stride_stk", "stride_stg")})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)  # the scales' strides: 1 or any
             if k not in ("stride_sm", "stride_sg", "stride_stk", "stride_stg") and not (tma and i < 3)}
    const = {"ROWS": rows, "R": r, "NC": nc, "TMA": tma}
    sig.update({k: "constexpr" for k in const})
    src = GluonASTSource(fn=_staged_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})


def compile_fwd_sm90(r: int = 16, nc: int = 64, tiles: bool = True, rows: bool = True, swiglu: bool = True,
                     tma: bool = False):
    """:func:`_staged_fwd_kernel` built for sm_90 on any machine (the CPU tests' registers, spills, shared memory)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src_t = f"tensordesc<bf16[{GROUP}, {GROUP}],{TMA_LAYOUT!r}>" if tma else "*bf16"
    sig = {"g_ptr": src_t, "u_ptr": src_t, "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "qt_ptr": "*fp8e4nv",
           "st_ptr": "*fp32"}
    sig.update({k: "i32" for k in ("M", "K", "stride_m", "RQ", "CQ", "RT", "stride_qm", "stride_sm", "stride_sg",
                                   "stride_qtk", "stride_stk", "stride_stg")})
    attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig)
             if k not in ("stride_sm", "stride_sg", "stride_stk", "stride_stg") and not (tma and k in ("g_ptr", "u_ptr"))}
    const = {"ROWS": rows, "TILE": tiles, "R": r, "NC": nc, "SWIGLU": swiglu, "TMA": tma}
    sig.update({k: "constexpr" for k in const})
    src = GluonASTSource(fn=_staged_fwd_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})


# (tokens a row chunk, warps, X^T's columns a step) of the forward form. H100, session 34 phase a, 16k tokens, back to
# back: 7B width (16, 8, 64) 0.830 ms, (32, 8, 64) 0.865, against the register-order SWIGLU form's 0.847; 32B width
# 1.216 / 1.258 against 1.226 -- level back to back; four programs a multiprocessor against two, so they are timed in
# the step too (the in-situ choice: the capped clock slows a latency-bound kernel more)
FWD_SETTINGS = ((16, 8, 64), (32, 8, 64))
# The same form for a plain BF16 activation (X and dY of the projections; ``fwd_spec`` with ``u`` None), a candidate of
# fp8_quant.quantize_act's choice beside the register-order kernel. Session 35 (H100, 7B width, 16k tokens, back to
# back; bits equal to the eager quantizers' in test_fp8_quant_gpu.py): (32, 8, 64) 0.133 ms for X [T, 3584] against the
# library's previous choice 0.145, 0.607 against 0.651 for [T, 18944]; slower for dY (0.144 / 0.616 against 0.140 /
# 0.588): the in-situ choice keeps what wins per operand
ACT_SETTINGS = ((16, 8, 64), (32, 8, 64))
# ``("tma", R, warps, NC)``: the three forms (backward, forward h, plain activation) with the tile read by one TMA copy
# per input (``tma=True``) instead of row-chunk loads -- the whole tile's bytes in flight at once (32 / 64 / 96 KB a
# program), where the load form has one R-row chunk in flight per program and none during phase 2. Why: the staged
# activation form streams at ~1.8 TB/s (0.133 ms for 235 MB) where a copy of the same bytes reaches 2.8. Session 35
# (H100, 7B width, 16k tokens; bit-equal in every GPU test): back to back, SwiGLU's forward h 0.73 ms against the load
# form's 0.84, its backward 1.29 against 1.40, X / dY [T, 3584] 0.126 against 0.132; in the step (the in-situ choice)
# 0.85 against 0.95 and 1.48 against 1.51. Candidates unless QUARL_FP8_TMA=0; (32, 8, 64) won everywhere but dY
# [T, 512] (k / v: 64 programs of one column tile each, the register-order kernel's 0.04 ms there)
TMA_SETTINGS = ((16, 8, 64), (32, 8, 64))

__all__ = ["ACT_SETTINGS", "FWD_SETTINGS", "SETTINGS", "TMA_LAYOUT", "TMA_SETTINGS", "compile_fwd_sm90", "compile_sm90",
           "fwd_spec", "spec", "tma_ok"]
