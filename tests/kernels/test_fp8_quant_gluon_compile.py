"""The Gluon one-read FP8 quantizers (``benchmarks/kernels/fp8_quant_gluon.py``: the one-tile kernel, measured in
session 26 and not kept -- half the split settings' speed -- and the persistent one that prefetches its next tile,
prepared and not yet run) build for sm_90 on a CPU in every form: no spills, exact division, the saturating RNE E4M3
cast and 16-byte loads. The first one's bits were checked on an H200 while it was a launch candidate; the
benchmark (``fp8_quant_operands.py --gluon``) checks both kernels' bytes before timing them.

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton).
"""

from __future__ import annotations

import pytest

from tests.kernels.helpers import bench_kernel_module

pytest.importorskip("triton.experimental.gluon", reason="the kernel is written in Gluon (Triton >= 3.5)")


@pytest.mark.parametrize("tiles", [False, True], ids=["1x128", "tiles"])
@pytest.mark.parametrize("rows", [True, False], ids=["rows", "t-only"])
@pytest.mark.parametrize("warps", [8, 16])
@pytest.mark.parametrize("persistent", [False, True], ids=["tile", "persistent"])
def test_builds_for_sm90(tiles, rows, warps, persistent):
    cr, fp8_quant_gluon = bench_kernel_module("compile_report"), bench_kernel_module("fp8_quant_gluon")
    k = fp8_quant_gluon.compile_sm90(tiles=tiles, rows=rows, warps=warps, persistent=persistent)
    r = cr.report(k, "_dual_kernel", None)
    assert r["stack"] == 0, f"ptxas spilled ({r['regs']} registers)"
    ptx = k.asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full" not in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "ld.global.v4.b32" in ptx  # each thread's columns of a token as one 16-byte load
