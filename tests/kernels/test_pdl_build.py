"""Programmatic dependent launch (``quarl_kernels.pdl``) on a CPU: the switch, and the sm_90 builds.

The switch: the ``PDL`` constexpr and the ``launch_pdl`` attribute come together or not at all (a kernel launched
with the attribute but without its wait would race); ``late`` by default, ``early`` on request, off with 0, on CPU,
under the interpreter and below sm_90; any other value is refused by name. The builds (PTX order): the decode GEMV
and the Gluon mma.sync kernel wait before their first load and store and, ``LATE``, signal after the K loop, before
the last stores (``EARLY``: signal first); no spills, no fewer CTAs per SM than without. The bit-equality of chained
launches with and without PDL is a GPU test (``test_gemv_gpu.py``, ``test_mma_decode_gpu.py``).
"""

from __future__ import annotations

import pytest

from tests.kernels.interpreter import needs_triton

pytestmark = needs_triton


def test_switch(monkeypatch):
    import torch
    from quarl_kernels import pdl

    cuda = torch.device("cuda", 0)
    monkeypatch.delenv(pdl.ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert pdl.kwargs(torch.device("cpu")) == {"PDL": pdl.OFF, "launch_pdl": False}
    monkeypatch.setattr(pdl, "_device_supports_pdl", lambda index: True)
    assert pdl.kwargs(cuda) == {"PDL": pdl.LATE, "launch_pdl": True} and pdl.on(cuda)
    for raw, want in (("early", pdl.EARLY), ("LATE", pdl.LATE), ("1", pdl.LATE), ("0", pdl.OFF), ("off", pdl.OFF)):
        monkeypatch.setenv(pdl.ENV, raw)
        assert pdl.kwargs(cuda) == {"PDL": want, "launch_pdl": want != pdl.OFF}, raw
    monkeypatch.setenv(pdl.ENV, "maybe")
    with pytest.raises(ValueError, match="QUARL_KERNELS_PDL='maybe'.*late.*early"):
        pdl.mode(cuda)
    monkeypatch.setenv(pdl.ENV, "early")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.on(cuda)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(pdl, "_device_supports_pdl", lambda index: False)  # an A100
    assert not pdl.on(cuda)


def test_needs_a_driver_that_captures_programmatic_launches(monkeypatch):
    """sm_90 alone is not enough: a driver before CUDA 12.3 cannot capture programmatic launches into a graph, and
    the engine would then fall back to eager decoding; PDL stays off there, and where the version cannot be read."""
    from quarl_kernels import pdl

    monkeypatch.setattr(pdl.torch.cuda, "get_device_capability", lambda index: (9, 0))
    for version, want in ((12080, True), (12030, True), (12020, False), (0, False)):
        pdl._device_supports_pdl.cache_clear()
        monkeypatch.setattr(pdl, "driver_version", lambda v=version: v)
        assert pdl._device_supports_pdl(0) is want, version
    pdl._device_supports_pdl.cache_clear()
    assert isinstance(pdl.driver_version(), int)  # 0 on a machine without libcuda


def _ptx_order(ptx: str, cp_async: bool = False) -> list[str]:
    """The PTX's PDL instructions and global loads / stores, in text order, as short tags (``cp_async``: the
    cp.async copies from global memory count as loads)."""
    tags = []
    for line in ptx.splitlines():
        t = line.strip()
        if t.startswith("griddepcontrol.launch_dependents"):
            tags.append("signal")
        elif t.startswith("griddepcontrol.wait"):
            tags.append("wait")
        elif "ld.global" in t or (cp_async and t.startswith("cp.async.c") and "shared.global" in t):
            tags.append("load")
        elif "st.global" in t:
            tags.append("store")
    return tags


def _check_order(tags: list[str], mode: int) -> None:
    first = min(tags.index("load"), tags.index("store"))
    assert tags.count("wait") == 1 and tags.count("signal") == 1, tags
    if mode == 2:  # EARLY
        assert tags[:first] == ["signal", "wait"], tags[:4]
    else:  # LATE: the signal after the loop, before the last store
        assert tags[:first] == ["wait"], tags[:4]
        sig = tags.index("signal")
        assert "load" in tags[first:sig] and "store" in tags[sig:], tags


def test_gemv_with_pdl_builds_for_sm90():
    """The 7B one-row GEMV (gate / up's config, down's long-row config 7) in both PDL modes: the order above, no
    spills, no fewer CTAs per SM than without."""
    import torch
    from quarl_kernels import gemv, pdl
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, registers, stack_bytes

    for n, k in ((18944, 3584), (3584, 18944)):
        pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                          torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
        x = torch.empty(1, k, dtype=torch.bfloat16)
        la = gemv.gemv_launch(x, pw, gemv.default_gemv_config(0, 1, n, k))
        assert la.constexprs["PDL"] == pdl.OFF  # a CPU tensor
        k0, _ = compile_launch(la)
        assert "wait" not in _ptx_order(k0.asm["ptx"])
        for mode in (pdl.LATE, pdl.EARLY):
            k1, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=mode)))
            _check_order(_ptx_order(k1.asm["ptx"]), mode)
            assert stack_bytes(k1) in (0, None), ("ptxas spilled registers", n, k, mode)
            r0, r1 = registers(k0), registers(k1)
            per_sm = 65536 // (32 * la.num_warps)  # registers of one CTA's threads, per register of a thread
            assert r1 is None or per_sm // r1 >= per_sm // r0, (n, k, mode, r0, r1)  # no fewer CTAs per SM


