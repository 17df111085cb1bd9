"""The sort-free nucleus sampler on the GPU at Qwen2.5's vocabulary (152064 words): ``sample(fused=True)`` below
top-p 1 (``quarl_kernels.nucleus``) draws the tokens of PyTorch's sort-based path from the same generator on fp32
logits (no ties at the nucleus's edge), batch 1 to 300, with a compacted batch's rows; a peaked row's draws follow
the renormalised nucleus."""

from __future__ import annotations

import pytest
import torch

from quarl.engine import sampling
from tests.kernels.sampler_gpu import MARKS, V, assert_same_draws, switched_on  # noqa: F401 - switched_on: an autouse fixture

pytestmark = MARKS


@pytest.mark.parametrize("rows", [1, 64, 300])
@pytest.mark.parametrize(("temperature", "top_p"), [(0.6, 0.95), (1.0, 0.9), (1.0, 0.5)])
def test_same_tokens_as_the_sort(rows, temperature, top_p):
    assert_same_draws(rows, temperature, top_p, steps=2)


def test_compacted_rows_take_their_noise_rows():
    logits = torch.randn(5, V, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 4
    rows_of = torch.tensor([7, 1, 4, 0, 2], device="cuda")
    ga, gb = torch.Generator("cuda").manual_seed(3), torch.Generator("cuda").manual_seed(3)
    a = sampling.sample(logits, 0.6, 0.95, ga, rows_of=rows_of, all_rows=8, fused=True)
    b = sampling.sample(logits, 0.6, 0.95, gb, rows_of=rows_of, all_rows=8, fused=False)
    assert torch.equal(a[0], b[0])


def test_draws_follow_the_nucleus():
    probs = torch.tensor([0.4, 0.2, 0.15, 0.1, 0.1, 0.05], device="cuda")
    logits = torch.full((8000, V), -40.0, device="cuda")
    logits[:, :6] = probs.log()
    tok, lp = sampling.sample(logits, 1.0, 0.7, torch.Generator("cuda").manual_seed(5), fused=True)
    assert int(tok.max()) <= 2  # 0.4 + 0.2 reach 0.6 < 0.7: tokens 0, 1, 2 kept, nothing else
    counts = torch.bincount(tok, minlength=3)[:3].float() / tok.numel()
    torch.testing.assert_close(counts, probs[:3] / probs[:3].sum(), atol=0.025, rtol=0)  # ~4.5 sigma
    torch.testing.assert_close(lp, probs.log()[tok], atol=1e-5, rtol=0)  # of the whole distribution
