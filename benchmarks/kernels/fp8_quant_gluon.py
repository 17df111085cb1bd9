"""One read of the input for both groupings of an FP8 activation operand, in Gluon (Jet-RL, issue 15).

``quarl_kernels.fp8_quant`` makes X (and dY) in 1x128 groups along K *and* X^T along the tokens (1x128 groups, or
128x128 tiles for ``fp8_wgrad=tiles``). Its Triton kernels that do both from one read of the input lose to "split"
settings that read it twice (RESULTS.md "Split quantizer settings", "Session 26"): the transposed store goes through
a layout change the compiler places, byte by byte in shared memory. Here the layout is chosen by hand so that no
transpose is needed at all:

    the [128 tokens, 128 columns] tile is held as [32, 4, 128]: token 4j + t at [j, t]; each thread owns one j, all
    four t and CPT consecutive columns (BlockedLayout size_per_thread [1, 4, CPT], 32 lanes along j, the warps
    along the columns).

* 1x128 groups along K: a row's amax is a max over the column axis (across the warps: the one cross-warp
  reduction); each thread stores its CPT codes of each of its four rows as one contiguous vector.
* X^T: a column's amax (or the tile's) is a max over t (in the thread) and j (across the 32 lanes: shuffles). The
  four codes a thread holds for a column are tokens 4j..4j+3 -- one 32-bit word of X^T's row -- so the transposed
  store is a word per (thread, column), and the 32 lanes of a warp write a column's 128 tokens as 128 contiguous
  bytes.

Numerics are ``fp8_quant``'s, bit for bit: scale = amax * fp32(1/448) (CUDA PyTorch's division by 448), eps for an
all-zero group, codes = div_rn(x, scale) clamped to +-448 and cast RNE with saturation.

**Measured and not kept** (session 26, H200, commit 3a3911c, where it was wired into ``fp8_quant``'s launch
candidates as ``("gluon", 8 | 16)``): the same bits as the eager quantizers on every tested operand
(``tests/kernels/test_fp8_quant_gpu.py``), but half the speed of the split settings on every wide operand (32B dY
[16384, 27648]: 1.81 ms against 0.86; ~1 TB/s of useful bytes). At 8 warps it needs 168-195 registers a thread, at
16 warps 96-111: one CTA, i.e. one 128x128 tile, in flight per SM, and nothing else to hide the load latency behind.
A next version would keep several tiles in flight (a persistent program loading tile i+1 before storing tile i, or
a TMA ring) -- RESULTS.md "Session 26". The first of those is here too: ``_dual_kernel(PERSISTENT=True)`` (16 warps:
128 registers, no spills; two tiles in flight per SM). Measured in session 27 (H200, ``fp8_quant_operands.py --gluon``,
phase a of ``benchmarks/gpu_session27.sh``): the same bits on all 10 operands, 3-22 % faster than the one-tile form on
8 of them and still 1.96-2.1x slower than the split settings on every operand 3584 columns or wider (32B dY [16384, 27648]: 1.674 ms
against 0.854) -- a second tile in flight is not enough; not kept as a candidate either. Gluon kernels do not run
in Triton's CPU interpreter; the CPU test only builds them for sm_90 (``tests/kernels/test_fp8_quant_gluon_compile.py``).
"""

from __future__ import annotations

import struct

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

FP8_MAX = gl.constexpr(448.0)
INV_FP8_MAX = gl.constexpr(struct.unpack("f", struct.pack("f", 1.0 / 448.0))[0])  # fp32(1 / 448): rounding's
FP32_EPS = gl.constexpr(2.0**-23)


@gluon.jit
def _scale(amax):
    s = amax * INV_FP8_MAX  # CUDA PyTorch: amax / 448.0 == amax * fp32(1/448)
    return gl.where(s == 0.0, FP32_EPS, s)


@gluon.jit
def _codes(x, s):
    q = gl.div_rn(x, s)
    q = gl.minimum(gl.maximum(q, -FP8_MAX), FP8_MAX)
    return q.to(gl.float8e4nv)  # cvt.rn.satfinite.e4m3x2.f32


