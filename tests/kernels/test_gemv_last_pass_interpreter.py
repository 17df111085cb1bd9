"""The GEMV's own last pass (``gemv._last_pass``, ``QUARL_GEMV_LAST_PASS``) on CPU through ``TRITON_INTERPRET=1``,
and its sm_90 build.

A one-row launch split over K counts each split's partial per output tile; the split that counts last sums them and
runs ``launch.epilogue_tile`` (bias, LoRA B with ``a`` or with the launch's own A partials, the MLP's gate) in the
same launch. Here: bit-equal to the separate last pass (``launch.finish``) for every epilogue kind, the arrival
counters back at zero after each launch (a CUDA-graph replay starts from zero), and launches it does not serve (two
rows, one split) unchanged. The interpreter runs programs one after another, so it checks the arithmetic and the
counting, not concurrency: the GPU test (``test_epilogue_gpu.py``) does that, inside a CUDA graph.

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl.quant import get_format, make_config
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue, finish
    from quarl_kernels.ops import _packed_weight

    C = gemv.GemvConfig
    pws = {}
    for spec, n, k, cfg in (("nvfp4", 48, 576, C(16, 8, 4, 4)), ("mxfp4", 40, 4608, C(16, 32, 4, 4, stages=3)),
                            ("int4-g128", 36, 512, C(16, 16, 4, 4))):
        torch.manual_seed(n + k)
        c = make_config(spec)
        q = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c)
        t = q.tensors
        pw = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                            t.get("weight_global_scale"), c.name, getattr(c, "block_size", None) or c.group_size, n, k)
        x = torch.randn(1, k).to(torch.bfloat16)
        amat = (torch.randn(96, k) * 0.05).to(torch.bfloat16)
        b = (torch.randn(n, 32) * 0.2).to(torch.bfloat16)
        bias = torch.randn(n).to(torch.bfloat16)
        gate = (torch.randn(1, n) * 3).to(torch.bfloat16)
        a = torch.randn(1, 32).to(torch.bfloat16)
        kinds = {"none": lambda: None, "bias": lambda: Epilogue(bias), "lora": lambda: Epilogue(None, a, b, 0.5),
                 "gate": lambda: Epilogue(bias, a, b, 0.5, gate=gate)}

        def with_a():
            la = lora_a.new_partials(x, amat)
            return Epilogue(bias, la.out[..., 64:], b, 0.5, lora_a=la, gate=gate)

        kinds["lora_a"] = with_a
        for name, make in kinds.items():
            outs = []
            for fuse in (False, True):
                epi = make()
                L = gemv.gemv_launch(x, pw, cfg, use_asm=False, epi=epi, fuse=fuse)
                assert (L.split == 0) == fuse and (L.constexprs.get("FUSE", False) == fuse), (name, fuse, L.split)
                L.kernel[L.grid](*L.args, **L.constexprs, num_warps=L.num_warps, num_stages=L.num_stages)
                outs.append(L.y if L.split == 0 else finish(L.out, L.y, L.split, epi))
                cnt = gemv._COUNTERS.get(("cpu", None))
                assert cnt is None or not cnt.any(), ("counters left set", name)
            assert torch.equal(outs[0], outs[1]), (spec, name, (outs[0].float() - outs[1].float()).abs().max())
            print("last pass in the launch", spec, name, "bit-equal")
        pws[spec] = pw
    # launches it does not serve: two rows (the GEMV at M = 2), or one split (a launch that fills the GPU unsplit)
    x2 = torch.randn(2, 576).to(torch.bfloat16)
    assert gemv.gemv_launch(x2, pws["nvfp4"], C(16, 8, 4, 4), fuse=True).split > 0
    one = gemv.gemv_launch(torch.randn(1, 576).to(torch.bfloat16), pws["nvfp4"], C(16, 8, 4, 4, waves=0), fuse=True)
    assert one.split == 1 and "FUSE" not in one.constexprs
    print("OK")
""")


@needs_interpreter
def test_gemv_last_pass_under_triton_interpreter():
    run_interpreted(SCRIPT)


@needs_triton
def test_gemv_last_pass_builds_for_sm90_without_spills():
    """The 7B one-row launches with their own last pass (q with the group's A programs, k plain, up with the gate,
    down with five A ranges), built for Hopper on a CPU: no spills, and no fewer CTAs per SM by registers than the
    launch without it."""
    import torch
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, registers, stack_bytes

    for n, k, gr, gate in ((3584, 3584, 96, False), (512, 3584, 0, False), (18944, 3584, 64, True),
                           (3584, 18944, 32, False)):
        words = torch.empty(n, k // 8, dtype=torch.int32)
        pw = PackedWeight(0, 16, n, k, words, torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
        x = torch.empty(1, k, dtype=torch.bfloat16)
        b, bias = torch.empty(n, 32, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
        g = torch.empty(1, n, dtype=torch.bfloat16) if gate else None
        if gr:
            la = lora_a.new_partials(x, torch.empty(gr, k, dtype=torch.bfloat16))
            epi = Epilogue(bias, la.out[..., :32], b, 1.0, lora_a=la, gate=g)
        else:
            epi = Epilogue(bias, torch.empty(1, 96, dtype=torch.bfloat16)[:, 32:64], b, 1.0, gate=g)
        cfg = gemv.default_gemv_config(0, 1, n, k)
        sep = gemv.gemv_launch(x, pw, cfg, epi=epi, fuse=False)
        own = gemv.gemv_launch(x, pw, cfg, epi=epi, fuse=True)
        assert own.constexprs["FUSE"] and own.split == 0, (n, k)
        k0, _ = compile_launch(sep)
        k1, _ = compile_launch(own)
        r0, r1 = registers(k0), registers(k1)
        print("registers", n, k, gr, gate, r0, r1)
        assert stack_bytes(k1) in (0, None), ("ptxas spilled registers", n, k)
        per_sm = 65536 // (32 * cfg.warps)  # registers of one CTA's threads, per register of a thread
        assert r1 is None or per_sm // r1 >= per_sm // r0, (n, k, r0, r1)  # no fewer CTAs per SM
