"""A LoRA group's last passes as one launch (``group_pass.finish_group``) on CPU through ``TRITON_INTERPRET=1``.

Against one ``launch.finish`` per projection on the same fp32 split partials: bit-equal for q/k/v of different
widths (bias, the LoRA ``a`` as split partials or as a plain ``[M, r]``), for gate / up with the activation
(``gate_act``: gate written, and ``silu(gate) * up``), for q/k/v with a decode step's RoPE and K/V cache write
in the pass (against the passes, then ``rope.rope_qk_cache``), at one row (the register-broadcast LoRA term) and at
several (the tl.dot tiles), split or not (in place). One kernel launch for the group; ``QUARL_GROUP_PASS=0`` and
groups the kernel does not take (adapters of different ranks) run one pass each.

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import os
    import torch
    from quarl_kernels import group_pass, launch
    from quarl_kernels.launch import Epilogue

    launches = []
    real = group_pass.group_epilogue_kernel
    class Count:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]
    group_pass.group_epilogue_kernel = Count()

    def case(m, ns, split, r, parts, gate_act, bias, rs=None):
        g = torch.Generator().manual_seed(m * 100 + split + r)
        rs = rs or [r] * len(ns)
        outs = [torch.randn(split, m, n, generator=g) for n in ns] if split > 1 else [None] * len(ns)
        sa = 3
        a_all = (torch.randn(sa, m, sum(rs), generator=g) if parts else torch.randn(m, sum(rs), generator=g).to(torch.bfloat16))
        epis, lo = [], 0
        for j, n in enumerate(ns):
            b = (torch.randn(n, rs[j], generator=g) * 0.3).to(torch.bfloat16)
            bi = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
            epis.append(Epilogue(bi, a_all[..., lo:lo + rs[j]], b, 0.5))
            lo += rs[j]
        def ys0():
            gen = torch.Generator().manual_seed(7)
            return [torch.randn(m, n, generator=gen).to(torch.bfloat16) for n in ns]  # the unsplit case: in place
        y_g, y_r = ys0(), ys0()
        pg = [(outs[j] if split > 1 else y_g[j], y_g[j]) for j in range(len(ns))]
        pr = [(outs[j] if split > 1 else y_r[j], y_r[j]) for j in range(len(ns))]
        before = len(launches)
        got = group_pass.finish_group(pg, split, epis, gate_act)
        n_launch = len(launches) - before
        ref = launch.each_in_group(epis, gate_act, lambda j, e: launch.finish(*pr[j], split, e))
        for j, (a, b) in enumerate(zip(got, ref)):
            assert torch.equal(a, b), (m, ns, split, parts, gate_act, j, (a.float() - b.float()).abs().max())
        return n_launch

    for m in (1, 3):
        for split in (1, 4):
            for parts in (True, False):
                assert case(m, [64, 16, 24], split, 8, parts, False, True) == 1
                assert case(m, [80, 80], split, 8, parts, True, False) == 1
    print("bit-equal")

    def rope_case(b, l, heads, kv, split, parts):
        # q/k/v with the RoPE and K/V write in the pass vs the passes, then rope.rope_qk_cache
        m, d, r = b * l, 16, 8
        ns = [heads * d, kv * d, kv * d]
        g = torch.Generator().manual_seed(b * 10 + l + split)
        outs = [torch.randn(split, m, n, generator=g) for n in ns]
        a_all = (torch.randn(3, m, 3 * r, generator=g) if parts
                 else torch.randn(m, 3 * r, generator=g).to(torch.bfloat16))
        epis = [Epilogue(torch.randn(n, generator=g).to(torch.bfloat16), a_all[..., j * r:(j + 1) * r],
                         (torch.randn(n, r, generator=g) * 0.3).to(torch.bfloat16), 0.5) for j, n in enumerate(ns)]
        ang = torch.randn(b, l, d // 2, generator=g)
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(torch.bfloat16)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(torch.bfloat16)
        slot = torch.tensor([5 + 2 * i for i in range(l)])
        def caches():
            return [torch.zeros(b, kv, 16, d).to(torch.bfloat16) for _ in range(2)]
        kc, vc = caches()
        ys = [torch.empty(m, n).to(torch.bfloat16) for n in ns]
        before = len(launches)
        got = group_pass.finish_group([(outs[j], ys[j]) for j in range(3)], split, epis, False,
                                  group_pass.RopeCache(cos, sin, kc, vc, slot))
        assert len(launches) - before == 1 and len(got) == 1
        kc2, vc2 = caches()
        ys2 = [torch.empty(m, n).to(torch.bfloat16) for n in ns]
        os.environ["QUARL_GROUP_PASS"] = "0"
        ref = group_pass.finish_group([(outs[j], ys2[j]) for j in range(3)], split, epis, False,
                                  group_pass.RopeCache(cos, sin, kc2, vc2, slot))
        del os.environ["QUARL_GROUP_PASS"]
        assert torch.equal(got[0], ref[0]), (b, l, (got[0].float() - ref[0].float()).abs().max())
        assert torch.equal(kc, kc2) and torch.equal(vc, vc2), (b, l)
        assert kc.abs().sum() > 0 and vc[:, :, 5].abs().sum() > 0

    for b, l in ((1, 1), (3, 1), (2, 2)):
        for split, parts in ((4, True), (2, False)):
            rope_case(b, l, 4, 2, split, parts)
    print("rope bit-equal")
    assert case(1, [64, 16], 4, 8, True, False, True, rs=[8, 16]) == 0  # two ranks: one pass each
    os.environ["QUARL_GROUP_PASS"] = "0"
    assert case(1, [64, 16, 24], 4, 8, True, False, True) == 0
    print("OK")
""")


