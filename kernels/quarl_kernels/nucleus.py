"""Top-p (nucleus) sampling without a sort: the nucleus's smallest logit by a radix search over the logits' bits,
weighted by probability, then the Gumbel-max token inside it -- each row split over many programs.

Why. ``quarl.engine.sampling.top_p_mask`` -- the rule both engines share -- sorts each ``[V]`` row (a segmented
key-value radix sort of 150k fp32 keys and int64 indices a row), then a softmax, a cumsum, a masked fill and a scatter
back: at the eval recipes' top-p 0.95 that is about a dozen more full passes over ``[B, V]`` a decode step than top-p
1, several of them through the sort's temporaries (``benchmarks/kernels/bench_sampler.py`` times it). A sort orders
every token; the nucleus needs one number, the logit ``tau`` of the token at which the mass of the tokens sorted by
probability first reaches ``top_p``: the nucleus is then every token with a logit ``>= tau``.

How. Each row is cut into ``S`` splits (``sampler.splits``: about ``PROGRAMS_PER_SM`` programs an SM over all rows)
and every pass below is one launch of grid ``(B, S)`` over the row read once more (from L2 after the first):

  1. ``_lse_kernel``: a split's max ``m_s`` of ``x = logit * fp32(1/T)`` and ``l_s = sum exp(x - m_s)``.
  2. ``_round_kernel``, eight launches (``R`` = 0..7): a radix search on ``key(x)``, the fp32 bits mapped so that
     unsigned order is float order, four bits a round from the top. A program first works out where the search
     stands -- round 0 from the ``(m_s, l_s)`` of every split (``m``, ``total = sum exp(x - m)``), later rounds from
     the state the previous launch's first program stored and the previous round's 16 digit masses of every split:
     walking the digits from 15 down, the first whose mass, with the mass of every larger key, reaches ``top_p *
     total`` is chosen (should rounding leave the whole row short, the smallest digit with mass: every token kept,
     as the sort keeps them) --, its split's first program stores that state, and then it sums ``exp(x - m)`` by
     the next digit over its split's tokens whose key matches the digits chosen so far. Past the first two rounds
     (sign and exponent bits) steps with no matching token skip the sums.
  3. ``_draw_kernel``: the eighth digit chosen, ``key(tau)`` is known; a split's ``argmax(x + g(u))`` over its tokens
     with ``key >= key(tau)`` (``g`` the noise of :mod:`quarl_kernels.sampler`; steps with no kept token -- most: a
     nucleus is small -- skip their noise), then ``sampler``'s combine kernel: the first split's best on ties,
     ``logp = x[token] - lse`` from the ``(m_s, l_s)``.

Why split. Session 39 (H200, Qwen2.5's vocabulary) timed a first version with one program a row: ~1 ms a call
at 1 to 64 rows -- a row's ten passes at one SM's instruction rate (the 16 digit sums are ~50 instructions a token) --
against the sort's 0.17 ms at one row; the splits put every SM on a row: 46 / 80 / 394 / 1708 us at 1 / 8 / 64 /
256 rows against the sort's 176 / 498 / 1565 / 5212, the same tokens (phase j, ``benchmarks/kernels/bench_sampler.py``).
The state a launch hands the next (a row's ``m``, ``total``, the mass above the chosen digits, the digits) is
recomputed by every program from the same numbers in the same order and stored by the first: the launches stay
independent of program order. A pass keeps per-lane partials over its steps and reduces across the program once at
its end, and the radix steps work on ``[BLOCK, 1]`` columns from the load on, so that the broadcast against the 16
digits stays in registers (sm_90 build, session 38: 129-163 instructions a thread per radix step of 512 tokens, 270
with a reduction a step).

What it equals. The nucleus of ``top_p_mask`` when no two tokens tie at ``tau``: the sort keeps the tokens before the
crossing one and it, i.e. the logits ``> tau`` and one token at ``tau``. With ties at ``tau`` (bf16 logits make them
real) the sort's choice among them is its (unstable) order; here all of them are kept -- the smallest set of whole
probability levels whose mass reaches ``top_p``, one deterministic rule. And the mass sums are fp32 in another
order than ``torch.cumsum``, so a row whose crossing mass is within fp32 rounding of ``top_p`` may keep one token
more or less. Given the same nucleus, the token is the PyTorch path's (the same ``u``, the same noise arithmetic),
and the log-prob is equal to fp32 rounding. (The masses and ``total`` use Triton's fast ``exp``, ``ex2.approx``,
both alike: they need to be right to fp32 rounding, not bit for bit, and libdevice's ``expf`` cost ~20 instructions
a token a pass more -- sm_90 build, session 38; the noise keeps libdevice's ``logf``, the bits of PyTorch's. The
weights are ``exp(x - m)`` against ``top_p * total``, not ``exp(x - lse)`` against ``top_p``: lse carries its own
rounding, half an ulp of ~10, enough to move the edge by a token at top-p 0.999 -- the CPU test's case.) Tested on
CPU under ``TRITON_INTERPRET=1`` against ``top_p_mask`` (tests/kernels/test_nucleus_interpreter.py) and on the GPU
against ``sample`` (tests/kernels/test_nucleus_gpu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels.sampler import _TINY, _combine_kernel, _log, interpreting, prepare, sm_count, splits

__all__ = ["BLOCK", "PROGRAMS_PER_SM", "ROUNDS", "nucleus_sample"]

BLOCK = 512  # entries a step; a round's digit sums are a [BLOCK, 16] reduction
PROGRAMS_PER_SM = 2  # the grid's target size over all rows (80 registers x 256 threads: 3 fit an SM)
ROUNDS = 8  # four bits a round
_ROUNDS = tl.constexpr(ROUNDS)  # the kernels' copy (a jit function reads only constexpr globals)


@triton.jit
def _sort_key(x):
    """fp32 -> uint32 whose unsigned order is the floats' order (negatives: every bit flipped; else the sign set)."""
    b = x.to(tl.uint32, bitcast=True)
    neg = (b >> 31) == 1
    return tl.where(neg, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _lse_kernel(x_ptr, stride_x, part_ptr, V, SPLIT, inv_t, BLOCK: tl.constexpr):
    """Pass 1: split s of row r -> ``part[r, s] = (m_s, l_s)``: the max of ``x`` and ``sum exp(x - m_s)``."""
    row = tl.program_id(0)
    s = tl.program_id(1)
    S = tl.num_programs(1)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    offs = tl.arange(0, BLOCK)
    start = s * SPLIT
    end = tl.minimum(start + SPLIT, V)
    m_l = tl.full((BLOCK,), float("-inf"), tl.float32)  # a lane's running max and sum
    l_l = tl.zeros((BLOCK,), tl.float32)
    for v0 in range(start, end, BLOCK):
        ok = v0 + offs < end
        x = tl.load(x_row + v0 + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t  # [BLOCK]
        m_new = tl.maximum(m_l, x)
        l_l = tl.where(m_new == float("-inf"), 0.0, l_l * tl.exp(m_l - m_new) + tl.exp(x - m_new))
        m_l = m_new
    m = tl.max(m_l, axis=0)
    slot = row * S + s
    tl.store(part_ptr + slot * 3, m)
    tl.store(part_ptr + slot * 3 + 1, tl.sum(tl.where(m_l == float("-inf"), 0.0, l_l * tl.exp(m_l - m)), axis=0))


@triton.jit
def _state(part_ptr, mass_ptr, st_ptr, pre_ptr, row, S, top_p, R: tl.constexpr, BLOCK_S: tl.constexpr):
    """Where row ``row``'s search stands before round ``R``: ``(m, total, above, prefix)`` -- the row's max, ``sum
    exp(x - m)``, the mass of every key above the chosen digits' range, the digits (the top ``4 R`` bits of
    ``key(tau)``). Round 0 from the lse partials; later rounds from the state stored before round ``R - 1`` and that
    round's digit masses of every split (the same numbers, in the same order, in every program)."""
    o = tl.arange(0, BLOCK_S)
    ok = o < S
    if R == 0:
        ms = tl.load(part_ptr + (row * S + o) * 3, mask=ok, other=float("-inf"))  # [BLOCK_S]
        ls = tl.load(part_ptr + (row * S + o) * 3 + 1, mask=ok, other=0.0)
        m = tl.max(ms, axis=0)
        total = tl.sum(tl.where(ms == float("-inf"), 0.0, ls * tl.exp(ms - m)), axis=0)
        above = tl.zeros((), tl.float32)
        prefix = tl.zeros((), tl.uint32)
    else:
        st = st_ptr + (row * (_ROUNDS + 1) + R - 1) * 3
        m = tl.load(st)
        total = tl.load(st + 1)
        above = tl.load(st + 2)
        prefix = tl.load(pre_ptr + row * (_ROUNDS + 1) + R - 1).to(tl.uint32, bitcast=True)
        digits = tl.arange(0, 16)
        mass = tl.sum(tl.load(mass_ptr + ((row * _ROUNDS + R - 1) * S + o[:, None]) * 16 + digits[None, :],
                              mask=ok[:, None], other=0.0), axis=0)  # [16]: round R - 1's masses by digit
        reach = above + tl.cumsum(mass, axis=0, reverse=True) >= top_p * total  # [16]: this digit and every larger
        best = tl.max(tl.where(reach, digits, -1), axis=0)
        lowest = tl.min(tl.where(mass > 0.0, digits, 16), axis=0)
        chosen = tl.where(best >= 0, best, tl.where(lowest < 16, lowest, 0))  # none reaches: keep everything
        above += tl.sum(tl.where(digits > chosen, mass, 0.0), axis=0)
        prefix = prefix | (chosen.to(tl.uint32) << (32 - 4 * R))
    return m, total, above, prefix


@triton.jit
def _store_state(st_ptr, pre_ptr, row, s, m, total, above, prefix, R: tl.constexpr):
    if s == 0:  # one program a row hands the state to the next launch
        st = st_ptr + (row * (_ROUNDS + 1) + R) * 3
        tl.store(st, m)
        tl.store(st + 1, total)
        tl.store(st + 2, above)
        tl.store(pre_ptr + row * (_ROUNDS + 1) + R, prefix.to(tl.int32, bitcast=True))


@triton.jit
def _round_kernel(x_ptr, stride_x, part_ptr, mass_ptr, st_ptr, pre_ptr, V, SPLIT, inv_t, top_p,
                  R: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """Round ``R`` of the radix search: split s of row r -> ``mass[r, R, s, d]``, the weight ``exp(x - m)`` of its
    tokens whose key matches the digits chosen so far and whose next digit is ``d``."""
    row = tl.program_id(0)
    s = tl.program_id(1)
    S = tl.num_programs(1)
    m, total, above, prefix = _state(part_ptr, mass_ptr, st_ptr, pre_ptr, row, S, top_p, R, BLOCK_S)
    _store_state(st_ptr, pre_ptr, row, s, m, total, above, prefix, R)
    known = tl.zeros((), tl.uint32)  # the chosen digits' bits
    for r in tl.static_range(R):
        known = known | (tl.full((), 15, tl.uint32) << (28 - 4 * r))
    x_row = x_ptr + row.to(tl.int64) * stride_x
    offs2 = tl.arange(0, BLOCK)[:, None]  # [BLOCK, 1]
    digits2 = tl.arange(0, 16)[None, :]  # [1, 16]
    start = s * SPLIT
    end = tl.minimum(start + SPLIT, V)
    acc = tl.zeros((BLOCK, 16), tl.float32)  # a lane's mass by digit, reduced once after the loop (a reduction a
    # step cost more than the step's own work: 270 instructions a radix step against 129-163, sm_90 build)
    for v0 in range(start, end, BLOCK):
        # [BLOCK, 1] from the load on: the broadcast against the 16 digits stays in registers (a [BLOCK] vector
        # broadcast took a shared-memory round trip and barriers a step)
        ok = v0 + offs2 < end
        x = tl.load(x_row + v0 + offs2, mask=ok, other=float("-inf")).to(tl.float32) * inv_t  # [BLOCK, 1]
        key = _sort_key(x)
        match = ok & ((key & known) == prefix)
        # past the first two rounds (sign and exponent bits) few steps hold a match: skip the sums there
        if R < 2 or tl.max(tl.max(match.to(tl.int32), axis=1), axis=0) > 0:
            p = tl.where(match, tl.exp(x - m), 0.0)  # [BLOCK, 1]
            d = ((key >> (28 - 4 * R)) & 15).to(tl.int32)
            acc += tl.where(d == digits2, p, 0.0)  # [BLOCK, 16]
    tl.store(mass_ptr + ((row * _ROUNDS + R) * S + s) * 16 + tl.arange(0, 16), tl.sum(acc, axis=0))


@triton.jit
def _draw_kernel(x_ptr, stride_x, u_ptr, stride_u, rows_ptr, part_ptr, idx_ptr, mass_ptr, st_ptr, pre_ptr, V, SPLIT,
                 inv_t, top_p, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, HAS_ROWS: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """The last digit chosen, split s of row r -> its best ``x + g`` among the keys ``>= key(tau)`` and its first
    index, as ``part[r, s, 2]`` / ``idx[r, s]`` for ``sampler``'s combine kernel."""
    row = tl.program_id(0)
    s = tl.program_id(1)
    S = tl.num_programs(1)
    m, total, above, prefix = _state(part_ptr, mass_ptr, st_ptr, pre_ptr, row, S, top_p, _ROUNDS, BLOCK_S)
    _store_state(st_ptr, pre_ptr, row, s, m, total, above, prefix, _ROUNDS)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    if HAS_ROWS:  # a compacted batch: this row's noise is row rows[row] of the full batch's
        u_row = u_ptr + tl.load(rows_ptr + row).to(tl.int64) * stride_u
    else:
        u_row = u_ptr + row.to(tl.int64) * stride_u
    offs = tl.arange(0, BLOCK)
    start = s * SPLIT
    end = tl.minimum(start + SPLIT, V)
    best_v = tl.full((BLOCK,), float("-inf"), tl.float32)  # a lane's first best
    best_k = tl.zeros((BLOCK,), tl.int32) + start
    for v0 in range(start, end, BLOCK):
        k = v0 + offs
        ok = k < end
        x = tl.load(x_row + k, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        kept = ok & (_sort_key(x) >= prefix)
        if tl.max(kept.to(tl.int32), axis=0) > 0:  # a nucleus is small: most steps hold none, skip their noise
            u = tl.maximum(tl.load(u_row + k, mask=kept, other=1.0), _TINY)
            y = tl.where(kept, x + -_log(-_log(u, INTERPRET), INTERPRET), float("-inf"))
            better = y > best_v  # strict: a lane keeps its earliest index on ties
            best_k = tl.where(better, k, best_k)
            best_v = tl.where(better, y, best_v)
    top = tl.max(best_v, axis=0)
    slot = row * S + s
    tl.store(part_ptr + slot * 3 + 2, top)
    tl.store(idx_ptr + slot, tl.min(tl.where(best_v == top, best_k, 2147483647), axis=0))  # the first index


def nucleus_sample(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor,
                   rows_of: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [B, V]`` -> (``[B]`` int64 tokens drawn from the top-``top_p`` nucleus of ``softmax(logits / T)``,
    ``[B]`` fp32 log-probs under the whole ``softmax(logits / T)``). ``u [R, V]``: ``torch.rand`` noise, row ``b``'s
    ``u[rows_of[b]]`` (else ``u[b]``), as :func:`quarl_kernels.sampler.gumbel_sample`."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if u is None:
        raise ValueError("nucleus_sample draws with noise: pass u (torch.rand [R, V]); greedy is gumbel_sample(u=None)")
    logits, tok, logp, inv_t, rows = prepare(logits, temperature, u, rows_of)
    B, V = logits.shape
    if B == 0:
        return tok, logp
    dev, interpret, top_p = logits.device, interpreting(), float(top_p)
    S, split = splits(B, V, sm_count(dev), BLOCK, PROGRAMS_PER_SM)
    block_s = max(triton.next_power_of_2(S), 2)
    part = torch.empty(B * S * 3, dtype=torch.float32, device=dev)  # (m_s, l_s, best_s) a split
    idx = torch.empty(B * S, dtype=torch.int32, device=dev)
    mass = torch.empty(B * ROUNDS * S * 16, dtype=torch.float32, device=dev)  # [B, ROUNDS, S, 16]
    st = torch.empty(B * (ROUNDS + 1) * 3, dtype=torch.float32, device=dev)  # [B, ROUNDS + 1, (m, total, above)]
    pre = torch.empty(B * (ROUNDS + 1), dtype=torch.int32, device=dev)  # [B, ROUNDS + 1]: the digits' bits
    x, sx = logits, logits.stride(0)
    _lse_kernel[(B, S)](x, sx, part, V, split, inv_t, BLOCK=BLOCK, num_warps=8, enable_fp_fusion=False)
    for r in range(ROUNDS):
        _round_kernel[(B, S)](x, sx, part, mass, st, pre, V, split, inv_t, top_p, R=r, BLOCK=BLOCK, BLOCK_S=block_s,
                              num_warps=8, enable_fp_fusion=False)
    _draw_kernel[(B, S)](x, sx, u, u.stride(0), rows, part, idx, mass, st, pre, V, split, inv_t, top_p, BLOCK=BLOCK,
                         BLOCK_S=block_s, HAS_ROWS=rows_of is not None, INTERPRET=interpret, num_warps=8,
                         enable_fp_fusion=False)
    _combine_kernel[(B,)](x, sx, part, idx, tok, logp, S, inv_t, BLOCK_S=block_s, INTERPRET=interpret, num_warps=1,
                          enable_fp_fusion=False)
    return tok, logp
