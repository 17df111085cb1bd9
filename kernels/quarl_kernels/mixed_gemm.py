"""Large-M weight-only GEMM on Hopper: the decoded FP4 weight as wgmma's register A operand (Gluon).

Why. From ~2k tokens (prefill chunks, the training forward) a weight-only GEMM is compute-bound, and the dense
path (``dense.py``: decode the whole weight to a transient BF16 copy, then cuBLAS) pays the copy's 2.56 bytes a
weight of memory traffic on top of cuBLAS: 0.82-0.89x cuBLAS BF16 at 2048 rows (issue 17 asks >= 0.95x). A fused
kernel must hand the decoded weight to the tensor cores without that round trip. Session 17-22's warp-specialized
kernel (``benchmarks/kernels/ws_mixed_gemm.py``) decoded into a shared-memory tile for wgmma's B operand and stopped
near 0.8x: its skeleton runs at cuBLAS speed, and converting and storing the 16 KB tile each K step is what it could
not hide (RESULTS "Issue 17, session 22"). Here the decoded weight never goes to shared memory:

* y^T = W x^T, as in the TMA ring (``wgmma_ring``): the weight is wgmma's **A operand, in registers** -- each K step's
  packed words are decoded straight into the A fragment (``wgmma_decode.a_fragment``, the PTX decode of
  ``mma_decode``), and x, permuted once per call into the fragment's k order (``ring_x.permute_x``), is the B
  operand, fed by TMA in 128-byte swizzled boxes.
* **Warp-specialized and persistent**: a loader warp fills a ring of ``STAGES`` (x box [256 tokens, 64], the step's
  words [128 rows, 8], and the step's scale bytes, staged through registers: 4 bytes a row for NVFP4, 2 for MXFP4,
  so K is never split); **two consumer warpgroups, each its own partition**, take 64 weight rows of the 128-row
  tile against the same 256-token x tile (m64n256, a [64, 256] fp32 accumulator each). With no CTA barrier between
  them, one's decode runs while the other's MMA holds the tensor cores. One CTA an SM walks the tiles (M tiles
  fastest, so the CTAs running together share x and weight rows in L2) and stores each accumulator straight from
  registers (through an 8-row vector layout: 16 addresses a thread, not 128).
* A consumer waits for its own MMA before it decodes the next step: the A registers must not change under a wgmma
  in flight (the TMA ring's reproducibility bug, session 14). ``OVERLAP`` decodes the next step into a second set of
  A registers while the MMA runs (the first set kept live through the wait by ``deps``).

Measured (H100, session 22, phases g-j; RESULTS "Issue 17, session 22: M >= 2048 ..."): on x permuted beforehand
0.90-1.09x cuBLAS BF16 at 2048-16384 rows on the 7B / 14B weights; with the permutation in the call (one pass over x,
~520 / N of the GEMM) 0.78-1.01x, ahead of the dense path on the wide weights up to 8192 rows. Routed only when
switched on (``QUARL_KERNELS_MIXED_GEMM=1``): the 7B GRPO step's update was no faster with it (``enabled``).

Numerics: the weight is decoded exactly to BF16 (NVFP4 ``e2m1 * e4m3 * 2**-16`` with ``2**16 / global_scale``
applied to the fp32 accumulator; MXFP4 exact), products accumulate in fp32 -- the dense path's values up to the
order of the fp32 sums. NVFP4 / MXFP4 only (FP4 decode); K % 64 == 0; words row-major or in
``quarl.quant.packed_layout``'s [64, 8] blocks (one TMA box per 64-row band, as the ring).
"""

from __future__ import annotations

import torch
import triton
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

from quarl_kernels.dequant import _fp4_asm
from quarl_kernels.formats import FMT_MXFP4, FMT_NVFP4
from quarl_kernels.launch import env_flag, env_int, num_sms
from quarl_kernels.mma_decode_step import _group_layout, _word_layout
from quarl_kernels.ring_x import permute_x, tile_rows
from quarl_kernels.wgmma_decode import a_fragment, device_ok
from quarl_kernels.wgmma_ring import _w_layout, _w_load, _x_layout

