"""The stream-K wgmma decode kernel (``benchmarks/kernels/wgmma_stream.py``, an experiment) builds for sm_90 on a CPU in every form it
launches -- NVFP4 / MXFP4, 8- and 16-token tiles, words row-major / blocked, partials or the direct bf16 store: no
spills, its ring inside the 227 KB of shared memory an H100 CTA may use, and 32 wgmma (two consumers, four K steps
of four k16 MMAs); and ``slots`` (the partial slots a launch allocates) against a brute-force walk of the CTAs'
shares. Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel is written in Gluon (Triton >= 3.5)")

BENCH_KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


def _stream():
    """The experiment's module, from benchmarks/kernels."""
    import sys
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels")
    if path not in sys.path:
        sys.path.insert(0, path)
    import wgmma_stream

    return wgmma_stream


@pytest.mark.parametrize("fmt", [0, 1], ids=["nvfp4", "mxfp4"])
@pytest.mark.parametrize("nt", [8, 16])
@pytest.mark.parametrize("blocked", [False, True], ids=["rowmajor", "blocked"])
@pytest.mark.parametrize("direct", [False, True], ids=["partials", "direct"])
@pytest.mark.parametrize("wide", [False, True], ids=["steps", "wide"])
def test_builds_for_sm90(fmt, nt, blocked, direct, wide):
    wgmma_stream = _stream()

    sys.path.insert(0, str(BENCH_KERNELS))
    try:
        import compile_report as cr
    finally:
        sys.path.pop(0)
    r = cr.report(wgmma_stream.compile_sm90(fmt, nt=nt, blocked=blocked, direct=direct,
                                                              wide=wide and blocked), "wgmma_stream", None)
    assert r["stack"] == 0, f"ptxas spilled ({r['regs']} registers)"
    assert 0 < r["smem"] <= 227 * 1024, r["smem"]
    assert r["wgmma"] == 32, r


@pytest.mark.parametrize(("tiles", "chunks", "ctas"), [(148, 14, 132), (28, 74, 132), (4, 14, 56), (8, 16, 8),
                                                       (8, 16, 3), (108, 20, 132), (1, 1, 1), (5, 3, 15)])
def test_slots_match_a_walk_of_the_shares(tiles, chunks, ctas):
    wgmma_stream = _stream()

    t_all = tiles * chunks
    ctas = min(ctas, t_all)
    owners = [set() for _ in range(tiles)]
    for p in range(ctas):
        for c in range(p * t_all // ctas, (p + 1) * t_all // ctas):
            owners[c // chunks].add(p)
    assert wgmma_stream.slots(tiles, chunks, ctas) == max(len(o) for o in owners)
    for t, o in enumerate(owners):  # the kernel's first / last CTA of a tile
        assert min(o) == ((t * chunks + 1) * ctas - 1) // t_all
        assert max(o) == ((t * chunks + chunks) * ctas - 1) // t_all