@needs_interpreter
def test_group_pass_under_triton_interpreter():
    run_interpreted(SCRIPT)


@needs_triton
def test_group_pass_builds_for_sm90_without_spills():
    """The 7B groups' passes (q/k/v with bias at one row, and with the RoPE + K/V write at 1 and 8 rows; gate / up
    with the activation at 8 rows: tl.dot tiles), built for Hopper on a CPU: they compile, and ptxas spills
    nothing."""
    import torch
    from quarl_kernels import group_pass
    from quarl_kernels.launch import Epilogue

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    for m, ns, split, gate_act, rope in ((1, (3584, 512, 512), 4, False, False), (8, (18944, 18944), 2, True, False),
                                         (1, (3584, 512, 512), 4, False, True), (8, (3584, 512, 512), 4, False, True)):
        pairs = [(torch.empty(split, m, n), torch.empty(m, n, dtype=torch.bfloat16)) for n in ns]
        parts = torch.empty(4, m, 32 * len(ns))
        epis = [Epilogue(None if gate_act else torch.empty(n, dtype=torch.bfloat16), parts[..., 32 * j:32 * j + 32],
                         torch.empty(n, 32, dtype=torch.bfloat16), 2.0) for j, n in enumerate(ns)]
        rc = None
        if rope:
            cs = torch.empty(m, 1, 128, dtype=torch.bfloat16)
            kv = [torch.empty(m, 4, 2304, 128, dtype=torch.bfloat16) for _ in range(2)]
            rc = group_pass.RopeCache(cs, cs, *kv, torch.zeros(1, dtype=torch.long))
        assert group_pass._group_pass_ok(pairs, split, epis, gate_act, rc)
        la = group_pass.group_pass_launch(pairs, split, epis, gate_act, rc)
        k, _ = compile_launch(la, fp_fusion=True, INTERPRET=False)  # as launched: FP contraction on
        assert stack_bytes(k) in (0, None), ("ptxas spilled registers", ns, rope)


@needs_triton
def test_rope_pass_keeps_the_products_rounding_under_fp_fusion():
    """Built for sm_90 as a launch builds it (fp fusion on): the RoPE pass's rotation has no bf16 FMA. (Without
    the software rounding of its products LLVM contracted ``round(round(x * cos) + rb)`` into one
    ``fma.rn.bf16``: one rounding fewer than ``rope.rope_qk_cache``, the H100's one-row differences.)"""
    import torch
    from quarl_kernels import group_pass
    from quarl_kernels.launch import Epilogue

    from tests.kernels.sm90_sass import compile_launch

    m, ns, split = 1, (3584, 512, 512), 4
    pairs = [(torch.empty(split, m, n), torch.empty(m, n, dtype=torch.bfloat16)) for n in ns]
    parts = torch.empty(4, m, 96)
    epis = [Epilogue(torch.empty(n, dtype=torch.bfloat16), parts[..., 32 * j:32 * j + 32],
                     torch.empty(n, 32, dtype=torch.bfloat16), 2.0) for j, n in enumerate(ns)]
    cs = torch.empty(m, 1, 128, dtype=torch.bfloat16)
    kv = [torch.empty(m, 4, 2304, 128, dtype=torch.bfloat16) for _ in range(2)]
    rc = group_pass.RopeCache(cs, cs, *kv, torch.zeros(1, dtype=torch.long))
    k, _ = compile_launch(group_pass.group_pass_launch(pairs, split, epis, False, rc), fp_fusion=True,
                          INTERPRET=False)
    ptx = k.asm["ptx"]
    assert "cvt.rn.bf16.f32" in ptx and "fma.rn.bf16 " not in ptx and "fma.rn.bf16\t" not in ptx