@gluon.jit
def _load_tile(x_ptr, pid_m, pid_k, M, K, stride_xm, valid, L3: gl.constexpr):
    """x's tile (pid_m, pid_k) as [32, 4, 128] in L3 (token 4j + t at [j, t]), in x's dtype; all zeros unless
    ``valid``."""
    LJT: gl.constexpr = gl.SliceLayout(2, L3)
    LJC: gl.constexpr = gl.SliceLayout(1, L3)
    j = gl.arange(0, 32, layout=gl.SliceLayout(1, LJT))
    t = gl.arange(0, 4, layout=gl.SliceLayout(0, LJT))
    c = gl.arange(0, 128, layout=gl.SliceLayout(0, LJC))
    tok = gl.expand_dims(pid_m * 128 + gl.expand_dims(j, 1) * 4 + gl.expand_dims(t, 0), 2).to(gl.int64)  # [32, 4, 1]
    col = gl.expand_dims(gl.expand_dims(pid_k * 128 + c, 0), 1).to(gl.int64)  # [1, 1, 128]
    return gl.load(x_ptr + tok * stride_xm + col, mask=(tok < M) & (col < K) & valid, other=0.0)  # [32, 4, 128]


@gluon.jit
def _quant_tile(x_in, pid_m, pid_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT,
                stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
                ROWS: gl.constexpr, TILE: gl.constexpr, L3: gl.constexpr):
    """Both groupings of one loaded tile (:func:`_load_tile`), stored."""
    LJT: gl.constexpr = gl.SliceLayout(2, L3)  # [32, 4]: a token per (j, t)
    LJC: gl.constexpr = gl.SliceLayout(1, L3)  # [32, 128]: a word of X^T per (j, column)
    j = gl.arange(0, 32, layout=gl.SliceLayout(1, LJT))
    t = gl.arange(0, 4, layout=gl.SliceLayout(0, LJT))
    c = gl.arange(0, 128, layout=gl.SliceLayout(0, LJC))
    tok2 = pid_m * 128 + gl.expand_dims(j, 1) * 4 + gl.expand_dims(t, 0)  # [32, 4]
    tok = gl.expand_dims(tok2, 2).to(gl.int64)  # [32, 4, 1]
    col1 = pid_k * 128 + c  # [128]
    col = gl.expand_dims(gl.expand_dims(col1, 0), 1).to(gl.int64)  # [1, 1, 128]
    x = x_in.to(gl.float32)  # [32, 4, 128]
    ax = gl.abs(x)
    if ROWS:  # 1x128 groups along K
        rs = _scale(gl.max(ax, axis=2))  # [32, 4]
        q = _codes(x, gl.expand_dims(rs, 2))
        gl.store(q_ptr + tok * stride_qm + col, q, mask=(tok < RQ) & (col < CQ))
        gl.store(s_ptr + tok2.to(gl.int64) * stride_sm + pid_k * stride_sg, rs, mask=tok2 < RQ)
    colmax = gl.max(gl.max(ax, axis=1), axis=0)  # [128]
    if TILE:  # X^T in 128x128 tiles: one scale
        s_tile = _scale(gl.max(colmax, axis=0))
        sc = gl.zeros([128], gl.float32, layout=gl.SliceLayout(0, LJC)) + s_tile
    else:
        sc = _scale(colmax)  # [128]
    ct = _codes(x, gl.expand_dims(gl.expand_dims(sc, 0), 1)).to(gl.uint8, bitcast=True).to(gl.int32)  # [32, 4, 128]
    shift = gl.expand_dims(gl.expand_dims(t * 8, 0), 2)  # [1, 4, 1]
    words = gl.sum(ct << shift, axis=1)  # [32, 128]: tokens 4j..4j+3 of a column, disjoint bytes (sum == or)
    jw = gl.arange(0, 32, layout=gl.SliceLayout(1, LJC))
    quad = gl.expand_dims(pid_m * 32 + jw, 1).to(gl.int64)  # [32, 1]
    colw = gl.expand_dims(col1, 0).to(gl.int64)  # [1, 128]
    gl.store(qt_ptr + colw * stride_qtk + quad, words, mask=(colw < CQ) & (quad * 4 < RT))
    if TILE:
        gl.store(st_ptr + pid_k * stride_stk + pid_m * stride_stg, s_tile)
    else:
        gl.store(st_ptr + col1.to(gl.int64) * stride_stk + pid_m * stride_stg, sc, mask=col1 < CQ)


