"""The fused sampler on the GPU at Qwen2.5's vocabulary (152064 words): ``sample(fused=True)`` (the Triton kernels)
draws the very tokens of ``sample(fused=False)`` (PyTorch's ops) from the same generator -- bit for bit, which
needs libdevice's ``logf`` to be CUDA's and the scaled logits to be PyTorch's ``a * (1/T)`` -- at batch 1 to 300,
with a temperature, a compacted batch's rows, and greedy; log-probs to fp32 rounding; the generator left where
PyTorch's path leaves it."""

from __future__ import annotations

import pytest
import torch

from quarl.engine import sampling
from tests.kernels.sampler_gpu import MARKS, V, assert_same_draws, switched_on  # noqa: F401 - switched_on: an autouse fixture

pytestmark = MARKS


@pytest.mark.parametrize("rows", [1, 8, 64, 300])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("top_p", [1.0, sampling.GREEDY_TOP_P / 2])
def test_same_tokens_as_pytorch(rows, temperature, top_p):
    assert sampling.fused_sampler() is not None
    assert_same_draws(rows, temperature, top_p, steps=3)  # three steps: the generators must stay in step


def test_compacted_rows_take_their_noise_rows():
    g = torch.Generator("cuda").manual_seed(0)
    logits = torch.randn(5, V, device="cuda", generator=g) * 4
    rows_of = torch.tensor([7, 1, 4, 0, 2], device="cuda")
    ga, gb = torch.Generator("cuda").manual_seed(3), torch.Generator("cuda").manual_seed(3)
    tok, lp = sampling.sample(logits, 0.9, 1.0, ga, rows_of=rows_of, all_rows=8, fused=True)
    rtok, rlp = sampling.sample(logits, 0.9, 1.0, gb, rows_of=rows_of, all_rows=8, fused=False)
    assert torch.equal(tok, rtok)
    assert ((lp - rlp).abs() / (1 + rlp.abs())).max().item() < 1e-5


def test_bf16_logits_and_the_distribution():
    """bf16 logits read as they are; a peaked row's draws follow its softmax (the kernel is a sampler, not only a
    copy of another one)."""
    probs = torch.tensor([0.5, 0.3, 0.2], device="cuda")
    logits = torch.full((8000, V), -30.0, device="cuda", dtype=torch.bfloat16)
    logits[:, :3] = probs.log().bfloat16()
    tok, lp = sampling.sample(logits, 1.0, 1.0, torch.Generator("cuda").manual_seed(5), fused=True)
    counts = torch.bincount(tok, minlength=3)[:3].float() / tok.numel()
    torch.testing.assert_close(counts, probs, atol=0.025, rtol=0)  # ~4.5 sigma at n = 8000
    torch.testing.assert_close(lp, probs.log()[tok.clamp(max=2)], atol=0.01, rtol=0)  # bf16 logits of log p