def test_mma_decode_with_pdl_builds_for_sm90():
    """The Gluon mma.sync decode kernel (8 rows, the 7B gate / up default config) in both modes (``pdl_gluon.py``)."""
    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import mma_decode, pdl
    from quarl_kernels.formats import FMT_NVFP4

    from tests.kernels.sm90_sass import bench_module

    compile_mma_decode = bench_module("bench_mma_decode").compile_mma_decode
    cfg = mma_decode.default_config(8, 18944)
    for mode in (pdl.LATE, pdl.EARLY):
        _check_order(_ptx_order(compile_mma_decode(FMT_NVFP4, cfg, 8, split=False, pdl=mode).asm["ptx"]), mode)
    assert "wait" not in _ptx_order(compile_mma_decode(FMT_NVFP4, cfg, 8, split=False).asm["ptx"])


def test_wgmma_ring_with_pdl_builds_for_sm90():
    """The TMA-ring kernel (64 rows, the 7B gate / up config): wait before its first copy, load and store; ``LATE``
    signals after the K loop, before the output store."""
    import sys
    from pathlib import Path

    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import pdl, wgmma_ring
    from quarl_kernels.formats import FMT_NVFP4

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    try:
        from bench_wgmma_decode import compile_wgmma_ring
    finally:
        sys.path.pop(0)
    cfg = wgmma_ring.default_config(64, 18944, 3584)
    ptx = compile_wgmma_ring(FMT_NVFP4, cfg, 64, pdl=pdl.LATE).asm["ptx"]
    tags = _ptx_order(ptx)
    _check_order(tags, pdl.LATE)
    assert ptx.index("griddepcontrol.wait") < ptx.index("cp.async.bulk.tensor")  # no TMA copy before the wait


def test_wgmma_ring_with_weights_before_the_wait_builds_for_sm90():
    """``QUARL_KERNELS_RING_W_EARLY=1`` (session 36): the ring's first weight copies and its scale loads before the
    PDL wait, x's copies after; no store before it; no spills, registers as without. With it off the SASS is the
    kernel's as before (no other change). The walk finds x's copies when there is no wait (so it can fail)."""
    import sys
    from pathlib import Path

    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import pdl, wgmma_ring
    from quarl_kernels.formats import FMT_NVFP4

    from tests.kernels.sm90_sass import registers, sass_of, stack_bytes, tma_copies_before_wait

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    try:
        from bench_wgmma_decode import compile_wgmma_ring
    finally:
        sys.path.pop(0)
    for m, n, k, blocked in ((64, 18944, 3584, True), (32, 3584, 3584, False)):
        cfg = wgmma_ring.default_config(m, n, k)
        nt = cfg.tile(m)
        plain = compile_wgmma_ring(FMT_NVFP4, cfg, nt, pdl=pdl.LATE, blocked=blocked)
        off = compile_wgmma_ring(FMT_NVFP4, cfg, nt, pdl=pdl.LATE, blocked=blocked, w_early=False)
        early = compile_wgmma_ring(FMT_NVFP4, cfg, nt, pdl=pdl.LATE, blocked=blocked, w_early=True)
        assert sass_of(off) == sass_of(plain)
        ptx = early.asm["ptx"]
        copies, from_x = tma_copies_before_wait(ptx)
        assert copies >= 1 and from_x == 0, (m, n, k, copies, from_x)
        assert "st.global" not in ptx[:ptx.index("griddepcontrol.wait")]
        assert ptx.count("griddepcontrol.wait") == 1
        assert stack_bytes(early) in (0, None) and registers(early) == registers(plain), (m, n, k)
        no_wait = compile_wgmma_ring(FMT_NVFP4, cfg, nt, pdl=pdl.OFF, blocked=blocked).asm["ptx"]
        assert tma_copies_before_wait(no_wait + "\ngriddepcontrol.wait;")[1] >= 1  # the walk sees x's copies


