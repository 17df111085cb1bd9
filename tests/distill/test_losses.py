"""Distillation objectives against torch references; chunked == unchunked; straight-through gradients."""

import pytest
import torch
import torch.nn.functional as F

from quarl.distill.config import LossConfig
from quarl.distill.losses import chunked_loss, token_loss
from quarl.quant import QuantLinear


def _logits(n=6, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g) * 3, torch.randn(n, v, generator=g) * 3


def test_forward_and_reverse_kl_match_kl_div():
    s, t = _logits()
    fwd = token_loss(s, t, None, "forward_kl")
    ref = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(fwd, ref, rtol=1e-5, atol=1e-6)
    rev = token_loss(s, t, None, "reverse_kl")
    ref_r = F.kl_div(F.log_softmax(t, -1), F.log_softmax(s, -1), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(rev, ref_r, rtol=1e-5, atol=1e-6)
    assert (fwd - rev).abs().max() > 1e-3  # the two directions are different objectives


def test_temperature_scales_by_t_squared():
    s, t = _logits()
    got = token_loss(s, t, None, "forward_kl", temperature=2.0)
    ref = F.kl_div(F.log_softmax(s / 2, -1), F.log_softmax(t / 2, -1), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(got, 4 * ref, rtol=1e-5, atol=1e-6)


def test_jsd_ce_and_mse_against_direct_formulas():
    s, t = _logits()
    ps, pt = s.softmax(-1), t.softmax(-1)
    m = 0.3 * pt + 0.7 * ps
    jsd = 0.3 * (pt * (pt / m).log()).sum(-1) + 0.7 * (ps * (ps / m).log()).sum(-1)
    torch.testing.assert_close(token_loss(s, t, None, "jsd", jsd_beta=0.3), jsd, rtol=1e-5, atol=1e-6)
    labels = torch.arange(6)
    torch.testing.assert_close(token_loss(s, None, labels, "ce"), F.cross_entropy(s, labels, reduction="none"))
    torch.testing.assert_close(token_loss(s, t, None, "mse"), ((s - t) ** 2).mean(-1))
    assert token_loss(t, t, None, "jsd").abs().max() < 1e-6


@pytest.mark.parametrize("objective", ["forward_kl", "reverse_kl", "jsd", "mse", "ce"])
def test_chunked_equals_unchunked_values_and_grads(objective):
    torch.manual_seed(0)
    n, h, v = 37, 16, 300
    hs0, ht = torch.randn(n, h), torch.randn(n, h)
    ws, wt = torch.randn(v, h) * 0.3, torch.randn(v, h) * 0.3
    labels = torch.randint(0, v, (n,))
    out = {}
    for chunk in (0, 5):
        hs = hs0.clone().requires_grad_(True)
        w = ws.clone().requires_grad_(True)
        r = chunked_loss(hs, lambda x, w=w: x @ w.T, ht, lambda x: x @ wt.T, labels,
                         LossConfig(objective=objective, chunk=chunk))
        r.loss_sum.backward()
        out[chunk] = (r.loss_sum.detach(), hs.grad, w.grad, r.kl_sum, r.ce_sum)
    for a, b in zip(out[0], out[5]):
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-4, atol=1e-5)
    # and the unchunked sum is the plain per-token loss summed
    ref = token_loss(hs0 @ ws.T, ht @ wt.T, labels, objective).sum()
    torch.testing.assert_close(out[0][0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["nvfp4", "int3-g32"])
def test_ste_gradient_is_the_gradient_at_the_quantized_weight(spec):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24, bias=False)
    q = QuantLinear.from_linear(lin, spec, mode="qat")
    x = torch.randn(5, 64)
    y = q(x)
    wq = q.dequantized_weight().detach().requires_grad_(True)  # the fake-quantized weight, as a leaf
    torch.testing.assert_close(y, F.linear(x, wq))
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (F.linear(x, wq) * g).sum().backward()
    # straight-through: d loss / d latent == d loss / d quantized weight (identity through rounding)
    torch.testing.assert_close(q.weight.grad, wq.grad)
    assert not torch.equal(wq.detach(), q.weight.detach())  # the forward really is quantized
