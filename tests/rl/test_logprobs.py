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


def test_mismatch_by_hand():
    roll = torch.tensor([[-1.0, -2.0, 0.0]])
    train = torch.tensor([[-1.5, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    m = mismatch(roll, train, mask)
    d = [-0.5, 0.0]  # log(pi_train / pi_rollout) on the two real tokens
    assert m["mismatch/abs_logprob_diff"] == pytest.approx(0.25)
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(0.5)
    assert m["mismatch/kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 2)
