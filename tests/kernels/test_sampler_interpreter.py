"""The fused sampler (``quarl_kernels.sampler``) on CPU through ``TRITON_INTERPRET=1``: the token is exactly the
argmax of ``logits * (1/T) + g(u)`` -- the first index on ties, the noise row picked by ``rows_of`` -- and greedy the
argmax of ``logits * (1/T)``, over vocabularies of one and many splits, fp32 and bf16 logits, strided rows; the
log-prob is ``log_softmax`` at the token to fp32 rounding; bad inputs are refused.

The reference draws its noise with NumPy's float32 logs, which the interpreter's kernels use in place of libdevice
(on the GPU: tests/kernels/test_sampler_gpu.py, against ``quarl.engine.sampling.sample`` itself). Skipped unless
Triton is importable and NumPy < 2.3 (see tests/kernels/interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, run_interpreted

SCRIPT = textwrap.dedent("""
    import numpy as np
    import torch
    from quarl_kernels import sampler as k
    from tests.kernels.interpreter import expect_value_errors

    def ref(x, T, u=None, rows_of=None):
        inv = np.float32(1.0) / np.float32(T)
        xs = x.float().numpy() * inv  # float32 * float32, rounded once
        lp = torch.log_softmax(torch.from_numpy(xs).double(), -1)
        if u is None:
            y = xs
        else:
            uu = u.numpy()[rows_of.numpy()] if rows_of is not None else u.numpy()[: x.shape[0]]
            uu = np.maximum(uu, np.float32(k.TINY))
            y = xs + -np.log(-np.log(uu))  # float32 throughout, as the kernel under the interpreter
        tok = torch.from_numpy(np.argmax(y, axis=-1))  # NumPy's argmax: the first index of the max
        return tok, lp.gather(-1, tok[:, None]).squeeze(-1)

    g = torch.Generator().manual_seed(0)
    cases = [  # rows, vocabulary, dtype, T, strided, rows_of
        (3, 700, torch.float32, 1.0, False, False),     # one split, one block
        (2, 9000, torch.float32, 0.7, False, False),    # several splits (4 "SMs" here)
        (5, 5000, torch.bfloat16, 1.3, True, False),    # bf16 logits, rows wider than V
        (4, 6000, torch.float32, 1.0, False, True),     # a compacted batch: noise rows picked by rows_of
    ]
    for n, v, dt, T, strided, compact in cases:
        x = (torch.randn(n, v + (64 if strided else 0), generator=g) * 3).to(dt)[:, :v]
        full = n + 3 if compact else n
        u = torch.rand(full, v, generator=g)
        rows_of = torch.randperm(full, generator=g)[:n] if compact else None
        for noise in (True, False):
            tok, lp = k.gumbel_sample(x, T, u if noise else None, rows_of if noise else None)
            rtok, rlp = ref(x, T, u if noise else None, rows_of if noise else None)
            assert tok.dtype == torch.int64 and lp.dtype == torch.float32
            assert torch.equal(tok, rtok), (n, v, noise, tok, rtok)
            err = (lp.double() - rlp).abs().max().item()
            print(n, v, dt, T, compact, noise, err)
            assert err < 1e-4, err

    # ties: every entry equal -> the first index (torch.argmax's answer), in any split
    x = torch.zeros(2, 5000)
    tok, lp = k.gumbel_sample(x, 1.0)
    assert tok.tolist() == [0, 0], tok
    assert torch.allclose(lp, torch.full((2,), -float(np.log(5000.0))), atol=1e-5), lp
    x[0, 4100] = 1.0; x[0, 4200] = 1.0  # two equal maxima in a later split
    assert k.gumbel_sample(x, 1.0)[0].tolist() == [4100, 0]

    # the split rule: about PROGRAMS_PER_SM programs an SM, splits of whole blocks, at least one
    assert k.splits(1, 152064, 132) == (149, 1024)
    S, split = k.splits(64, 152064, 132)
    assert split % k.BLOCK == 0 and S * split >= 152064 > (S - 1) * split and S == 9
    assert k.splits(1000, 500, 132) == (1, 1024)

    expect_value_errors(((lambda: k.gumbel_sample(x, 0.0), "temperature"),
                         (lambda: k.gumbel_sample(x, 1.0, torch.rand(2, 10)), "u must be"),
                         (lambda: k.gumbel_sample(x, 1.0, torch.rand(1, 5000)), "rows_of")))
    print("OK")
""")


@needs_interpreter
def test_sampler_under_the_interpreter():
    run_interpreted(SCRIPT)
