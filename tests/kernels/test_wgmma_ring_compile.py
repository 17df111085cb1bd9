"""The TMA-ring wgmma decode GEMM built for sm_90 without a GPU (Triton's bundled ptxas): every ring config at both
token tiles, NVFP4 and MXFP4, must compile to HGMMA without spills, and its K loop must be what the design says
(``wgmma_ring`` module docstring): the x and weight tiles arrive by TMA (``UTMALDG``) and an mbarrier wait, the
weight words are read back from shared memory, and nothing in the loop loads global memory or stores to shared
memory (the x permutation, stores and fence that ``wgmma_decode`` pays per step are gone).

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="wgmma_ring is written in Gluon (Triton >= 3.5)")
from quarl_kernels import wgmma_ring  # after the skip: it imports Triton

ROOT = Path(__file__).resolve().parents[2]
_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);")


def _build(fmt, cfg, nt, dump):
    sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
    try:
        import compile_report as cr
        from bench_wgmma_decode import compile_wgmma_ring
    finally:
        sys.path.pop(0)
    r = cr.report(compile_wgmma_ring(fmt, cfg, nt), "k", dump)
    return r, (Path(dump) / "k.sass").read_text()


def k_loop(sass: str, full: bool = False) -> list[str]:
    """Opcodes (``full``: whole instructions) of the K loop: the smallest backward-branch span that holds every
    HGMMA (the mbarrier wait's out-of-line retry branches back from past the epilogue, so "largest loop" would
    mislead)."""
    ins = [(int(a, 16), op + rest if full else op) for a, op, rest in _INS.findall(sass)]
    mma = [a for a, op in ins if op.startswith("HGMMA")]
    spans = []
    for a, op in ins:
        if op.startswith("BRA"):
            m = re.search(rf"/\*{a:04x}\*/[^;]*BRA[^;]*0x([0-9a-f]+)", sass)
            t = int(m.group(1), 16) if m else None
            if t is not None and t <= min(mma) and a >= max(mma):
                spans.append((a - t, t, a))
    assert spans, "no loop around the HGMMAs"
    _, lo, hi = min(spans)
    return [op if full else op.split(".")[0] for a, op in ins if lo <= a <= hi]


CASES = [(0, c, nt) for c in wgmma_ring.RING_CONFIGS for nt in (32, 64)] + [(1, wgmma_ring.RING_CONFIGS[0], 64)] + [
    (0, c, c.tokens) for c in wgmma_ring.WIDE_CONFIGS] + [(1, wgmma_ring.WIDE_CONFIGS[4], 256)]


@pytest.mark.parametrize("fmt,cfg,nt", CASES, ids=[f"f{c[0]}-{c[1]}-NT{c[2]}" for c in CASES])
def test_k_loop_is_tma_fed_without_spills(fmt, cfg, nt, tmp_path):
    r, sass = _build(fmt, cfg, nt, str(tmp_path))
    assert r["stack"] == 0, f"{cfg} NT={nt} spills ({r['regs']} registers)"
    assert r["hmma"] == 0
    loop = k_loop(sass)
    assert loop.count("HGMMA") == cfg.rows // (16 * cfg.warps) * cfg.bkw // 2  # a warpgroup's m64 tiles x k16 slabs
    assert loop.count("UTMALDG") == 2  # the refill: one x box, one word box
    assert loop.count("SYNCS") >= 2  # the mbarrier wait and the refill's expect
    assert "LDS" in loop  # the words (and scales) come back from shared memory
    assert "LDG" not in loop and "STS" not in loop
    # the step's own wgmma is waited for before the next decode rewrites its A registers (inflight = 0), or only
    # the previous step's (1, the measured-and-not-kept overlap)
    waits = [i.strip() for i in k_loop(sass, full=True) if i.startswith("WARPGROUP.DEPBAR")]
    assert waits == [f"WARPGROUP.DEPBAR.LE gsb0, 0x{cfg.inflight}"], waits
    # x stages + word stages + the scale buffer (SMAX = 32 steps here) + the barriers
    ng = cfg.bkw // min((16 if fmt == 0 else 32) // 8, cfg.bkw)
    assert r["smem"] >= cfg.stages * (nt * cfg.bkw * 16 + cfg.rows * cfg.bkw * 4) + 32 * cfg.rows * ng