NT = 256  # tokens a tile (wgmma n)
R = 128  # weight rows a tile: two consumers of 64 (wgmma m)
BKW = 8  # packed words a K step (64 weights: one 128-byte x box)
_R = gl.constexpr(R)  # the same two, as the kernels see them
_BKW = gl.constexpr(BKW)
DEFAULT_STAGES = 4
X_GROUP_BYTES = 24 << 20  # x of the token tiles that walk the weights together: about half the H100's L2
ENV = "QUARL_KERNELS_MIXED_GEMM"
DEFAULT_MIN_M = 2048  # from here it is measured ahead of the dense path (session 22); env QUARL_KERNELS_MIXED_GEMM_MIN_M
# Where it is routed (``takes``), from session 22's phase i (H100, x permuted in the call): up to 8192 rows -- at 16384
# the dense path's 0.97-1.0x cuBLAS is ahead of this kernel with its x permutation (0.96x) -- and on weights of >= 8192
# output rows, where the permutation (one pass over x, ~520 / N of the GEMM's time) costs <= ~6 %: the 7B / 14B
# gate / up projections; q / k / v / o and down stay on the dense path.
MAX_M = 8192
MIN_N = 8192


# ---------------------------------------------------------------------------
# NATURAL: the A fragment in x's own k order, so x needs no permutation. A thread of the fragment holds, for each of
# its two rows, k = 32 j + 16 r1 + 8 r0 + 2 t + h (t = lane % 4): byte t of every packed word of the row. The quad's
# four lanes hold words 2t, 2t + 1 of the same rows (``_word_layout``), so a 4 x 4 byte transpose across the quad
# (two ``shfl.bfly`` and two ``prmt`` a word) gives each lane its bytes: G0 = byte t of words 0..3, G1 = of 4..7. G is
# then decoded like a word (its code o -- byte o // 2, nibble o % 2 -- is exactly the code the fragment wants at
# output o), with a scale per 16-bit half: codes 0..3 (words 4j, 4j + 1) and 4..7 (words 4j + 2, 4j + 3) are two
# NVFP4 groups. Measured (H100, session 22 phase l): correct, and slower than permuting x (0.75-0.91x cuBLAS against
# 0.78-1.01x): the shuffles and the per-register scale conversion cost the consumers more than the pass they save.
_QUAD_T = """
    shfl.sync.bfly.b32 r, {v}, 2, 0x1f, 0xffffffff;
    prmt.b32 u, {v}, r, sa;
    shfl.sync.bfly.b32 r, u, 1, 0x1f, 0xffffffff;
    prmt.b32 {out}, u, r, sb;"""
GATHER_ASM = gl.constexpr(
    "{\n .reg .b32 l, sa, sb, r, u, te, to;\n .reg .pred p;\n mov.u32 l, %laneid;\n"
    " and.b32 sa, l, 2;\n setp.ne.u32 p, sa, 0;\n selp.b32 sa, 0x3276, 0x5410, p;\n"
    " and.b32 sb, l, 1;\n setp.ne.u32 p, sb, 0;\n selp.b32 sb, 0x3715, 0x6240, p;"
    + _QUAD_T.format(v="$2", out="te") + _QUAD_T.format(v="$3", out="to")
    + "\n prmt.b32 $0, te, to, 0x5140;\n prmt.b32 $1, te, to, 0x7362;\n}")
# dequant's FP4 decode with the scale pair {S_lo, S_hi} instead of {S, S}
FP4_ASM_2S = gl.constexpr(_fp4_asm().replace("mov.b32 s2, {$9, $9};", "mov.b32 s2, {$9, $10};"))


