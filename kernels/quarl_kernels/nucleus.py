"""Top-p (nucleus) sampling without a sort: one program a row finds the nucleus's smallest logit by a radix search
over the logits' bits, weighted by probability, then draws the Gumbel-max token inside it.

Why. ``quarl.engine.sampling.top_p_mask`` -- the rule both engines share -- sorts each ``[V]`` row (a segmented
key-value radix sort of 150k fp32 keys and int64 indices a row), then a softmax, a cumsum, a masked fill and a scatter
back: at the eval recipes' top-p 0.95 that is about a dozen more full passes over ``[B, V]`` a decode step than top-p
1, several of them through the sort's temporaries (``benchmarks/kernels/bench_sampler.py`` times it). A sort orders
every token; the nucleus needs one number, the logit ``tau`` of the token at which the mass of the tokens sorted by
probability first reaches ``top_p``: the nucleus is then every token with a logit ``>= tau``.

How, per row (one program, ``BLOCK`` entries a step, the row read 10 times -- from L2 after the first):

  1. The max ``m`` of ``x = logit * fp32(1/T)`` and ``total = sum exp(x - m)`` (``lse = m + log(total)``).
  2. Eight rounds of a radix search on ``key(x)``, the fp32 bits mapped so that unsigned order is float order, four
     bits a round from the top: over the tokens whose key matches the digits chosen so far, the weight ``exp(x -
     m)`` per value of the next digit (16 sums); walking the digits from 15 down, the first whose weight, with the
     weight of every larger key, reaches ``top_p * total`` is chosen and the weight above it carried on. After the
     eighth round the chosen digits are ``key(tau)``. (Should rounding leave the whole row short of the target, the
     smallest digit with weight is taken: every token is kept, as the sort keeps them.) Past the first two rounds
     (sign and exponent bits) steps with no matching token skip the sums.
  3. ``argmax(x + g(u))`` over the tokens with ``key >= key(tau)`` -- the first index on ties -- and
     ``logp = x[token] - lse``, with ``g`` the noise of :mod:`quarl_kernels.sampler`; steps with no kept token (most:
     a nucleus is small) skip their noise.

Each pass keeps per-position partials over its steps and reduces across the program once at its end, and the radix
steps work on ``[BLOCK, 1]`` columns from the load on, so that the broadcast against the 16 digits stays in
registers: sm_90 build, 129-163 instructions a thread per radix step of 512 tokens (270 with a reduction a step
and a ``[BLOCK]`` vector, which went through shared memory), 80 registers, no spills.

What it equals. The nucleus of ``top_p_mask`` when no two tokens tie at ``tau``: the sort keeps the tokens before the
crossing one and it, i.e. the logits ``> tau`` and one token at ``tau``. With ties at ``tau`` (bf16 logits make them
real) the sort's choice among them is its (unstable) order; here all of them are kept -- the smallest set of whole
probability levels whose mass reaches ``top_p``, one deterministic rule. And the mass sums are fp32 in another
order than ``torch.cumsum``, so a row whose crossing mass is within fp32 rounding of ``top_p`` may keep one token
more or less. Given the same nucleus, the token is the PyTorch path's (the same ``u``, the same noise arithmetic),
and the log-prob is equal to fp32 rounding. (The masses and ``lse`` use Triton's fast ``exp``, ``ex2.approx``: they need
to be right to fp32 rounding, not bit for bit, and libdevice's ``expf`` cost ~20 instructions a token a pass more --
sm_90 build, session 38; the noise keeps libdevice's ``logf``, the bits of PyTorch's.) Tested on CPU under ``TRITON_INTERPRET=1`` against ``top_p_mask``
(tests/kernels/test_nucleus_interpreter.py) and on the GPU against ``sample`` (tests/kernels/test_nucleus_gpu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels.sampler import _TINY, _log, interpreting, prepare

__all__ = ["BLOCK", "nucleus_sample"]

BLOCK = 512  # entries a step; a round's digit sums are a [BLOCK, 16] reduction


@triton.jit
def _sort_key(x):
    """fp32 -> uint32 whose unsigned order is the floats' order (negatives: every bit flipped; else the sign set)."""
    b = x.to(tl.uint32, bitcast=True)
    neg = (b >> 31) == 1
    return tl.where(neg, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _nucleus_kernel(x_ptr, stride_x, u_ptr, stride_u, rows_ptr, tok_ptr, logp_ptr, V, inv_t, top_p,
                    BLOCK: tl.constexpr, HAS_ROWS: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    if HAS_ROWS:
        u_row = u_ptr + tl.load(rows_ptr + row).to(tl.int64) * stride_u
    else:
        u_row = u_ptr + row.to(tl.int64) * stride_u
    offs = tl.arange(0, BLOCK)
    digits = tl.arange(0, 16)
    offs2 = tl.arange(0, BLOCK)[:, None]  # [BLOCK, 1]
    digits2 = digits[None, :]  # [1, 16]

    # Every pass keeps per-lane partials (a lane: one of the BLOCK positions) and reduces across the program once,
    # after its loop: a reduction every step cost more than the step's own work (sm_90 build: 270 instructions a
    # radix step of 2 tokens a thread with the [BLOCK, 16] sums reduced every step).

    # 1. lse of the scaled row: a running max and sum a lane
    m_l = tl.full((BLOCK,), float("-inf"), tl.float32)
    l_l = tl.zeros((BLOCK,), tl.float32)
    for v0 in range(0, V, BLOCK):
        ok = v0 + offs < V
        x = tl.load(x_row + v0 + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t  # [BLOCK]
        m_new = tl.maximum(m_l, x)
        l_l = tl.where(m_new == float("-inf"), 0.0, l_l * tl.exp(m_l - m_new) + tl.exp(x - m_new))
        m_l = m_new
    m = tl.max(m_l, axis=0)
    total = tl.sum(tl.where(m_l == float("-inf"), 0.0, l_l * tl.exp(m_l - m)), axis=0)  # sum exp(x - m)
    lse = m + _log(total, INTERPRET)
    # the rounds weigh tokens by exp(x - m) against top_p * total, not by exp(x - lse) against top_p: lse carries
    # its own rounding (half an ulp of ~10: 5e-7 relative on every mass), enough to move the edge by a token at top-p
    # 0.999 where the sort's softmax (x - max, then a division) did not (the CPU test's case)
    target = top_p * total

    # 2. key(tau), four bits a round from the top
    prefix = tl.zeros((), tl.uint32)  # the digits chosen so far
    known = tl.zeros((), tl.uint32)  # their bits
    above = tl.zeros((), tl.float32)  # the mass of every key above the prefix's range
    for r in tl.static_range(8):
        shift = 28 - 4 * r  # r is a compile-time int: so is shift
        acc = tl.zeros((BLOCK, 16), tl.float32)  # a lane's mass by digit
        for v0 in range(0, V, BLOCK):
            # [BLOCK, 1] from the load on: the broadcast against the 16 digits stays in registers (a [BLOCK] vector
            # broadcast took a shared-memory round trip and barriers a step)
            ok = v0 + offs2 < V
            x = tl.load(x_row + v0 + offs2, mask=ok, other=float("-inf")).to(tl.float32) * inv_t  # [BLOCK, 1]
            key = _sort_key(x)
            match = ok & ((key & known) == prefix)
            # past the first two rounds (sign and exponent bits) few steps hold a match: skip the sums there
            if r < 2 or tl.max(tl.max(match.to(tl.int32), axis=1), axis=0) > 0:
                p = tl.where(match, tl.exp(x - m), 0.0)  # [BLOCK, 1]
                d = ((key >> shift) & 15).to(tl.int32)
                acc += tl.where(d == digits2, p, 0.0)  # [BLOCK, 16]
        mass = tl.sum(acc, axis=0)  # [16]
        reach = above + tl.cumsum(mass, axis=0, reverse=True) >= target  # [16]: this digit and every larger one
        best = tl.max(tl.where(reach, digits, -1), axis=0)
        lowest = tl.min(tl.where(mass > 0.0, digits, 16), axis=0)
        chosen = tl.where(best >= 0, best, tl.where(lowest < 16, lowest, 0))  # none reaches: keep everything
        above += tl.sum(tl.where(digits > chosen, mass, 0.0), axis=0)
        prefix = prefix | (chosen.to(tl.uint32) << shift)
        known = known | (tl.full((), 15, tl.uint32) << shift)

    # 3. the Gumbel-max token among the keys >= key(tau): a lane's first best, then the first index of the best
    best_v = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_k = tl.zeros((BLOCK,), tl.int32)
    for v0 in range(0, V, BLOCK):
        k = v0 + offs
        ok = k < V
        x = tl.load(x_row + k, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        kept = ok & (_sort_key(x) >= prefix)
        if tl.max(kept.to(tl.int32), axis=0) > 0:  # a nucleus is small: most steps hold none, skip their noise
            u = tl.maximum(tl.load(u_row + k, mask=kept, other=1.0), _TINY)
            y = tl.where(kept, x + -_log(-_log(u, INTERPRET), INTERPRET), float("-inf"))
            better = y > best_v  # strict: a lane keeps its earliest index on ties
            best_k = tl.where(better, k, best_k)
            best_v = tl.where(better, y, best_v)
    top = tl.max(best_v, axis=0)
    best_i = tl.min(tl.where(best_v == top, best_k, 2147483647), axis=0)  # torch.argmax: the first index
    x_tok = tl.load(x_row + best_i).to(tl.float32) * inv_t
    tl.store(tok_ptr + row, best_i.to(tl.int64))
    tl.store(logp_ptr + row, x_tok - lse)


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
    if B:
        _nucleus_kernel[(B,)](
            logits, logits.stride(0), u, u.stride(0), rows, tok, logp, V, inv_t, float(top_p),
            BLOCK=BLOCK, HAS_ROWS=rows_of is not None, INTERPRET=interpreting(), num_warps=8, enable_fp_fusion=False,
        )
    return tok, logp
