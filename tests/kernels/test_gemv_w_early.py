"""The one-row GEMV with its first weight tile loaded before the PDL wait (``QUARL_KERNELS_GEMV_W_EARLY=1``), on CPU.

Why a test file of its own: the switch changes where a program waits for the kernel before it (``pdl.py``'s
contract: nothing a kernel of the step writes is read, and nothing is stored, before the wait). Here: the switch
(opt-in, on only with PDL, refused by name when malformed); under ``TRITON_INTERPRET=1`` the peeled first step gives
the same bits as the loop (single weights with split K and a masked K tail, the register-prefetch config, a q/k/v
group with its LoRA A programs); and the sm_90 build: with the switch off the SASS is the one without it, with it
on the loads before the wait are weight loads only (none derives from x's pointer), no store precedes the wait,
no spills, no fewer CTAs per SM. The chained launches' bits on a GPU: ``test_gemv_gpu.py``.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl.quant import get_format, make_config
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue, finish
    from quarl_kernels.ops import _packed_weight

    C = gemv.GemvConfig

    def weight(spec, n, k, seed):
        c = make_config(spec)
        torch.manual_seed(seed)
        t = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c).tensors
        return _packed_weight(t["weight_packed"], t["weight_scale"], None, t.get("weight_global_scale"), c.name,
                              c.block_size, n, k)

    def run(la, early):
        la.out.zero_()
        for _, o in la.rest:
            o.zero_()
        la.kernel[la.grid](*la.args, **dict(la.constexprs, W_EARLY=early), num_warps=la.num_warps,
                           num_stages=la.num_stages)
        return [la.out.clone()] + [o.clone() for o, _ in la.rest]

    cases = [  # spec, M, N, K, config, weights in the launch, LoRA A programs
        ("nvfp4", 1, 48, 256, C(16, 8, 4, 4, prefetch=False), 1, False),  # split K, several steps a split
        ("nvfp4", 1, 40, 320, C(16, 16, 4, 4, prefetch=False), 1, False),  # KW = 40: masked K tail, N tail
        ("mxfp4", 3, 24, 512, C(16, 8, 4, 4, prefetch=False), 1, False),  # three tokens
        ("nvfp4", 1, 48, 256, C(16, 8, 4, 4), 1, False),  # register prefetch: the wait after its first load
        ("nvfp4", 1, 64, 576, C(16, 8, 4, 4, prefetch=False), 3, True),  # q/k/v group + A programs
    ]
    for spec, m, n, k, cfg, nw, with_la in cases:
        pws = [weight(spec, nn, k, j) for j, nn in enumerate((n, 16, 24)[:nw])]
        x = torch.randn(m, k).to(torch.bfloat16)
        epi = None
        if with_la:
            la_p = lora_a.new_partials(x, (torch.randn(24, k) * 0.05).to(torch.bfloat16))
            epi = Epilogue(None, la_p.out[..., :8], (torch.randn(n, 8) * 0.2).to(torch.bfloat16), 0.5, lora_a=la_p)
        la = gemv.gemv_launch(x, pws[0], cfg, use_asm=False, epi=epi, more=tuple(pws[1:]))
        assert la.constexprs["W_EARLY"] is False  # PDL is off under the interpreter, so the switch is too
        plain, early = run(la, False), run(la, True)
        a_plain = la_p.out.clone() if with_la else None
        for j, (a, b) in enumerate(zip(plain, early, strict=True)):
            assert torch.equal(a, b), (spec, m, n, k, str(cfg), j, (a - b).abs().max())
        if with_la:
            assert torch.equal(la_p.out, a_plain)
        if nw == 1:  # the partials summed as launch_gemv sums them: its output
            y = finish(plain[0], la.y, la.split, None)
            assert torch.equal(y, gemv.launch_gemv(x, pws[0], cfg, use_asm=False))
        assert la.split > 1 or k != 256, "the first case must split K"
        print(spec, m, n, k, cfg, nw, with_la, "split", la.split, "bit-equal")
    print("OK")
""")


@needs_interpreter
def test_first_tile_before_the_wait_gives_the_same_bits():
    run_interpreted(SCRIPT)


