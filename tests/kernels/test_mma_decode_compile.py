"""The Gluon mma.sync decode GEMM's config helpers and its sm_90 build, without a GPU.

``mma_decode.default_config`` sends M = 17..64 to token tiles of 32 / 64, where the
B fragments and accumulators crowd the register file; a config that spills there
would still be correct but slow. Triton compiles Gluon for sm_90 with its bundled
ptxas on any machine, so the registers, local-memory stack and shared memory of
the default large-M configs are checked here (what ``bench_mma_decode.py
--compile-report`` prints for every config): no spills, no shared memory (every
layout conversion stays in registers); and that the shared-x configs read their B
fragments with 16-byte loads straight into the HMMA operands.

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="mma_decode is written in Gluon (Triton >= 3.5)")
from quarl_kernels import mma_decode  # after the skip: it imports Triton
from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4

ROOT = Path(__file__).resolve().parents[2]
C = mma_decode.MMA_DECODE_CONFIGS


def test_token_tiles_and_defaults():
    assert [mma_decode.token_tile(m) for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [8, 8, 16, 16, 32, 32, 64, 64]
    assert mma_decode.MAX_M == 64
    # M <= 16 keeps wo_gemm's measured choice: 1 for N <= 1024, 4 above
    assert mma_decode.default_config(2, 512) is C[1] and mma_decode.default_config(16, 1024) is C[1]
    assert mma_decode.default_config(8, 18944) is C[4] and mma_decode.default_config(16, 3584) is C[4]
    for m in (2, 8, 16, 17, 32, 33, 64):
        for n in (512, 18944):
            assert mma_decode.default_config(m, n) in mma_decode.candidate_configs(m)
    assert mma_decode.candidate_configs(8) == C[:6]  # the M <= 16 set is unchanged



def _report(fmt, cfg, m, even_k=True):
    sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
    try:
        import compile_report as cr
        from bench_mma_decode import compile_mma_decode
    finally:
        sys.path.pop(0)
    return cr.report(compile_mma_decode(fmt, cfg, mma_decode.token_tile(m), even_k=even_k), f"{cfg}-M{m}", None)


@pytest.mark.parametrize("fmt", [FMT_NVFP4, FMT_MXFP4, FMT_INT4], ids=["nvfp4", "mxfp4", "int4"])
@pytest.mark.parametrize("m", [32, 64])
def test_large_m_default_compiles_without_spills(fmt, m):
    cfg = mma_decode.default_config(m, 18944)
    r = _report(fmt, cfg, m)
    assert r["stack"] == 0, f"{cfg} at M = {m} spills ({r['regs']} registers, {r['stack']} B stack)"
    if cfg.xsmem:  # x staged through shared memory (the measured default above 16 tokens): weights never are
        assert 0 < r["smem"] <= 2 * 64 * cfg.bkw * 8 * 2 and r["loop_bar"] <= 2, (cfg, r["smem"], r["loop_bar"])
    else:
        assert r["smem"] == 0 and r["loop_bar"] == 0, f"{cfg} at M = {m} goes through shared memory"
    assert r["hmma"] > 0 and r["regs"] <= 255


@pytest.mark.parametrize("idx,m", [(11, 32), (12, 64), (13, 32)])
def test_shared_x_configs_compile_as_designed(idx, m):
    """x staged in shared memory: no spills, 16-byte LDS straight into HMMA operands (the
    B pairing holds: far fewer instructions than the register path), at most 2 barriers."""
    cfg = C[idx]
    r = _report(FMT_INT4, cfg, m, even_k=False)
    plain = _report(FMT_INT4, mma_decode.MmaDecodeConfig(cfg.rows, cfg.bkw, cfg.warps, cfg.prefetch), m, even_k=False)
    assert r["stack"] == 0 and 0 < r["smem"] <= 16384 and 1 <= r["loop_bar"] <= 2
    assert r["loop_lds"] == mma_decode.token_tile(m) // 4  # [NT, 64] bf16 per thread: NT / 8 octets x 2 LDS.128
    assert r["loop_len"] < 0.9 * plain["loop_len"], (r["loop_len"], plain["loop_len"])


def test_shared_x_needs_8_word_steps():
    with pytest.raises(ValueError, match="bkw = 8"):
        mma_decode.MmaDecodeConfig(128, 16, 4, xsmem=True)



@pytest.mark.parametrize("m,n", [(8, 3584), (8, 512), (16, 18944), (16, 512)])
def test_lora_a_programs_compile_without_costing_the_tiles_registers(m, n):
    """With a LoRA group's A programs in front (``HAS_LA``, ``lora_a``), the default M <= 16 launches build for sm_90
    without spills, with the same tensor-core work and without costing the weight tiles occupancy (CTAs per SM
    by registers)."""
    cfg = mma_decode.default_config(m, n)
    sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
    try:
        import compile_report as cr
        from bench_mma_decode import compile_mma_decode
    finally:
        sys.path.pop(0)
    nt = mma_decode.token_tile(m)
    plain = cr.report(compile_mma_decode(FMT_NVFP4, cfg, nt), f"{cfg}-M{m}", None)
    fused = cr.report(compile_mma_decode(FMT_NVFP4, cfg, nt, lora_a=True), f"{cfg}-M{m}-la", None)
    print(m, n, cfg, "regs", plain["regs"], fused["regs"], "loop", plain["loop_len"], fused["loop_len"])
    assert fused["stack"] == 0, (plain["regs"], fused["regs"])
    def per_sm(regs):  # CTAs an SM's 64K registers hold: the A branch must not lower it
        return 65536 // (regs * 32 * cfg.warps)

    assert per_sm(fused["regs"]) >= per_sm(plain["regs"]), (plain["regs"], fused["regs"])
    assert fused["hmma"] == plain["hmma"], (plain, fused)


@pytest.mark.parametrize("m,nw", [(8, 3), (16, 2)])
def test_group_launch_compiles_without_costing_the_tiles_registers(m, nw):
    """Two or three weights' tiles and the A programs in one launch (a group's q/k/v, gate/up: NW), built for sm_90:
    no spills, the same tensor-core work per tile, no CTAs per SM lost against one weight's launch."""
    cfg = mma_decode.default_config(m, 3584)
    sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
    try:
        import compile_report as cr
        from bench_mma_decode import compile_mma_decode
    finally:
        sys.path.pop(0)
    nt = mma_decode.token_tile(m)
    one = cr.report(compile_mma_decode(FMT_NVFP4, cfg, nt, lora_a=True), f"{cfg}-M{m}-la", None)
    grp = cr.report(compile_mma_decode(FMT_NVFP4, cfg, nt, lora_a=True, nw=nw), f"{cfg}-M{m}-la-nw{nw}", None)
    print(m, nw, "regs", one["regs"], grp["regs"])
    per_sm = 65536 // (32 * cfg.warps)
    assert grp["stack"] == 0 and per_sm // grp["regs"] >= per_sm // one["regs"], (one["regs"], grp["regs"])
