"""The wgmma decode GEMM built for sm_90 without a GPU (Triton's bundled ptxas): every
NVFP4 candidate at both token tiles, and the MXFP4 / INT4 defaults (with a K tail), must
compile to HGMMA (no mma.sync), with no local-memory spills, the weight never in shared
memory (the only shared stores are x's: NT * BK * 2 bytes per step over the CTA), and
the wgmma kept asynchronous (one ``WARPGROUP.DEPBAR`` per K step, not one per HGMMA).

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="wgmma_decode is written in Gluon (Triton >= 3.5)")
from quarl_kernels import wgmma_decode  # after the skip: it imports Triton

ROOT = Path(__file__).resolve().parents[2]


def _build(fmt, cfg, nt, even_k=True, dump=None):
    sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
    try:
        import compile_report as cr
        from bench_wgmma_decode import compile_wgmma_decode
    finally:
        sys.path.pop(0)
    k = compile_wgmma_decode(fmt, cfg, nt, even_k=even_k)
    r = cr.report(k, "k", dump)
    if dump:  # the main loop's full opcodes (``WARPGROUP.DEPBAR.LE``: a wait for the wgmma group)
        sass = (Path(dump) / "k.sass").read_text()
        r["loop_ops"] = [op for op in cr._main_loop(sass)]
        r["depbar"] = sum(line.count("WARPGROUP.DEPBAR") for line in sass.splitlines())
    return r


CASES = [(0, c, nt, True) for nt in (32, 64) for c in wgmma_decode.candidate_configs(nt)] + [
    (fmt, wgmma_decode.default_config(m, 18944), wgmma_decode.token_tile(m), even)
    for fmt in (1, 2) for m in (32, 64) for even in (True, False)]


@pytest.mark.parametrize("fmt,cfg,nt,even_k", CASES, ids=[f"f{c[0]}-{c[1]}-NT{c[2]}-{'even' if c[3] else 'tail'}"
                                                           for c in CASES])
def test_compiles_to_async_hgmma_without_spills(fmt, cfg, nt, even_k, tmp_path):
    r = _build(fmt, cfg, nt, even_k, str(tmp_path))
    assert r["stack"] == 0, f"{cfg} NT={nt} spills ({r['regs']} registers)"
    assert r["hmma"] == 0 and r["loop_mma"] == (cfg.rows // (16 * cfg.warps)) * cfg.bkw // 2, r
    assert r["smem"] == cfg.nbuf * nt * cfg.bkw * 8 * 2  # the x ring only: the weight stays in registers
    per_thread_x = nt * cfg.bkw * 8 * 2 // (32 * cfg.warps)  # bytes of x each thread stores per step
    assert r["loop_sts"] * 16 <= max(per_thread_x, 64), (r["loop_sts"], per_thread_x)  # 16-byte stores only
    assert r["loop_bar"] <= 2 and r["regs"] <= 255
    # async: one wgmma group per K step, waited for one step later (ptxas serializing the
    # wgmmas would put a wait after each); plus the final wait(0) after the loop
    assert r["loop_ops"].count("WARPGROUP") == 2 and r["depbar"] == 2, (r["loop_ops"].count("WARPGROUP"), r["depbar"])
