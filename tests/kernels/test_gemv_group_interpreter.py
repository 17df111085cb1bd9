"""A LoRA group's weights in one GEMV launch (``gemv.launch_gemv_group``) on CPU through ``TRITON_INTERPRET=1``.

Two or three FP4 weights that read the same x (q/k/v of different widths, gate/up) and the group's A programs in
one launch, then each weight's last pass: bit-equal to one launch per weight where both split K alike (as here),
with the second output as ``silu(y_0) * y_1`` under ``gate_act``; weights of another K or format are refused by
name. The engine's constant against the kernels', and the sm_90 build (no spills, no CTAs per SM lost).

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl.quant import get_format, make_config
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.ops import _packed_weight

    C = gemv.GemvConfig
    for spec in ("nvfp4", "mxfp4"):
        c = make_config(spec)
        k = 576
        pws = []
        for n in (64, 16, 24):  # q, k, v of different widths (v's last tile partly past N)
            torch.manual_seed(n)
            t = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c).tensors
            pws.append(_packed_weight(t["weight_packed"], t["weight_scale"], None, t.get("weight_global_scale"),
                                      c.name, c.block_size, n, k))
        x = torch.randn(1, k).to(torch.bfloat16)
        cfg = C(16, 8, 4, 4)
        amat = (torch.randn(24, k) * 0.05).to(torch.bfloat16)
        bias = [torch.randn(p.n).to(torch.bfloat16) for p in pws]
        for nw, gate_act in ((3, False), (2, True)):
            use = [pws[0], pws[0]] if gate_act else pws[:nw]
            bs = [(torch.randn(p.n, 8) * 0.2).to(torch.bfloat16) for p in use]
            la = lora_a.new_partials(x, amat)
            epis = [Epilogue(bias[0] if gate_act else bias[j], la.out[..., 8 * j:8 * j + 8], bs[j], 0.5,
                             lora_a=la if j == 0 else None) for j in range(nw)]
            ys = gemv.launch_gemv_group(x, use, cfg, epis, use_asm=False, gate_act=gate_act)
            la2 = lora_a.new_partials(x, amat)
            ref = [gemv.launch_gemv(x, use[0], cfg, use_asm=False,
                                    epi=Epilogue(epis[0].bias, la2.out[..., 0:8], bs[0], 0.5, lora_a=la2))]
            for j in range(1, nw):
                ref.append(gemv.launch_gemv(x, use[j], cfg, use_asm=False,
                                            epi=Epilogue(epis[j].bias, la2.out[..., 8 * j:8 * j + 8], bs[j], 0.5,
                                                         gate=ref[0] if gate_act else None)))
            assert [tuple(y.shape) for y in ys] == [(1, p.n) for p in use]
            for j, (y, r) in enumerate(zip(ys, ref)):
                assert torch.equal(y, r), (spec, nw, gate_act, j, (y.float() - r.float()).abs().max())
            print("group", spec, nw, gate_act, "bit-equal")
        t = get_format("nvfp4").quantize(torch.randn(16, 640) * 0.05, make_config("nvfp4")).tensors
        other_k = _packed_weight(t["weight_packed"], t["weight_scale"], None, t["weight_global_scale"], "nvfp4", 16,
                                 16, 640)
        assert not gemv.group_supported(x, [pws[0], other_k])
        try:
            gemv.gemv_launch(x, pws[0], cfg, more=(other_k,))
        except ValueError as e:
            assert "K, format and group" in str(e)
        else:
            raise AssertionError("a weight of another K was accepted")
    assert gemv.group_supported(x, pws) and not gemv.group_supported(torch.randn(2, 576).to(torch.bfloat16), pws)
    print("OK")
""")


@needs_interpreter
def test_gemv_group_under_triton_interpreter():
    run_interpreted(SCRIPT)


