"""The fused token log-prob kernels (``quarl_kernels.token_logprob``) on CPU through ``TRITON_INTERPRET=1``:
log-probs, logsumexp, entropy and the logits' gradient agree with PyTorch's ops (the rl stage's reference path)
for bf16 and fp32 logits, vocabularies of one and several slices, strided rows and a temperature; and
``quarl.rl.logprobs.completion_logprobs`` gives the same log-probs and parameter gradients with the kernel (chunked,
recomputed in backward) as without.

Skipped unless Triton is importable and NumPy < 2.3 (see tests/kernels/interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, run_interpreted

SCRIPT = textwrap.dedent("""
    import os
    import torch
    from quarl_kernels import token_logprob as k

    def ref(x, t, T):
        xf = x.float() / T
        lse = torch.logsumexp(xf, -1)
        return xf.gather(-1, t[:, None]).squeeze(-1) - lse, lse, lse - (torch.softmax(xf, -1) * xf).sum(-1)

    torch.manual_seed(0)
    cases = [(5, 1000, torch.bfloat16, 1.0, False), (3, 9000, torch.bfloat16, 0.7, True), (4, 5000, torch.float32, 1.3, False)]
    for n, v, dt, T, strided in cases:
        x = (torch.randn(n, v + (64 if strided else 0)) * 4).to(dt)[:, :v]  # strided: rows wider than V
        t = torch.randint(0, v, (n,))
        lp, lse, ent = k.token_logprob_fwd(x, t, T, with_entropy=True)
        rlp, rlse, rent = ref(x, t, T)
        for name, a, b in (("logp", lp, rlp), ("lse", lse, rlse), ("entropy", ent, rent)):
            err = ((a - b).abs() / (1 + b.abs())).max().item()  # fp32 sums in another order: relative ~1e-6
            print(name, n, v, dt, T, err)
            assert a.dtype == torch.float32 and err < 1e-5, (name, err)
        assert k.token_logprob_fwd(x, t, T)[2] is None
        g = torch.randn(n)
        xr = x.detach().clone().requires_grad_()
        (ref(xr, t, T)[0] * g).sum().backward()
        dx = k.token_logprob_bwd(x, t, lse, g, T)
        assert dx.dtype == dt and dx.shape == x.shape
        ulp = 2.0 ** -7 if dt == torch.bfloat16 else 1e-6  # both round an fp32 value to dt: at most 1 ulp apart
        bad = ((dx.float() - xr.grad.float()).abs() > ulp * xr.grad.float().abs() + 1e-12).sum().item()
        print("grad", n, v, dt, bad)
        assert bad == 0, bad
    try:
        k.token_logprob_fwd(torch.randn(4, 8).t(), torch.zeros(8, dtype=torch.long))
    except ValueError as e:
        assert "contiguous vocabulary axis" in str(e)
    else:
        raise AssertionError("a column-major logits tensor was accepted")

    # through the rl stage's path: chunked, each chunk recomputed in backward
    import warnings
    from quarl.models import tiny_model
    from quarl.rl.logprobs import completion_logprobs, use_kernel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = tiny_model("llama", vocab_size=2048)
    ids = torch.randint(0, 2048, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded prompt
    out = {}
    for flag in ("0", "1"):
        os.environ["QUARL_LOGPROB_KERNEL"] = flag
        assert use_kernel(torch.zeros(2, 2)) == (flag == "1")
        model.zero_grad(set_to_none=True)
        logp, ent = completion_logprobs(model, ids, mask, 12, temperature=0.9, with_entropy=True, chunk=5)
        (logp * torch.linspace(-1, 1, 12)).sum().backward()
        out[flag] = logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    (l0, e0, g0), (l1, e1, g1) = out["0"], out["1"]
    print("rl path", (l0 - l1).abs().max().item(), (e0 - e1).abs().max().item())
    assert (l0 - l1).abs().max() < 1e-5 and (e0 - e1).abs().max() < 1e-5
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-4, atol=1e-6), n
    print("OK")
""")


@needs_interpreter
def test_token_logprob_matches_pytorch_and_the_rl_path():
    run_interpreted(SCRIPT, timeout=600)
