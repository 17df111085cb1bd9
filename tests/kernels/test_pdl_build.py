"""Programmatic dependent launch (``quarl_kernels.pdl``) on a CPU: the switch, and the sm_90 builds.

The switch: the ``PDL`` constexpr and the ``launch_pdl`` attribute come together or not at all (a kernel launched
with the attribute but without its wait would race); off on CPU, under the interpreter and below sm_90;
``QUARL_KERNELS_PDL=0`` turns it off and a value that is neither on nor off is refused by name. The builds: the
decode GEMV signals first, asks L2 for its weight slice, and waits before its first load of x and its first store
(the order in the PTX), with no spills and no fewer CTAs per SM than without; the 16-byte checks of the prefetch.
The Gluon mma.sync decode kernel (2..16 rows) in the same order. The bit-equality of chained launches with and
without PDL is a GPU test (``test_gemv_gpu.py``, ``test_mma_decode_gpu.py``).
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
    assert pdl.kwargs(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: True)
    assert pdl.on(cuda) and pdl.kwargs(cuda) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv(pdl.ENV, "0")
    assert pdl.kwargs(cuda) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setenv(pdl.ENV, "maybe")
    with pytest.raises(ValueError, match="QUARL_KERNELS_PDL"):
        pdl.on(cuda)
    monkeypatch.setenv(pdl.ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.on(cuda)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(pdl, "_hopper_or_later", lambda index: False)  # an A100
    assert not pdl.on(cuda)


def test_prefetch_alignment_checks(monkeypatch):
    import torch
    from quarl_kernels import pdl
    from quarl_kernels.gemv import _prefetch_mode
    from quarl_kernels.pdl import rows_aligned
    from quarl_kernels.wo_gemm import PackedWeight

    w = torch.empty(8, 448, dtype=torch.int32)  # 7B rows: 1792 bytes
    assert rows_aligned([w], 4, 448, 448) and rows_aligned([w], 4, 64, 448)
    assert not rows_aligned([w], 4, 6, 448)  # a split of 24 bytes
    assert not rows_aligned([w[:, 1:]], 4, 64, 447)  # rows start 4 bytes in
    s = torch.empty(8, 224, dtype=torch.uint8)  # their scale bytes
    assert rows_aligned([s], 1, 32, 224) and not rows_aligned([s], 1, 8, 224)
    assert not rows_aligned([w, torch.empty(8, 450, dtype=torch.int32)], 4, 64, 448)  # one weight of the group off
    p = PackedWeight(0, 16, 8, 3584, w, s, None, torch.ones(1))
    monkeypatch.delenv(pdl.PREFETCH_ENV, raising=False)
    assert _prefetch_mode(True, (p,), 1, 448, 448) == 2  # unsplit: the program's rows are one block
    assert _prefetch_mode(True, (p,), 7, 64, 448) == 1  # split over K: row by row
    assert _prefetch_mode(False, (p,), 1, 448, 448) == 0  # no PDL: nothing before a wait to overlap
    monkeypatch.setenv(pdl.PREFETCH_ENV, "0")
    assert _prefetch_mode(True, (p,), 1, 448, 448) == 0


def _ptx_order(ptx: str) -> list[str]:
    """The PTX's PDL instructions, prefetches and global loads / stores, in text order, as short tags."""
    tags = []
    for line in ptx.splitlines():
        t = line.strip()
        if t.startswith("griddepcontrol.launch_dependents"):
            tags.append("signal")
        elif t.startswith("griddepcontrol.wait"):
            tags.append("wait")
        elif "cp.async.bulk.prefetch.L2" in t:
            tags.append("prefetch")
        elif "ld.global" in t:
            tags.append("load")
        elif "st.global" in t:
            tags.append("store")
    return tags


def test_gemv_with_pdl_builds_for_sm90():
    """The 7B one-row GEMV (gate / up config, and down's long-row config 7) with PDL: signal, the prefetches (the
    words, the scale bytes), wait, then every load and store; no spills, no fewer CTAs per SM than without."""
    import torch
    from quarl_kernels import gemv
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, registers, stack_bytes

    for n, k in ((18944, 3584), (3584, 18944)):
        pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                          torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
        x = torch.empty(1, k, dtype=torch.bfloat16)
        la = gemv.gemv_launch(x, pw, gemv.default_gemv_config(0, 1, n, k))
        assert not la.constexprs["PDL"]  # a CPU tensor: off, and with it the prefetches
        k0, _ = compile_launch(la)
        assert _ptx_order(k0.asm["ptx"]).count("wait") == 0
        for mode in (2, 1):  # a program's rows as one block (unsplit), one request per row (split over K)
            on = la._replace(constexprs=dict(la.constexprs, PDL=True, PF_W=mode, PF_S=True))
            k1, sass = compile_launch(on)
            tags = _ptx_order(k1.asm["ptx"])
            first = min(tags.index("load"), tags.index("store"))
            assert tags[0] == "signal" and tags[first - 1] == "wait" and set(tags[1:first - 1]) == {"prefetch"}, tags
            assert "prefetch" not in tags[first:] and tags.count("wait") == 1
            if mode == 2:  # two requests a warp: the words' block and the scales' block
                assert tags[1:first - 1] == ["prefetch", "prefetch"] and sass.count("UBLKPF") == 2
            assert stack_bytes(k1) in (0, None), ("ptxas spilled registers", n, k, mode)
            r0, r1 = registers(k0), registers(k1)
            per_sm = 65536 // (32 * la.num_warps)  # registers of one CTA's threads, per register of a thread
            assert r1 is None or per_sm // r1 >= per_sm // r0, (n, k, mode, r0, r1)  # no fewer CTAs per SM


def test_mma_decode_with_pdl_builds_for_sm90():
    """The Gluon mma.sync decode kernel (8 rows, the 7B gate / up default config) with PDL: the same order -- signal,
    the weight block's and its scales' prefetch, wait, then every load and store (``pdl_gluon.py``)."""
    import sys
    from pathlib import Path

    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import mma_decode
    from quarl_kernels.formats import FMT_NVFP4

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    try:
        from bench_mma_decode import compile_mma_decode
    finally:
        sys.path.pop(0)
    cfg = mma_decode.default_config(8, 18944)
    tags = _ptx_order(compile_mma_decode(FMT_NVFP4, cfg, 8, split=False, pdl=True).asm["ptx"])
    first = min(tags.index("load"), tags.index("store"))
    assert tags[:first] == ["signal", "prefetch", "prefetch", "wait"], tags[:6]
    assert "wait" not in _ptx_order(compile_mma_decode(FMT_NVFP4, cfg, 8, split=False).asm["ptx"])