@gluon.jit
def _a_fragment_natural(w, srow, FMT: gl.constexpr, LW: gl.constexpr, A_L: gl.constexpr):
    """One K step's words [64, 8] (``_word_layout``) and each row's scale bytes of the step (int32: NVFP4's four
    groups; int16: MXFP4's two) -> the wgmma A fragment [64, 64] bf16 in natural k order."""
    R: gl.constexpr = w.type.shape[0]
    BKW_: gl.constexpr = w.type.shape[1]
    g = gl.inline_asm_elementwise(GATHER_ASM, "=r,=r,r,r", [w], dtype=gl.int32, is_pure=True, pack=2)
    jw = gl.arange(0, BKW_, layout=gl.SliceLayout(0, LW)) % 2  # [8]: the slot j of G in a word position
    sr = gl.broadcast(gl.expand_dims(srow.to(gl.int32), 1), g)[0]  # [R, 8] the row's scale bytes
    if FMT == 0:  # NVFP4: groups 2j (codes 0..3) and 2j + 1 (4..7); S = e4m3 * 2**110, exact in bf16
        lo = (sr >> (16 * jw)[None, :]) & 0xFF
        hi = (sr >> (16 * jw + 8)[None, :]) & 0xFF
        s_lo = (lo.to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * 1.298074214633707e33).to(gl.bfloat16)
        s_hi = (hi.to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * 1.298074214633707e33).to(gl.bfloat16)
    else:  # MXFP4: one group (j) for all eight codes; S = 2**(e - 17) from the E8M0 byte
        e = gl.minimum((sr >> (8 * jw)[None, :]) & 0xFF, 144)
        s_lo = ((e + 110) << 7).to(gl.int16).to(gl.bfloat16, bitcast=True)
        s_hi = s_lo
    q0, q1, q2, q3, q4, q5, q6, q7 = gl.inline_asm_elementwise(
        FP4_ASM_2S, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [g, s_lo, s_hi], dtype=(gl.bfloat16,) * 8, is_pure=True,
        pack=1)
    # pair order (output q holds code q // 2 + 4 (q % 2)) -> natural order p[o] = code o, as a_fragment lays out
    J: gl.constexpr = BKW_ // 4
    q = gl.join(gl.join(gl.join(q0, q2), gl.join(q4, q6)), gl.join(gl.join(q1, q3), gl.join(q5, q7)))
    q = gl.reshape(q, [R, 4, J, 2, 2, 2])  # [R, t, j, h, r0, r1]
    a = gl.reshape(gl.permute(q, [0, 2, 5, 4, 1, 3]), [R, BKW_ * 8])  # [R, j, r1, r0, t, h]: k in natural order
    return gl.convert_layout(a, A_L, assert_trivial=True)


