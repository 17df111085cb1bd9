"""GRPO and DAPO objectives: group advantages, the clipped surrogate, KL, overlong shaping.

Both algorithms share one per-token surrogate (PPO's clipped ratio) and differ in
how it is shaped and averaged:

GRPO (DeepSeekMath, Shao et al. 2024, Eq. 3)
    * advantage of sample i in a group of G answers to one prompt:
      ``A_i = (r_i - mean(r)) / (std(r) + eps)``, broadcast to every token of i;
    * symmetric clip ``[1 - eps, 1 + eps]``;
    * optional KL to a frozen reference, with the k3 estimator
      ``exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0);
    * *sequence-level* averaging: mean over each answer's tokens, then mean over
      answers -- every answer weighs the same whatever its length.

DAPO (Yu et al. 2025)
    * decoupled clip ``[1 - eps_low, 1 + eps_high]`` with 0.2 / 0.28 ("clip-higher":
      low-probability tokens may grow more, which keeps entropy up);
    * *token-level* averaging over all tokens of the batch, so long answers are not
      under-weighted (TRL calls this ``bnpo``);
    * no KL term;
    * overlong handling: either mask truncated answers out of the loss ("overlong
      filtering") or add the soft length penalty of the paper's Eq. 13;
    * dynamic sampling: groups whose rewards are all equal carry no gradient
      (their advantages are exactly zero) and are dropped and refilled -- the
      group test lives here (:func:`informative_groups`), the refill loop in
      :mod:`quarl.rl.sampling`.

Off-policy updates. With one policy update per rollout the "old" log-probs are the
current ones detached, so ``ratio == 1`` numerically while the gradient
``d ratio / d theta = d logp / d theta`` still flows (TRL's trick, and why the
trainer skips the extra forward pass in that case). With several updates per
rollout (QeRL's GSM8K setting, 4) the old log-probs come from a separate forward
pass before the first update and the ratio moves away from 1.

Micro-batching. The trainer splits a batch into micro-batches for memory; the
loss must still be the *batch* average. So :func:`policy_loss` takes the batch-wide
normalizers (number of valid tokens for token-level, number of sequences for
sequence-level) and returns a sum that is already divided by them: the
micro-batch losses add up to the batch loss exactly, whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGGREGATIONS = ("token", "sequence")


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, scale: bool = True) -> torch.Tensor:
    """``[N]`` rewards ordered as N/G consecutive groups of G -> ``[N]`` advantages.

    ``(r - mean_g) / (std_g + eps)`` with the unbiased group std (as TRL and verl);
    ``scale=False`` keeps only the mean-centering (Dr. GRPO). Groups whose rewards
    are all equal get advantage exactly 0 -- not ``0 / eps`` rounding noise, and
    never NaN -- so they contribute nothing to the gradient.
    """
    if group_size < 2:
        raise ValueError(f"GRPO needs at least 2 samples per prompt to form a baseline, got group_size={group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)  # [N/G, G]
    centered = r - r.mean(dim=1, keepdim=True)
    adv = centered / (r.std(dim=1, keepdim=True) + eps) if scale else centered
    constant = (r == r[:, :1]).all(dim=1, keepdim=True)  # [N/G, 1]
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N/G]`` bool: groups whose rewards are not all equal (DAPO dynamic sampling keeps these)."""
    r = rewards.view(-1, group_size)
    return ~(r == r[:, :1]).all(dim=1)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) from samples of pi (Schulman 2020): >= 0, unbiased."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Eq. 13), added to the reward.

    ``0`` for ``L <= max_len - buffer``; ``((max_len - buffer) - L) / buffer`` inside the
    buffer (linear from 0 to -1); ``-1`` beyond ``max_len``.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer_len}")
    lengths = lengths.float()
    expected = max_len - buffer_len
    pen = (expected - lengths) / buffer_len
    pen = torch.where(lengths <= expected, torch.zeros_like(pen), pen)
    return pen.clamp(min=-1.0)


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, already divided by the batch normalizer
    # token sums over this micro-batch, for batch-level metrics: detached 0-dim tensors on the loss's device, not
    # floats -- reading one waits for the GPU, and a read between a micro-batch's forward and its backward kept the
    # host from queueing the backward ahead (the trainer sums them on the device and reads them once an update)
    clipped_tokens: torch.Tensor
    kl_sum: torch.Tensor
    ratio_sum: torch.Tensor
    tokens: torch.Tensor


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    aggregation: str = "token",
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    weights: torch.Tensor | None = None,
) -> LossOutput:
    """The clipped surrogate, to *minimize*.

    logp, old_logp, ref_logp, mask: ``[B, T]`` (completion tokens; mask 1 = counts)
    advantages: ``[B]`` (one per answer, broadcast over its tokens)
    num_tokens / num_sequences: batch-wide normalizers (default: this micro-batch).
    weights: ``[B, T]`` constant per-token factors on the policy-gradient term (rollout importance
    sampling, :mod:`quarl.rl.precision`); None = 1.
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss aggregation must be one of {LOSS_AGGREGATIONS}, got {aggregation!r}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs the reference log-probs (ref_logp)")
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logp - old_logp)  # [B, T]
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(surr1, surr2)  # [B, T]
    if weights is not None:
        per_token = per_token * weights.detach().to(per_token.dtype)
    kl = None
    if beta > 0:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + beta * kl
    if aggregation == "token":
        denom = float(num_tokens) if num_tokens is not None else mask.sum().clamp(min=1.0)
        loss = (per_token * mask).sum() / denom
    else:
        seq_len = mask.sum(dim=1).clamp(min=1.0)  # [B]
        per_seq = (per_token * mask).sum(dim=1) / seq_len
        denom = float(num_sequences) if num_sequences is not None else float(logp.shape[0])
        loss = per_seq.sum() / denom
    with torch.no_grad():
        clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        out = LossOutput(
            loss=loss,
            clipped_tokens=(clipped.to(mask.dtype) * mask).sum(),
            kl_sum=(kl * mask).sum() if kl is not None else mask.new_zeros(()),
            ratio_sum=(ratio * mask).sum(),
            tokens=mask.sum(),
        )
    return out
