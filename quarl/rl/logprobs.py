"""Trainer-side log-probs of sampled completions, and the rollout/trainer mismatch.

One forward over ``[prompt | completion]`` (left-padded prompt, right-padded
completion) with the same ``cumsum(mask) - 1`` positions the rollout used. Only
completion positions are projected to the vocabulary, ``chunk`` positions at a
time, and ``log p(token) = logit[token] - logsumexp(logits)``. Why chunks: the
float32 logits of one 8192-token answer over Qwen2.5's 152k vocabulary are 5 GB;
projecting ``chunk`` positions at a time under activation checkpointing keeps
only ``[B, chunk, V]`` alive and recomputes each chunk's projection in the
backward pass (one extra LM-head matmul, a few percent of the step). On CUDA what follows the LM-head GEMM
(the fp32 upcast, temperature, logsumexp, gather, and their backward) is one Triton kernel each way
(``quarl_kernels.token_logprob``: one read of the logits forward, one read and one write backward, where the
PyTorch ops made about ten fp32 passes; ``QUARL_LOGPROB_KERNEL=0`` keeps the ops, which CPUs always run).

Mismatch. The rollout keeps the log-probs it sampled with; the trainer recomputes
them. They differ by (a) AQN noise, present only during the rollout (by design,
see :mod:`quarl.rl.aqn`), (b) kernel/cache numerics (KV cache vs. full forward,
a GPU generator's kernels), (c) nothing else -- weights are the same. Every step
logs ``mean |logp_rollout - logp_train|`` over completion tokens and the k3
estimate of ``KL(pi_rollout || pi_train)`` (samples come from the rollout
policy, so ``r = pi_train / pi_rollout`` and ``k3 = r - 1 - log r``). Without
noise these are ~1e-6 in float32; large values flag a broken engine or a bad
noise level.

No mask at all. Left padding is moved to the end before the forward: each row is
rolled left by its number of leading pad columns, so every row reads ``prompt |
completion | pads``, and plain causal attention (``attention_mask=None``) gives every
real token exactly the keys it saw with the mask (pads only ever come after it), with
the same ``cumsum(mask) - 1`` positions; the completion's hidden states are then
gathered per row. Why it matters: with a mask, left padding makes query rows with no
key at all, and the masked memory-efficient SDPA backward on CUDA can return NaN
gradients from a finite loss (pytorch/pytorch#178251, #103749); GRPO on GSM8K
(prompts of 89-294 tokens, so up to ~200 pad columns in a micro-batch of two prompts)
stopped on exactly that symptom (benchmarks/RESULTS.md, "RL that learns (GPU)"). A
mask with holes inside a row (never made by quarl's rollouts) still takes the masked
forward.

No synchronization. The rolled rows get plain ``0..L-1`` positions (the same as ``cumsum(mask) - 1`` on every real
token; only the trailing pads differ, and no real token attends to them). ``cumsum(mask) - 1`` repeats the last
position over the pads, which transformers 5's packed-sequence detection (``masking_utils.
find_packed_sequence_indices``: positions that do not step by one) takes for several sequences packed in a row -- a
block-diagonal mask materialized for SDPA, off the flash kernels, whenever answers differ in length -- and that
check reads a GPU value, which waits for the GPU. Rolled rows are one sequence each, so the check is skipped
(:func:`_unpacked_rows`). The trainer also vouches for its layout (``trailing_only=True``), which skips the
trailing-padding check's read: a micro-batch's forward is queued without waiting for the previous one's backward.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from quarl.engine.rollout import position_ids_from_mask
from quarl.train.fsdp import decoder_hidden


@functools.cache
def _kernels():
    """``quarl_kernels.token_logprob``, or None (no Triton / kernels package: the PyTorch path serves)."""
    try:
        from quarl_kernels import token_logprob
    except Exception as e:  # noqa: BLE001 - any import failure means: no kernel here
        warnings.warn(f"quarl_kernels.token_logprob unavailable ({type(e).__name__}: {e}); token log-probs take the "
                      f"PyTorch path", RuntimeWarning, stacklevel=2)
        return None
    return token_logprob


def use_kernel(logits: torch.Tensor) -> bool:
    """The fused token log-prob kernel for these logits? ``QUARL_LOGPROB_KERNEL``: unset/1 = on CUDA (when the
    kernels import), 0 = never (the PyTorch path); on CPU only with 1 under ``TRITON_INTERPRET=1`` (its test)."""
    flag = os.environ.get("QUARL_LOGPROB_KERNEL", "").strip().lower()
    if flag not in ("", "0", "1"):
        raise ValueError(f"QUARL_LOGPROB_KERNEL={flag!r}: use 1 (the fused kernel where it can run) or 0 (PyTorch)")
    if flag == "0":
        return False
    if not logits.is_cuda and not (flag == "1" and os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    return logits.stride(-1) == 1 and _kernels() is not None


class TokenLogprob(torch.autograd.Function):
    """``[N, V]`` logits, ``[N]`` targets -> (``[N]`` fp32 log-probs, ``[N]`` detached entropy or zeros) through
    ``quarl_kernels.token_logprob``: one read of the logits forward, one read and one write backward."""

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, with_entropy: bool):
        logp, lse, ent = _kernels().token_logprob_fwd(logits, targets, temperature, with_entropy)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ent = torch.zeros_like(logp) if ent is None else ent
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        logits, targets, lse = ctx.saved_tensors
        return _kernels().token_logprob_bwd(logits, targets, lse, grad_logp, ctx.temperature), None, None, None


def _project(lm_head: nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """``[B, c, H]`` hidden states -> ``[B, c]`` log-probs of ``targets`` (and detached entropy)."""
    logits = lm_head(h)  # [B, c, V] in the head's dtype
    if use_kernel(logits):
        logp, ent = TokenLogprob.apply(logits.flatten(0, 1), targets.flatten(), float(temperature), with_entropy)
        return logp.view(targets.shape), ent.view(targets.shape)
    logits = logits.float() / temperature  # [B, c, V]
    lse = torch.logsumexp(logits, dim=-1)  # [B, c]
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    with torch.no_grad():
        ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)  # H = logsumexp - E_p[logit]
    return logp, ent


@contextlib.contextmanager
def _unpacked_rows():
    """transformers' packed-sequence detection off for a forward whose rows are one sequence each (module docstring):
    it would only find that out by reading a GPU value. Restored on exit; a transformers without it is left alone."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    real = getattr(masking_utils, "find_packed_sequence_indices", None)
    if real is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = real


