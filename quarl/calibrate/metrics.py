"""Whole-model quality of a quantized model against its full-precision reference.

    compare_models(quant, ref, windows) -> {"kl": ..., "ppl": ..., "ref_ppl": ..., ...}
    cmp = BlockwiseComparison(windows); ... -> the same numbers, one decoder block at a time
    compare_blockwise(quant, ref, windows, onload=Onloader("cuda")) -> the same, two host models

* KL divergence ``KL(p_ref || p_quant)`` of the next-token distributions, in
  nats, averaged over every position of every held-out window: the direct
  measure of how much quantization changed the policy (what RL starts from).
* Perplexity ``exp(mean NLL)`` of the next token on the same windows, for the
  quantized model and for the reference, so the gap is visible.

Both models run one window batch at a time in float32 log-space; the only
large tensor is one batch of ``[b, L, vocab]`` logits per model, so keep the
batch small for big vocabularies (49k x 256 x 4 B = 50 MB per window).

Block by block (sequential onloading, ``quarl.calibrate.onload``): the inputs of
block 0 are captured once for the held-out windows (the embeddings are the same in
both models); two hidden-state caches -- reference and quantized -- then go
through the blocks, the reference one through block i's dense weights *before* the
block is quantized and the quantized one through the packed block right after, so
neither a second model nor a copy of the dense weights is ever needed; the final
norm and ``lm_head`` turn both caches into logits batch by batch, and the same
tally as :func:`compare_models` is kept. Same batches, same ops: on a CPU the two
give the same numbers to the last bit in the tests (the contract is fp32 rounding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class _Tally:
    """Sums of NLL (quantized, reference) and KL over the held-out tokens."""

    def __init__(self, windows: torch.Tensor, with_ref: bool):
        self.windows, self.with_ref = windows, with_ref
        self.kl_sum = self.nll_q = self.nll_r = 0.0
        self.n_kl = self.n_tok = 0
        self.max_kl = 0.0

    def add(self, ids: torch.Tensor, lq: torch.Tensor, lr: torch.Tensor | None) -> None:
        """``lq``/``lr`` [b, L, V]: float32 log-probabilities of the quantized / reference model."""
        tgt = ids[:, 1:].to(lq.device)
        self.nll_q += float(-lq[:, :-1].gather(-1, tgt.unsqueeze(-1)).sum())
        self.n_tok += tgt.numel()
        if lr is not None:
            self.nll_r += float(-lr[:, :-1].gather(-1, tgt.unsqueeze(-1)).sum())
            kl = F.kl_div(lq, lr, log_target=True, reduction="none").sum(-1)  # [b, L] = sum p_r (log p_r - log p_q)
            self.kl_sum += float(kl.sum())
            self.n_kl += kl.numel()
            self.max_kl = max(self.max_kl, float(kl.max()))

    def result(self) -> dict:
        n = max(self.n_tok, 1)
        out = {
            "tokens": self.n_tok,
            "windows": int(self.windows.shape[0]),
            "seq_len": int(self.windows.shape[1]),
            "nll": self.nll_q / n,
            "ppl": math.exp(self.nll_q / n),
        }
        if self.with_ref:
            out.update(kl=self.kl_sum / max(self.n_kl, 1), kl_max_token=self.max_kl,
                       ref_nll=self.nll_r / n, ref_ppl=math.exp(self.nll_r / n))
        return out


@torch.no_grad()
def compare_models(quant: nn.Module, ref: nn.Module | None, windows: torch.Tensor, batch_size: int = 1) -> dict:
    """Mean KL(ref || quant) per token and perplexities on ``windows`` [n, L]."""
    dev_q = next(quant.parameters()).device
    tally = _Tally(windows, ref is not None)
    for i in range(0, windows.shape[0], max(1, batch_size)):
        ids = windows[i : i + batch_size]
        lq = quant(input_ids=ids.to(dev_q), use_cache=False).logits.float().log_softmax(-1)  # [b, L, V]
        lr = None
        if ref is not None:
            dev_r = next(ref.parameters()).device
            lr = ref(input_ids=ids.to(dev_r), use_cache=False).logits.float().log_softmax(-1).to(lq.device)
        tally.add(ids, lq, lr)
        del lq, lr
    return tally.result()


class BlockwiseComparison:
    """:func:`compare_models` one decoder block at a time (see the module docstring).

        cmp = BlockwiseComparison(windows, batch_size)
        cmp.capture(model, device)        # stem on `device`: inputs of block 0 for both caches
        for block i: cmp.reference(block_i_dense); ...quantize...; cmp.quantized(block_i_packed)
        cmp.finish(norm, lm_head)         # on the device (ref_head=: a dense copy if lm_head was quantized)
    """

    def __init__(self, windows: torch.Tensor, batch_size: int = 1):
        self.windows, self.batch_size = windows, max(1, batch_size)
        self.ref: list[tuple[torch.Tensor, dict]] = []
        self.quant: list[tuple[torch.Tensor, dict]] = []

    def batches(self) -> list[torch.Tensor]:
        return [self.windows[i : i + self.batch_size] for i in range(0, self.windows.shape[0], self.batch_size)]

    def capture(self, model: nn.Module, device: torch.device) -> None:
        from quarl.calibrate.sequential import capture_block_inputs

        self.ref = capture_block_inputs(model, self.batches(), device)
        self.quant = list(self.ref)  # the same embeddings; the caches part at block 0

    def reference(self, block: nn.Module) -> None:
        self.ref = self._step(block, self.ref)

    def quantized(self, block: nn.Module) -> None:
        self.quant = self._step(block, self.quant)

    @staticmethod
    @torch.no_grad()
    def _step(block: nn.Module, cache: list[tuple[torch.Tensor, dict]]) -> list[tuple[torch.Tensor, dict]]:
        from quarl.calibrate.sequential import run_block

        return [(o, kw) for o, (_, kw) in zip(run_block(block, cache), cache)]

    @torch.no_grad()
    def finish(self, norm: nn.Module, head: nn.Module, ref_norm: nn.Module | None = None,
               ref_head: nn.Module | None = None) -> dict:
        """The metrics of :func:`compare_models` (the reference's norm / head default to the same
        modules: the final norm is never quantized, ``lm_head`` only by an explicit recipe); frees
        both caches."""
        tally = _Tally(self.windows, True)
        ref_norm = norm if ref_norm is None else ref_norm
        ref_head = head if ref_head is None else ref_head
        for ids, (hq, _), (hr, _) in zip(self.batches(), self.quant, self.ref):
            lq = head(norm(hq)).float().log_softmax(-1)  # [b, L, V]
            lr = ref_head(ref_norm(hr)).float().log_softmax(-1).to(lq.device)
            tally.add(ids, lq, lr)
            del lq, lr
        self.ref, self.quant = [], []
        return tally.result()


@torch.no_grad()
def compare_blockwise(quant: nn.Module, ref: nn.Module, windows: torch.Tensor, batch_size: int = 1,
                      onload=None) -> dict:
    """:func:`compare_models` of two models of the same architecture, block by block: with
    ``onload`` (a :class:`quarl.calibrate.onload.Onloader`) both stay on the host and one block of
    each is on the device at a time."""
    from quarl.calibrate.onload import head_modules, stem_modules
    from quarl.calibrate.sequential import decoder_blocks

    _, qb = decoder_blocks(quant)
    _, rb = decoder_blocks(ref)
    dev = onload.device if onload is not None else next(ref.parameters()).device
    move, back = (onload.onload, onload.offload) if onload is not None else (lambda *m: None, lambda *m: None)
    cmp = BlockwiseComparison(windows, batch_size)
    stem = stem_modules(ref, rb)
    move(*stem)
    cmp.capture(ref, dev)
    back(*stem)
    for q, r in zip(qb, rb):
        move(r)
        cmp.reference(r)
        back(r)
        move(q)
        cmp.quantized(q)
        back(q)
    (nq, hq), (nr, hr) = head_modules(quant, qb), head_modules(ref, rb)
    move(nq, hq, nr, hr)
    try:
        return cmp.finish(nq, hq, ref_norm=nr, ref_head=hr)
    finally:
        back(nq, hq, nr, hr)
