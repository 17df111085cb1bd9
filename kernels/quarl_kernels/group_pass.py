"""A LoRA group's last passes as one launch (q/k/v, gate/up), and a decode step's RoPE + K/V write in the q/k/v one.

Why. A group launch (``gemv.launch_gemv_group``, ``mma_decode.launch_mma_decode_group``) computes two or three
projections that read the same x; each then needed its own last pass (``launch.finish``: the split-K sum, bias,
LoRA B, rounding): three kernels per q/k/v group and two per gate/up group, 140 a 7B step, each latency-bound.
:func:`finish_group` runs them as one kernel (:func:`group_epilogue_kernel`): program tiles over the projections'
columns, each with ``launch.epilogue_kernel``'s arithmetic (``launch._epilogue_acc``); for gate/up each program does
the same columns of both and writes ``gate`` and ``silu(gate) * up``. 7B NVFP4+LoRA step 3.482 -> 3.329 ms at
batch 1, 4.764 -> 4.385 at batch 8 (H100, RESULTS "Issue 17, session 12"). ``QUARL_GROUP_PASS=0``: one pass each.

RoPE in the q/k/v pass (:class:`RopeCache`; the engine's default at one row, ``QUARL_ENGINE_GROUP_ROPE=0`` turns
it off): one head per tile, ``rotate_half`` as a register permutation, ``rope._rope_tile``'s arithmetic, k / v
written into the KV cache. Bit-equal to the passes then ``rope.rope_qk_cache`` under the interpreter and on the H100
at 1 and 8 rows. The products are rounded in software: with fp fusion on (this kernel's LoRA sums want FMAs), LLVM
contracted ``round(round(x * cos) + rb)`` into one ``fma.rn.bf16`` and left one-ulp differences at one row (session
12); a build test checks there is no bf16 FMA.
"""

from __future__ import annotations

import typing

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl
from quarl_kernels.act import silu_mul_values
from quarl_kernels.launch import _epilogue_acc, _epilogue_tiles, each_in_group, env_flag, finish, interpreting
from quarl_kernels.rounding import round_to

__all__ = ["GROUP_PASS_ENV", "PassLaunch", "RopeCache", "finish_group", "group_epilogue_kernel", "group_pass_launch",
           "rope_after"]


@triton.jit
def _group_pass(ws_ptr, y_ptr, bias_ptr, a_ptr, b_ptr, rows, t, M, N, scaling, s_ws, m_ws, m_a,
                s_a, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                BN: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr, A_PARTS: tl.constexpr,
                SA: tl.constexpr):
    """One projection's column tile ``t`` of :func:`group_epilogue_kernel`: the pass, rounded and stored."""
    cols = t * BN + tl.arange(0, BN)
    acc = _epilogue_acc(ws_ptr, bias_ptr, a_ptr, b_ptr, rows, cols, M, N, scaling, s_ws, m_ws, m_a, s_a,
                        SPLIT_K, HAS_BIAS, R, RP, DOT, INTERPRET, A_PARTS, SA, y_ptr.dtype.element_ty)
    out = round_to(acc, y_ptr.dtype.element_ty, INTERPRET)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], out, mask=(rows < M)[:, None] & (cols < N)[None, :])
    return acc


