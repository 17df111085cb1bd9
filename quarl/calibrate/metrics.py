"""Whole-model quality of a quantized model against its full-precision reference.

    compare_models(quant, ref, windows) -> {"kl": ..., "ppl": ..., "ref_ppl": ..., ...}

* KL divergence ``KL(p_ref || p_quant)`` of the next-token distributions, in
  nats, averaged over every position of every held-out window: the direct
  measure of how much quantization changed the policy (what RL starts from).
* Perplexity ``exp(mean NLL)`` of the next token on the same windows, for the
  quantized model and for the reference, so the gap is visible.

Both models run one window batch at a time in float32 log-space; the only
large tensor is one batch of ``[b, L, vocab]`` logits per model, so keep the
batch small for big vocabularies (49k x 256 x 4 B = 50 MB per window).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def compare_models(quant: nn.Module, ref: nn.Module | None, windows: torch.Tensor, batch_size: int = 1) -> dict:
    """Mean KL(ref || quant) per token and perplexities on ``windows`` [n, L]."""
    dev_q = next(quant.parameters()).device
    kl_sum = nll_q = nll_r = 0.0
    n_kl = n_tok = 0
    max_kl = 0.0
    for i in range(0, windows.shape[0], max(1, batch_size)):
        ids = windows[i : i + batch_size]
        lq = quant(input_ids=ids.to(dev_q), use_cache=False).logits.float().log_softmax(-1)  # [b, L, V]
        tgt = ids[:, 1:].to(lq.device)
        nll_q += float(-lq[:, :-1].gather(-1, tgt.unsqueeze(-1)).sum())
        n_tok += tgt.numel()
        if ref is not None:
            dev_r = next(ref.parameters()).device
            lr = ref(input_ids=ids.to(dev_r), use_cache=False).logits.float().log_softmax(-1).to(lq.device)
            nll_r += float(-lr[:, :-1].gather(-1, tgt.unsqueeze(-1)).sum())
            kl = F.kl_div(lq, lr, log_target=True, reduction="none").sum(-1)  # [b, L] = sum p_r (log p_r - log p_q)
            kl_sum += float(kl.sum())
            n_kl += kl.numel()
            max_kl = max(max_kl, float(kl.max()))
            del lr
        del lq
    out = {
        "tokens": n_tok,
        "windows": int(windows.shape[0]),
        "seq_len": int(windows.shape[1]),
        "nll": nll_q / max(n_tok, 1),
        "ppl": math.exp(nll_q / max(n_tok, 1)),
    }
    if ref is not None:
        out.update(
            kl=kl_sum / max(n_kl, 1),
            kl_max_token=max_kl,
            ref_nll=nll_r / max(n_tok, 1),
            ref_ppl=math.exp(nll_r / max(n_tok, 1)),
        )
    return out