@needs_triton
def test_group_route_by_rows_and_switches(monkeypatch):
    """One row: the GEMV group launch; 8 rows: the mma.sync one, which needs CUDA tensors (so none here; on the GPU
    ``test_epilogue_gpu.py`` checks it names "mma"), and none with ``QUARL_MMA_GROUP=0``; ``QUARL_GEMV_GROUP=0``:
    none."""
    import torch
    from quarl_kernels import wo_gemm
    from quarl_kernels.wo_gemm import PackedWeight

    pws = [PackedWeight(0, 16, n, 3584, torch.empty(n, 448, dtype=torch.int32), torch.empty(n, 224, dtype=torch.uint8),
                        None, torch.ones(1)) for n in (3584, 512, 512)]
    one, eight = torch.empty(1, 3584, dtype=torch.bfloat16), torch.empty(8, 3584, dtype=torch.bfloat16)
    monkeypatch.delenv("QUARL_MMA_GROUP", raising=False)
    assert wo_gemm.group_route(one, pws) == "gemv" and wo_gemm.group_route(eight, pws) is None
    monkeypatch.setenv("QUARL_GEMV_GROUP", "0")
    assert wo_gemm.group_route(one, pws) is None


@needs_triton
def test_engine_and_kernels_agree_on_the_group_rows():
    from quarl_kernels import gemv, wo_gemm

    from quarl.engine import lora as lp

    # the GEMV's one row, then the mma.sync kernel's token tiles of 8 and 16 (its group launch: 2..16 rows)
    assert gemv.GEMV_GROUP_MAX_M == 1 < wo_gemm.MMA_DECODE_MIN_M and lp.GROUP_MAX_M == wo_gemm.GROUP_MAX_M == 16


@needs_triton
def test_gemv_group_builds_for_sm90_without_spills():
    """The 7B one-row group launches (q/k/v with the A programs, gate/up), built for Hopper on a CPU as launched (FP
    contraction on): no spill inside a K loop, and no fewer CTAs per SM by registers than q's launch alone. (The
    build keeps two values on the stack across the loops -- 8 bytes, 4 stores and 2 loads a program, outside them:
    session 37, when these builds were first compiled as launched; before, without FP contraction, 117 registers and
    no stack.)"""
    import torch
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, loop_spills, registers, stack_bytes

    def pw(n, k):
        return PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                            torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))

    for ns, k, gr in (((3584, 512, 512), 3584, 96), ((18944, 18944), 3584, 64)):
        x = torch.empty(1, k, dtype=torch.bfloat16)
        la = lora_a.new_partials(x, torch.empty(gr, k, dtype=torch.bfloat16))
        epi = Epilogue(None, la.out[..., :32], torch.empty(ns[0], 32, dtype=torch.bfloat16), 1.0, lora_a=la)
        cfg = gemv.default_gemv_config(0, 1, ns[0], k)
        alone = gemv.gemv_launch(x, pw(ns[0], k), cfg, epi=epi)
        group = gemv.gemv_launch(x, pw(ns[0], k), cfg, epi=epi, more=tuple(pw(n, k) for n in ns[1:]))
        assert group.constexprs["NW"] == len(ns) and len(group.rest) == len(ns) - 1
        k0, _ = compile_launch(alone)
        k1, sass1 = compile_launch(group)
        r0, r1 = registers(k0), registers(k1)
        print("registers", ns, r0, r1, "stack", stack_bytes(k1))
        assert loop_spills(sass1) == 0 and stack_bytes(k1) in (0, 8, None), ("ptxas spilled registers", ns)
        per_sm = 65536 // (32 * cfg.warps)  # registers of one CTA's threads, per register of a thread
        assert r1 is None or per_sm // r1 >= per_sm // r0, (ns, r0, r1)  # no fewer CTAs per SM


