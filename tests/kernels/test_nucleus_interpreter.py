"""The sort-free nucleus sampler (``quarl_kernels.nucleus``) on CPU through ``TRITON_INTERPRET=1``: its nucleus is
``top_p_mask``'s to the token -- probed at the boundary with noise that makes one chosen token win if and only if it
is kept, wherever the edge's mass is more than 1e-7 from ``top_p`` (at top-p 0.999 a first version, weighing tokens
by ``exp(x - lse)``, kept a token whose mass before it was 0.9990006: lse's own rounding) --, its random draws are the PyTorch path's (the same noise, NumPy's logs standing in for libdevice's), a
compacted batch reads its noise rows, top-p 1 keeps every token, bad input is refused.

Skipped unless Triton is importable and NumPy < 2.3 (see tests/kernels/interpreter.py)."""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, run_interpreted

SCRIPT = textwrap.dedent("""
    import numpy as np
    import torch
    from quarl.engine.sampling import top_p_mask
    from quarl_kernels import nucleus, sampler
    from tests.kernels.interpreter import expect_value_errors

    def scaled(x, T):
        return torch.from_numpy(x.float().numpy() * (np.float32(1.0) / np.float32(T)))  # CUDA's x * (1/T)

    def ref(x, T, top_p, u, rows_of=None):
        xs = scaled(x, T)
        uu = u.numpy()[rows_of.numpy()] if rows_of is not None else u.numpy()[: x.shape[0]]
        g = -np.log(-np.log(np.maximum(uu, np.float32(sampler.TINY))))
        tok = torch.from_numpy(np.argmax(top_p_mask(xs, top_p).numpy() + g, axis=-1))
        return tok, torch.log_softmax(xs.double(), -1).gather(-1, tok[:, None]).squeeze(-1)

    gen = torch.Generator().manual_seed(0)
    # 1. the boundary, token by token: one token's noise made huge wins iff that token is in the nucleus
    for v, T, top_p in ((3000, 1.0, 0.9), (2000, 0.6, 0.95), (700, 1.3, 0.5), (1500, 1.0, 0.999)):
        x = torch.randn(6, v, generator=gen) * 3
        kept = torch.isfinite(top_p_mask(scaled(x, T), top_p))  # [6, v]
        for r in range(6):
            xs = scaled(x, T)[r]
            last_in = int(torch.where(kept[r], xs, float("inf")).argmin())  # the nucleus's smallest logit
            first_out = int(torch.where(kept[r], -float("inf"), xs).argmax()) if not kept[r].all() else None
            probs = torch.softmax(xs.double(), -1)
            for j in (last_in, first_out):
                if j is None:
                    continue
                before = probs[probs > probs[j]].sum().item()  # the mass strictly before j, in float64
                if abs(before - top_p) < 1e-7:  # within fp32 rounding of the edge: either answer is the rule
                    continue
                u = torch.full((1, v), 0.5)
                u[0, j] = 1.0 - 2.0 ** -24  # g = 16.6 against 0.37 everywhere else
                tok, _ = nucleus.nucleus_sample(x[r:r + 1], T, top_p, u)
                want = j if kept[r, j] else int(xs.argmax())
                assert int(tok) == want, (v, T, top_p, r, j, int(tok), want)
        print("boundary", v, T, top_p, int(kept.sum()))

    # 2. random draws: the PyTorch path's tokens, log-probs to fp32 rounding; a compacted batch; bf16, strided rows
    for n, v, dt, T, top_p, compact, strided in ((5, 4000, torch.float32, 0.7, 0.95, False, False),
                                                (4, 3000, torch.bfloat16, 1.0, 0.8, True, True)):
        x = (torch.randn(n, v + (32 if strided else 0), generator=gen) * 3).to(dt)[:, :v]
        full = n + 2 if compact else n
        u = torch.rand(full, v, generator=gen)
        rows_of = torch.randperm(full, generator=gen)[:n] if compact else None
        tok, lp = nucleus.nucleus_sample(x, T, top_p, u, rows_of)
        rtok, rlp = ref(x, T, top_p, u, rows_of)
        assert tok.dtype == torch.int64 and torch.equal(tok, rtok), (tok, rtok)
        assert (lp.double() - rlp).abs().max().item() < 1e-4
        print("draws", n, v, dt, T, top_p, compact)

    # 3. top-p 1: every token kept -- the draw is gumbel_sample's
    x = torch.randn(3, 2500, generator=gen) * 2
    u = torch.rand(3, 2500, generator=gen)
    assert torch.equal(nucleus.nucleus_sample(x, 1.0, 1.0, u)[0], sampler.gumbel_sample(x, 1.0, u)[0])

    expect_value_errors(((lambda: nucleus.nucleus_sample(x, 1.0, 0.0, u), "top_p"),
                         (lambda: nucleus.nucleus_sample(x, 1.0, 0.9, None), "pass u"),
                         (lambda: nucleus.nucleus_sample(x, -1.0, 0.9, u), "temperature")))
    print("OK")
""")


@needs_interpreter
def test_nucleus_under_the_interpreter():
    run_interpreted(SCRIPT, timeout=600)