@gluon.jit
def _dual_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_xm, RQ, CQ, RT,
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: gl.constexpr, TILE: gl.constexpr, CPT: gl.constexpr, PERSISTENT: gl.constexpr = False,
):
    # one program: tokens [pid_m*128, +128) x columns [pid_k*128, +128); qt_ptr is X^T's int32 view (stride in words).
    # PERSISTENT (session 26, prepared, not yet run on a GPU): a program walks tiles pid, pid + programs, ... (columns
    # fastest) and loads the next one before quantizing this one -- two tiles in flight per program where the
    # one-tile form had one, the load latency that bound it (RESULTS.md "Session 26")
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4, CPT], threads_per_warp=[32, 1, 1],
                                        warps_per_cta=[1, 1, 128 // CPT], order=[2, 1, 0])
    if PERSISTENT:
        n_k = CQ // 128
        total = (RT // 128) * n_k
        pid = gl.program_id(0)
        step = gl.num_programs(0)
        x = _load_tile(x_ptr, pid // n_k, pid % n_k, M, K, stride_xm, pid < total, L3)
        for tile in range(pid, total, step):
            nxt = tile + step
            x_next = _load_tile(x_ptr, nxt // n_k, nxt % n_k, M, K, stride_xm, nxt < total, L3)
            _quant_tile(x, tile // n_k, tile % n_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT, stride_qm, stride_sm,
                        stride_sg, stride_qtk, stride_stk, stride_stg, ROWS, TILE, L3)
            x = x_next
    else:
        pid_m = gl.program_id(0)
        pid_k = gl.program_id(1)
        x = _load_tile(x_ptr, pid_m, pid_k, M, K, stride_xm, True, L3)
        _quant_tile(x, pid_m, pid_k, q_ptr, s_ptr, qt_ptr, st_ptr, RQ, CQ, RT, stride_qm, stride_sm, stride_sg,
                    stride_qtk, stride_stk, stride_stg, ROWS, TILE, L3)


def launch_args(x: torch.Tensor, q, s, qt, st, rows: int, cols: int, t_rows: int, tiles: bool):
    """(grid, positional args, constexprs) of :func:`_dual_kernel` for ``fp8_quant.quantize_act``'s outputs (``qt``
    given as stored: [cols, t_rows] E4M3, passed as its int32 view). ``x`` must have unit column stride."""
    m, k = x.shape
    if x.stride(1) != 1 or t_rows % 128:
        raise ValueError("fp8_quant_gluon: needs x with unit column stride and t_rows a multiple of 128")
    qw = qt.view(torch.int32)
    dq, ds = (q, s) if q is not None else (qt, st)  # placeholders when the row groups are not wanted
    args = (x, dq, ds, qw, st, m, k, x.stride(0), rows, cols, t_rows, dq.stride(0), ds.stride(0), ds.stride(1),
            qw.stride(0), st.stride(0), st.stride(1))
    return (t_rows // 128, cols // 128), args, {"ROWS": q is not None, "TILE": tiles}


def quantize_dual(x: torch.Tensor, rows: int, cols: int, t_rows: int, *, tiles: bool = False, row_groups: bool = True,
                  warps: int = 16, persistent: bool = False, programs: int | None = None):
    """``fp8_quant.quantize_act(x, rows, cols, t_rows, row_groups=..., t_tiles=tiles)``'s outputs from these kernels
    (CUDA, unit column stride): for the benchmark's side-by-side timing and bit check. ``persistent``: the
    prefetching kernel on ``programs`` programs (default: one per SM)."""
    from quarl_kernels import fp8_quant as fq

    q, s, qt, st = fq._act_outputs(x, rows, cols, t_rows, row_groups, tiles)
    grid, args, const = launch_args(x, q, s, qt, st, rows, cols, t_rows, tiles)
    const["CPT"] = 128 // warps
    if persistent:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid = (min(grid[0] * grid[1], programs or sms),)
    _dual_kernel[grid](*args, **const, PERSISTENT=persistent, num_warps=warps)
    return q, s, qt, st


def compile_sm90(tiles: bool = False, rows: bool = True, warps: int = 8, persistent: bool = False):
    """The kernel built for sm_90 on any machine (bf16 input): the CPU tests' view of its registers and spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "qt_ptr": "*i32", "st_ptr": "*fp32",
           "M": "i32", "K": "i32", "stride_xm": "i32", "RQ": "i32", "CQ": "i32", "RT": "i32", "stride_qm": "i32",
           "stride_sm": "i32", "stride_sg": "i32", "stride_qtk": "i32", "stride_stk": "i32", "stride_stg": "i32"}
    const = {"ROWS": rows, "TILE": tiles, "CPT": 128 // warps, "PERSISTENT": persistent}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, ty) in enumerate(sig.items())
             if ty != "constexpr"}  # as the launch specializes them at these shapes (multiples of 16)
    src = GluonASTSource(fn=_dual_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


__all__ = ["compile_sm90", "launch_args", "quantize_dual"]
