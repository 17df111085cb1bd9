"""Decode at 1..16 rows on Hopper: a TMA-fed, warp-specialized wgmma kernel, stream-K over the weight (Gluon).

Why. Issue 17 asks the weight-only decode kernels for >= 80 % of HBM at 1..16 rows. The one-row GEMV (``gemv.py``)
and the ``mma.sync`` kernel (``mma_decode.py``, 2..16 rows) stream the large 7B / 14B weights at 52-66 % of the
H100's bandwidth, where a plain read of the same bytes reaches ~80 %. Sessions 17-19 located the gap in their loops:
every thread computes its own addresses and waits for its own loads, so the decode, the loads and the per-step chain
share one instruction stream (a cp.async ring inside the ``mma.sync`` kernel was slower; pre-tiled words helped
1.1-1.2x). Session 22's large-M kernel (``mixed_gemm.py``) took the loads off the consumers entirely -- a loader warp
issues TMA copies into a ring of stages, two consumer warpgroups decode the FP4 words straight into wgmma's register
A operand -- and this module is that design cut for decode:

* **y^T = W x^T with the weight as the register A operand, x in its natural order** (``mixed_gemm``'s ``natural``
  decode: a 4 x 4 byte transpose across each quad gathers the fragment's codes, a scale pair per register), so no
  launch permutes x; x [M, K] is wgmma's B operand, NT = 8 or 16 tokens a TMA box, rows past M zero-filled by TMA.
  At 1..16 rows the tensor cores are nearly idle; what counts is that a consumer thread spends its instructions on
  the decode alone (no address math, no load waits but its scale bytes, which it loads one stage ahead).
* **Stages of four K steps**: a stage is 4 x ([128 rows, 8 words] + [NT, 64] x) -- 20-24 KB -- so a CTA's ring
  holds ``STAGES`` x that in flight (80-96 KB at 4 stages: enough bytes in flight for HBM latency at one CTA an
  SM) and the consumers meet the stage barriers once per 256 weights of a row.
* **Stream-K**: the weight is a sequence of (128-row tile, 256-wide K chunk) units, tile-major; each persistent CTA
  takes a contiguous, equal share (``c0 = p T / P``), so no SM waits through a tail wave (148 row tiles of the 7B
  gate / up weight on 132 SMs would be 1.12 waves as whole tiles). A CTA writes its accumulator of each tile it
  touches to slot ``p - first(tile)`` of fp32 partials ``[S, M, N]``; the tile's last CTA zeroes the slots past
  its count; the launch's last pass (``launch.finish``: the bias, LoRA and gate epilogue of every decode kernel)
  sums the slots in order -- deterministic. With one CTA a tile (``S = 1``) the consumers store bf16 directly.

Numerics: the weight decoded exactly to bf16 (NVFP4 ``e2m1 * e4m3 * 2**-16`` with ``2**16 / global_scale`` on the
fp32 accumulator, MXFP4 exact), fp32 accumulation -- the other decode kernels' values up to the order of fp32 sums.
NVFP4 / MXFP4, K % 256 == 0, N % 128 == 0, words row-major or in ``quarl.quant.packed_layout``'s [64, 8] blocks.

Measured (H100, session 23, ``benchmarks/gpu_session23.sh`` phases a-b; RESULTS "Issue 17, session 23"): correct
(55 GPU tests), and **slower than the kernels ``wo_matmul`` routes to at every point**: ~29-34 us on every ~38 MB
7B / 14B MLP weight at 1..16 rows, 40-45 % of the HBM copy rate, whatever the ring depth (3 / 4 / 6 stages), the
word layout or the TMA box size -- against the one-row GEMV's 57-65 % and the ``mma.sync`` kernel's 45-60 %. Its
consumers bind it: with the ring's handshakes alone (``diag=1``) the same launch streams at 65-68 % (69-72 % with
``wide`` 8 KB boxes), against 80-81 % for a plain read of the bytes; the natural-order decode (~140 instructions a
thread a K step: the quad transpose, eight scale conversions, the FP4 decode -- ~4.4 a weight, the whole issue budget
at HBM speed) adds ~10 us. So neither side of this design reaches the issue's 80 %: kept here, not in the library,
as the measured record (``bench_wgmma_stream.py`` runs it).
"""

from __future__ import annotations

import torch
import triton
from quarl_kernels.formats import FMT_MXFP4, FMT_NVFP4
from quarl_kernels.launch import finish, num_sms
from quarl_kernels.mixed_gemm import _a_fragment_natural
from quarl_kernels.mma_decode_step import _word_layout
from quarl_kernels.wgmma_decode import device_ok
from quarl_kernels.wgmma_ring import _w_layout, _w_load, _x_layout
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

