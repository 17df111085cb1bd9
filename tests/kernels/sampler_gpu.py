"""What the sampler kernels' GPU test files share: the marks, Qwen2.5's vocabulary, the switch turned on, and the
check that the kernels draw PyTorch's path's tokens step after step.

Imported first by ``test_sampler_gpu.py`` and ``test_nucleus_gpu.py``; without Triton the import skips the file."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl.engine import sampling

MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

V = 152064  # Qwen2.5's vocabulary


@pytest.fixture(autouse=True)
def switched_on(monkeypatch):  # whatever the caller's environment says
    monkeypatch.setenv(sampling.FUSED_ENV, "1")


def assert_same_draws(rows: int, temperature: float, top_p: float, steps: int) -> None:
    """``steps`` draws from fp32 logits (as the engine's ``st.logits``) through the kernels and through PyTorch's ops,
    each from its own generator of one seed: the same tokens, log-probs to fp32 rounding, the generators in step."""
    g = torch.Generator("cuda").manual_seed(rows)
    logits = torch.randn(rows, V, device="cuda", generator=g) * 4
    ga, gb = torch.Generator("cuda").manual_seed(1), torch.Generator("cuda").manual_seed(1)
    for _ in range(steps):
        tok, lp = sampling.sample(logits, temperature, top_p, ga, fused=True)
        rtok, rlp = sampling.sample(logits, temperature, top_p, gb, fused=False)
        assert torch.equal(tok, rtok), (tok != rtok).sum().item()
        assert ((lp - rlp).abs() / (1 + rlp.abs())).max().item() < 1e-5
    assert torch.equal(ga.get_state(), gb.get_state())