@needs_triton
def test_gemv_defaults_switch(monkeypatch):
    """One row: config 7 on large FP4 weights with long rows (7B down, 14B's weights), config 0 on the rest (7B
    q/o, gate/up: K = 3584), 1 for INT4; ``QUARL_KERNELS_GEMV_DEFAULTS=h200``: config 0 everywhere; anything else is
    refused with the fix."""
    import pytest
    from quarl_kernels import gemv

    G = gemv.GEMV_CONFIGS
    monkeypatch.delenv(gemv.DEFAULTS_ENV, raising=False)
    assert gemv.default_gemv_config(0, 1, 3584, 18944) is G[7] and gemv.default_gemv_config(1, 1, 5120, 5120) is G[7]
    assert gemv.default_gemv_config(0, 1, 18944, 3584) is G[0] and gemv.default_gemv_config(0, 1, 1024, 5120) is G[0]
    assert gemv.default_gemv_config(2, 1, 3584, 18944) is G[1] and gemv.default_gemv_config(0, 2, 3584, 18944) is G[2]
    monkeypatch.setenv(gemv.DEFAULTS_ENV, "h200")
    assert gemv.default_gemv_config(0, 1, 3584, 18944) is G[0]
    monkeypatch.setenv(gemv.DEFAULTS_ENV, "fast")
    with pytest.raises(ValueError, match="auto .* or h200"):
        gemv.default_gemv_config(0, 1, 3584, 18944)


@needs_triton
def test_gemv_m1_names_a_config_per_shape(monkeypatch):
    """``QUARL_KERNELS_GEMV_M1=NxK:i,...`` names the one-row config of FP4 weights of that shape (over both rules),
    leaves other shapes, INT4 and M > 1 alone; malformed entries and configs out of range are refused with the fix."""
    import pytest
    from quarl_kernels import gemv

    G = gemv.GEMV_CONFIGS
    monkeypatch.delenv(gemv.DEFAULTS_ENV, raising=False)
    monkeypatch.setenv(gemv.M1_ENV, " 18944x3584:7, 13824X5120:0 ")
    assert gemv.m1_overrides() == {(18944, 3584): 7, (13824, 5120): 0}
    assert gemv.default_gemv_config(0, 1, 18944, 3584) is G[7]  # the rule's K < 4096 would give 0
    assert gemv.default_gemv_config(1, 1, 13824, 5120) is G[0]  # the rule's long rows would give 7
    assert gemv.default_gemv_config(0, 1, 3584, 18944) is G[7] and gemv.default_gemv_config(0, 1, 3584, 3584) is G[0]
    assert gemv.default_gemv_config(2, 1, 18944, 3584) is G[1] and gemv.default_gemv_config(0, 2, 18944, 3584) is G[2]
    for bad, match in (("18944x3584", "NxK:i"), ("18944:7", "NxK:i"), ("axb:1", "NxK:i"),
                       ("18944x3584:8", "0..7"), ("0x3584:7", "positive")):
        monkeypatch.setenv(gemv.M1_ENV, bad)
        with pytest.raises(ValueError, match=match):
            gemv.default_gemv_config(0, 1, 1, 1)


@needs_triton
def test_gemv_split_names_a_launchs_k_split(monkeypatch):
    """``QUARL_KERNELS_GEMV_SPLIT=NxK:s,...`` (session 40's experiment) splits a one-row launch of N rows in all -- a
    group's weights summed -- s ways over K instead of the waves rule, at most one way a K step; other shapes and
    M > 1 keep the rule; malformed entries and counts out of 1..64 are refused with the fix."""
    import pytest
    import torch
    from quarl_kernels import gemv
    from quarl_kernels.wo_gemm import PackedWeight

    def pw(n, k):
        return PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                            torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))

    x = torch.empty(1, 5120, dtype=torch.bfloat16)
    cfg = gemv.GEMV_CONFIGS[7]  # 32 rows, 64-word K steps: 10 steps at K = 5120

    def split(n0, n1, xx=x):
        la = gemv.gemv_launch(xx, pw(n0, 5120), cfg, more=(pw(n1, 5120),))
        return la.split, la.args[8], la.grid  # (split, words per split, grid)

    monkeypatch.delenv(gemv.SPLIT_ENV, raising=False)
    monkeypatch.setenv(gemv.WHOLE_WAVES_ENV, "0")
    assert split(13824, 13824)[0] == 1  # the waves rule: 864 tiles already pass 4 x 132 programs
    rule = split(13824, 1024)
    monkeypatch.setenv(gemv.SPLIT_ENV, "27648x5120:3, 7168x5120:64")
    assert gemv.split_overrides() == {(27648, 5120): 3, (7168, 5120): 64}
    assert split(13824, 13824) == (3, 256, (864, 3))  # 4 + 4 + 2 steps of 64 words
    assert split(5120, 2048)[:2] == (10, 64)  # 64 asked, one way a K step at most
    assert split(13824, 1024) == rule  # another N in all: the rule
    assert split(13824, 13824, torch.empty(2, 5120, dtype=torch.bfloat16))[0] == 1  # two rows: the rule
    for bad, match in (("27648x5120", "NxK:i"), ("27648x5120:0", "1..64"), ("27648x5120:65", "1..64")):
        monkeypatch.setenv(gemv.SPLIT_ENV, bad)
        with pytest.raises(ValueError, match=match):
            split(13824, 13824)