def completion_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    n_completion: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int = 1024,
    trailing_only: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, P + T]`` ids/mask -> (``[B, T]`` log-probs of the last T tokens, ``[B, T]`` entropy or None).

    Differentiable unless called under ``torch.no_grad()``; the entropy is always
    detached (a metric, not a loss term). ``chunk``: positions projected to the
    vocabulary at once (``<= 0``: all). ``trailing_only``: whether every row, its leading padding rolled to the end,
    reads ``1...1 0...0`` (left-padded prompts followed by right-padded completions, as quarl's rollouts are): None
    checks it (a read of a GPU value, so the host waits for the GPU), True is the caller's word for it.
    """
    T = n_completion
    L = input_ids.shape[1]
    lead = (attention_mask.cumsum(1) == 0).sum(1)  # [B] leading pad columns
    roll = (torch.arange(L, device=input_ids.device)[None, :] + lead[:, None]) % L  # [B, L]: pads to the end
    ids_r, mask_r = input_ids.gather(1, roll), attention_mask.gather(1, roll)
    if trailing_only is None:
        trailing_only = bool((mask_r[:, 1:] <= mask_r[:, :-1]).all())  # each row 1...1 0...0 after the roll
    if trailing_only:  # one sequence a row from position 0: plain causal attention, positions 0..L-1
        with _unpacked_rows():
            hidden = decoder_hidden(model, input_ids=ids_r, attention_mask=None,
                                    position_ids=torch.arange(L, device=input_ids.device)[None, :].expand(len(ids_r), L),
                                    use_cache=False)  # [B, L, H]
    else:  # holes inside a row: keep the original layout and the mask
        ids_r, mask_r, lead = input_ids, attention_mask, torch.zeros_like(lead)
        hidden = decoder_hidden(model, input_ids=ids_r, attention_mask=mask_r,
                                position_ids=position_ids_from_mask(mask_r), use_cache=False)  # [B, L, H]
    # position t predicts completion token t; rolled row b holds completion token 0 at L - T - lead[b]
    at = (L - T - 1 - lead)[:, None] + torch.arange(T, device=input_ids.device)[None, :]  # [B, T]
    hidden = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, T, H]
    targets = input_ids[:, -T:]  # [B, T]
    lm_head = model.get_output_embeddings()
    step = T if chunk <= 0 else chunk
    grad = torch.is_grad_enabled()
    lps, ents = [], []
    for s in range(0, T, step):
        h, tg = hidden[:, s:s + step], targets[:, s:s + step]
        if grad and T > step:  # recompute the chunk's logits in backward instead of keeping them
            lp, ent = checkpoint(_project, lm_head, h, tg, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _project(lm_head, h, tg, temperature, with_entropy)
        lps.append(lp)
        ents.append(ent)
    logp = torch.cat(lps, dim=1)
    return logp, (torch.cat(ents, dim=1).detach() if with_entropy else None)


def mismatch(rollout_logp: torch.Tensor, train_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Rollout vs. trainer log-probs over masked tokens: mean |diff|, k3 KL(rollout || train), max |diff|,
    and the fraction of tokens whose ratio pi_train / pi_rollout is outside [0.5, 2] (Jet-RL's measure)."""
    m = mask.bool().to(train_logp.device)
    if not m.any():
        return {"mismatch/abs_logprob_diff": 0.0, "mismatch/kl": 0.0, "mismatch/max_abs_logprob_diff": 0.0,
                "mismatch/ratio_outside_0.5_2": 0.0}
    d = (train_logp - rollout_logp.to(train_logp.device))[m].double()  # log r
    return {
        "mismatch/abs_logprob_diff": float(d.abs().mean()),
        "mismatch/kl": float((d.exp() - 1 - d).mean()),
        "mismatch/max_abs_logprob_diff": float(d.abs().max()),
        "mismatch/ratio_outside_0.5_2": float((d.abs() > torch.log(torch.tensor(2.0, dtype=d.dtype))).float().mean()),
    }
