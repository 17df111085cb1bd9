"""Chunked vocabulary projection gives the same log-probs, entropy and gradients as one projection;
the mismatch metric is right on a hand example."""

import math

import pytest
import torch

from quarl.quant import quantize_model
from quarl.rl.logprobs import completion_logprobs, mismatch
from tests.rl.conftest import small_tiny_model


def test_chunked_projection_matches_full_with_gradients():
    model, _ = small_tiny_model()
    quantize_model(model, {"default": "nvfp4", "lora": {"r": 4, "alpha": 8}})
    with torch.no_grad():  # a non-zero adapter, so LoRA gradients are non-trivial
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 2048, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding in one row
    out = {}
    for chunk in (0, 3):
        model.zero_grad()
        lp, ent = completion_logprobs(model, ids, mask, 9, temperature=0.8, with_entropy=True, chunk=chunk)
        lp.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out[chunk] = (lp.detach(), ent, grads)
    torch.testing.assert_close(out[0][0], out[3][0], atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0][1], out[3][1], atol=1e-5, rtol=0)
    assert out[0][2].keys() == out[3][2].keys() and len(out[0][2]) > 0
    for n in out[0][2]:
        scale = float(out[0][2][n].abs().max())  # fp32 summation order differs between the two graphs
        torch.testing.assert_close(out[0][2][n], out[3][2][n], atol=1e-5 * scale, rtol=1e-4)
    # and the log-probs are those of the plain HF forward
    with torch.no_grad():
        logits = model(ids[1:], attention_mask=mask[1:]).logits[:, -10:-1].float() / 0.8
        ref = torch.log_softmax(logits, -1).gather(-1, ids[1:, -9:, None]).squeeze(-1)
    torch.testing.assert_close(out[3][0][1:], ref, atol=1e-5, rtol=0)


def test_padded_rows_run_without_a_mask_and_give_the_masked_log_probs(monkeypatch):
    """Left padding (prompts of different lengths) and trailing padding (answers of different lengths)
    both go through plain causal attention -- no mask, so no fully-masked query rows for the SDPA
    backward -- with the same log-probs and gradients on every real token as the masked HF forward."""
    model, _ = small_tiny_model()
    quantize_model(model, {"default": "nvfp4", "lora": {"r": 4, "alpha": 8}})
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 2048, (4, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # answers of different lengths: trailing padding
    mask[2, 12:] = 0
    mask[2, :3] = 0  # shorter prompts: left padding
    mask[3, :2] = 0
    decoder = model.get_decoder()
    seen = []
    real_forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **kw: seen.append(kw["attention_mask"]) or real_forward(*a, **kw))
    real = mask[:, -9:].bool()
    model.zero_grad()
    lp, _ = completion_logprobs(model, ids, mask, 9)
    lp[real].sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert seen == [None]  # no mask was needed
    monkeypatch.undo()
    model.zero_grad()  # the reference: HF's own masked forward on the original layout
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(ids, attention_mask=mask, position_ids=pos).logits[:, -10:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, -9:, None]).squeeze(-1)
    ref[real].sum().backward()
    torch.testing.assert_close(lp[real], ref[real], atol=1e-5, rtol=0)
    assert len(grads) > 0
    for n, gr in grads.items():
        torch.testing.assert_close(gr, dict(model.named_parameters())[n].grad, atol=1e-5 * float(gr.abs().max()),
                                   rtol=1e-4)


def test_mismatch_by_hand():
    roll = torch.tensor([[-1.0, -2.0, 0.0]])
    train = torch.tensor([[-1.5, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    m = mismatch(roll, train, mask)
    d = [-0.5, 0.0]  # log(pi_train / pi_rollout) on the two real tokens
    assert m["mismatch/abs_logprob_diff"] == pytest.approx(0.25)
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(0.5)
    assert m["mismatch/kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 2)


def test_vouched_layout_gives_the_checked_layouts_log_probs_and_restores_transformers():
    """``trailing_only=True`` (the trainer's word for its rollouts' layout) skips the check and gives the same
    log-probs on every real token; transformers' packed-sequence detection is skipped during the forward only."""
    from transformers import masking_utils

    model, _ = small_tiny_model()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 2048, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a shorter prompt
    mask[1, 9:] = 0  # a shorter answer: trailing padding (positions that stop stepping by one under cumsum)
    real = mask[:, -6:].bool()
    real_find = masking_utils.find_packed_sequence_indices
    with torch.no_grad():
        checked, _ = completion_logprobs(model, ids, mask, 6)
        vouched, _ = completion_logprobs(model, ids, mask, 6, trailing_only=True)
    assert masking_utils.find_packed_sequence_indices is real_find
    torch.testing.assert_close(vouched[real], checked[real], atol=0, rtol=0)
