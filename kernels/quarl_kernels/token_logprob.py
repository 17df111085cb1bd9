"""Token log-probabilities from LM-head logits in one read: ``logp[n] = x[n, t_n] - logsumexp(x[n, :])``.

Why. The rl stage turns every completion position into ``log p(token)`` (``quarl.rl.logprobs``) over a
150k-word vocabulary. In PyTorch ops that is a cast of the bf16 logits to fp32, a division by the temperature,
``logsumexp`` (a max, an ``exp`` pass, a sum) and a gather forward, and in backward a softmax, a scatter of the
target gradient and their sum, each a pass over a ``[rows, V]`` fp32 tensor: on a Qwen2.5-7B-width model at 8k
tokens about 40 ms of a 185 ms 4-layer full-parameter step went to these passes (torch.profiler,
benchmarks/RESULTS.md "The whole actor update"). Here each row is one program:

  forward   streams its bf16 logits once in ``BLOCK_V`` slices, keeping a running max ``m`` and sum
            ``s = sum exp(x - m)`` (rescaled when the max grows), so ``lse = m + log s``; the target's logit is
            one load. With ``WITH_ENT`` it also keeps ``s2 = sum exp(x - m) * x`` and writes the entropy
            ``lse - s2 / s`` (a detached metric).
  backward  ``d logits = g * (onehot(t) - exp(x - lse)) / T`` written in the logits' dtype: one read, one write.

Everything between the load and the store is fp32, as in the reference (``logits.float() / T``). The sums run in
another order than ``torch.logsumexp``: results agree to fp32 rounding, not bit for bit (tested against the
reference on CPU through the Triton interpreter and on the GPU). Rows may have any stride; the vocabulary axis
must be contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["token_logprob_bwd", "token_logprob_fwd"]

BLOCK_V = 4096  # vocabulary slice per loop step: 8 KB of bf16 per row and step


@triton.jit
def _fwd_kernel(x_ptr, stride_x, t_ptr, logp_ptr, lse_ptr, ent_ptr, V, temperature,
                BLOCK: tl.constexpr, WITH_ENT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)  # running max
    s = tl.zeros((), tl.float32)  # sum exp(x - m)
    s2 = tl.zeros((), tl.float32)  # sum exp(x - m) * x (entropy)
    for v0 in range(0, V, BLOCK):
        ok = v0 + offs < V
        x = tl.load(base + v0 + offs, mask=ok, other=float("-inf")).to(tl.float32) / temperature  # [BLOCK]
        m_new = tl.maximum(m, tl.max(x, axis=0))
        alpha = tl.exp(m - m_new)  # 0 on the first slice (m = -inf)
        e = tl.where(ok, tl.exp(x - m_new), 0.0)
        s = s * alpha + tl.sum(e, axis=0)
        if WITH_ENT:
            s2 = s2 * alpha + tl.sum(tl.where(ok, e * x, 0.0), axis=0)
        m = m_new
    lse = m + tl.log(s)
    t = tl.load(t_ptr + row)
    xt = tl.load(base + t).to(tl.float32) / temperature
    tl.store(logp_ptr + row, xt - lse)
    tl.store(lse_ptr + row, lse)
    if WITH_ENT:
        tl.store(ent_ptr + row, lse - s2 / s)


@triton.jit
def _bwd_kernel(x_ptr, stride_x, t_ptr, lse_ptr, g_ptr, dx_ptr, stride_dx, V, temperature, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    dbase = dx_ptr + row * stride_dx
    offs = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + row)
    t = tl.load(t_ptr + row)
    g = tl.load(g_ptr + row) / temperature  # d logp / d x[v] = (onehot - p) / T
    for v0 in range(0, V, BLOCK):
        ok = v0 + offs < V
        x = tl.load(base + v0 + offs, mask=ok, other=0.0).to(tl.float32) / temperature
        d = g * (tl.where(v0 + offs == t, 1.0, 0.0) - tl.exp(x - lse))  # [BLOCK]
        tl.store(dbase + v0 + offs, d.to(dx_ptr.dtype.element_ty), mask=ok)


def _check(x: torch.Tensor, targets: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"token_logprob: logits must be [rows, V] with a contiguous vocabulary axis, got shape "
                         f"{tuple(x.shape)} and strides {x.stride()}")
    if targets.shape != (x.shape[0],) or targets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"token_logprob: targets must be int32/int64 [rows={x.shape[0]}], got "
                         f"{targets.dtype} {tuple(targets.shape)}")


def token_logprob_fwd(x: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False):
    """``[N, V]`` logits (any float dtype), ``[N]`` target ids -> (``[N]`` fp32 log-probs, ``[N]`` fp32 logsumexp
    of ``x / T``, ``[N]`` fp32 entropy or None)."""
    _check(x, targets)
    n, v = x.shape
    logp = torch.empty(n, device=x.device, dtype=torch.float32)
    lse = torch.empty_like(logp)
    ent = torch.empty_like(logp) if with_entropy else logp  # unused pointer when off
    if n:
        _fwd_kernel[(n,)](x, x.stride(0), targets, logp, lse, ent, v, float(temperature),
                          BLOCK=min(BLOCK_V, triton.next_power_of_2(v)), WITH_ENT=with_entropy, num_warps=8)
    return logp, lse, (ent if with_entropy else None)


def token_logprob_bwd(x: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad_logp: torch.Tensor,
                      temperature: float = 1.0) -> torch.Tensor:
    """``d loss / d logits`` ``[N, V]`` in ``x``'s dtype from ``d loss / d logp`` ``[N]``."""
    _check(x, targets)
    n, v = x.shape
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if n:
        _bwd_kernel[(n,)](x, x.stride(0), targets, lse, grad_logp.float().contiguous(), dx, dx.stride(0), v,
                          float(temperature), BLOCK=min(BLOCK_V, triton.next_power_of_2(v)), num_warps=8)
    return dx
