"""Distillation objectives over the full vocabulary, chunked over positions so a 150k vocabulary fits.

    token_loss(s_logits [N, V], t_logits [N, V] | None, labels [N], objective) -> [N] per-position loss
    chunked_loss(s_hidden [N, H], s_head, t_hidden [N, Ht] | None, t_head, labels [N], cfg)
        -> ChunkedLoss(loss_sum (differentiable), kl_sum, ce_sum, count)

Objectives (p_t = teacher, p_s = student, both softmax(z / T)):

    forward_kl  KL(p_t || p_s) = sum_v p_t (log p_t - log p_s)        QAD's loss (T = 1)
    reverse_kl  KL(p_s || p_t)
    jsd         beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s
    mse         mean_v (z_s - z_t)^2 on raw logits                    ablation
    ce          -log p_s(label)                                       plain QAT (no teacher)

KL/JSD are multiplied by T^2 (Hinton et al.) so the gradient scale does not
shrink with the temperature; at QAD's T = 1 this is a no-op.

Memory. The logits of a sequence batch are ``[N, V]`` floats: 2048 positions of
Qwen2.5's 152k vocabulary are 1.2 GB in fp32 per copy, and a KL needs the
teacher's, the student's, their log-softmaxes and the gradient. So the trainer
keeps only the final hidden states ``[N, H]`` of both models and projects them
to the vocabulary ``chunk`` positions at a time inside
``torch.utils.checkpoint`` (non-reentrant): the forward stores the chunk's
*inputs* only and the backward recomputes the chunk's logits, so at most one
chunk of ``[chunk, V]`` tensors is alive at any time, in the forward and in the
backward. The teacher's logits are never stored beyond the chunk in use (they
are recomputed from its hidden state in the backward pass too).

Every chunk also returns the forward KL and the label CE (no grad), so the
training curves show both whatever the objective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from quarl.distill.config import LossConfig

__all__ = ["ChunkedLoss", "chunked_loss", "kl_terms", "token_loss"]


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row from log-probabilities [N, V] -> [N]."""
    return (logp.exp() * (logp - logq)).sum(-1)


def token_loss(s_logits: torch.Tensor, t_logits: torch.Tensor | None, labels: torch.Tensor | None,
               objective: str, temperature: float = 1.0, jsd_beta: float = 0.5) -> torch.Tensor:
    """Per-position loss [N] of student logits [N, V] against teacher logits [N, V] (fp32 math)."""
    s = s_logits.float()
    if objective == "ce":
        if labels is None:
            raise ValueError("objective ce needs labels")
        return F.cross_entropy(s, labels, reduction="none")
    if t_logits is None:
        raise ValueError(f"objective {objective} needs the teacher's logits")
    t = t_logits.float()
    if objective == "mse":
        return (s - t).pow(2).mean(-1)
    ls = F.log_softmax(s / temperature, dim=-1)  # [N, V]
    lt = F.log_softmax(t / temperature, dim=-1)
    scale = temperature * temperature
    if objective == "forward_kl":
        return scale * _kl(lt, ls)
    if objective == "reverse_kl":
        return scale * _kl(ls, lt)
    if objective == "jsd":
        b = jsd_beta
        # log m = logsumexp(log b + lt, log(1-b) + ls), stable in log space
        lm = torch.logsumexp(torch.stack([lt + torch.log(torch.tensor(b)), ls + torch.log(torch.tensor(1 - b))]), 0)
        return scale * (b * _kl(lt, lm) + (1 - b) * _kl(ls, lm))
    raise ValueError(f"unknown objective {objective!r}")


@torch.no_grad()
def kl_terms(s_logits: torch.Tensor, t_logits: torch.Tensor | None, labels: torch.Tensor) -> tuple[float, float]:
    """(sum of forward KL(teacher || student) at T = 1, sum of label CE) over the rows: the curves' metrics."""
    ls = F.log_softmax(s_logits.float(), dim=-1)
    ce = float(F.nll_loss(ls, labels, reduction="sum"))
    if t_logits is None:
        return float("nan"), ce
    return float(_kl(F.log_softmax(t_logits.float(), dim=-1), ls).sum()), ce


@dataclass
class ChunkedLoss:
    loss_sum: torch.Tensor  # differentiable sum of the per-position losses
    kl_sum: float  # forward KL(teacher || student), T = 1, summed
    ce_sum: float  # label cross-entropy of the student, summed
    count: int  # positions


def chunked_loss(s_hidden: torch.Tensor, s_head: Callable[[torch.Tensor], torch.Tensor],
                 t_hidden: torch.Tensor | None, t_head: Callable[[torch.Tensor], torch.Tensor] | None,
                 labels: torch.Tensor, cfg: LossConfig) -> ChunkedLoss:
    """Sum of ``cfg.objective`` over positions: hidden states [N, H] -> logits chunk by chunk.

    ``t_hidden`` must be detached (the teacher runs under no_grad); it is None
    for ``objective=ce`` when no teacher metrics are wanted.
    """
    n = s_hidden.shape[0]
    step = cfg.chunk or max(n, 1)
    total = s_hidden.new_zeros((), dtype=torch.float32)
    kl = ce = 0.0

    stats: list[tuple[float, float]] = []

    def chunk_fn(hs: torch.Tensor, ht: torch.Tensor | None, lab: torch.Tensor) -> torch.Tensor:
        zs = s_head(hs)  # [c, V]
        zt = t_head(ht) if ht is not None else None
        stats.append(kl_terms(zs.detach(), zt, lab))  # the curves' KL and CE from the same logits
        return token_loss(zs, zt, lab, cfg.objective, cfg.temperature, cfg.jsd_beta).sum()

    for i in range(0, n, step):
        hs = s_hidden[i:i + step]
        ht = t_hidden[i:i + step] if t_hidden is not None else None
        lab = labels[i:i + step]
        if hs.requires_grad:  # backward recomputes this chunk's logits (and appends to stats again: ignored)
            total = total + checkpoint(chunk_fn, hs, ht, lab, use_reentrant=False)
        else:
            total = total + chunk_fn(hs, ht, lab)
        k, c = stats[-1]
        kl += k
        ce += c
    return ChunkedLoss(total, kl, ce, n)