def test_mma_decode_with_weights_before_the_wait_builds_for_sm90():
    """``QUARL_KERNELS_MMA_W_EARLY=1`` (session 36): the mma.sync kernel's first step of words and scales before the
    PDL wait (config 4 peels that step off its loop; config 1, with the register prefetch, already loads it first),
    x after; no store before the wait; no spills, no fewer CTAs per SM (registers rounded as the SM allocates them).
    Off: config 4's SASS is the kernel's before at 8 rows."""
    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import mma_decode, pdl
    from quarl_kernels.formats import FMT_NVFP4

    from tests.kernels.sm90_sass import bench_module, ctas_per_sm, loads_before_wait, registers, sass_of, stack_bytes

    compile_mma_decode = bench_module("bench_mma_decode").compile_mma_decode
    for n in (18944, 512):  # config 4 (no prefetch), config 1 (prefetch)
        cfg = mma_decode.default_config(8, n)
        plain = compile_mma_decode(FMT_NVFP4, cfg, 8, pdl=pdl.LATE, blocked=True)
        early = compile_mma_decode(FMT_NVFP4, cfg, 8, pdl=pdl.LATE, blocked=True, w_early=True)
        ptx = early.asm["ptx"]
        assert ptx.count("griddepcontrol.wait") == 1
        loads, from_x = loads_before_wait(ptx)
        assert loads and not from_x, (str(cfg), from_x[:3])
        assert "st.global" not in ptx[:ptx.index("griddepcontrol.wait")]
        assert stack_bytes(early) in (0, None), str(cfg)
        r0, r1 = registers(plain), registers(early)
        assert r1 is None or ctas_per_sm(r1, cfg.warps) >= ctas_per_sm(r0, cfg.warps), (str(cfg), r0, r1)
        off = compile_mma_decode(FMT_NVFP4, cfg, 8, pdl=pdl.OFF, blocked=True)
        assert len(loads_before_wait(off.asm["ptx"])[1]) >= 1  # no wait: the walk finds x's loads
    cfg = mma_decode.default_config(8, 18944)
    assert sass_of(compile_mma_decode(FMT_NVFP4, cfg, 8, pdl=pdl.LATE, blocked=True, w_early=False)) == \
        sass_of(compile_mma_decode(FMT_NVFP4, cfg, 8, pdl=pdl.LATE, blocked=True))


def test_fp8_decode_kernels_with_pdl_build_for_sm90():
    """Jet-RL's decode chain at rollout (session 29): the 1x128 quantizer of X (row groups alone, what
    ``quantize_act`` launches before each projection) and the FP8 GEMV, launched with PDL: the wait before any load
    or store (the GEMV's cp.async copies counted as loads), the GEMV's signal after its K loop and before its store,
    no spills. Launched for a CPU tensor, both leave PDL off."""
    import torch
    from quarl_kernels import fp8_gemv as g
    from quarl_kernels import fp8_quant as fq
    from quarl_kernels import pdl

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    m, k, n = 8, 4096, 4096
    x = torch.empty(m, k, dtype=torch.bfloat16)
    q, s = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(m, k // 128)
    la = fq._act_launch(x, q, s, None, None, m, k, None, fq.SUB, fq.WARPS)
    assert la.constexprs["PDL"] == pdl.OFF
    kq, _ = compile_launch(la._replace(constexprs=dict(la.constexprs, PDL=pdl.LATE)))
    t = _ptx_order(kq.asm["ptx"], cp_async=True)
    assert t.count("wait") == 1 and t.index("wait") < min(t.index("load"), t.index("store")), t[:4]
    assert stack_bytes(kq) in (0, None), "ptxas spilled registers (quantizer)"

    cfg = g.default_config(m, n, k)
    a, b = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn)
    sa, sb, out = torch.empty(m, k // 128), torch.empty(n // 128, k // 128), torch.empty(3, m, n)
    args = (a, sa, b, sb, out, m, n, k // 128, 11, a.stride(0), sa.stride(0), sa.stride(1), b.stride(0), sb.stride(0),
            sb.stride(1), out.stride(0), out.stride(1))
    gl = fq.Launch(g._fp8_gemv_kernel, None, args, {"BM": g.BM, "BN": cfg.bn, "BK": g.BK, "STAGES": cfg.stages,
                                                    "INTERPRET": False, "PDL": pdl.LATE}, cfg.warps)
    kg, _ = compile_launch(gl)
    t = _ptx_order(kg.asm["ptx"], cp_async=True)
    first = min(t.index("load"), t.index("store"))
    assert t[:first] == ["wait"] and t.count("signal") == 1, t[:4]
    sig = t.index("signal")
    assert "load" in t[first:sig] and "store" in t[sig:] and "load" not in t[sig:], t
    assert stack_bytes(kg) in (0, None), "ptxas spilled registers (GEMV)"
