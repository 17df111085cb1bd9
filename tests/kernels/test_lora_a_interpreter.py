"""The LoRA A GEMM as split partials (``quarl_kernels.lora_a``) on CPU through ``TRITON_INTERPRET=1``: the partials
sum to ``x @ A^T`` for decode row counts, K not a multiple of the K step, R not a multiple of the column block, and
the split rule; bad operands are named. (Its use by the last pass: ``test_epilogue_interpreter.py``.)

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl_kernels import lora_a

    assert [lora_a.splits_for(k) for k in (128, 576, 3584, 4100, 18944)] == [1, 5, 28, 17, 30]
    for m, k, r in ((1, 576, 96), (5, 4100, 40), (17, 3584, 32), (64, 640, 64)):
        torch.manual_seed(m + k)
        x = torch.randn(m, k).to(torch.bfloat16)
        w = (torch.randn(r, k) * 0.05).to(torch.bfloat16)
        parts = lora_a.lora_a_partials(x, w)
        s = lora_a.splits_for(k)
        assert parts.shape == (s, m, r) and parts.dtype == torch.float32
        ref = x.double() @ w.double().T
        got = parts.double().sum(0)
        err = ((got - ref).norm() / ref.norm()).item()
        print("lora_a", m, k, r, s, err)
        assert err < 1e-6, (m, k, r, err)  # bf16 products are exact in fp32; only the fp32 sums round
    xt = torch.randn(8, 256).to(torch.bfloat16).t()  # K stride != 1
    try:
        lora_a.lora_a_partials(xt, torch.randn(4, 8).to(torch.bfloat16))
    except ValueError as e:
        assert "unit K strides" in str(e)
    else:
        raise AssertionError("a strided x was accepted")
    print("OK")
""")


@needs_interpreter
def test_lora_a_partials_under_triton_interpreter():
    run_interpreted(SCRIPT)


@needs_triton
def test_lora_a_builds_for_sm90_without_spills():
    """The launch built for Hopper on a CPU: the products on the tensor cores (HMMA), no spills."""
    import collections

    import torch
    import triton
    from quarl_kernels import lora_a

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    Launch = collections.namedtuple("Launch", "kernel grid args constexprs num_warps")
    for m, k, r in ((1, 3584, 96), (64, 18944, 32)):
        x, w = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(r, k, dtype=torch.bfloat16)
        s = lora_a.splits_for(k)
        out = torch.empty(s, m, r)
        per = triton.cdiv(triton.cdiv(k, lora_a.BK), s) * lora_a.BK  # K per split, as lora_a_partials takes it
        la = Launch(lora_a._lora_a_kernel, None,
                    (x, w, out, m, k, r, per, x.stride(0), w.stride(0), out.stride(0), out.stride(1)),
                    {"BM": lora_a.BM, "BR": lora_a.BR, "BK": lora_a.BK, "INTERPRET": False}, 4)
        kern, sass = compile_launch(la)
        assert "HMMA" in sass, (m, k, r)
        assert stack_bytes(kern) in (0, None), ("ptxas spilled registers", m, k, r)
