"""The LoRA A GEMM inside the GEMV launch (``quarl_kernels.lora_a``) on CPU through ``TRITON_INTERPRET=1``.

The GEMV launch with ``Epilogue(lora_a=...)``: its extra programs' fp32 partials sum to ``x @ A^T`` (M = 1..3,
K of one and of two K ranges and not a multiple of the K step, adapter rows not a multiple of the row block), the
weight tiles after them are unchanged, and the last pass finishes ``y`` from the partials exactly as from ``a``
given as their rounded sum. ``fill_partials`` (any other route) gives ``F.linear``'s value. Then the engine's
constant against the kernels' and the build for sm_90 (no spills, the weight loop unchanged).

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.ops import _packed_weight, _reference_weight, _sum_parts
    from tests.kernels.helpers import qweight

    assert [lora_a.splits_for(k) for k in (576, 3584, 4096, 4608, 18944)] == [1, 1, 1, 2, 5]
    assert [lora_a.k_per_split(k) for k in (576, 4608, 18944)] == [1024, 2560, 4096]
    # more rows (the mma.sync launch): about MMA_SPLITS ranges where K has the BK steps for them
    assert [lora_a.splits_for(k, 8) for k in (576, 3584, 4608, 18944)] == [2, 4, 3, 5]
    C = gemv.GemvConfig
    for spec, m, n, k, gr, r, cfg in [("nvfp4", 1, 48, 576, 96, 32, C(16, 8, 4, 4)),
                                      ("nvfp4", 2, 40, 4608, 42, 14, C(16, 32, 4, 4, stages=3)),
                                      ("mxfp4", 3, 24, 640, 8, 4, C(16, 8, 2, 4))]:
        torch.manual_seed(m * 11 + k)
        args, _ = qweight(spec, n, k, device="cpu")
        pw = _packed_weight(*args)
        x = torch.randn(m, k).to(torch.bfloat16)
        amat = (torch.randn(gr, k) * 0.05).to(torch.bfloat16)
        b = (torch.randn(n, r) * 0.2).to(torch.bfloat16)
        bias = torch.randn(n).to(torch.bfloat16)
        la = lora_a.new_partials(x, amat)
        la.out.fill_(float("nan"))  # every element must be written by the launch
        lo = gr - r  # the last projection's columns
        y = gemv.launch_gemv(x, pw, cfg, use_asm=False, epi=Epilogue(bias, la.out[..., lo:], b, 0.5, lora_a=la))
        s = lora_a.splits_for(k, m)
        assert la.out.shape == (s, m, gr) and not torch.isnan(la.out).any(), (spec, m, k)
        ref_a = x.double() @ amat.double().T
        err = ((la.out.double().sum(0) - ref_a).norm() / ref_a.norm()).item()
        print("lora_a in the gemv", spec, m, n, k, gr, s, err)
        assert err < 1e-6, (spec, m, k, err)  # bf16 products are exact in fp32; only the fp32 sums round
        # the same launch given a as the partials' rounded sum: the same bits
        a_sum = _sum_parts(la.out[..., lo:]).to(torch.bfloat16)
        y2 = gemv.launch_gemv(x, pw, cfg, use_asm=False, epi=Epilogue(bias, a_sum, b, 0.5))
        assert torch.equal(y, y2), (spec, m, (y.float() - y2.float()).abs().max())
        w = _reference_weight(*args, dtype=torch.float32)
        ref = x.float() @ w.T + bias.float() + 0.5 * a_sum.float() @ b.float().T
        rel = ((y.float() - ref).norm() / ref.norm()).item()
        assert rel < 1.5e-2, (spec, m, rel)
        # any other route: F.linear's rounded value in split 0, zeros after
        fill = lora_a.new_partials(x, amat)
        lora_a.fill_partials(x, fill)
        assert torch.equal(_sum_parts(fill.out).to(torch.bfloat16), F.linear(x, amat))
    # a buffer of the wrong shape is named, not written out of bounds
    x = torch.randn(1, 576).to(torch.bfloat16)
    try:
        lora_a.LoraA(torch.randn(8, 576).to(torch.bfloat16), torch.empty(2, 1, 8)).check(1, 576)
    except ValueError as e:
        assert "splits_for(576, 1) = 1" in str(e)
    else:
        raise AssertionError("a wrong partials buffer was accepted")
    print("OK")
""")


@needs_interpreter
def test_lora_a_in_the_gemv_under_triton_interpreter():
    run_interpreted(SCRIPT)


@needs_triton
def test_engine_and_kernels_agree_on_the_rows_it_serves():
    from quarl_kernels import lora_a, mma_decode, wo_gemm

    from quarl.engine import lora as lp

    assert lp.A_MAX_M == lora_a.MAX_M
    # the rows the GEMV (1) and the mma.sync kernel at its token tiles 8 / 16 serve by default: both carry the A
    assert wo_gemm.MMA_DECODE_MIN_M == 2 and mma_decode.token_tile(lora_a.MAX_M) == 16
    assert all(mma_decode.preferred(m, 512, 3584) for m in range(2, lora_a.MAX_M + 1))


@needs_triton
def test_gemv_with_lora_a_builds_for_sm90_without_spills():
    """The 7B decode launches with the A programs, built for Hopper on a CPU as launched (FP contraction on): no
    spills, and no fewer programs per SM by registers than the launch without them (or <= 128 registers: still 4
    programs of 128 threads per SM). At 3 rows both builds take 228-230 registers (2 programs per SM)."""
    import torch
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, ctas_per_sm, registers, stack_bytes

    for m, n, k, gr in ((1, 3584, 3584, 96), (1, 3584, 18944, 32), (3, 37888 // 2, 3584, 64)):
        words = torch.empty(n, k // 8, dtype=torch.int32)
        pw = PackedWeight(0, 16, n, k, words, torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
        x = torch.empty(m, k, dtype=torch.bfloat16)
        la = lora_a.new_partials(x, torch.empty(gr, k, dtype=torch.bfloat16))
        cfg = gemv.default_gemv_config(0, m, n, k)
        plain = gemv.gemv_launch(x, pw, cfg)
        fused = gemv.gemv_launch(x, pw, cfg, epi=Epilogue(None, la.out[..., :32], torch.empty(n, 32), 1.0, lora_a=la))
        assert fused.grid[0] == plain.grid[0] + lora_a.programs(gr, k, m)
        k0, _ = compile_launch(plain)
        k1, _ = compile_launch(fused)
        assert stack_bytes(k1) in (0, None), ("ptxas spilled registers", m, n, k)
        r0, r1 = registers(k0), registers(k1)
        print("registers", m, n, k, r0, r1)
        assert r1 is None or r1 <= 128 or ctas_per_sm(r1, plain.num_warps) >= ctas_per_sm(r0, plain.num_warps), \
            (m, n, k, r0, r1)
