"""The large-M register-A mixed-input GEMM (``quarl_kernels.mixed_gemm``) builds for sm_90 on a CPU in every form
it launches -- NVFP4 / MXFP4, words row-major / blocked, the decode serialized / overlapped with the MMA, the A
fragment in the permuted or the natural k order (its quad byte transpose): no spills
(its two consumer warpgroups hold a [64, 256] fp32 accumulator each beside the A fragment), its ring inside the
227 KB of shared memory an H100 CTA may use, and eight m64n256 wgmma (four k16 steps per consumer).

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton).
"""

from __future__ import annotations

import pytest

from tests.kernels.helpers import bench_kernel_module

pytest.importorskip("triton.experimental.gluon", reason="the kernel is written in Gluon (Triton >= 3.5)")


@pytest.mark.parametrize("fmt", [0, 1], ids=["nvfp4", "mxfp4"])
@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("blocked", [False, True], ids=["rowmajor", "blocked"])
@pytest.mark.parametrize("natural", [False, True], ids=["permuted", "natural"])
def test_builds_for_sm90(fmt, overlap, blocked, natural):
    from quarl_kernels import mixed_gemm

    cr = bench_kernel_module("compile_report")
    r = cr.report(mixed_gemm.compile_sm90(fmt, overlap=overlap, blocked=blocked, natural=natural), "mixed_gemm", None)
    assert r["stack"] == 0, f"ptxas spilled ({r['regs']} registers)"
    assert 0 < r["smem"] <= 227 * 1024, r["smem"]
    assert r["wgmma"] == 8, r