@gluon.jit
def _tile_offsets(t, m_tiles, n_tiles, GM, NT_: gl.constexpr, R_: gl.constexpr):
    """Tile ``t`` -> (token offset, weight-row offset): groups of ``GM`` token tiles walk every weight tile together,
    token tiles fastest, so the CTAs running at once share a group's x (sized to stay in L2) and each weight tile."""
    first = (t // (GM * n_tiles)) * GM
    gm = gl.minimum(m_tiles - first, GM)
    local = t % (GM * n_tiles)
    return (first + local % gm) * NT_, (local // gm) * R_


@gluon.jit
def _loader(x_desc, w_desc, xs, ws, s_bufs, s_ptr, N, KW, stride_sn, ready, empty, k_steps, num_tiles, m_tiles,
            n_tiles, GM, BLOCKED: gl.constexpr):
    """One warp: step ``it``'s x box, words and scale bytes into stage ``it % STAGES`` once both consumers freed it."""
    stages: gl.constexpr = xs.type.shape[0]
    NT_: gl.constexpr = x_desc.block_type.shape[0]
    R_: gl.constexpr = ws.type.shape[1]
    BKW_: gl.constexpr = ws.type.shape[2]
    LS: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    SB: gl.constexpr = s_bufs.dtype.primitive_bitwidth // 8  # scale bytes a row and step: 4 (NVFP4) or 2 (MXFP4)
    ar = gl.arange(0, R_, layout=LS)
    step_bytes: gl.constexpr = x_desc.block_type.nbytes + R_ * BKW_ * 4
    it = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(t, m_tiles, n_tiles, GM, NT_, R_)
        rows = gl.minimum(off_n + ar, N - 1)  # rows past N: zero words from TMA, their scales never used
        sbase = s_ptr.to(gl.pointer_type(s_bufs.dtype), bitcast=True) + rows * (stride_sn // SB)  # [R]
        for i in range(k_steps):
            s = it % stages
            sc = gl.load(sbase + i)  # issued before the wait: its latency overlaps it
            mbarrier.wait(empty.index(s), ((it // stages) & 1) ^ 1)  # fresh barriers count as freed once
            mbarrier.expect(ready.index(s), step_bytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, i * BKW_ * 8], ready.index(s), xs.index(s))
            _w_load(w_desc, off_n, i * BKW_, KW, ready.index(s), ws.index(s), True, R_, BLOCKED)
            s_bufs.index(s).store(sc)
            gl.thread_barrier()  # every lane's store before the one arrive
            mbarrier.arrive(ready.index(s), count=1)
            it += 1


@gluon.jit
def _decode_a(xs, ws, s_bufs, s_bytes, ready, it, HALF: gl.constexpr, FMT: gl.constexpr, GROUP: gl.constexpr,
              A_L: gl.constexpr, NATURAL: gl.constexpr):
    """Wait for step ``it``'s stage and decode this consumer's 64 rows of it into the A fragment [64, 64] bf16 (in
    the permuted x's k order, or NATURAL: in x's own)."""
    stages: gl.constexpr = xs.type.shape[0]
    BKW_: gl.constexpr = ws.type.shape[2]
    WT: gl.constexpr = GROUP // 8
    LW: gl.constexpr = _word_layout(64, BKW_, 4)
    s = it % stages
    mbarrier.wait(ready.index(s), (it // stages) & 1)
    w = ws.index(s).slice(HALF * 64, 64).load(LW)  # [64, BKW] words
    if NATURAL:
        srow = s_bufs.index(s).slice(HALF * 64, 64).load(gl.SliceLayout(1, LW))  # [64] a row's scale bytes
        return _a_fragment_natural(w, srow, FMT, LW, A_L)
    else:
        LG: gl.constexpr = gl.SliceLayout(2, _group_layout(64, BKW_, 4, WT))
        sg = s_bytes.index(s).slice(HALF * 64, 64).load(LG)  # [64, NG] scale bytes
        return a_fragment(w, sg, sg, FMT, False, LW, 64, BKW_, WT, A_L)


@gluon.jit
def _store_tile(acc, y_ptr, gs_ptr, M, N, stride_ym, off_m, off_n, HALF: gl.constexpr, FMT: gl.constexpr):
    """``acc [64, NT]`` (weight rows x tokens) scaled, rounded to bf16 and stored transposed into ``y [M, N]``."""
    NT_: gl.constexpr = acc.type.shape[1]
    OL: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])  # 8-row vectors along N: 16 addresses
    if FMT == 0:  # the decode's 2**-16 and NVFP4's global scale
        factor = 65536.0 / gl.load(gs_ptr).to(gl.float32)
    else:
        factor = 65536.0
    y = gl.convert_layout((acc * factor).to(y_ptr.dtype.element_ty), OL)
    offs_r = off_n + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, OL))
    offs_t = off_m + gl.arange(0, NT_, layout=gl.SliceLayout(0, OL))
    gl.store(y_ptr + offs_t[None, :].to(gl.int64) * stride_ym + offs_r[:, None], y,
             mask=(offs_r[:, None] < N) & (offs_t[None, :] < M))


@gluon.jit
def _consumer(xs, ws, s_bufs, s_bytes, ready, empty, y_ptr, gs_ptr, M, N, stride_ym, k_steps, num_tiles, m_tiles,
              n_tiles, GM, HALF: gl.constexpr, FMT: gl.constexpr, GROUP: gl.constexpr, OVERLAP: gl.constexpr,
              NATURAL: gl.constexpr):
    """One warpgroup: rows ``HALF * 64 ..`` of every tile of this program, a step at a time: decode into the A
    registers, wgmma against the stage's x, wait for it, free the stage; the tile's epilogue after its last step.
    OVERLAP: the next step of the tile is decoded while the MMA runs (a tile's first step is not)."""
    NT_: gl.constexpr = xs.type.shape[1]
    R_: gl.constexpr = ws.type.shape[1]
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NT_, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    stages: gl.constexpr = xs.type.shape[0]
    it = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        acc = gl.zeros([64, NT_], gl.float32, MMA)
        if OVERLAP:
            a = _decode_a(xs, ws, s_bufs, s_bytes, ready, it, HALF, FMT, GROUP, A_L, NATURAL)
        for i in range(k_steps):
            s = it % stages
            if not OVERLAP:
                a = _decode_a(xs, ws, s_bufs, s_bytes, ready, it, HALF, FMT, GROUP, A_L, NATURAL)
            acc = warpgroup_mma(a, xs.index(s).permute((1, 0)), acc, is_async=True)  # [64, NT] += W x^T
            if OVERLAP:  # into other registers while this MMA runs (``a`` stays live until the wait)
                a_next = _decode_a(xs, ws, s_bufs, s_bytes, ready, gl.minimum(i + 1, k_steps - 1) + it - i, HALF,
                                   FMT, GROUP, A_L, NATURAL)
            acc, a = warpgroup_mma_wait(0, deps=[acc, a])
            mbarrier.arrive(empty.index(s), count=1)  # this consumer's reads of the stage are done
            if OVERLAP:
                a = a_next
            it += 1
        off_m, off_n = _tile_offsets(t, m_tiles, n_tiles, GM, NT_, R_)
        _store_tile(acc, y_ptr, gs_ptr, M, N, stride_ym, off_m, off_n, HALF, FMT)


@gluon.jit
def _mixed_gemm_kernel(x_desc, w_desc, s_ptr, gs_ptr, y_ptr, M, N, KW, stride_sn, stride_ym, GM,
                       FMT: gl.constexpr, GROUP: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                       BLOCKED: gl.constexpr, CR: gl.constexpr, NATURAL: gl.constexpr = False):
    """y [M, N] = x [M, K] @ dequant(W)^T: x_desc over the permuted x (box [NT, 64]), w_desc over the words (box
    [R, 8], or [64, 8] per band when BLOCKED); one CTA an SM walks the [NT, R] tiles."""
    NT_: gl.constexpr = x_desc.block_type.shape[0]
    SB: gl.constexpr = 4 if FMT == 0 else 2  # scale bytes a row and step (64 weights: 4 groups of 16 / 2 of 32)
    k_steps = KW // _BKW
    m_tiles = gl.cdiv(M, NT_)
    n_tiles = gl.cdiv(N, _R)
    num_tiles = m_tiles * n_tiles
    xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, NT_, _BKW * 8], x_desc.layout)
    ws = gl.allocate_shared_memory(gl.int32, [STAGES, _R, _BKW], w_desc.layout)
    if SB == 4:
        s_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, _R], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        s_bufs = gl.allocate_shared_memory(gl.int16, [STAGES, _R], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    s_bytes = s_bufs._reinterpret(gl.uint8, [STAGES, _R, SB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=2)  # the TMA bytes and the loader's scale store
        mbarrier.init(empty.index(i), count=2)  # both consumers
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (xs, ws, s_bufs, s_bytes, ready, empty, y_ptr, gs_ptr, M, N, stride_ym, k_steps, num_tiles,
                     m_tiles, n_tiles, GM, 0, FMT, GROUP, OVERLAP, NATURAL)),
        (_consumer, (xs, ws, s_bufs, s_bytes, ready, empty, y_ptr, gs_ptr, M, N, stride_ym, k_steps, num_tiles,
                     m_tiles, n_tiles, GM, 1, FMT, GROUP, OVERLAP, NATURAL)),
        (_loader, (x_desc, w_desc, xs, ws, s_bufs, s_ptr, N, KW, stride_sn, ready, empty, k_steps, num_tiles,
                   m_tiles, n_tiles, GM, BLOCKED)),
    ], [4, 1], [CR, 48])