@triton.jit
def _group_rope_pass(ws_ptr, y_ptr, bias_ptr, a_ptr, b_ptr, rows, t, M, N, scaling, s_ws, m_ws, m_a, s_a,
                     cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kv_ptr, skb, skh, sks, slot_ptr,
                     SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
                     A_PARTS: tl.constexpr, SA: tl.constexpr, ROTATE: tl.constexpr, TO_CACHE: tl.constexpr):
    """:func:`_group_pass` of a q/k/v group at a decode step, with ``rope.rope_qk_cache``'s work done here: q's
    columns rotated (into ``y``), k's rotated and v's copied into their caches ``[B, H_kv, S, D]`` at position
    ``slot[l]`` (row ``b * L + l``). A tile is one head (``BN = D``), so ``rotate_half`` is a register permutation
    of the rounded outputs (split the head's halves, join them swapped), and the rotation is ``rope._rope_tile``'s
    arithmetic on them. (Computing the partner columns' pass again instead gave 1-ulp differences on the GPU: the
    two copies of the LoRA sum were contracted differently.)"""
    dt: tl.constexpr = y_ptr.dtype.element_ty
    HALF: tl.constexpr = BN // 2
    cols = t * BN + tl.arange(0, BN)  # [BN]: head t
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    acc = _epilogue_acc(ws_ptr, bias_ptr, a_ptr, b_ptr, rows, cols, M, N, scaling, s_ws, m_ws, m_a, s_a,
                        SPLIT_K, HAS_BIAS, R, RP, DOT, INTERPRET, A_PARTS, SA, dt)
    d = tl.arange(0, BN)  # position in the head
    b_row = (rows // L).to(tl.int64)  # [BM]
    l_row = rows % L
    if ROTATE:
        x = round_to(acc, dt, INTERPRET).to(tl.float32)  # [BM, BN]
        x1, x2 = tl.split(tl.permute(tl.reshape(x, [BM, 2, HALF]), (0, 2, 1)))  # the halves, [BM, HALF] each
        xr = tl.reshape(tl.permute(tl.join(-x2, x1), (0, 2, 1)), [BM, BN])  # rotate_half(x) = cat(-x2, x1)
        c = tl.load(cos_ptr + b_row[:, None] * scb + l_row[:, None] * scl + d[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        sn = tl.load(sin_ptr + b_row[:, None] * ssb + l_row[:, None] * ssl + d[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        # the products rounded in software (integer RNE on the bits): with fp fusion on (this kernel's LoRA sums
        # want it), LLVM turned round(round(x * cos) + rb) into one bf16 FMA, skipping x * cos's rounding --
        # the H100's one-row differences against rope.rope_qk_cache (compiled without fusion)
        ra = round_to(x * c, dt, True).to(tl.float32)  # x * cos
        rb = round_to(xr * sn, dt, True).to(tl.float32)  # rotate_half(x) * sin
        out = round_to(ra + rb, dt, INTERPRET)
    else:
        out = round_to(acc, dt, INTERPRET)
    if TO_CACHE:
        lo = tl.load(slot_ptr + l_row, mask=rows < M, other=0).to(tl.int64)  # [BM]
        dest = kv_ptr + b_row[:, None] * skb + t.to(tl.int64) * skh + lo[:, None] * sks + d[None, :]
    else:
        dest = y_ptr + rows[:, None] * N + cols[None, :]
    tl.store(dest, out, mask=mask)


@triton.jit
def group_epilogue_kernel(
    M, s_a, ws0, y0, bias0, a0, b0, N0, sc0, s_ws0, m_ws0, m_a0, T0,
    ws1, y1, bias1, a1, b1, N1, sc1, s_ws1, m_ws1, m_a1, T1,
    ws2, y2, bias2, a2, b2, N2, sc2, s_ws2, m_ws2, m_a2,
    cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kc_ptr, vc_ptr, skb, skh, sks, svb, svh, svs, slot_ptr,
    SPLIT_K: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    DOT: tl.constexpr, INTERPRET: tl.constexpr, A_PARTS: tl.constexpr, SA: tl.constexpr,
    HB0: tl.constexpr, HB1: tl.constexpr, HB2: tl.constexpr, GATE_ACT: tl.constexpr, ROPE: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    """The last passes of a LoRA group's two or three projections (one launch's partials: one split count, one
    rank) as one launch: :func:`epilogue_kernel` for each, program tiles ``[0, T0)`` for projection 0, ``[T0, T0 +
    T1)`` for 1, the rest for 2. ``GATE_ACT`` (gate / up, one N): each program does the same columns of both and
    writes ``gate`` and ``silu(gate) * up`` (``act.silu_mul``'s arithmetic on the rounded values), as the up pass
    with ``HAS_GATE`` would after the gate pass. ``ROPE`` (q / k / v at a decode step; ``BN`` = the head dim):
    :func:`_group_rope_pass` -- q rotated into ``y0``, k rotated into ``kc``, v into ``vc`` (``y1`` / ``y2`` not
    written). ``PDL``: ``pdl.enter`` first."""
    pdl.enter(PDL)
    pid = tl.program_id(1)
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)  # [BM] int64: rows * N may pass 2**31
    if GATE_ACT:
        g = _group_pass(ws0, y0, bias0, a0, b0, rows, pid, M, N0, sc0, s_ws0, m_ws0, m_a0, s_a,
                        SPLIT_K, HB0, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)
        cols = pid * BN + tl.arange(0, BN)
        mask = (rows < M)[:, None] & (cols < N1)[None, :]
        u = _epilogue_acc(ws1, bias1, a1, b1, rows, cols, M, N1, sc1, s_ws1, m_ws1, m_a1, s_a,
                          SPLIT_K, HB1, R, RP, DOT, INTERPRET, A_PARTS, SA, y1.dtype.element_ty)
        gr = round_to(g, y1.dtype.element_ty, INTERPRET).to(tl.float32)
        ur = round_to(u, y1.dtype.element_ty, INTERPRET).to(tl.float32)
        tl.store(y1 + rows[:, None] * N1 + cols[None, :], silu_mul_values(gr, ur, y1.dtype.element_ty, INTERPRET),
                 mask=mask)
    elif ROPE:
        if pid < T0:
            _group_rope_pass(ws0, y0, bias0, a0, b0, rows, pid, M, N0, sc0, s_ws0, m_ws0, m_a0, s_a,
                             cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kc_ptr, skb, skh, sks, slot_ptr,
                             SPLIT_K, HB0, R, RP, BM, BN, DOT, INTERPRET, A_PARTS, SA, True, False)
        elif pid < T0 + T1:
            _group_rope_pass(ws1, y1, bias1, a1, b1, rows, pid - T0, M, N1, sc1, s_ws1, m_ws1, m_a1, s_a,
                             cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kc_ptr, skb, skh, sks, slot_ptr,
                             SPLIT_K, HB1, R, RP, BM, BN, DOT, INTERPRET, A_PARTS, SA, True, True)
        else:
            _group_rope_pass(ws2, y2, bias2, a2, b2, rows, pid - T0 - T1, M, N2, sc2, s_ws2, m_ws2, m_a2, s_a,
                             cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, vc_ptr, svb, svh, svs, slot_ptr,
                             SPLIT_K, HB2, R, RP, BM, BN, DOT, INTERPRET, A_PARTS, SA, False, True)
    elif pid < T0:
        _group_pass(ws0, y0, bias0, a0, b0, rows, pid, M, N0, sc0, s_ws0, m_ws0, m_a0, s_a,
                    SPLIT_K, HB0, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)
    elif pid < T0 + T1:
        _group_pass(ws1, y1, bias1, a1, b1, rows, pid - T0, M, N1, sc1, s_ws1, m_ws1, m_a1, s_a,
                    SPLIT_K, HB1, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)
    else:
        _group_pass(ws2, y2, bias2, a2, b2, rows, pid - T0 - T1, M, N2, sc2, s_ws2, m_ws2, m_a2, s_a,
                    SPLIT_K, HB2, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)


GROUP_PASS_ENV = "QUARL_GROUP_PASS"  # 0: a group's last passes as one launch each (the before of the group pass)


class RopeCache(typing.NamedTuple):
    """A decode step's RoPE and K/V cache write for a q/k/v group (``rope.rope_qk_cache``'s arguments): rows of the
    group's ``x`` are tokens ``b * L + l``; ``cos, sin [B, L, D]`` (unit stride along D); ``k_cache, v_cache [B,
    H_kv, S, D]`` (unit stride along D) get k rotated and v at position ``slot[l]`` along S."""

    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot: torch.Tensor


def rope_after(ys: list, rope: RopeCache) -> list[torch.Tensor]:
    """``[q, k, v]`` (``[B * L, H * D]`` each) -> ``[q_rot]`` (same layout) with k and v written into the caches:
    ``rope.rope_qk_cache`` after the passes, where the group pass could not do it."""
    from quarl_kernels import rope as rope_mod

    b, l, d = rope.cos.shape
    q, k, v = (y.view(b, l, -1, d).transpose(1, 2) for y in ys)  # [B, H, L, D] views
    q_rot = rope_mod.rope_qk_cache(q, k, v, rope.cos, rope.sin, rope.k_cache, rope.v_cache, rope.slot)
    return [q_rot.transpose(1, 2).reshape(ys[0].shape)]


def _group_pass_ok(pairs: list, split: int, epis: list, gate_act: bool, rope: RopeCache | None = None) -> bool:
    """True when :func:`finish_group` can run the group's passes as one launch: every projection has a LoRA branch
    of one rank with its ``a`` in one form (all split partials with one count, or all plain), and gate / up share
    N; with ``rope``, three projections of whole heads and caches of the outputs' dtype."""
    if not env_flag(GROUP_PASS_ENV, True) or not 2 <= len(pairs) <= 3:
        return False
    if any(e is None or e.a is None or e.gate is not None for e in epis):
        return False
    r, dim, sa = epis[0].b.shape[-1], epis[0].a.dim(), epis[0].a.shape[0]
    if any(e.b.shape[-1] != r or e.a.dim() != dim or (dim == 3 and e.a.shape[0] != sa) for e in epis):
        return False
    if dim == 3 and any(e.a.stride(0) != epis[0].a.stride(0) for e in epis):
        return False
    if rope is not None:
        b, l, d = rope.cos.shape
        y = pairs[0][1]
        r_pad = triton.next_power_of_2(max(r, 1))
        if (gate_act or len(pairs) != 3 or d < 16 or d & (d - 1) or d * r_pad > 8192 or b * l != y.shape[0]
                or rope.cos.stride(-1) != 1
                or rope.sin.stride(-1) != 1 or rope.sin.shape != rope.cos.shape
                or rope.cos.dtype != y.dtype or rope.sin.dtype != y.dtype
                or any(p[1].shape[1] % d for p in pairs) or pairs[1][1].shape != pairs[2][1].shape
                or any(c.dtype != y.dtype or c.stride(-1) != 1 or c.shape[1] * d != pairs[1][1].shape[1]
                       or c.shape[0] != b for c in (rope.k_cache, rope.v_cache))):
            return False
    return not gate_act or (len(pairs) == 2 and pairs[0][1].shape == pairs[1][1].shape)


class PassLaunch(typing.NamedTuple):
    """One launch of :func:`group_epilogue_kernel`, as :func:`group_pass_launch` builds it (also what a build test
    compiles for sm_90 on a CPU)."""

    kernel: typing.Any
    grid: tuple
    args: tuple
    constexprs: dict
    num_warps: int


def group_pass_launch(pairs: list, split: int, epis: list, gate_act: bool, rope: RopeCache | None = None
                      ) -> PassLaunch:
    """The :func:`group_epilogue_kernel` launch for :func:`finish_group`'s arguments (which it assumes
    :func:`_group_pass_ok` accepted)."""
    m = pairs[0][1].shape[0]
    r = epis[0].b.shape[-1]
    parts = epis[0].a.dim() == 3
    ns = [y.shape[1] for _, y in pairs]
    bm, bn, rp, dot = _epilogue_tiles(m, min(ns), r)
    if rope is not None:  # one head per tile: rotate_half inside the tile
        bn = rope.cos.shape[-1]
    tiles = [triton.cdiv(n, bn) for n in ns]
    sets = []
    for j in range(3):  # a missing third projection: placeholders no program reads (T0 + T1 covers the grid)
        out, y = pairs[min(j, len(pairs) - 1)]
        e = epis[min(j, len(pairs) - 1)]
        real = j < len(pairs)
        s_ws, m_ws = (out.stride(0), out.stride(1)) if split > 1 else (0, y.stride(0))  # unsplit: in place over y
        sets += [out if split > 1 else y, y, e.bias if e.bias is not None else y, e.a, e.b, ns[j] if real else 0,
                 float(e.scaling), s_ws, m_ws, e.a.stride(-2)]
        if j < 2:
            sets.append(tiles[j] if real else 0)
    if rope is not None:
        kc, vc = rope.k_cache, rope.v_cache
        rargs = (rope.cos, rope.sin, rope.cos.stride(0), rope.cos.stride(1), rope.sin.stride(0), rope.sin.stride(1),
                 rope.cos.shape[1], kc, vc, kc.stride(0), kc.stride(1), kc.stride(2),
                 vc.stride(0), vc.stride(1), vc.stride(2), rope.slot)
    else:  # placeholders the kernel does not read
        y = pairs[0][1]
        rargs = (y, y, 0, 0, 0, 0, 1, y, y, 0, 0, 0, 0, 0, 0, y)
    hb = [j < len(epis) and epis[j].bias is not None for j in range(3)]
    const = {"SPLIT_K": split, "R": r, "RP": rp, "BM": bm, "BN": bn, "DOT": dot, "INTERPRET": interpreting(),
             "A_PARTS": parts, "SA": epis[0].a.shape[0] if parts else 1, "HB0": hb[0], "HB1": hb[1], "HB2": hb[2],
             "GATE_ACT": gate_act, "ROPE": rope is not None}
    grid = (triton.cdiv(m, bm), tiles[0] if gate_act else sum(tiles))
    return PassLaunch(group_epilogue_kernel, grid, (m, epis[0].a.stride(0) if parts else 0, *sets, *rargs), const,
                      4)


def finish_group(pairs: list, split: int, epis: list, gate_act: bool = False, rope: RopeCache | None = None
                 ) -> list[torch.Tensor]:
    """The last passes of a group launch (``pairs[j] = (out_j, y_j)``: fp32 partials ``[S, M, N_j]`` and output
    ``[M, N_j]``; ``epis[j]`` as :func:`finish` takes it) -> ``[y_j]``. One kernel for all of them where
    :func:`_group_pass_ok` allows (:func:`group_epilogue_kernel`: one launch instead of two or three per LoRA
    group), else one :func:`finish` each; ``gate_act`` as in :func:`each_in_group`. ``QUARL_GROUP_PASS=0``: one
    each. ``rope`` (a q/k/v group at a decode step): ``[q_rot]`` comes back and k / v go into the caches, in the
    same pass where it can (else :func:`rope_after` after the passes)."""
    if not _group_pass_ok(pairs, split, epis, gate_act, rope):
        ys = each_in_group(epis, gate_act, lambda j, e: finish(*pairs[j], split, e))
        return ys if rope is None else rope_after(ys, rope)
    m = pairs[0][1].shape[0]
    for (_, y), e in zip(pairs, epis, strict=True):
        e.check(m, y.shape[1])
    if m > 0:
        la = group_pass_launch(pairs, split, epis, gate_act, rope)
        la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps, **pdl.kwargs(pairs[0][1].device))
    ys = [y for _, y in pairs]
    return ys if rope is None else ys[:1]
