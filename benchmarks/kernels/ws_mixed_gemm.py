"""A warp-specialized mixed-input GEMM for large M on Hopper (issue 17: M >= 2048 at >= 0.95x cuBLAS) -- EXPERIMENT.

Status: written in session 16 (built for sm_90 on a CPU), first run in session 17 (H100, ``gpu_session17.sh a``;
RESULTS "Issue 17, session 17"): correct (2.2-2.4e-3 relative to the float product, the bf16 output's rounding) and
**slow: 0.48-0.62x cuBLAS BF16** at M = 2048 / 4096 on the 7B weights (e.g. 18944 x 3584 at 2048 rows 630.8 us
against cuBLAS 365.1 and the dense path 417.9), where the dense path is 0.85-0.98x. At ~440 TFLOP/s it runs at about
half the tensor cores' rate: one consumer warpgroup with one wgmma group in flight, one CTA an SM (115 KB of shared
memory), no persistent tiles (prologue and epilogue not overlapped), and the scale bytes read from global memory one
step ahead. Session 17's variants (``VARIANTS``, phase g): the scales staged by the loader warp +2-9 %, no fence after
the word reads and a third decoded stage nothing, **two MMA warpgroups on 256-token tiles** (``bm=256``) +20-35 %,
and a fourth x stage (phases h-i) +11-18 %: **0.78-0.84x cuBLAS at 2048 rows, 0.74-0.78x at 4096** -- level with the
dense path at 2048, below it at 4096. The decoder is not the bound (the ``nodecode`` diagnostic, phase j, is as
fast): the MMA side is -- non-persistent tiles whose refill and epilogue leave the tensor cores idle, and the CTA
barriers Triton's membar pass puts around the MMA partition's mbarrier operations. Not wired into ``wo_matmul``.
Session 22 (``gpu_session22.sh a-b, d, f``, RESULTS "Issue 17, session 22"): persistent tiles
(``ws_gemm_persistent_kernel``, the epilogue from registers while the loader and decoder fill the next tile's rings) are
no faster (0.61-0.85x). With the decoder doing only the ring handshakes (``-hs``, wrong results) the same skeleton runs
at 0.93-1.07x cuBLAS; converting and storing a constant 16 KB tile a step (``-st``) brings it back to 0.77-0.88x: the
decoder warps' per-step work -- the tile's register shuffles and its shared-memory store more than the decode --
is the bound, not the refill or the epilogue. Swapped operands (``SWAP``: the decoded tile as A, m64n256, fewer operand
reads) need more than the 128 registers a thread that 16 warps leave: with a two-warp decoder (``-w2``, 12 warps
launched) they gain 1-5 % over the same kernel unswapped, which itself loses 10-15 % to the four-warp decoder
(0.63-0.82x, phase f); a 12-warp kernel whose decoder issued the loads itself was slower still (0.57-0.67x, phase d,
commit 799142a); an eight-warp decoder spills the accumulators. Phase g then took the decoded weight off shared
memory (commit 13edc9b, ``--ra``: a loader warp and two consumer warpgroups decoding into wgmma's register A operand,
m64n256, x permuted once per call as in the TMA ring): 0.80-0.97x with the permutation, ahead of the dense path -- it
became ``quarl_kernels.mixed_gemm`` (docs/kernels.md v17; ``bench_mixed_gemm.py``) and left this file.

Why. At M >= 2048 a weight-only GEMM is compute-bound. The dense path (``quarl_kernels.dense``) decodes the whole
weight to a transient BF16 copy and runs cuBLAS: 0.81-0.91x cuBLAS at M = 2048 (the decode's 2.56 bytes a weight),
and the BF16 transient costs memory. The ring (``wgmma_ring``, v13) decodes into the wgmma A registers of the same
warps that issue the MMA, one 128-token tile at a time: 0.54-0.67x at 2048. Here the work is split by role, as
CUTLASS's mixed-input Hopper GEMMs do:

* a loader warp issues the TMA copies: an x tile ``[BM, BK]`` and the packed words of the weight tile ``[BN, BK/8]``
  per K step into a ring of ``STAGES``;
* a decoder warpgroup turns each step's words (and their scale bytes: read from global memory one step ahead in v1,
  staged into the stage by the loader warp with ``ssmem``) into
  the BF16 weight tile ``[BN, BK]`` (``mma_decode_step._decode_step``'s PTX, codes put back in natural k order) and stores
  it into a second ring in the NVMMA layout wgmma reads;
* the default warpgroup issues ``wgmma(x [BM, BK], W^T [BK, BN])`` from shared memory, one group in flight, and
  releases each step's buffers when its MMA is done.

Per K step (BM = BN = 128, BK = 64) the MMA is ~512 cycles of tensor-core time and the decode ~100 issue cycles
plus a 16 KB shared-memory store: the decode can hide under the MMA when it runs on its own warps. Each weight
tile is decoded once per M tile (16 times at M = 2048), never stored to HBM. NVFP4 / MXFP4 only (the FP4 decode).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from quarl_kernels.mma_decode_step import _decode_step, _group_layout, _word_layout
from quarl_kernels.wgmma_ring import _w_layout, _x_layout  # the ring's TMA layouts: the same x and word boxes
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

BM, BN, BK = 128, 128, 64  # tokens, weight rows, K per step
BKW = BK // 8  # packed words per row per step
STAGES = 4  # x + word ring
DSTAGES = 2  # decoded-weight ring
DECODE_WARPS = 4
DECODER_REGS_BM256 = gl.constexpr(120)  # the decoder's registers beside two MMA warpgroups (bm = 256)
# Session 17's variants, by name (``--variants``; RESULTS "Issue 17, session 17" has each one's figures): v1, the first
# version; ssmem, the scale bytes staged by the loader warp; nofence, without the decoder's proxy fence after its word
# reads; d3 / s4 / s5, 3 decoded stages / 4 / 5 x stages; bm256, two MMA warpgroups on 256-token tiles; spf, the
# loader's scale loads 3 steps ahead; nodecode, a diagnostic with wrong results (the decode replaced by a conversion).
# Fastest measured: bm256-s4 and bm256-spf-s4 (0.78-0.84x cuBLAS at 2048 rows).
VARIANTS = {"v1": {}, "ssmem": {"ssmem": True}, "ssmem-nofence": {"ssmem": True, "wfence": False},
            "ssmem-nofence-d3": {"ssmem": True, "wfence": False, "dstages": 3},
            "bm256": {"ssmem": True, "wfence": False, "bm": 256, "stages": 3},
            "bm256-d3": {"ssmem": True, "wfence": False, "bm": 256, "stages": 3, "dstages": 3},
            "bm256-spf": {"ssmem": True, "wfence": False, "bm": 256, "stages": 3, "spf": True},
            "bm256-spf-s4": {"ssmem": True, "wfence": False, "bm": 256, "stages": 4, "spf": True},
            "bm128-spf": {"ssmem": True, "wfence": False, "spf": True},
            "bm256-spf-s5": {"ssmem": True, "wfence": False, "bm": 256, "stages": 5, "spf": True},
            "bm256-s4": {"ssmem": True, "wfence": False, "bm": 256, "stages": 4},
            "bm256-s4-nodecode": {"ssmem": True, "wfence": False, "bm": 256, "stages": 4, "nodecode": True}}


@gluon.jit
def _loader(x_desc, w_desc, x_bufs, w_bufs, s_bufs, s_ptr, N, stride_sn, ready, empty, off_m, off_n, k_steps,
            SSMEM: gl.constexpr, SPF: gl.constexpr):
    """One warp: x and the packed words of each K step into stage ``i % STAGES`` once both consumers freed it.
    SSMEM: also the step's scale bytes (4 a row: NVFP4's 4 groups of a 64-wide step, one int32), loaded from global
    memory here and stored into the stage, so that the decoder's loads are all from shared memory (its
    ``fence_async_shared`` -- a MEMBAR.ALL.CTA in the SASS -- otherwise waits out a global load every step)."""
    stages: gl.constexpr = x_bufs.type.shape[0]
    bk: gl.constexpr = x_desc.block_type.shape[1]
    bkw: gl.constexpr = w_desc.block_type.shape[1]
    R: gl.constexpr = w_desc.block_type.shape[0]
    if SSMEM:
        LS: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])  # [R] rows over the warp
        rows = gl.minimum(off_n + gl.arange(0, R, layout=LS), N - 1)
        sbase = s_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + rows * (stride_sn // 4)  # [R]: a row's int32 words
        if SPF:  # a register FIFO: step i's scales were loaded 3 steps ago (the loader no longer waits out a load a step)
            f0 = gl.load(sbase)
            f1 = gl.load(sbase + gl.minimum(1, k_steps - 1))
            f2 = gl.load(sbase + gl.minimum(2, k_steps - 1))
    for i in range(k_steps):
        s = i % stages
        mbarrier.wait(empty.index(s), ((i // stages) & 1) ^ 1)  # fresh barriers count as freed once
        mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [off_m, i * bk], ready.index(s), x_bufs.index(s))
        tma.async_copy_global_to_shared(w_desc, [off_n, i * bkw], ready.index(s), w_bufs.index(s))
        if SSMEM:
            if SPF:
                s_bufs.index(s).store(f0)
                f0 = f1
                f1 = f2
                f2 = gl.load(sbase + gl.minimum(i + 3, k_steps - 1))
            else:
                s_bufs.index(s).store(gl.load(sbase + i))
            gl.thread_barrier()  # every lane's store before the one arrive
            mbarrier.arrive(ready.index(s), count=1)  # the barrier's second arrival (init count 2)


@gluon.jit
def _decoder(s_ptr, N, stride_sn, w_bufs, s_bytes, d_bufs, ready, empty, d_ready, d_empty, off_n, k_steps,
             FMT: gl.constexpr, GROUP: gl.constexpr, R: gl.constexpr, BKW_: gl.constexpr, W: gl.constexpr,
             SSMEM: gl.constexpr, WFENCE: gl.constexpr, NODECODE: gl.constexpr):
    """A warpgroup: each step's words -> the BF16 weight tile [R, 8 BKW] in natural k order, into the decoded ring."""
    stages: gl.constexpr = w_bufs.type.shape[0]
    dstages: gl.constexpr = d_bufs.type.shape[0]
    WPG: gl.constexpr = GROUP // 8  # words per scale group
    WT: gl.constexpr = WPG if WPG < BKW_ else BKW_  # noqa: FURB136  words per group slot in a step
    NG: gl.constexpr = BKW_ // WT
    LW: gl.constexpr = _word_layout(R, BKW_, W)
    LG: gl.constexpr = gl.SliceLayout(2, _group_layout(R, BKW_, W, WT))
    gl.static_assert(WT == WPG, "whole scale groups per K step (groups of <= 8 * BKW codes)")
    rows = gl.minimum(off_n + gl.arange(0, R, layout=gl.SliceLayout(1, LG)), N - 1)  # rows past N: never stored
    g = gl.arange(0, NG, layout=gl.SliceLayout(0, LG))
    sp = s_ptr + rows[:, None] * stride_sn + g[None, :]  # [R, NG]: step i's groups are i * NG + g
    if not SSMEM:
        sg = gl.load(sp)
    for i in range(k_steps):
        s = i % stages
        if not SSMEM:
            sg_next = gl.load(sp + gl.minimum(i + 1, k_steps - 1) * NG)  # the next step's scales, one step early
        mbarrier.wait(ready.index(s), (i // stages) & 1)
        w = w_bufs.index(s).load(LW)  # [R, BKW] words
        if SSMEM:
            sg = s_bytes.index(s).load(LG)  # [R, NG] scale bytes of this step
        if WFENCE:
            fence_async_shared()  # this read before the loader's next TMA write of the stage
        mbarrier.arrive(empty.index(s), count=1)
        if NODECODE:  # diagnostic only (wrong results): one conversion instead of the decode, the rest the same
            pz = w.to(gl.bfloat16)
            p0, p1, p2, p3, p4, p5, p6, p7 = pz, pz, pz, pz, pz, pz, pz, pz
        else:
            p0, p1, p2, p3, p4, p5, p6, p7 = _decode_step(w, sg, sg, FMT, False, LW, R, BKW_, WT)
        # pair order (output 2 r + h holds code r + 4 h) -> codes 0..7 of each word along a new last axis
        q = gl.join(gl.join(gl.join(p0, p2), gl.join(p4, p6)), gl.join(gl.join(p1, p3), gl.join(p5, p7)))
        tile = gl.reshape(gl.permute(q, [0, 1, 4, 3, 2]), [R, BKW_ * 8])  # [R, BK] k = 8 word + code
        d = i % dstages
        mbarrier.wait(d_empty.index(d), ((i // dstages) & 1) ^ 1)
        d_bufs.index(d).store(tile)
        fence_async_shared()  # generic-proxy store before wgmma's async-proxy read
        mbarrier.arrive(d_ready.index(d), count=1)
        if not SSMEM:
            sg = sg_next


@gluon.jit
def _mma_steps(x_bufs, d_bufs, ready, empty, d_ready, d_empty, acc, it0, k_steps, SWAP: gl.constexpr = False):
    """``k_steps`` wgmma steps from the ring position ``it0``, one group in flight: each step's wait for the one before
    gives that step's buffers back (the first step's predecessor, if any, is the caller's). Returns the accumulator
    with the last group still in flight. SWAP: acc [R, BM] += W x^T (the decoded tile as A)."""
    stages: gl.constexpr = x_bufs.type.shape[0]
    dstages: gl.constexpr = d_bufs.type.shape[0]
    for i in range(k_steps):
        it = it0 + i
        s = it % stages
        d = it % dstages
        mbarrier.wait(ready.index(s), (it // stages) & 1)
        mbarrier.wait(d_ready.index(d), (it // dstages) & 1)
        if SWAP:
            acc = warpgroup_mma(d_bufs.index(d), x_bufs.index(s).permute((1, 0)), acc, is_async=True)
        else:
            acc = warpgroup_mma(x_bufs.index(s), d_bufs.index(d).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=[acc])  # the previous step's MMA is done: its buffers go back
        mbarrier.arrive(empty.index((it + stages - 1) % stages), count=1, pred=i > 0)
        mbarrier.arrive(d_empty.index((it + dstages - 1) % dstages), count=1, pred=i > 0)
    return acc


@gluon.jit
def _mma(x_bufs, d_bufs, ready, empty, d_ready, d_empty, k_steps, BM_: gl.constexpr, R: gl.constexpr,
         W: gl.constexpr):
    """The default warpgroup: wgmma over the ready stages, one group in flight; returns the fp32 accumulator."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, R, 16])
    acc = _mma_steps(x_bufs, d_bufs, ready, empty, d_ready, d_empty, gl.zeros([BM_, R], gl.float32, MMA), 0, k_steps)
    acc = warpgroup_mma_wait(0, deps=[acc])
    return (acc,)  # warp_specialize returns the default partition's results as a tuple


@gluon.jit
def _rings(x_desc, w_desc, STAGES_: gl.constexpr, DSTAGES_: gl.constexpr, READY_COUNT: gl.constexpr):
    """The shared memory of both kernels: the x / word ring (with the staged scale bytes, ``SSMEM``), the decoded ring,
    and their mbarriers, initialized. ``READY_COUNT``: 2 when the loader's scale store arrives beside the TMA bytes."""
    BM_: gl.constexpr = x_desc.block_type.shape[0]
    BK_: gl.constexpr = x_desc.block_type.shape[1]
    R: gl.constexpr = w_desc.block_type.shape[0]
    BKW_: gl.constexpr = w_desc.block_type.shape[1]
    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES_, BM_, BK_], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES_, R, BKW_], w_desc.layout)
    d_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    d_bufs = gl.allocate_shared_memory(gl.bfloat16, [DSTAGES_, R, BK_], d_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    d_ready = gl.allocate_shared_memory(gl.int64, [DSTAGES_, 1], mbarrier.MBarrierLayout())
    d_empty = gl.allocate_shared_memory(gl.int64, [DSTAGES_, 1], mbarrier.MBarrierLayout())
    s_bufs = gl.allocate_shared_memory(gl.int32, [STAGES_, R], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    s_bytes = s_bufs._reinterpret(gl.uint8, [STAGES_, R, 4], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for i in gl.static_range(STAGES_):
        mbarrier.init(ready.index(i), count=READY_COUNT)
        mbarrier.init(empty.index(i), count=2)  # the decoder (words) and the MMA (x) both release a stage
    for i in gl.static_range(DSTAGES_):
        mbarrier.init(d_ready.index(i), count=1)
        mbarrier.init(d_empty.index(i), count=1)
    fence_async_shared()
    return x_bufs, w_bufs, d_bufs, s_bufs, s_bytes, ready, empty, d_ready, d_empty


@gluon.jit
def ws_gemm_kernel(x_desc, w_desc, s_ptr, gs_ptr, y_ptr, M, N, K, stride_sn, stride_ym,
                   FMT: gl.constexpr, GROUP: gl.constexpr, STAGES_: gl.constexpr, DSTAGES_: gl.constexpr,
                   DW: gl.constexpr, SSMEM: gl.constexpr = False, WFENCE: gl.constexpr = True,
                   SPF: gl.constexpr = False, NODECODE: gl.constexpr = False):
    """y [M, N] bf16 = x [M, K] @ dequant(W)^T for one [BM, BN] tile per program (grid: M tiles x N tiles)."""
    BM_: gl.constexpr = x_desc.block_type.shape[0]
    BK_: gl.constexpr = x_desc.block_type.shape[1]
    R: gl.constexpr = w_desc.block_type.shape[0]
    BKW_: gl.constexpr = w_desc.block_type.shape[1]
    W: gl.constexpr = gl.num_warps()
    off_m = gl.program_id(0) * BM_
    off_n = gl.program_id(1) * R
    k_steps = gl.cdiv(K, BK_)

    gl.static_assert(not SSMEM or (FMT == 0 and BK_ == 64), "SSMEM: NVFP4, 4 scale bytes a row and step")
    x_bufs, w_bufs, d_bufs, s_bufs, s_bytes, ready, empty, d_ready, d_empty = _rings(x_desc, w_desc, STAGES_, DSTAGES_,
                                                                                    2 if SSMEM else 1)

    LREGS: gl.constexpr = 48 if SSMEM else 24  # the loader warp: its scale loads need more than 24
    DR: gl.constexpr = 168 if BM_ <= 128 else DECODER_REGS_BM256  # two MMA warpgroups' accumulators need the rest
    (acc,) = gl.warp_specialize([
        (_mma, (x_bufs, d_bufs, ready, empty, d_ready, d_empty, k_steps, BM_, R, W)),
        (_loader, (x_desc, w_desc, x_bufs, w_bufs, s_bufs, s_ptr, N, stride_sn, ready, empty, off_m, off_n, k_steps,
                   SSMEM, SPF)),
        (_decoder, (s_ptr, N, stride_sn, w_bufs, s_bytes, d_bufs, ready, empty, d_ready, d_empty, off_n, k_steps,
                    FMT, GROUP, R, BKW_, DW, SSMEM, WFENCE, NODECODE)),
    ], [1, DW], [LREGS, DR])

    if FMT == 0:  # the decode's 2**-16 and NVFP4's global scale
        acc = acc * (65536.0 / gl.load(gs_ptr).to(gl.float32))
    else:
        acc = acc * 65536.0
    OL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [W, 1], [1, 0])
    y = gl.convert_layout(acc.to(gl.bfloat16), OL)
    rm = off_m + gl.arange(0, BM_, layout=gl.SliceLayout(1, OL))
    rn = off_n + gl.arange(0, R, layout=gl.SliceLayout(0, OL))
    gl.store(y_ptr + rm[:, None].to(gl.int64) * stride_ym + rn[None, :], y, mask=(rm < M)[:, None] & (rn < N)[None, :])


# ---------------------------------------------------------------------------------------------------------------
# Session 22: the same three roles, persistent. One CTA an SM walks tiles ``pid, pid + grid, ...`` (M tiles fastest, so
# the CTAs running at once share their x tiles and weight rows in L2); every partition keeps one step counter across
# tiles, so the loader and the decoder fill the rings for the next tile while the MMA warpgroups run the last one's
# epilogue (straight from the accumulator registers to global memory: no shared memory, no layout conversion).
# Session 17 measured the non-persistent kernel's MMA side as its bound (refill + epilogue with the tensor cores idle).


@gluon.jit
def _tile_offsets(t, m_tiles, BM_: gl.constexpr, R: gl.constexpr):
    return (t % m_tiles) * BM_, (t // m_tiles) * R


@gluon.jit
def _loader_p(x_desc, w_desc, x_bufs, w_bufs, s_bufs, s_ptr, N, stride_sn, ready, empty, k_steps, num_tiles, m_tiles):
    """One warp: as ``_loader`` with ``SSMEM`` (NVFP4's 4 scale bytes a row and step staged into the stage), every
    tile of this program in turn."""
    stages: gl.constexpr = x_bufs.type.shape[0]
    BM_: gl.constexpr = x_desc.block_type.shape[0]
    bk: gl.constexpr = x_desc.block_type.shape[1]
    bkw: gl.constexpr = w_desc.block_type.shape[1]
    R: gl.constexpr = w_desc.block_type.shape[0]
    LS: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    ar = gl.arange(0, R, layout=LS)
    it = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(t, m_tiles, BM_, R)
        rows = gl.minimum(off_n + ar, N - 1)
        sbase = s_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + rows * (stride_sn // 4)  # [R] int32 a row
        for i in range(k_steps):
            s = it % stages
            sc = gl.load(sbase + i)  # issued before the wait: its latency overlaps it
            mbarrier.wait(empty.index(s), ((it // stages) & 1) ^ 1)
            mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, i * bk], ready.index(s), x_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [off_n, i * bkw], ready.index(s), w_bufs.index(s))
            s_bufs.index(s).store(sc)
            gl.thread_barrier()
            mbarrier.arrive(ready.index(s), count=1)
            it += 1


@gluon.jit
def _decoder_p(w_bufs, s_bytes, d_bufs, ready, empty, d_ready, d_empty, k_steps, num_tiles,
               FMT: gl.constexpr, GROUP: gl.constexpr, R: gl.constexpr, BKW_: gl.constexpr, W: gl.constexpr,
               DIAG: gl.constexpr = 0):
    """A warpgroup: ``_decoder`` (scales from the stage), every step of every tile of this program. DIAG, to locate
    the bound (wrong results by design): 1 the handshakes only (no decode, no store: the MMA reads stale tiles), 3 a
    constant tile stored instead of the decoded one (the store and handshakes, no decode)."""
    stages: gl.constexpr = w_bufs.type.shape[0]
    dstages: gl.constexpr = d_bufs.type.shape[0]
    WT: gl.constexpr = GROUP // 8
    LW: gl.constexpr = _word_layout(R, BKW_, W)
    LG: gl.constexpr = gl.SliceLayout(2, _group_layout(R, BKW_, W, WT))
    n_mine = gl.cdiv(num_tiles - gl.program_id(0), gl.num_programs(0))
    for it in range(n_mine * k_steps):
        s = it % stages
        mbarrier.wait(ready.index(s), (it // stages) & 1)
        w = w_bufs.index(s).load(LW)  # [R, BKW] words
        sg = s_bytes.index(s).load(LG)  # [R, NG] scale bytes
        mbarrier.arrive(empty.index(s), count=1)
        if DIAG == 3:
            p0 = w.to(gl.bfloat16)
            p1, p2, p3, p4, p5, p6, p7 = p0, p0, p0, p0, p0, p0, p0
        else:
            p0, p1, p2, p3, p4, p5, p6, p7 = _decode_step(w, sg, sg, FMT, False, LW, R, BKW_, WT)
        q = gl.join(gl.join(gl.join(p0, p2), gl.join(p4, p6)), gl.join(gl.join(p1, p3), gl.join(p5, p7)))
        tile = gl.reshape(gl.permute(q, [0, 1, 4, 3, 2]), [R, BKW_ * 8])  # [R, BK] natural k order
        d = it % dstages
        mbarrier.wait(d_empty.index(d), ((it // dstages) & 1) ^ 1)
        if DIAG != 1:
            d_bufs.index(d).store(tile)
        fence_async_shared()
        mbarrier.arrive(d_ready.index(d), count=1)


@gluon.jit
def _mma_p(x_bufs, d_bufs, ready, empty, d_ready, d_empty, y_ptr, gs_ptr, M, N, stride_ym, k_steps, num_tiles,
           m_tiles, FMT: gl.constexpr, BM_: gl.constexpr, R: gl.constexpr, W: gl.constexpr, SWAP: gl.constexpr):
    """The default warpgroups: wgmma over the ready stages (one group in flight), then the tile's epilogue from
    the accumulator registers while the other roles fill the rings for the next tile. SWAP: y^T = W x^T, the decoded
    tile as wgmma's A (64 weight rows an instruction) and x^T as B (all BM tokens: m64n256 at BM = 256), so each
    warpgroup reads its A once a k16 step instead of the B tile once per 64 tokens (session 22, phase f: 1-5 %, so
    operand reads are not what binds this kernel)."""
    stages: gl.constexpr = x_bufs.type.shape[0]
    dstages: gl.constexpr = d_bufs.type.shape[0]
    if SWAP:
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BM_, 16])
    else:
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, R, 16])
    if FMT == 0:  # the decode's 2**-16 and NVFP4's global scale
        factor = 65536.0 / gl.load(gs_ptr).to(gl.float32)
    else:
        factor = 65536.0
    it = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(t, m_tiles, BM_, R)
        if SWAP:
            acc = gl.zeros([R, BM_], gl.float32, MMA)
        else:
            acc = gl.zeros([BM_, R], gl.float32, MMA)
        acc = _mma_steps(x_bufs, d_bufs, ready, empty, d_ready, d_empty, acc, it, k_steps, SWAP)
        it += k_steps
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index((it + stages - 1) % stages), count=1)
        mbarrier.arrive(d_empty.index((it + dstages - 1) % dstages), count=1)
        y = (acc * factor).to(gl.bfloat16)
        if SWAP:  # [R, BM]: weight rows down, tokens across
            rn = off_n + gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
            rm = off_m + gl.arange(0, BM_, layout=gl.SliceLayout(0, MMA))
            gl.store(y_ptr + rm[None, :].to(gl.int64) * stride_ym + rn[:, None], y,
                     mask=(rm < M)[None, :] & (rn < N)[:, None])
        else:
            rm = off_m + gl.arange(0, BM_, layout=gl.SliceLayout(1, MMA))
            rn = off_n + gl.arange(0, R, layout=gl.SliceLayout(0, MMA))
            gl.store(y_ptr + rm[:, None].to(gl.int64) * stride_ym + rn[None, :], y,
                     mask=(rm < M)[:, None] & (rn < N)[None, :])


@gluon.jit
def ws_gemm_persistent_kernel(x_desc, w_desc, s_ptr, gs_ptr, y_ptr, M, N, K, stride_sn, stride_ym,
                              FMT: gl.constexpr, GROUP: gl.constexpr, STAGES_: gl.constexpr, DSTAGES_: gl.constexpr,
                              DW: gl.constexpr, DR: gl.constexpr, DIAG: gl.constexpr = 0,
                              SWAP: gl.constexpr = False):
    """y [M, N] bf16 = x [M, K] @ dequant(W)^T, NVFP4, persistent (grid: min(tiles, SMs) programs)."""
    BM_: gl.constexpr = x_desc.block_type.shape[0]
    BK_: gl.constexpr = x_desc.block_type.shape[1]
    R: gl.constexpr = w_desc.block_type.shape[0]
    BKW_: gl.constexpr = w_desc.block_type.shape[1]
    W: gl.constexpr = gl.num_warps()
    gl.static_assert(FMT == 0 and BK_ == 64, "NVFP4, 4 scale bytes a row and step")
    k_steps = gl.cdiv(K, BK_)
    m_tiles = gl.cdiv(M, BM_)
    num_tiles = m_tiles * gl.cdiv(N, R)

    x_bufs, w_bufs, d_bufs, s_bufs, s_bytes, ready, empty, d_ready, d_empty = _rings(x_desc, w_desc, STAGES_, DSTAGES_,
                                                                                    2)
    gl.warp_specialize([
        (_mma_p, (x_bufs, d_bufs, ready, empty, d_ready, d_empty, y_ptr, gs_ptr, M, N, stride_ym, k_steps,
                  num_tiles, m_tiles, FMT, BM_, R, W, SWAP)),
        (_loader_p, (x_desc, w_desc, x_bufs, w_bufs, s_bufs, s_ptr, N, stride_sn, ready, empty, k_steps, num_tiles,
                     m_tiles)),
        (_decoder_p, (w_bufs, s_bytes, d_bufs, ready, empty, d_ready, d_empty, k_steps, num_tiles, FMT, GROUP, R,
                      BKW_, DW, DIAG)),
    ], [1, DW], [48, DR])


# name -> (tokens a tile, weight rows a tile, x / word stages, decoded stages, decoder warps, decoder registers, DIAG).
# 128 tokens x 256 weight rows a tile does not build (the two MMA warpgroups' 128 accumulators each need > 128
# registers beside the decoder's); -hs / -st: session 22's diagnostics (``_decoder_p``'s DIAG 1 / 3, wrong results).
# -w2: a decoder of two warps, so that with the loader warp the kernel is 11 warps (12 launched: 168 registers a thread
# instead of 128), which m64n256 instructions (-swap) need.
PERSISTENT = {"p-bm256": (256, 128, 4, 2, 4, 120, 0), "p-bm256-s3": (256, 128, 3, 2, 4, 120, 0),
              "p-bm256-hs": (256, 128, 4, 2, 4, 120, 1), "p-bm256-st": (256, 128, 4, 2, 4, 120, 3),
              "p-w2": (256, 128, 4, 2, 2, 152, 0), "p-w2-swap": (256, 128, 4, 2, 2, 152, 0, True),
              "p-w2-swap-hs": (256, 128, 4, 2, 2, 152, 1, True), "p-w2-swap-r120": (256, 128, 4, 2, 2, 120, 0, True)}
# (an eight-warp decoder, 20 warps launched, spills the MMA warps' accumulators around every wgmma: not kept)


def ws_matmul_persistent(x2: torch.Tensor, pw, variant: str = "p-bm256", grid: int | None = None) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T with the persistent kernel (NVFP4, row-major words, K % 64 == 0)."""
    bm, r, stages, dstages, dw, dr, diag, *swap = PERSISTENT[variant]
    m, k = x2.shape
    if pw.fmt != 0 or k % BK or pw.k != k or getattr(pw, "blocked", False):
        raise ValueError("ws_matmul_persistent: NVFP4 row-major words with K % 64 == 0 and x of their K")
    s = pw.scale.view(torch.uint8)
    if s.stride(0) % 4 or s.data_ptr() % 4:
        raise ValueError("ws_matmul_persistent: 4-byte aligned scale rows")
    y = torch.empty((m, pw.n), device=x2.device, dtype=torch.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x2.contiguous(), [bm, BK], _x_layout(bm))
    w_desc = TensorDescriptor.from_tensor(pw.words, [r, BKW], _w_layout())
    tiles = triton.cdiv(m, bm) * triton.cdiv(pw.n, r)
    n_prog = grid or min(tiles, torch.cuda.get_device_properties(x2.device).multi_processor_count)
    ws_gemm_persistent_kernel[(n_prog,)](x_desc, w_desc, s, pw.gscale, y, m, pw.n, k, s.stride(0), y.stride(0),
                                         FMT=0, GROUP=16, STAGES_=stages, DSTAGES_=dstages, DW=dw, DR=dr, DIAG=diag, SWAP=bool(swap),
                                         num_warps=8)
    return y


def compile_sm90_persistent(variant: str = "p-bm256"):
    """The persistent kernel built for sm_90 on any machine."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    bm, r, stages, dstages, dw, dr, diag, *swap = PERSISTENT[variant]
    sig = {"x_desc": f"tensordesc<bf16[{bm}, {BK}],{_x_layout(bm)!r}>",
           "w_desc": f"tensordesc<i32[{r}, {BKW}],{_w_layout()!r}>",
           "s_ptr": "*u8", "gs_ptr": "*fp32", "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "stride_sn": "i32", "stride_ym": "i32"}
    const = {"FMT": 0, "GROUP": 16, "STAGES_": stages, "DSTAGES_": dstages, "DW": dw, "DR": dr, "DIAG": diag,
             "SWAP": bool(swap)}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items())
             if t != "constexpr" and not t.startswith("tensordesc") and k != "M"}
    src = GluonASTSource(fn=ws_gemm_persistent_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})


def ws_matmul(x2: torch.Tensor, pw, ssmem: bool = False, wfence: bool = True, dstages: int = DSTAGES, bm: int = BM,
              stages: int = STAGES, spf: bool = False, nodecode: bool = False) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T (``pw``: a ``wo_gemm.PackedWeight``, NVFP4 / MXFP4, K % 64 == 0).
    ``ssmem``: the scale bytes through the loader into shared memory (NVFP4); ``wfence``: the decoder's proxy fence
    after reading a stage's words; ``dstages``: decoded-tile ring depth; ``bm`` 256: two MMA warpgroups (the
    default partition of 8 warps), each 128 tokens of the tile, sharing every decoded weight tile; ``spf``: the
    loader's scale loads 3 steps ahead in registers; ``nodecode``: a diagnostic with the decode replaced by one
    conversion (wrong results: how fast the pipeline runs without the decode's cost) (session 17)."""
    m, k = x2.shape
    if pw.fmt not in (0, 1) or k % BK or pw.k != k:
        raise ValueError("ws_matmul: NVFP4 / MXFP4 weights with K % 64 == 0 and x of their K")
    y = torch.empty((m, pw.n), device=x2.device, dtype=torch.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x2.contiguous(), [bm, BK], _x_layout(bm))
    w_desc = TensorDescriptor.from_tensor(pw.words, [BN, BKW], _w_layout())
    s = pw.scale.view(torch.uint8)
    gs = pw.gscale if pw.gscale is not None else s
    grid = (triton.cdiv(m, bm), triton.cdiv(pw.n, BN))
    if ssmem and (pw.fmt != 0 or s.stride(0) % 4 or s.data_ptr() % 4):
        raise ValueError("ws_matmul(ssmem=True): NVFP4 with 4-byte aligned scale rows")
    ws_gemm_kernel[grid](x_desc, w_desc, s, gs, y, m, pw.n, k, s.stride(0), y.stride(0),
                         FMT=pw.fmt, GROUP=pw.group, STAGES_=stages, DSTAGES_=dstages, DW=DECODE_WARPS,
                         SSMEM=ssmem, WFENCE=wfence, SPF=spf, NODECODE=nodecode, num_warps=bm // 32)
    return y


def compile_sm90(fmt: int = 0, ssmem: bool = False, wfence: bool = True, dstages: int = DSTAGES, bm: int = BM,
                 stages: int = STAGES, spf: bool = False, nodecode: bool = False):
    """The kernel built for sm_90 on any machine (its TMA descriptors as ``ws_matmul`` builds them)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    group = 16 if fmt == 0 else 32
    sig = {"x_desc": f"tensordesc<bf16[{bm}, {BK}],{_x_layout(bm)!r}>",
           "w_desc": f"tensordesc<i32[{BN}, {BKW}],{_w_layout()!r}>",
           "s_ptr": "*u8", "gs_ptr": "*fp32", "y_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "stride_sn": "i32", "stride_ym": "i32"}
    const = {"FMT": fmt, "GROUP": group, "STAGES_": stages, "DSTAGES_": dstages, "DW": DECODE_WARPS,
             "SSMEM": ssmem, "WFENCE": wfence, "SPF": spf, "NODECODE": nodecode}
    sig.update({k: "constexpr" for k in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items())
             if t != "constexpr" and not t.startswith("tensordesc") and k != "M"}
    src = GluonASTSource(fn=ws_gemm_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": bm // 32})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="build for sm_90 only (no GPU): registers, spills, smem")
    ap.add_argument("--ms", default="2048,4096")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    ap.add_argument("--persistent", default=",".join(PERSISTENT),
                    help=f"comma-separated of {', '.join(PERSISTENT)} (session 22), '' for none")
    ap.add_argument("--shapes", default="18944x3584,3584x18944,3584x3584")
    args = ap.parse_args()
    pvars = [v for v in args.persistent.split(",") if v]
    if args.compile:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import compile_report as cr

        for name in [v for v in args.variants.split(",") if v]:
            print(cr.report(compile_sm90(0, **VARIANTS[name]), f"ws-gemm {name}", None))
        for name in pvars:
            print(cr.report(compile_sm90_persistent(name), f"ws-gemm {name}", None))
        return
    from bench_gemv import _quantized, graph_us
    from quarl_kernels import dense

    for n, k in (tuple(map(int, sh.split("x"))) for sh in args.shapes.split(",")):
        w, _, pw = _quantized("nvfp4", n, k, n + k)
        wb = w.to(torch.bfloat16)
        ref_w = dense.dequantize(pw)
        for m in map(int, args.ms.split(",")):
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            want = (x.float() @ ref_w.float().T)
            t_bf16 = graph_us([lambda x=x, wb=wb: x @ wb.T])
            t_dense = graph_us([lambda x=x, pw=pw: x @ dense.dequantize(pw).T])
            print(f"{n}x{k} M={m}: cuBLAS {t_bf16:.1f}  dense {t_dense:.1f} ({t_bf16 / t_dense:.3f}x)", flush=True)
            runs = [(name, lambda x=x, pw=pw, v=VARIANTS[name]: ws_matmul(x, pw, **v))
                    for name in args.variants.split(",") if name]
            runs += [(name, lambda x=x, pw=pw, name=name: ws_matmul_persistent(x, pw, name)) for name in pvars]
            for name, fn in runs:
                err = ((fn().float() - want).norm() / want.norm()).item()
                t = graph_us([fn])
                print(f"    {name:18s} {t:7.1f} us ({t_bf16 / t:.3f}x cuBLAS, err {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