@needs_triton
def test_switch(monkeypatch):
    """Opt-in, only with PDL (so never under the interpreter or on CPU tensors), and refused by name otherwise."""
    import torch
    from quarl_kernels import gemv, pdl
    from quarl_kernels.wo_gemm import PackedWeight

    pw = PackedWeight(0, 16, 64, 256, torch.empty(64, 32, dtype=torch.int32), torch.empty(64, 16, dtype=torch.uint8),
                      None, torch.ones(1))
    x = torch.empty(1, 256, dtype=torch.bfloat16)
    monkeypatch.delenv(gemv.W_EARLY_ENV, raising=False)
    assert not gemv.w_early()
    monkeypatch.setenv(gemv.W_EARLY_ENV, "1")
    assert gemv.w_early()
    la = gemv.gemv_launch(x, pw, gemv.GEMV_CONFIGS[0])
    assert la.constexprs["PDL"] == pdl.OFF and la.constexprs["W_EARLY"] is False  # CPU tensors: no PDL, no switch
    monkeypatch.setattr(pdl, "mode", lambda device: pdl.LATE)  # as on an H100: the switch reaches the kernel
    assert gemv.gemv_launch(x, pw, gemv.GEMV_CONFIGS[0]).constexprs["W_EARLY"] is True
    monkeypatch.setenv(gemv.W_EARLY_ENV, "0")
    assert gemv.gemv_launch(x, pw, gemv.GEMV_CONFIGS[0]).constexprs["W_EARLY"] is False
    monkeypatch.setenv(gemv.W_EARLY_ENV, "maybe")
    with pytest.raises(ValueError, match="QUARL_KERNELS_GEMV_W_EARLY='maybe' is neither on nor off"):
        gemv.w_early()


@needs_triton
def test_mma_and_ring_switches(monkeypatch):
    """The mma.sync kernel's and the TMA ring's switches: the mma.sync one on unless 0 (session 37's batch-8 rows),
    the ring's off unless 1; either on only where PDL is, refused by name."""
    pytest.importorskip("triton.experimental.gluon")
    import torch
    from quarl_kernels import mma_decode, pdl, wgmma_ring

    cuda = torch.device("cuda", 0)
    for mod, env, default in ((mma_decode, "QUARL_KERNELS_MMA_W_EARLY", True),
                              (wgmma_ring, "QUARL_KERNELS_RING_W_EARLY", False)):
        assert mod.W_EARLY_ENV == env
        monkeypatch.setattr(pdl, "on", lambda device: True)
        monkeypatch.delenv(env, raising=False)
        assert mod.w_early(cuda) is default
        monkeypatch.setenv(env, "0")
        assert not mod.w_early(cuda)
        monkeypatch.setenv(env, "1")
        assert mod.w_early(cuda)
        monkeypatch.setattr(pdl, "on", lambda device: False)  # no PDL: nothing to move ahead of
        assert not mod.w_early(cuda)
        monkeypatch.setenv(env, "maybe")
        with pytest.raises(ValueError, match=f"{env}='maybe' is neither on nor off"):
            mod.w_early(cuda)


@needs_triton
def test_sm90_build_loads_only_weights_before_the_wait():
    """The one-row GEMV with the switch, built for sm_90 as launched (FP contraction on): the loads before the PDL wait
    derive from no register of x's pointer, no store precedes it, no spills; with the switch off the SASS is the
    kernel's before the change."""
    import torch
    from quarl_kernels import gemv, pdl
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, ctas_per_sm, loads_before_wait, registers, sass_of, stack_bytes

    for n, k in ((18944, 3584), (3584, 18944)):  # 7B gate / up (config 0), down (config 7)
        pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                          torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
        la = gemv.gemv_launch(torch.empty(1, k, dtype=torch.bfloat16), pw, gemv.default_gemv_config(0, 1, n, k))
        plain, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.LATE)))
        same, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.LATE, W_EARLY=False)))
        early, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.LATE, W_EARLY=True)))
        assert sass_of(same) == sass_of(plain)  # off: the kernel as it was
        off, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.OFF, W_EARLY=False)))
        assert len(loads_before_wait(off.asm["ptx"])[1]) >= 4  # no wait: the walk finds x's loads in the whole kernel
        ptx = early.asm["ptx"]
        assert ptx.count("griddepcontrol.wait") == 1
        loads, from_x = loads_before_wait(ptx)
        assert loads and not from_x, (n, k, from_x[:3])
        head = ptx[:ptx.index("griddepcontrol.wait")]
        assert "st.global" not in head
        assert ptx.index("griddepcontrol.wait") < ptx.index("griddepcontrol.launch_dependents")
        assert stack_bytes(early) in (0, None), ("ptxas spilled registers", n, k)
        # Registers as launched (FP contraction on): 124 against 96, 4 programs per SM against 5 -- why the switch
        # measured slower (session 37; capping it at 96 spills 48 bytes); printed, not asserted: it is opt-in
        print("registers", n, k, registers(plain), registers(early), "CTAs / SM",
              ctas_per_sm(registers(plain), la.num_warps), ctas_per_sm(registers(early), la.num_warps))