R = 128  # weight rows a tile: two consumers of 64 (wgmma m)
BKW = 8  # packed words a K step (64 weights: one 128-byte x box)
SUB = 4  # K steps a stage (and a stream-K chunk: 256 weights of a row)
MAX_M = 16
DEFAULT_STAGES = 4
_R = gl.constexpr(R)
_BKW = gl.constexpr(BKW)
_SUB = gl.constexpr(SUB)


@gluon.jit
def _loader(x_desc, w_desc, xs, ws, ws_wide, ready, empty, KW, C, T, BLOCKED: gl.constexpr, WIDE: gl.constexpr):
    """One warp: chunk ``c``'s four x boxes and four word boxes (two a step when BLOCKED; WIDE: one 8 KB box per
    64-row band -- a band's four [64, 8] blocks of the chunk lie together in the blocked layout) into its stage."""
    stages: gl.constexpr = xs.type.shape[0] // _SUB
    step_bytes: gl.constexpr = _SUB * (x_desc.block_type.nbytes + _R * _BKW * 4)
    p = gl.program_id(0)
    P = gl.num_programs(0)
    c0 = p * T // P
    c1 = (p + 1) * T // P
    for c in range(c0, c1):
        it = c - c0
        s = it % stages
        row0 = (c // C) * _R
        kw0 = (c % C) * (_SUB * _BKW)
        mbarrier.wait(empty.index(s), ((it // stages) & 1) ^ 1)  # fresh barriers count as freed once
        mbarrier.expect(ready.index(s), step_bytes)
        for j in gl.static_range(_SUB):
            tma.async_copy_global_to_shared(x_desc, [0, (kw0 + j * _BKW) * 8], ready.index(s),
                                            xs.index(s * _SUB + j))
            if not WIDE:
                _w_load(w_desc, row0, kw0 + j * _BKW, KW, ready.index(s), ws.index(s * _SUB + j), True, _R, BLOCKED)
        if WIDE:  # band b's blocks kw0 / 8 .. + 3: rows 2 (b KW / 8 + kw0 / 8) .. + 7 of the words viewed [-1, 256]
            for b in gl.static_range(_R // 64):
                tma.async_copy_global_to_shared(w_desc, [2 * ((row0 // 64 + b) * (KW // 8) + kw0 // 8), 0],
                                                ready.index(s), ws_wide.index(s * (_R // 64) + b))


@gluon.jit
def _scale_ptrs(sp, stride_s, c, C, ar, HALF: gl.constexpr):
    """[64] pointers to this consumer's rows' scale words (int32: NVFP4's 4 bytes, int16: MXFP4's 2) of chunk c's
    first K step; step j of the chunk is ``+ j``."""
    rows = (c // C) * _R + HALF * 64 + ar
    return sp + rows * stride_s + (c % C) * _SUB


@gluon.jit
def _step(ws, s, j, srow, HALF: gl.constexpr, FMT: gl.constexpr, LW: gl.constexpr, A_L: gl.constexpr,
          WIDE: gl.constexpr):
    """Step j of stage s: this consumer's [64, 8] words (WIDE: its band's j-th block) decoded to the A fragment."""
    if WIDE:
        w = ws.index((s * (_R // 64) + HALF) * _SUB + j).load(LW)  # [64, 8] words
    else:
        w = ws.index(s * _SUB + j).slice(HALF * 64, 64).load(LW)
    return _a_fragment_natural(w, srow, FMT, LW, A_L)  # [64, 64] bf16


@gluon.jit
def _emit(acc, out_ptr, gs_ptr, M, N, tile, p, C, T, P, SMAX, HALF: gl.constexpr, FMT: gl.constexpr,
          DIRECT: gl.constexpr):
    """This CTA's accumulator of ``tile`` [64, NT] (rows x tokens), scaled: bf16 into y [M, N] (DIRECT), else fp32
    into its slot of the partials [S, M, N]; the tile's last CTA zeroes the slots no CTA fills."""
    NT_: gl.constexpr = acc.type.shape[1]
    OL: gl.constexpr = gl.BlockedLayout([2, 1], [32, 1], [1, 4], [0, 1])  # rows along the lanes: 256 B a warp
    if FMT == 0:  # the decode's 2**-16 and NVFP4's global scale
        factor = 65536.0 / gl.load(gs_ptr).to(gl.float32)
    else:
        factor = 65536.0
    y = gl.convert_layout(acc * factor, OL)
    offs_r = tile * _R + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, OL))
    offs_t = gl.arange(0, NT_, layout=gl.SliceLayout(0, OL))
    mask = (offs_r[:, None] < N) & (offs_t[None, :] < M)
    ptrs = out_ptr + offs_t[None, :] * N + offs_r[:, None]
    if DIRECT:
        gl.store(ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        first = ((tile * C + 1) * P - 1) // T  # the CTA holding the tile's first chunk
        last = ((tile * C + C) * P - 1) // T
        gl.store(ptrs + (p - first) * (M * N), y, mask=mask)
        if p == last:
            for z in range(last - first + 1, SMAX):
                gl.store(ptrs + z * (M * N), gl.zeros_like(y), mask=mask)


@gluon.jit
def _consumer(xs, ws, ready, empty, s_ptr, gs_ptr, out_ptr, M, N, stride_sn, C, T, SMAX, HALF: gl.constexpr,
              FMT: gl.constexpr, DIRECT: gl.constexpr, WIDE: gl.constexpr, DIAG: gl.constexpr):
    """One warpgroup: rows ``HALF * 64 ..`` of each chunk's 128-row tile. Per K step: decode into the A registers
    while the previous step's wgmma runs, then wgmma; the stage freed after its fourth step; the tile's partial out
    after its last chunk in this CTA. DIAG 1 (a diagnostic, wrong results by design): the ring's handshakes only --
    wait for each stage and free it, no decode, no MMA, no store: the stream's own ceiling."""
    NT_: gl.constexpr = xs.type.shape[1]
    stages: gl.constexpr = xs.type.shape[0] // _SUB
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NT_, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    LW: gl.constexpr = _word_layout(64, _BKW, 4)
    SB: gl.constexpr = 4 if FMT == 0 else 2  # scale bytes a row and K step
    SDT: gl.constexpr = gl.int32 if FMT == 0 else gl.int16
    p = gl.program_id(0)
    P = gl.num_programs(0)
    c0 = p * T // P
    c1 = (p + 1) * T // P
    sp = s_ptr.to(gl.pointer_type(SDT), bitcast=True)
    stride_s = stride_sn // SB
    ar = gl.arange(0, 64, layout=gl.SliceLayout(1, LW))
    sb = _scale_ptrs(sp, stride_s, c0, C, ar, HALF)
    n0 = gl.load(sb)
    n1 = gl.load(sb + 1)
    n2 = gl.load(sb + 2)
    n3 = gl.load(sb + 3)
    acc = gl.zeros([64, NT_], gl.float32, MMA)
    for c in range(c0, c1):
        it = c - c0
        s = it % stages
        s0 = n0
        s1 = n1
        s2 = n2
        s3 = n3
        sb = _scale_ptrs(sp, stride_s, gl.minimum(c + 1, c1 - 1), C, ar, HALF)  # the next chunk's, a stage ahead
        n0 = gl.load(sb)
        n1 = gl.load(sb + 1)
        n2 = gl.load(sb + 2)
        n3 = gl.load(sb + 3)
        mbarrier.wait(ready.index(s), (it // stages) & 1)
        if DIAG == 0:
            i = s * _SUB
            a0 = _step(ws, s, 0, s0, HALF, FMT, LW, A_L, WIDE)
            acc = warpgroup_mma(a0, xs.index(i).permute((1, 0)), acc, is_async=True)  # [64, NT] += W x^T
            a1 = _step(ws, s, 1, s1, HALF, FMT, LW, A_L, WIDE)  # into other registers while that MMA runs
            acc, a0 = warpgroup_mma_wait(0, deps=[acc, a0])
            acc = warpgroup_mma(a1, xs.index(i + 1).permute((1, 0)), acc, is_async=True)
            a2 = _step(ws, s, 2, s2, HALF, FMT, LW, A_L, WIDE)
            acc, a1 = warpgroup_mma_wait(0, deps=[acc, a1])
            acc = warpgroup_mma(a2, xs.index(i + 2).permute((1, 0)), acc, is_async=True)
            a3 = _step(ws, s, 3, s3, HALF, FMT, LW, A_L, WIDE)
            acc, a2 = warpgroup_mma_wait(0, deps=[acc, a2])
            acc = warpgroup_mma(a3, xs.index(i + 3).permute((1, 0)), acc, is_async=True)
            acc, a3 = warpgroup_mma_wait(0, deps=[acc, a3])
        mbarrier.arrive(empty.index(s), count=1)  # this consumer's reads of the stage are done
        if DIAG == 0 and (((c % C) == C - 1) | (c == c1 - 1)):
            _emit(acc, out_ptr, gs_ptr, M, N, c // C, p, C, T, P, SMAX, HALF, FMT, DIRECT)
            acc = gl.zeros([64, NT_], gl.float32, MMA)


@gluon.jit
def _wgmma_stream_kernel(x_desc, w_desc, s_ptr, gs_ptr, out_ptr, M, N, KW, stride_sn, C, T, SMAX,
                         FMT: gl.constexpr, STAGES: gl.constexpr, BLOCKED: gl.constexpr, DIRECT: gl.constexpr,
                         CR: gl.constexpr, WIDE: gl.constexpr = False, DIAG: gl.constexpr = 0):
    """y [M, N] (or its partials [S, M, N]) = x [M, K] @ dequant(W)^T: x_desc over x (box [NT, 64]), w_desc over the
    words (box [128, 8], or [64, 8] per band when BLOCKED); CTA p walks chunks [p T / P, (p + 1) T / P) of the
    ``T = N / 128 * C`` (tile, K chunk) units."""
    NT_: gl.constexpr = x_desc.block_type.shape[0]
    xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES * _SUB, NT_, _BKW * 8], x_desc.layout)
    if WIDE:  # [stage, band, step] blocks [64, 8]; the loader writes a band's four as one [8, 256] box
        ws = gl.allocate_shared_memory(gl.int32, [STAGES * (_R // 64) * _SUB, 64, _BKW],
                                       gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
        ws_wide = ws._reinterpret(gl.int32, [STAGES * (_R // 64), 8, 256], w_desc.layout)
    else:
        ws = gl.allocate_shared_memory(gl.int32, [STAGES * _SUB, _R, _BKW], w_desc.layout)
        ws_wide = ws
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)  # the loader's expect; the TMA bytes complete it
        mbarrier.init(empty.index(i), count=2)  # both consumers
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (xs, ws, ready, empty, s_ptr, gs_ptr, out_ptr, M, N, stride_sn, C, T, SMAX, 0, FMT, DIRECT, WIDE,
                     DIAG)),
        (_consumer, (xs, ws, ready, empty, s_ptr, gs_ptr, out_ptr, M, N, stride_sn, C, T, SMAX, 1, FMT, DIRECT, WIDE,
                     DIAG)),
        (_loader, (x_desc, w_desc, xs, ws, ws_wide, ready, empty, KW, C, T, BLOCKED, WIDE)),
    ], [4, 1], [CR, 48])


# ---------------------------------------------------------------------------
def token_tile(m: int) -> int:
    """wgmma n for ``m`` rows: 8 up to 8, else 16."""
    return 8 if m <= 8 else 16


def slots(tiles: int, chunks: int, ctas: int) -> int:
    """Partial slots ``S``: the most CTAs any tile's ``chunks`` K chunks are spread over when ``ctas`` CTAs take
    equal contiguous shares of ``tiles * chunks`` (the kernel's ``first`` / ``last``)."""
    t_all = tiles * chunks
    return max(((t * chunks + chunks) * ctas - 1) // t_all - ((t * chunks + 1) * ctas - 1) // t_all + 1
               for t in range(tiles))


def supported(x2: torch.Tensor, pw) -> bool:
    """CUDA bf16 x [M <= 16, K] on an sm_90 GPU; an NVFP4 / MXFP4 weight with K % 256 == 0, N % 128 == 0, 16-byte
    aligned words and scale rows aligned for the consumers' 4- / 2-byte loads."""
    sb = 4 if pw.fmt == FMT_NVFP4 else 2
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and x2.dim() == 2 and 1 <= x2.shape[0] <= MAX_M
            and x2.shape[1] == pw.k and pw.fmt in (FMT_NVFP4, FMT_MXFP4) and pw.k % (64 * SUB) == 0
            and pw.n % R == 0 and pw.words.data_ptr() % 16 == 0
            and (pw.blocked or (pw.words.stride(1) == 1 and (pw.words.stride(0) * 4) % 16 == 0))
            and pw.scale.stride(-1) == 1 and (pw.scale.stride(0) * pw.scale.element_size()) % sb == 0
            and pw.scale.data_ptr() % sb == 0 and device_ok(x2.device))


def launch_wgmma_stream(x2: torch.Tensor, pw, *, stages: int = DEFAULT_STAGES, ctas: int | None = None, epi=None,
                        x_rows: int | None = None, wide: bool = False, diag: int = 0) -> torch.Tensor:
    """y [M, N] bf16 = x2 [M, K] @ dequant(W)^T (+ ``epi``, a ``launch.Epilogue``, in the last pass); ``supported``
    must hold. ``ctas``: persistent CTAs (default: one an SM, at most one a chunk). ``x_rows``: x copied into a
    zero-padded [x_rows, K] buffer first (a whole TMA box; default: the box's rows past M zero-filled by TMA).
    ``wide`` (blocked words only): a band's four K steps as one 8 KB TMA box instead of four [64, 8] ones. ``diag=1``:
    the ring's handshakes alone (a diagnostic: the output is garbage)."""
    if not supported(x2, pw):
        raise ValueError(f"launch_wgmma_stream: needs CUDA bf16 x [1..{MAX_M}, {pw.k}] on an sm_90 GPU and an NVFP4 / "
                         f"MXFP4 weight with K % {64 * SUB} == 0, N % {R} == 0 and aligned words and scales; got "
                         f"{x2.dtype} {tuple(x2.shape)} on {x2.device}, format {pw.fmt}, N {pw.n}")
    m = x2.shape[0]
    nt = token_tile(m)
    xc = x2.contiguous()
    if x_rows is not None and x_rows > m:
        xc = torch.cat([xc, xc.new_zeros(x_rows - m, pw.k)])
    chunks = pw.k // (64 * SUB)
    tiles = pw.n // R
    t_all = tiles * chunks
    p = min(ctas or num_sms(x2.device), t_all)
    smax = slots(tiles, chunks, p)
    y = torch.empty((m, pw.n), device=x2.device, dtype=torch.bfloat16)
    out = y if smax == 1 else torch.empty((smax, m, pw.n), device=x2.device, dtype=torch.float32)
    x_desc = TensorDescriptor.from_tensor(xc, [nt, BKW * 8], _x_layout(nt))
    if wide and not pw.blocked:
        raise ValueError("launch_wgmma_stream: wide=True reads blocked words (quarl.quant.packed_layout)")
    if wide:
        w_desc = TensorDescriptor.from_tensor(pw.words.view(-1, 256), [8, 256], _w_layout())
    elif pw.blocked:
        w_desc = TensorDescriptor.from_tensor(pw.words.view(-1, 8), [64, 8], _w_layout())
    else:
        w_desc = TensorDescriptor.from_tensor(pw.words, [R, BKW], _w_layout())
    scale = pw.scale.view(torch.uint8) if pw.scale.dtype != torch.uint8 else pw.scale
    gs = pw.gscale if pw.gscale is not None else scale
    _wgmma_stream_kernel[(p,)](
        x_desc, w_desc, scale, gs, out, m, pw.n, pw.k // 8, scale.stride(0), chunks, t_all, smax,
        FMT=pw.fmt, STAGES=stages, BLOCKED=pw.blocked, DIRECT=smax == 1, CR=232, WIDE=wide, DIAG=diag, num_warps=4,
    )
    return finish(out, y, smax, epi)


def compile_sm90(fmt: int = FMT_NVFP4, *, nt: int = 8, stages: int = DEFAULT_STAGES, blocked: bool = False,
                 direct: bool = False, wide: bool = False, diag: int = 0):
    """The kernel built for sm_90 on any machine (its TMA descriptors as ``launch_wgmma_stream`` builds them): the
    CPU tests' view of its registers, spills and shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    wbox = "[8, 256]" if wide else "[64, 8]" if blocked else f"[{R}, {BKW}]"
    sig = {"x_desc": f"tensordesc<bf16[{nt}, {BKW * 8}],{_x_layout(nt)!r}>",
           "w_desc": f"tensordesc<i32{wbox},{_w_layout()!r}>",
           "s_ptr": "*u8", "gs_ptr": "*fp32" if fmt == FMT_NVFP4 else "*u8",
           "out_ptr": "*bf16" if direct else "*fp32",
           "M": "i32", "N": "i32", "KW": "i32", "stride_sn": "i32", "C": "i32", "T": "i32", "SMAX": "i32"}
    const = {"FMT": fmt, "STAGES": stages, "BLOCKED": blocked or wide, "DIRECT": direct, "CR": 232, "WIDE": wide,
             "DIAG": diag}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items())
             if t != "constexpr" and not t.startswith("tensordesc") and k in ("s_ptr", "out_ptr", "N", "KW",
                                                                              "stride_sn")}
    src = GluonASTSource(fn=_wgmma_stream_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


__all__ = ["DEFAULT_STAGES", "MAX_M", "compile_sm90", "launch_wgmma_stream", "slots", "supported", "token_tile"]