# ---------------------------------------------------------------------------
def enabled() -> bool:
    """``QUARL_KERNELS_MIXED_GEMM`` (off unless 1 / on: per call it is ahead of the dense path where it is routed,
    but the 7B GRPO step measured no faster with it -- 11.30 / 11.34 s against 11.12 s of update, session 22 phase j:
    the x permutation and launch path cost what the GEMM saves at 6144 rows, and the backward no longer finds the
    recompute's decoded weight to reuse)."""
    return env_flag(ENV, False)


def min_m() -> int:
    """Smallest M this kernel takes in ``dense.dense_matmul`` (``QUARL_KERNELS_MIXED_GEMM_MIN_M``)."""
    return env_int(ENV + "_MIN_M", DEFAULT_MIN_M, "a token count (e.g. 4096)")


def supported(x2: torch.Tensor, pw) -> bool:
    """CUDA bf16 x [M, K] on an sm_90 GPU, an NVFP4 / MXFP4 weight with K % 64 == 0 whose words are 16-byte aligned
    for TMA and whose scale rows are aligned for the loader's 4- / 2-byte loads."""
    sb = 4 if pw.fmt == FMT_NVFP4 else 2
    return (x2.is_cuda and x2.dtype == torch.bfloat16 and x2.dim() == 2 and x2.shape[1] == pw.k
            and pw.fmt in (FMT_NVFP4, FMT_MXFP4) and pw.k % 64 == 0 and pw.words.data_ptr() % 16 == 0
            and (pw.blocked or (pw.words.stride(1) == 1 and (pw.words.stride(0) * 4) % 16 == 0))
            and pw.scale.stride(-1) == 1 and (pw.scale.stride(0) * pw.scale.element_size()) % sb == 0
            and pw.scale.data_ptr() % sb == 0 and device_ok(x2.device))


