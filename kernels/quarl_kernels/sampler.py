"""One token a row from LM-head logits in two kernels: the Gumbel-max draw (or greedy argmax) and its log-prob.

Why. The engine's sampler (``quarl.engine.sampling.sample``) at top-p 1 is about a dozen PyTorch kernels over the
``[B, V]`` fp32 logits -- the division by the temperature, ``log_softmax``, ``rand``, the clamp, two logs and two
negations of the Gumbel noise, the add, the argmax, the gather -- most of them a full read and write of a 150k-word
row: 0.059 ms of a 7B batch-1 decode step and 0.316 ms at batch 64 (H100, benchmarks/RESULTS.md, session 30's
profile), as much as the whole BF16 LM head at 64 rows. Here the noise is still drawn by ``torch.rand`` from the
caller's generator (the same call ``sample`` makes: the same ``u``, the same generator state after it), and
everything else is two kernels (below top-p 1, :mod:`quarl_kernels.nucleus` instead):

  partial  grid ``(B, S)``: program ``(r, s)`` streams its slice of row ``r``'s vocabulary in ``BLOCK`` pieces,
           ``x = logit * (1/T)`` in fp32, and keeps the running max ``m``, the sum ``l = sum exp(x - m)``
           (rescaled when the max grows) and the running best of ``x + g``, ``g = -log(-log(max(u, tiny)))``
           (greedy: of ``x``), its first index on ties; writes ``(m, l, best)`` and the index. ``S`` splits fill
           the GPU at batch 1 (a 150k row in one program would stream at one SM's rate).
  combine  one program a row: the ``S`` partials in split order -> the token (the first split's best on ties: the
           lowest index, as ``torch.argmax``), ``lse = M + log(sum l_s exp(m_s - M))``, ``logp = x[token] - lse``.

Numerics. The draw is ``sample``'s, operation for operation, so the tokens are the same bits when the logs are:
``x`` is ``logit * fp32(1/T)`` because that is what PyTorch's CUDA division by a host scalar computes
(``div_true_kernel_cuda``: "a * reciprocal(b)"), the noise and the sums call libdevice's ``logf`` / ``expf`` by name
(what ``torch.log`` / ``torch.exp`` compile to; Triton 3.6 lowers ``tl.log`` to the same ``logf`` but ``tl.exp`` to a
bare ``ex2.approx``), and the kernels are built without FP contraction (``x + g`` must not become an FMA of the
product). The log-prob sums in another order than ``torch.log_softmax``: equal to fp32 rounding, not
bit for bit. Under ``TRITON_INTERPRET=1`` (no libdevice) NumPy's ``log`` / ``exp`` stand in; the CPU tests hold the
kernels to a reference with NumPy's noise. A row whose logits are all ``-inf`` gives token 0 (``torch.argmax``'s
answer) and a log-prob of NaN; NaN logits are not handled (the trainer stops on non-finite values elsewhere).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

__all__ = ["BLOCK", "gumbel_sample", "prepare", "sm_count", "splits"]

BLOCK = 1024  # vocabulary entries a program step: 4 KB of fp32 logits (and 4 KB of noise) a row
PROGRAMS_PER_SM = 4  # the partial grid's target size: enough programs in flight to stream at batch 1
TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: u = 0 would give g = +inf (sample's clamp)
_TINY = tl.constexpr(TINY)  # the kernels' copy (a jit function reads only constexpr globals)


@triton.jit
def _log(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.log(x)
    else:
        return libdevice.log(x)


@triton.jit
def _exp(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def _partial_kernel(x_ptr, stride_x, u_ptr, stride_u, rows_ptr, part_ptr, idx_ptr, V, SPLIT, inv_t,
                    BLOCK: tl.constexpr, NOISE: tl.constexpr, HAS_ROWS: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0)
    s = tl.program_id(1)
    S = tl.num_programs(1)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    if NOISE:
        if HAS_ROWS:  # a compacted batch: this row's noise is row rows[row] of the full batch's
            u_row = u_ptr + tl.load(rows_ptr + row).to(tl.int64) * stride_u
        else:
            u_row = u_ptr + row.to(tl.int64) * stride_u
    start = s * SPLIT
    end = tl.minimum(start + SPLIT, V)
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)  # running max of x
    l = tl.zeros((), tl.float32)  # sum exp(x - m)
    best = tl.full((), float("-inf"), tl.float32)  # running max of x + g (greedy: of x)
    best_i = start  # its index; the split's first entry while every value is -inf (torch.argmax: the first)
    for v0 in range(start, end, BLOCK):
        k = v0 + offs
        ok = k < end
        x = tl.load(x_row + k, mask=ok, other=float("-inf")).to(tl.float32) * inv_t  # [BLOCK]
        m_new = tl.maximum(m, tl.max(x, axis=0))
        alpha = tl.where(m_new == float("-inf"), 0.0, _exp(m - m_new, INTERPRET))  # 0 on the first finite piece
        e = tl.where(x > float("-inf"), _exp(x - m_new, INTERPRET), 0.0)
        l = l * alpha + tl.sum(e, axis=0)
        m = m_new
        if NOISE:
            u = tl.maximum(tl.load(u_row + k, mask=ok, other=1.0), _TINY)
            y = tl.where(ok, x + -_log(-_log(u, INTERPRET), INTERPRET), float("-inf"))  # x + g, as sample adds
        else:
            y = x
        y_max, y_arg = tl.max(y, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = y_max > best  # strict: an equal value later in the row does not replace the first
        best_i = tl.where(better, v0 + y_arg, best_i)
        best = tl.where(better, y_max, best)
    slot = row * S + s
    tl.store(part_ptr + slot * 3, m)
    tl.store(part_ptr + slot * 3 + 1, l)
    tl.store(part_ptr + slot * 3 + 2, best)
    tl.store(idx_ptr + slot, best_i)


@triton.jit
def _combine_kernel(x_ptr, stride_x, part_ptr, idx_ptr, tok_ptr, logp_ptr, S, inv_t,
                    BLOCK_S: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0)
    o = tl.arange(0, BLOCK_S)
    ok = o < S
    slot = row * S + o
    m = tl.load(part_ptr + slot * 3, mask=ok, other=float("-inf"))  # [BLOCK_S]
    l = tl.load(part_ptr + slot * 3 + 1, mask=ok, other=0.0)
    best = tl.load(part_ptr + slot * 3 + 2, mask=ok, other=float("-inf"))
    best_i = tl.load(idx_ptr + slot, mask=ok, other=0)
    M = tl.max(m, axis=0)
    L = tl.sum(tl.where(m > float("-inf"), l * _exp(m - M, INTERPRET), 0.0), axis=0)
    _, s_best = tl.max(best, axis=0, return_indices=True, return_indices_tie_break_left=True)  # the first split
    tok = tl.sum(tl.where(o == s_best, best_i, 0), axis=0)
    x_tok = tl.load(x_ptr + row.to(tl.int64) * stride_x + tok).to(tl.float32) * inv_t
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(logp_ptr + row, x_tok - (M + _log(L, INTERPRET)))


def splits(rows: int, vocab: int, sms: int, block: int = BLOCK, per_sm: int = PROGRAMS_PER_SM) -> tuple[int, int]:
    """``(S, SPLIT)``: the partial grid's splits of a row and the entries of each (a multiple of ``block``) --
    about ``per_sm`` programs an SM over all rows, never a split of less than one ``block``."""
    s = max(1, min(triton.cdiv(per_sm * sms, max(rows, 1)), triton.cdiv(vocab, block)))
    split = triton.cdiv(triton.cdiv(vocab, s), block) * block
    return triton.cdiv(vocab, split), split


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few splits, so the tests cover the combine
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def prepare(logits: torch.Tensor, temperature: float, u: torch.Tensor | None, rows_of: torch.Tensor | None):
    """The checks and buffers of a sampling launch: (logits with a contiguous last axis, ``[B]`` int64 tokens and
    fp32 log-probs to fill, ``fp32(1/T)``, ``rows_of`` as int64 or a stand-in pointer)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if u is not None:
        if u.dtype != torch.float32 or u.shape[1] != V or u.stride(1) != 1:
            raise ValueError(f"u must be a [R, {V}] fp32 tensor with a contiguous last axis, got {tuple(u.shape)} "
                             f"{u.dtype}")
        if rows_of is None and u.shape[0] < B:
            raise ValueError(f"u has {u.shape[0]} rows for {B} logits rows; pass rows_of to pick them")
    tok = torch.empty(B, dtype=torch.long, device=logits.device)
    logp = torch.empty(B, dtype=torch.float32, device=logits.device)
    inv_t = float(np.float32(1.0) / np.float32(temperature))  # what PyTorch's CUDA division by a scalar multiplies by
    rows = rows_of.to(torch.int64) if rows_of is not None else tok  # any pointer when unused
    return logits, tok, logp, inv_t, rows


