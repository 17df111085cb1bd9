"""The warp-specialized mixed-input GEMM experiment (``benchmarks/kernels/ws_mixed_gemm.py``, issue 17's M >= 2048
target; on an H100 in session 17 correct but 0.48-0.62x cuBLAS, its persistent version of session 22 0.61-0.85x) builds
for sm_90 on a CPU for both FP4 formats: no spills, its rings inside the 227 KB of shared memory an H100 CTA may use,
and wgmma in the build (the MMA partition really issues the tensor-core MMA).

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel is written in Gluon (Triton >= 3.5)")

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.mark.parametrize("fmt", [0, 1], ids=["nvfp4", "mxfp4"])
def test_builds_for_sm90(fmt):
    sys.path.insert(0, str(KERNELS))
    try:
        import compile_report as cr
        import ws_mixed_gemm as ws
    finally:
        sys.path.pop(0)
    r = cr.report(ws.compile_sm90(fmt), f"ws-gemm fmt{fmt}", None)
    assert r["stack"] == 0, f"ptxas spilled ({r['regs']} registers)"
    assert 0 < r["smem"] <= 227 * 1024, r["smem"]
    assert r["wgmma"] > 0, r


@pytest.mark.parametrize("variant", ["ssmem", "ssmem-nofence", "ssmem-nofence-d3", "bm256", "bm256-d3", "bm256-spf",
                                     "bm256-spf-s4", "bm128-spf", "bm256-spf-s5", "bm256-s4"])
def test_nvfp4_variants_build_for_sm90(variant):
    """Session 17's variants (the scale bytes staged by the loader warp; no proxy fence after the word reads; a third
    decoded-tile stage; two MMA warpgroups on 256-token tiles): no spills, inside the shared memory, wgmma built."""
    sys.path.insert(0, str(KERNELS))
    try:
        import compile_report as cr
        import ws_mixed_gemm as ws
    finally:
        sys.path.pop(0)
    r = cr.report(ws.compile_sm90(0, **ws.VARIANTS[variant]), variant, None)
    assert r["stack"] == 0 and 0 < r["smem"] <= 227 * 1024 and r["wgmma"] > 0, r


@pytest.mark.parametrize("variant", ["p-bm256", "p-bm256-s3", "p-bm256-hs", "p-bm256-st", "p-w2", "p-w2-swap",
                                     "p-w2-swap-hs", "p-w2-swap-r120"])
def test_persistent_variants_build_for_sm90(variant):
    """Session 22's persistent kernel and its variants (diagnostics, a two-warp decoder, swapped operands): no
    spills, inside the shared memory, wgmma built -- m64n256 (half the instructions of m64n128) when swapped."""
    sys.path.insert(0, str(KERNELS))
    try:
        import compile_report as cr
        import ws_mixed_gemm as ws
    finally:
        sys.path.pop(0)
    assert variant in ws.PERSISTENT
    r = cr.report(ws.compile_sm90_persistent(variant), variant, None)
    assert r["stack"] == 0 and 0 < r["smem"] <= 227 * 1024 and r["wgmma"] > 0, r
    swapped = len(ws.PERSISTENT[variant]) > 7 and ws.PERSISTENT[variant][7]
    assert r["wgmma"] == (4 if swapped else 8), r