@needs_triton
def test_a_launch_past_a_wave_is_split_to_whole_waves(monkeypatch):
    """Session 40's rule: a one-row launch the waves rule leaves unsplit past 1.25 waves of ``SLOTS_PER_SM`` programs
    an SM is split the fewest ways that leave <= 5 % of its waves' slots idle -- the 14B (and 32B) gate/up group
    launches 3 ways on 132 SMs; every 7B launch, 14B's q/k/v, o and down keep their splits; ``=0`` turns it off."""
    import torch
    from quarl_kernels import gemv, lora_a
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.wo_gemm import PackedWeight

    def pw(n, k):
        return PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                            torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))

    def launch(ns, k, a_rows):
        x = torch.empty(1, k, dtype=torch.bfloat16)
        la = lora_a.new_partials(x, torch.empty(a_rows, k, dtype=torch.bfloat16))
        epi = Epilogue(None, la.out[..., :32], torch.empty(ns[0], 32, dtype=torch.bfloat16), 1.0, lora_a=la)
        cfg = gemv.default_gemv_config(0, 1, ns[0], k)
        return gemv.gemv_launch(x, pw(ns[0], k), cfg, epi=epi, more=tuple(pw(n, k) for n in ns[1:]))

    launches = {"7B q/k/v": ((3584, 512, 512), 3584, 96, 7), "7B o": ((3584,), 3584, 32, 7),
                "7B gate/up": ((18944, 18944), 3584, 64, 1), "7B down": ((3584,), 18944, 32, 5),
                "14B q/k/v": ((5120, 1024, 1024), 5120, 96, 3), "14B o": ((5120,), 5120, 32, 4),
                "14B gate/up": ((13824, 13824), 5120, 64, 3), "14B down": ((5120,), 13824, 32, 4),
                "32B gate/up": ((27648, 27648), 5120, 64, 3)}
    monkeypatch.delenv(gemv.SPLIT_ENV, raising=False)
    monkeypatch.delenv(gemv.WHOLE_WAVES_ENV, raising=False)
    got = {name: launch(ns, k, a).split for name, (ns, k, a, _) in launches.items()}
    assert got == {name: want for name, (*_, want) in launches.items()}
    monkeypatch.setenv(gemv.WHOLE_WAVES_ENV, "0")
    assert launch((13824, 13824), 5120, 64).split == 1 and launch((27648, 27648), 5120, 64).split == 1
    # the rule itself: under 1.25 waves unsplit; the idle share of the waves' slots decides past that
    slots = gemv.SLOTS_PER_SM * 132
    assert gemv.whole_waves_split(int(1.2 * slots), 0, 10, 132) == 1
    assert gemv.whole_waves_split(2 * slots, 0, 10, 132) == 1  # two whole waves already
    assert gemv.whole_waves_split(864, 32, 10, 132) == 3  # 896 -> 2624 programs: 4.97 waves
    assert gemv.whole_waves_split(864, 32, 1, 132) == 1  # one K step: nothing to split