@needs_triton
def test_sm90_group_builds_wait_once_per_weight():
    """The 7B one-row group launches (q/k/v, gate / up) with the switch, built as launched: each weight's branch waits
    once (three / two waits in the PTX text, one on each program's path), no spill inside a K loop. (Like the single
    launch's, 4 programs per SM against 5 without the switch: printed.)"""
    import torch
    from quarl_kernels import gemv, pdl
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, ctas_per_sm, loop_spills, registers

    def pw(n, k):
        return PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                            torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))

    for ns, k in (((3584, 512, 512), 3584), ((18944, 18944), 3584)):
        x = torch.empty(1, k, dtype=torch.bfloat16)
        la = gemv.gemv_launch(x, pw(ns[0], k), gemv.default_gemv_config(0, 1, ns[0], k),
                              more=tuple(pw(n, k) for n in ns[1:]))
        plain, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.LATE)))
        early, sass_early = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.LATE, W_EARLY=True)))
        assert early.asm["ptx"].count("griddepcontrol.wait") == len(ns)
        assert loop_spills(sass_early) == 0, ("ptxas spilled registers in a K loop", ns)
        print("registers", ns, registers(plain), registers(early), "CTAs / SM",  # as the single launch's: one fewer
              ctas_per_sm(registers(plain), la.num_warps), ctas_per_sm(registers(early), la.num_warps))


@needs_triton
def test_l2_mode_prefetches_the_first_tile_and_holds_no_registers(monkeypatch):
    """``QUARL_KERNELS_GEMV_W_EARLY=l2`` (session 37): the first tile's lines prefetched to L2 before the PDL wait,
    built for sm_90 as launched -- prefetches and no load before the wait (nothing read, so nothing of x), no store,
    no spills, the same programs per SM as without the switch (what ``=1``'s loads cost: one); blocked words keep the
    plain order (the wait first, no prefetch)."""
    import dataclasses

    import torch
    from quarl_kernels import gemv, pdl
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, ctas_per_sm, loads_before_wait, registers, stack_bytes

    monkeypatch.setenv(gemv.W_EARLY_ENV, "l2")
    assert gemv.w_early() == gemv.L2_FIRST == 2
    monkeypatch.setattr(pdl, "mode", lambda device: pdl.LATE)  # as on an H100: the switch reaches the kernel
    for n, k in ((18944, 3584), (3584, 18944)):  # 7B gate / up (config 0: one line a row), down (config 7: two)
        pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                          torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
        cfg = gemv.default_gemv_config(0, 1, n, k)
        la = gemv.gemv_launch(torch.empty(1, k, dtype=torch.bfloat16), pw, cfg)
        assert la.constexprs["W_EARLY"] == 2
        plain, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, W_EARLY=False)))
        l2, _ = compile_launch(la)
        ptx = l2.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        head = ptx[:wait]
        assert "prefetch.global.L2" in head and "ld.global" not in head and "st.global" not in head, (n, k)
        assert not loads_before_wait(ptx)[1]
        assert ptx.count("griddepcontrol.wait") == 1 and wait < ptx.index("griddepcontrol.launch_dependents")
        assert stack_bytes(l2) in (0, None), ("ptxas spilled registers", n, k)
        r0, r1 = registers(plain), registers(l2)
        print("registers", n, k, str(cfg), r0, r1)
        assert r1 is None or ctas_per_sm(r1, la.num_warps) == ctas_per_sm(r0, la.num_warps), (n, k, r0, r1)
        group = gemv.gemv_launch(torch.empty(1, k, dtype=torch.bfloat16), pw, cfg, more=(pw,))  # gate / up
        gk, _ = compile_launch(group)
        assert gk.asm["ptx"].count("griddepcontrol.wait") == 2 and stack_bytes(gk) in (0, 8, None)  # one per weight
        blocked = gemv.gemv_launch(torch.empty(1, k, dtype=torch.bfloat16), dataclasses.replace(pw, blocked=True), cfg)
        bptx = compile_launch(blocked)[0].asm["ptx"]
        assert "prefetch" not in bptx and bptx.index("griddepcontrol.wait") < bptx.index("ld.global")
