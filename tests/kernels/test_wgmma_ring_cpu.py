"""The TMA-ring wgmma decode GEMM's host side on CPU (``quarl_kernels.wgmma_ring``): x's per-step permutation
(the A fragment's logical k order, as ``wgmma_decode._x_logical`` makes it in registers), configs, split-K sizing
under the scale buffer's cap, and the ``QUARL_KERNELS_WGMMA_RING`` switch in ``wo_matmul`` (launch stubbed).

Skipped unless Triton with Gluon is importable (the CPU CI has no Triton)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon", reason="wgmma_ring is written in Gluon (Triton >= 3.5)")
from quarl_kernels import wgmma_ring, wo_gemm  # after the skip: they import Triton
from quarl_kernels.formats import FMT_NVFP4


def test_permute_x_is_the_logical_k_order_of_every_step():
    torch.manual_seed(0)
    bkw, steps = 8, 3
    j = bkw // 4
    x = torch.randn(5, steps * bkw * 8)
    xp = wgmma_ring.permute_x(x, bkw)
    for s in range(steps):
        xs, ps = x[:, s * 64:(s + 1) * 64], xp[:, s * 64:(s + 1) * 64]
        for t in range(4):
            for jj in range(j):
                for code in range(8):
                    r, h = code % 4, code // 4
                    kl = 32 * jj + 16 * (r // 2) + 8 * (r % 2) + 2 * t + h
                    assert torch.equal(ps[:, kl], xs[:, 8 * (j * t + jj) + code])
    # the same as wgmma_decode's in-register permutation of one step ([n, t, j, h, r1, r0] -> [n, j, r1, r0, t, h])
    xl = x[:, :64].reshape(5, 4, j, 2, 2, 2).permute(0, 2, 4, 5, 1, 3).reshape(5, 64)
    assert torch.equal(xp[:, :64], xl)


def test_permute_x_pads_to_whole_token_tiles():
    x = torch.randn(70, 128)
    xp = wgmma_ring.permute_x(x, 8, wgmma_ring.tile_rows(70, 128))
    assert xp.shape == (128, 128) and torch.equal(xp[:70], wgmma_ring.permute_x(x, 8)) and not xp[70:].any()
    assert wgmma_ring.tile_rows(128, 128) == 128 and wgmma_ring.tile_rows(17, 32) == 32


def test_config_validation():
    with pytest.raises(ValueError, match="rows must be 64 or 128"):
        wgmma_ring.WgmmaRingConfig(rows=256)
    with pytest.raises(ValueError, match="stages must be 2..8"):
        wgmma_ring.WgmmaRingConfig(stages=1)
    with pytest.raises(ValueError, match="bkw must be 8"):
        wgmma_ring.WgmmaRingConfig(bkw=16)
    with pytest.raises(ValueError, match="tokens must be 0"):
        wgmma_ring.WgmmaRingConfig(tokens=64)
    with pytest.raises(ValueError, match="accumulator registers"):
        wgmma_ring.WgmmaRingConfig(rows=128, tokens=256)
    with pytest.raises(ValueError, match="warps must be 4, or 8 with rows=128"):
        wgmma_ring.WgmmaRingConfig(rows=64, warps=8)
    assert wgmma_ring.WgmmaRingConfig(rows=128, tokens=256, warps=8).tile(65) == 256
    assert all(isinstance(c, wgmma_ring.WgmmaRingConfig) for c in wgmma_ring.RING_CONFIGS + wgmma_ring.WIDE_CONFIGS)
    assert wgmma_ring.default_config(64, 18944) in wgmma_ring.RING_CONFIGS


def test_token_tile_by_rows():
    auto, wide = wgmma_ring.WgmmaRingConfig(), wgmma_ring.WgmmaRingConfig(tokens=256)
    assert [auto.tile(m) for m in (17, 32, 33, 64, 65, 2048)] == [32, 32, 64, 64, 128, 128]
    assert wide.tile(17) == wide.tile(300) == 256
    assert str(wide) == "ring-R64S4W4T256" and str(auto) == "ring-R64S4W4"


@pytest.mark.parametrize("m", [96, 256, 2048])
def test_split_counts_the_token_tiles(m):
    cfg = wgmma_ring.WgmmaRingConfig(tokens=128)
    mtiles = -(-m // 128)
    split, _ = wgmma_ring.split_for(cfg, 18944, 3584 // 8, 132, 16, mtiles)
    alone, _ = wgmma_ring.split_for(cfg, 18944, 3584 // 8, 132, 16)
    assert split <= alone  # more token tiles fill the SMs: no more K splits than one tile needs
    assert split == max(1, -(-4 * 132 // (296 * mtiles)))


@pytest.mark.parametrize("n,k", [(18944, 3584), (3584, 18944), (3584, 3584), (27648, 5120), (5120, 27648), (520, 1088)])
@pytest.mark.parametrize("cfg", wgmma_ring.RING_CONFIGS + wgmma_ring.WIDE_CONFIGS)
@pytest.mark.parametrize("group", [16, 32])
def test_split_covers_k_once_within_the_scale_buffer(n, k, cfg, group):
    kw = k // 8
    split, per = wgmma_ring.split_for(cfg, n, kw, 132, group)
    steps = -(-kw // cfg.bkw)
    assert (split - 1) * per < steps <= split * per  # every step in exactly one split, no empty split
    assert per <= cfg.smax(group)  # the split's scales fit the CTA's buffer
    ng = cfg.bkw // min(group // 8, cfg.bkw)
    assert cfg.smax(group) * cfg.rows * ng <= wgmma_ring.SCALE_SMEM


class _PW:
    fmt, group, n, k = FMT_NVFP4, 16, 6144, 3584


def test_wo_matmul_takes_it_by_default_and_the_switch_turns_it_off(monkeypatch):
    calls = []
    monkeypatch.setattr(wgmma_ring, "ring_supported", lambda x2, pw: True)
    monkeypatch.setattr(wgmma_ring, "launch_wgmma_ring",
                        lambda x2, pw, cfg, epi=None, xp=None: calls.append(cfg) or "ring")
    monkeypatch.setattr(wo_gemm, "_interpreting", lambda: False)
    monkeypatch.setattr(wo_gemm.dense, "use_dense", lambda m: False)
    monkeypatch.setattr(wo_gemm, "_wgmma_decode", lambda: None)
    monkeypatch.setattr(wo_gemm, "_mma_decode", lambda: None)
    monkeypatch.setattr(wo_gemm.gemv, "gemv_supported", lambda x2, pw: True)
    monkeypatch.setattr(wo_gemm, "_gemv", lambda x2, pw, tune, epi: "other")
    x = torch.zeros(48, 3584, dtype=torch.bfloat16)
    monkeypatch.setenv(wgmma_ring.ENV, "0")
    assert wo_gemm.wo_matmul(x, _PW(), tune=False) == "other"  # switched off
    monkeypatch.delenv(wgmma_ring.ENV, raising=False)  # on by default
    assert wo_gemm.wo_matmul(x, _PW(), tune=False) == "ring" and calls == [wgmma_ring.default_config(48, 6144, 3584)]
    assert wo_gemm.wo_matmul(x[:16], _PW(), tune=False) == "other"  # 16 rows: not its range
    assert wo_gemm.wo_matmul(x[:24], _PW(), tune=False) == "other"  # 22M weights at <= 32 rows: wgmma_decode's
    big = _PW()
    big.n = 18944
    assert wo_gemm.wo_matmul(x[:24], big, tune=False) == "ring"
    small = _PW()
    small.n = 512
    assert wo_gemm.wo_matmul(x, small, tune=False) == "other"  # a small weight stays off it


def test_defaults_follow_the_sweep():
    w = wgmma_ring.wide_config(128, 18944, 3584)
    assert (w.rows, w.stages, w.waves, w.tokens, w.warps) == (64, 3, 2, 128, 4)  # session 15, phase b's winner
    assert wgmma_ring.wide_max_m() == wgmma_ring.DEFAULT_WIDE_MAX_M == 384
    c = wgmma_ring.RING_CONFIGS
    assert wgmma_ring.default_config(32, 18944, 3584) == c[0] and wgmma_ring.default_config(64, 18944, 3584) == c[3]
    assert wgmma_ring.default_config(64, 3584, 3584).waves == 2 and wgmma_ring.default_config(24, 3584, 3584).waves == 2


def test_a_group_permutes_x_once_for_the_ring(monkeypatch):
    seen = []
    monkeypatch.setattr(wo_gemm, "_wgmma_ring", lambda: wgmma_ring)
    monkeypatch.setattr(wgmma_ring, "takes", lambda x2, pw: pw.n >= 4096)
    monkeypatch.setattr(wgmma_ring, "permute_x", lambda x2, bkw, rows: seen.append((bkw, rows)) or ("xp", x2.shape))
    monkeypatch.setattr(wo_gemm, "group_route", lambda x2, pws: None)
    got = []
    monkeypatch.setattr(wo_gemm, "wo_matmul", lambda x2, pw, epi=None, xp=None: got.append(xp) or x2)
    x = torch.zeros(48, 3584, dtype=torch.bfloat16)
    gate, up, small = _PW(), _PW(), _PW()
    small.n = 512
    wo_gemm.wo_matmul_group(x, [gate, up], [None, None])
    assert seen == [(8, 64)] and got == [("xp", (48, 3584))] * 2  # once for both, padded to the 64-row tile
    seen.clear(), got.clear()
    wo_gemm.wo_matmul_group(x, [gate, small, small], [None, None, None])
    assert seen == [] and got == [None] * 3  # one ring weight: it permutes its own


def test_wide_rows_route_by_size_and_the_switch(monkeypatch):
    """Above 64 rows: the wide token tiles up to ``QUARL_KERNELS_RING_WIDE_MAX_M`` rows on weights of >=
    ``WIDE_MIN_WEIGHTS``, ahead of the dense path; past the limit, on small weights or with the switch at 0, the
    dense path as before."""
    calls = []
    monkeypatch.setattr(wgmma_ring, "ring_supported", lambda x2, pw: True)
    monkeypatch.setattr(wgmma_ring, "launch_wgmma_ring",
                        lambda x2, pw, cfg, epi=None, xp=None: calls.append(cfg) or "ring")
    monkeypatch.setattr(wo_gemm, "_interpreting", lambda: False)
    monkeypatch.setattr(wo_gemm.dense, "dense_matmul", lambda x2, pw: "dense")
    monkeypatch.setattr(wo_gemm, "_finish", lambda ws, y, split, epi: y)
    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "96")
    monkeypatch.setenv(wgmma_ring.WIDE_ENV, "200")
    x = torch.zeros(256, 3584, dtype=torch.bfloat16)
    assert wo_gemm.wo_matmul(x[:128], _PW(), tune=False) == "ring"  # above the dense floor: the ring goes first
    assert calls == [wgmma_ring.wide_config(128, 6144, 3584)] and calls[0].tile(128) >= 128
    assert wo_gemm.wo_matmul(x[:201], _PW(), tune=False) == "dense"  # past the limit
    small = _PW()
    small.n = 512
    assert wo_gemm.wo_matmul(x[:128], small, tune=False) == "dense"  # 1.8M weights: below WIDE_MIN_WEIGHTS
    mid = _PW()
    mid.n, mid.k = 1024, 5120  # 5.2M weights (14B k / v): up to WIDE_SMALL_MAX_M rows
    monkeypatch.setenv(wgmma_ring.WIDE_ENV, "384")
    assert wo_gemm.wo_matmul(x[:200], mid, tune=False) == "ring"
    assert wo_gemm.wo_matmul(torch.zeros(300, 5120, dtype=torch.bfloat16), mid, tune=False) == "dense"
    assert wo_gemm.wo_matmul(torch.zeros(300, 3584, dtype=torch.bfloat16), _PW(), tune=False) == "ring"  # 22M: to 384
    monkeypatch.setenv(wgmma_ring.WIDE_ENV, "0")
    assert wo_gemm.wo_matmul(x[:128], _PW(), tune=False) == "dense"
    monkeypatch.setenv(wgmma_ring.WIDE_ENV, "lots")
    with pytest.raises(ValueError, match="QUARL_KERNELS_RING_WIDE_MAX_M='lots' is not an integer"):
        wo_gemm.wo_matmul(x[:128], _PW(), tune=False)
