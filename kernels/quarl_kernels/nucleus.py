"""Top-p (nucleus) sampling without a sort: one program a row finds the nucleus's smallest logit by a radix search
over the logits' bits, weighted by probability, then draws the Gumbel-max token inside it.

Why. ``quarl.engine.sampling.top_p_mask`` -- the rule both engines share -- sorts each ``[V]`` row (a segmented
key-value radix sort of 150k fp32 keys and int64 indices a row), then a softmax, a cumsum, a masked fill and a scatter
back: at the eval recipes' top-p 0.95 that is about a dozen more full passes over ``[B, V]`` a decode step than top-p
1, several of them through the sort's temporaries (``benchmarks/kernels/bench_sampler.py`` times it). A sort orders
every token; the nucleus needs one number, the logit ``tau`` of the token at which the mass of the tokens sorted by
probability first reaches ``top_p``: the nucleus is then every token with a logit ``>= tau``.

How, per row (one program, ``BLOCK`` entries a step, the row read 10 times -- from L2 after the first):

  1. ``lse`` of ``x = logit * fp32(1/T)`` (running max and sum, as :mod:`quarl_kernels.sampler`).
  2. Eight rounds of a radix search on ``key(x)``, the fp32 bits mapped so that unsigned order is float order, four
     bits a round from the top: over the tokens whose key matches the digits chosen so far, the probability mass
     ``exp(x - lse)`` per value of the next digit (16 sums); walking the digits from 15 down, the first whose mass,
     with the mass of every larger key, reaches ``top_p`` is chosen and the mass above it carried on. After the
     eighth round the chosen digits are ``key(tau)``. (Should rounding leave the whole row's mass short of
     ``top_p``, the smallest digit with mass is taken: every token is kept, as the sort keeps them.) Blocks with no
     matching token skip the sums, so the rounds after the first two touch few tokens.
  3. ``argmax(x + g(u))`` over the tokens with ``key >= key(tau)`` -- the first index on ties -- and
     ``logp = x[token] - lse``, with ``g`` the noise of :mod:`quarl_kernels.sampler`.

What it equals. The nucleus of ``top_p_mask`` when no two tokens tie at ``tau``: the sort keeps the tokens before the
crossing one and it, i.e. the logits ``> tau`` and one token at ``tau``. With ties at ``tau`` (bf16 logits make them
real) the sort's choice among them is its (unstable) order; here all of them are kept -- the smallest set of whole
probability levels whose mass reaches ``top_p``, one deterministic rule. And the mass sums are fp32 in another
order than ``torch.cumsum``, so a row whose crossing mass is within fp32 rounding of ``top_p`` may keep one token
more or less. Given the same nucleus, the token is the PyTorch path's (the same ``u``, the same noise arithmetic),
and the log-prob is equal to fp32 rounding. Tested on CPU under ``TRITON_INTERPRET=1`` against ``top_p_mask``
(tests/kernels/test_nucleus_interpreter.py) and on the GPU against ``sample`` (tests/kernels/test_nucleus_gpu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels.sampler import _TINY, _exp, _log, interpreting, prepare

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

    # 1. lse of the scaled row
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK):
        ok = v0 + offs < V
        x = tl.load(x_row + v0 + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t  # [BLOCK]
        m_new = tl.maximum(m, tl.max(x, axis=0))
        alpha = tl.where(m_new == float("-inf"), 0.0, _exp(m - m_new, INTERPRET))
        l = l * alpha + tl.sum(tl.where(x > float("-inf"), _exp(x - m_new, INTERPRET), 0.0), axis=0)
        m = m_new
    lse = m + _log(l, INTERPRET)

    # 2. key(tau), four bits a round from the top
    prefix = tl.zeros((), tl.uint32)  # the digits chosen so far
    known = tl.zeros((), tl.uint32)  # their bits
    above = tl.zeros((), tl.float32)  # the mass of every key above the prefix's range
    for r in tl.static_range(8):
        shift = 28 - 4 * r  # r is a compile-time int: so is shift
        mass = tl.zeros((16,), tl.float32)
        for v0 in range(0, V, BLOCK):
            ok = v0 + offs < V
            x = tl.load(x_row + v0 + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
            key = _sort_key(x)
            match = ok & ((key & known) == prefix)
            if tl.max(match.to(tl.int32), axis=0) > 0:
                p = tl.where(match, _exp(x - lse, INTERPRET), 0.0)  # [BLOCK]
                d = ((key >> shift) & 15).to(tl.int32)
                mass += tl.sum(tl.where(d[:, None] == digits[None, :], p[:, None], 0.0), axis=0)  # [16]
        reach = above + tl.cumsum(mass, axis=0, reverse=True) >= top_p  # [16]: this digit and every larger one
        best = tl.max(tl.where(reach, digits, -1), axis=0)
        lowest = tl.min(tl.where(mass > 0.0, digits, 16), axis=0)
        chosen = tl.where(best >= 0, best, tl.where(lowest < 16, lowest, 0))  # none reaches: keep everything
        above += tl.sum(tl.where(digits > chosen, mass, 0.0), axis=0)
        prefix = prefix | (chosen.to(tl.uint32) << shift)
        known = known | (tl.full((), 15, tl.uint32) << shift)

    # 3. the Gumbel-max token among the keys >= key(tau)
    best_v = tl.full((), float("-inf"), tl.float32)
    best_i = tl.zeros((), tl.int32)
    for v0 in range(0, V, BLOCK):
        k = v0 + offs
        ok = k < V
        x = tl.load(x_row + k, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        u = tl.maximum(tl.load(u_row + k, mask=ok, other=1.0), _TINY)
        y = tl.where(ok & (_sort_key(x) >= prefix), x + -_log(-_log(u, INTERPRET), INTERPRET), float("-inf"))
        y_max, y_arg = tl.max(y, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = y_max > best_v
        best_i = tl.where(better, v0 + y_arg, best_i)
        best_v = tl.where(better, y_max, best_v)
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
