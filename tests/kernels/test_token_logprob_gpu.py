"""The fused token log-prob kernels on the GPU at a real vocabulary (Qwen2.5's 152064 words): log-probs, entropy and
the logits' gradient agree with PyTorch's ops, and the rl stage's ``completion_logprobs`` gives the same log-probs
and gradients with the kernel as without."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import token_logprob as k

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _ref(x, t, temperature):
    xf = x.float() / temperature
    lse = torch.logsumexp(xf, -1)
    return xf.gather(-1, t[:, None]).squeeze(-1) - lse, lse, lse - (torch.softmax(xf, -1) * xf).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_pytorch_at_qwen_vocabulary(temperature):
    g = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(1024, 152064, device="cuda", generator=g) * 3).to(torch.bfloat16)
    t = torch.randint(0, 152064, (1024,), device="cuda", generator=g)
    lp, lse, ent = k.token_logprob_fwd(x, t, temperature, with_entropy=True)
    for a, b in zip((lp, lse, ent), _ref(x, t, temperature), strict=True):
        assert ((a - b).abs() / (1 + b.abs())).max().item() < 1e-5
    gl = torch.randn(1024, device="cuda", generator=g)
    xr = x.clone().requires_grad_()
    (_ref(xr, t, temperature)[0] * gl).sum().backward()
    dx = k.token_logprob_bwd(x, t, lse, gl, temperature)
    assert ((dx.float() - xr.grad.float()).abs() > 2.0**-7 * xr.grad.float().abs() + 1e-12).sum().item() == 0


def test_rl_path_is_the_same_with_and_without_the_kernel(monkeypatch):
    from transformers import AutoModelForCausalLM

    from quarl.models import tiny_config
    from quarl.rl.logprobs import completion_logprobs, use_kernel

    torch.manual_seed(0)  # the tiny model's shape, random weights (no tokenizer: the device has no embedded model)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=4096)).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 4096, (4, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :17] = 0
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("QUARL_LOGPROB_KERNEL", flag)
        assert use_kernel(torch.zeros(2, 2, device="cuda")) == (flag == "1")
        model.zero_grad(set_to_none=True)
        logp, ent = completion_logprobs(model, ids, mask, 200, temperature=1.0, with_entropy=True, chunk=64)
        (logp * torch.linspace(-1, 1, 200, device="cuda")).sum().backward()
        out[flag] = logp.detach(), ent, {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    (l0, e0, g0), (l1, e1, g1) = out["0"], out["1"]
    assert (l0 - l1).abs().max() < 1e-4 and (e0 - e1).abs().max() < 1e-4
    for n in g0:  # bf16 gradients of the logits rounded once either way: the weights' gradients agree closely
        cos = torch.nn.functional.cosine_similarity(g0[n].flatten(), g1[n].flatten(), dim=0).item()
        assert cos > 0.9999, (n, cos)