def takes(x2: torch.Tensor, pw) -> bool:
    """Whether ``dense.dense_matmul`` sends this forward here: switched on (``QUARL_KERNELS_MIXED_GEMM=1``),
    ``min_m() <= M <= MAX_M``, a weight of >= ``MIN_N`` rows, supported."""
    m = min_m()
    return (enabled() and m > 0 and m <= x2.shape[0] <= MAX_M and pw.n >= MIN_N and supported(x2, pw))


def group_tiles(m: int, k: int) -> int:
    """Token tiles that walk the weight tiles together (``_tile_offsets``): as many as keep their x (``NT x K``
    bf16 each) within ``X_GROUP_BYTES`` -- at 16384 rows a whole-M walk re-read x from HBM for every weight tile."""
    return max(1, min(triton.cdiv(m, NT), X_GROUP_BYTES // (NT * k * 2)))


def mixed_matmul(x2: torch.Tensor, pw, *, stages: int = DEFAULT_STAGES, overlap: bool = True, natural: bool = False,
                 xp: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] bf16 = x2 [M, K] @ dequant(W)^T (``supported`` must hold). ``xp``: x already permuted
    (``ring_x.permute_x(x2, 8, tile_rows(M, 256))``), else permuted here (one pass over x)."""
    if not supported(x2, pw):
        raise ValueError(f"mixed_matmul: needs CUDA bf16 x [M, {pw.k}] on an sm_90 GPU and an NVFP4 / MXFP4 weight "
                         f"with K % 64 == 0 and aligned words and scales; got {x2.dtype} {tuple(x2.shape)} on "
                         f"{x2.device}, format {pw.fmt}")
    m = x2.shape[0]
    if natural:  # the fragment in x's own k order: x as it is (a last partial token tile TMA-zero-filled)
        xp = x2.contiguous()
    elif xp is None:
        xp = permute_x(x2.contiguous(), BKW, tile_rows(m, NT))
    y = torch.empty((m, pw.n), device=x2.device, dtype=torch.bfloat16) if out is None else out
    x_desc = TensorDescriptor.from_tensor(xp, [NT, BKW * 8], _x_layout(NT))
    w_desc = TensorDescriptor.from_tensor(pw.words.view(-1, 8), [64, 8], _w_layout()) if pw.blocked else \
        TensorDescriptor.from_tensor(pw.words, [R, BKW], _w_layout())
    scale = pw.scale.view(torch.uint8) if pw.scale.dtype != torch.uint8 else pw.scale
    gs = pw.gscale if pw.gscale is not None else scale
    tiles = triton.cdiv(m, NT) * triton.cdiv(pw.n, R)
    _mixed_gemm_kernel[(min(tiles, num_sms(x2.device)),)](
        x_desc, w_desc, scale, gs, y, m, pw.n, pw.k // 8, scale.stride(0), y.stride(0), group_tiles(m, pw.k),
        FMT=pw.fmt, GROUP=pw.group, STAGES=stages, OVERLAP=overlap, BLOCKED=pw.blocked, CR=232, NATURAL=natural,
        num_warps=4,
    )
    return y


def compile_sm90(fmt: int = FMT_NVFP4, *, stages: int = DEFAULT_STAGES, overlap: bool = False,
                 blocked: bool = False, natural: bool = False):
    """The kernel built for sm_90 on any machine (its TMA descriptors as ``mixed_matmul`` builds them): the CPU
    tests' view of its registers, spills and shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    wbox = "[64, 8]" if blocked else f"[{R}, {BKW}]"
    sig = {"x_desc": f"tensordesc<bf16[{NT}, {BKW * 8}],{_x_layout(NT)!r}>",
           "w_desc": f"tensordesc<i32{wbox},{_w_layout()!r}>",
           "s_ptr": "*u8", "gs_ptr": "*fp32" if fmt == FMT_NVFP4 else "*u8", "y_ptr": "*bf16",
           "M": "i32", "N": "i32", "KW": "i32", "stride_sn": "i32", "stride_ym": "i32", "GM": "i32"}
    const = {"FMT": fmt, "GROUP": 16 if fmt == FMT_NVFP4 else 32, "STAGES": stages, "OVERLAP": overlap,
             "BLOCKED": blocked, "CR": 232, "NATURAL": natural}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items())
             if t != "constexpr" and not t.startswith("tensordesc") and k != "M"}
    src = GluonASTSource(fn=_mixed_gemm_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


__all__ = ["DEFAULT_MIN_M", "ENV", "MAX_M", "MIN_N", "compile_sm90", "enabled", "group_tiles", "min_m", "mixed_matmul",
           "supported", "takes"]
