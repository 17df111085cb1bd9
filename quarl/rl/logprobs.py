"""Trainer-side log-probs of sampled completions, and the rollout/trainer mismatch.

One forward over ``[prompt | completion]`` (left-padded prompt, right-padded
completion) with the same ``cumsum(mask) - 1`` positions the rollout used. Only
the last ``T + 1`` positions are projected to the vocabulary (``logits_to_keep``),
and ``log p(token)`` is ``logit[token] - logsumexp(logits)`` -- no ``[B, T, V]``
log-softmax copy is materialized beyond the logits themselves.

Mismatch. The rollout keeps the log-probs it sampled with; the trainer recomputes
them. They differ by (a) AQN noise, present only during the rollout (by design,
see :mod:`quarl.rl.aqn`), (b) kernel/cache numerics (KV cache vs. full forward,
a GPU generator's kernels), (c) nothing else -- weights are the same. Every step
logs ``mean |logp_rollout - logp_train|`` over completion tokens and the k3
estimate of ``KL(pi_rollout || pi_train)`` (samples come from the rollout
policy, so ``r = pi_train / pi_rollout`` and ``k3 = r - 1 - log r``). Without
noise these are ~1e-6 in float32; large values flag a broken engine or a bad
noise level.
"""

from __future__ import annotations

import torch
from torch import nn

from quarl.rl.rollout import position_ids_from_mask


def completion_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    n_completion: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, P + T]`` ids/mask -> (``[B, T]`` log-probs of the last T tokens, ``[B, T]`` entropy or None).

    Differentiable unless called under ``torch.no_grad()``; the entropy is always
    detached (a metric, not a loss term).
    """
    T = n_completion
    pos = position_ids_from_mask(attention_mask)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False,
                logits_to_keep=T + 1)
    logits = out.logits[:, -(T + 1):-1, :].float() / temperature  # [B, T, V]: position t predicts token t
    targets = input_ids[:, -T:]  # [B, T]
    lse = torch.logsumexp(logits, dim=-1)  # [B, T]
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        with torch.no_grad():
            p = torch.softmax(logits, dim=-1)
            ent = lse - (p * logits).sum(dim=-1)  # H = logsumexp - E_p[logit]
    return logp, ent


def mismatch(rollout_logp: torch.Tensor, train_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Rollout vs. trainer log-probs over masked tokens: mean |diff|, k3 KL(rollout || train), max |diff|."""
    m = mask.bool()
    if not m.any():
        return {"mismatch/abs_logprob_diff": 0.0, "mismatch/kl": 0.0, "mismatch/max_abs_logprob_diff": 0.0}
    d = (train_logp - rollout_logp)[m].double()  # log r
    return {
        "mismatch/abs_logprob_diff": float(d.abs().mean()),
        "mismatch/kl": float((d.exp() - 1 - d).mean()),
        "mismatch/max_abs_logprob_diff": float(d.abs().max()),
    }