def gumbel_sample(logits: torch.Tensor, temperature: float, u: torch.Tensor | None = None,
                  rows_of: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [B, V]`` -> (``[B]`` int64 tokens, ``[B]`` fp32 log-probs under ``softmax(logits / T)``).

    ``u [R, V]`` fp32 uniform noise (``torch.rand``): the token is ``argmax(logits * (1/T) + g(u))``, a sample of
    ``softmax(logits / T)``; ``None``: greedy, ``argmax(logits * (1/T))``. ``rows_of [B]`` (int): row ``b``'s noise
    is ``u[rows_of[b]]`` (a compacted batch, ``R`` the full one's rows); else ``u[b]``. The vocabulary axis of
    ``logits`` and ``u`` must be contiguous."""
    logits, tok, logp, inv_t, rows = prepare(logits, temperature, u, rows_of)
    B, V = logits.shape
    if B == 0:
        return tok, logp
    noise, dev, interpret = u is not None, logits.device, interpreting()
    S, split = splits(B, V, sm_count(dev))
    part = torch.empty(B * S * 3, dtype=torch.float32, device=dev)
    idx = torch.empty(B * S, dtype=torch.int32, device=dev)
    _partial_kernel[(B, S)](
        logits, logits.stride(0), u if noise else logits, u.stride(0) if noise else 0, rows, part, idx, V, split,
        inv_t, BLOCK=BLOCK, NOISE=noise, HAS_ROWS=rows_of is not None, INTERPRET=interpret,
        num_warps=4, enable_fp_fusion=False,
    )
    _combine_kernel[(B,)](
        logits, logits.stride(0), part, idx, tok, logp, S, inv_t, BLOCK_S=max(triton.next_power_of_2(S), 2),
        INTERPRET=interpret, num_warps=1, enable_fp_fusion=False,
    )
    return tok, logp
