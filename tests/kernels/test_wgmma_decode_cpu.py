"""The wgmma decode GEMM's host side on CPU (``quarl_kernels.wgmma_decode``): configs,
token tiles, split-K sizing, the ``QUARL_KERNELS_WGMMA_DECODE`` switch and ``wo_matmul``'s
dispatch with it (launches stubbed), plus the K-permutation algebra the kernel relies on
(A's logical k order and x's, emulated with the kernel's own reshape / permute).

Skipped unless Triton with Gluon is importable (the CPU CI has no Triton)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon", reason="wgmma_decode is written in Gluon (Triton >= 3.5)")
from quarl_kernels import launch, wgmma_decode, wo_gemm  # after the skip: they import Triton

C = wgmma_decode.WGMMA_DECODE_CONFIGS


@pytest.mark.parametrize("raw,want", [(None, "auto"), ("auto", "auto"), (" AUTO ", "auto"), ("1", "on"), ("on", "on"),
                                      ("TRUE", "on"), (" yes ", "on"), ("0", "off"), ("off", "off"), ("", "off"),
                                      ("No", "off")])
def test_env_switch(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(wgmma_decode.ENV, raising=False)
    else:
        monkeypatch.setenv(wgmma_decode.ENV, raw)
    assert wgmma_decode.mode() == want and wgmma_decode.enabled() is (want != "off")
    assert wo_gemm.WGMMA_DECODE_ENV == wgmma_decode.ENV


def test_env_switch_rejects_other_values(monkeypatch):
    monkeypatch.setenv(wgmma_decode.ENV, "2")
    with pytest.raises(ValueError, match="QUARL_KERNELS_WGMMA_DECODE='2'"):
        wgmma_decode.enabled()
    with pytest.raises(ValueError, match="neither on nor off"):
        launch.env_flag(wgmma_decode.ENV, False)


def test_token_tiles_candidates_defaults():
    assert [wgmma_decode.token_tile(m) for m in (17, 24, 32, 33, 48, 64)] == [32, 32, 32, 64, 64, 64]
    for bad in (16, 65):
        with pytest.raises(ValueError, match="mma_decode"):
            wgmma_decode.token_tile(bad)
    for m in (17, 32, 33, 64):
        cands = wgmma_decode.candidate_configs(m)
        assert cands and all(c in C for c in cands)
        assert wgmma_decode.default_config(m, 18944) in cands
    # NT = 64 keeps the configs that compile below ~210 registers (bench --dry-run): not 2 / 7
    assert C[2] not in wgmma_decode.candidate_configs(64) and C[7] not in wgmma_decode.candidate_configs(64)
    assert wgmma_decode.preferred(64, 18944, 3584) and not wgmma_decode.preferred(64, 512, 3584)
    assert not wgmma_decode.preferred(16, 18944, 3584)
    # the measured rule: NVFP4 at NT = 64 with N > K stays on mma_decode unless forced; N <= K, NT = 32, other formats: wgmma
    from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4

    assert not wgmma_decode.preferred(64, 18944, 3584, FMT_NVFP4) and wgmma_decode.preferred(64, 18944, 3584, FMT_NVFP4,
                                                                                               forced=True)
    assert wgmma_decode.preferred(64, 3584, 18944, FMT_NVFP4) and wgmma_decode.preferred(32, 18944, 3584, FMT_NVFP4)
    assert wgmma_decode.preferred(64, 18944, 3584, FMT_MXFP4) and wgmma_decode.preferred(64, 18944, 3584, FMT_INT4)
    assert wgmma_decode.preferred(32, 3584, 3584) and not wgmma_decode.preferred(32, 1024, 4096)


def test_nvfp4_rules_for_14b_sized_weights():
    """Session 19 (phase i, in the engine): NVFP4 weights of 5M..12M entries (14B k / v, 1024 x 5120) take the kernel at
    33..64 rows (not at 17..32, not smaller ones, not other formats); NVFP4 at 17..32 rows with N >= 5120 (14B q / o)
    takes config 1, every other case its token tile's default."""
    from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4

    assert wgmma_decode.preferred(64, 1024, 5120, FMT_NVFP4) and wgmma_decode.preferred(33, 1024, 5120, FMT_NVFP4)
    assert not wgmma_decode.preferred(32, 1024, 5120, FMT_NVFP4)  # 17..32 rows: a tie there, left as it was
    assert not wgmma_decode.preferred(64, 512, 3584, FMT_NVFP4)  # 7B k / v (1.8M): the Triton kernel stays faster
    assert not wgmma_decode.preferred(64, 1024, 4096, FMT_NVFP4)  # 8B-class k / v (4.2M): not measured, left as it was
    assert not wgmma_decode.preferred(64, 1024, 5120, FMT_MXFP4)
    assert not wgmma_decode.preferred(64, 1024, 5120, FMT_INT4)
    assert not wgmma_decode.preferred(64, 1024, 5120)  # format unknown: the size rule alone
    assert wgmma_decode.default_config(32, 5120, FMT_NVFP4) == C[1]
    assert wgmma_decode.default_config(17, 5120, FMT_NVFP4) == C[1]
    assert wgmma_decode.default_config(32, 4096, FMT_NVFP4) == C[2]  # the 8B class: not measured, as before
    assert wgmma_decode.default_config(32, 3584, FMT_NVFP4) == C[2]  # 7B q / o: config 2 as measured (v11)
    assert wgmma_decode.default_config(32, 5120, FMT_MXFP4) == C[2] and wgmma_decode.default_config(32, 5120) == C[2]
    assert wgmma_decode.default_config(64, 5120, FMT_NVFP4) == C[1]  # NT = 64: its default (config 1) anyway


def test_config_validation():
    assert C[0].nbuf == 2 and C[3].nbuf == 3  # two warpgroups need a third x buffer
    assert str(C[0]) == "wg-R128xBK64w4pW4"
    for bad in [{"rows": 96, "bkw": 8}, {"rows": 64, "bkw": 8, "warps": 8}, {"rows": 128, "bkw": 4}, {"rows": 128, "bkw": 8, "warps": 2}]:
        with pytest.raises(ValueError, match="WgmmaDecodeConfig"):
            wgmma_decode.WgmmaDecodeConfig(**bad)


@pytest.mark.parametrize("n,k", [(18944, 3584), (3584, 18944), (512, 3584), (27648, 5120), (64, 64)])
@pytest.mark.parametrize("cfg", C, ids=str)
def test_split_covers_k_exactly_once(n, k, cfg):
    kw = k // 8
    split, per = wgmma_decode.split_for(cfg, n, kw, 132)
    steps = -(-kw // cfg.bkw)
    assert 1 <= split <= 64 and per >= 1
    assert (split - 1) * per < steps <= split * per  # every split has >= 1 step, all steps covered
    tiles = -(-n // cfg.rows)
    assert split == 1 or tiles * (split - 1) < cfg.waves * 132  # no more splits than needed to fill the waves


def test_supported_needs_cuda_sm90():
    pw = wo_gemm.PackedWeight(0, 16, 256, 512, torch.zeros(256, 64, dtype=torch.int32),
                              torch.zeros(256, 32, dtype=torch.uint8), None, torch.ones(1))
    assert not wgmma_decode.wgmma_decode_supported(torch.zeros(32, 512, dtype=torch.bfloat16), pw)  # CPU
    with pytest.raises(ValueError, match="sm_90"):
        wgmma_decode.launch_wgmma_decode(torch.zeros(32, 512, dtype=torch.bfloat16), pw, C[0])


def _pw(n=20480, k=1024):
    return wo_gemm.PackedWeight(0, 16, n, k, torch.zeros(n, k // 8, dtype=torch.int32),
                                torch.zeros(n, k // 16, dtype=torch.uint8), None, torch.ones(1))


@pytest.mark.parametrize("switch,m,n,want", [
    ("1", 32, 20480, "wgmma"), ("1", 64, 20480, "wgmma"), ("1", 17, 20480, "wgmma"),
    ("1", 16, 20480, "mma"),  # below 17 tokens: mma_decode
    ("1", 32, 512, "tc"),  # small weight: neither decode kernel prefers it above 16 tokens
    ("0", 32, 20480, "mma"), ("off", 64, 20480, "mma"),  # switched off
    (None, 32, 20480, "wgmma"), ("auto", 17, 20480, "wgmma"),  # the default (auto): NVFP4 at NT = 32
    (None, 64, 20480, "mma"), ("auto", 64, 20480, "mma"),  # auto: NVFP4 at NT = 64 with N > K stays on mma_decode
    (None, 64, 5120, "wgmma"), (None, 32, 5120, "tc"),  # 5.2M entries (14B k / v shaped: 5120 x 1024): 33..64 rows only
])
def test_dispatch_behind_the_switch(monkeypatch, switch, m, n, want):
    from quarl_kernels import mma_decode

    if switch is None:
        monkeypatch.delenv(wgmma_decode.ENV, raising=False)
    else:
        monkeypatch.setenv(wgmma_decode.ENV, switch)
    monkeypatch.setattr(wo_gemm, "_WGMMA_DECODE_BROKEN", None)
    monkeypatch.setattr(wo_gemm, "_MMA_DECODE_BROKEN", None)
    monkeypatch.setattr(wo_gemm, "_interpreting", lambda: False)
    monkeypatch.setattr(wo_gemm, "_wgmma_ring", lambda: None)  # the TMA ring (tested on its own) would ask the driver
    monkeypatch.setattr(wgmma_decode, "device_ok", lambda d: True)
    monkeypatch.setattr(mma_decode, "mma_decode_supported", lambda x2, pw: True)
    monkeypatch.setattr(wgmma_decode, "launch_wgmma_decode", lambda x2, pw, c, epi=None: ("wgmma", c))
    monkeypatch.setattr(mma_decode, "launch_mma_decode", lambda x2, pw, c, epi=None: ("mma", c))
    monkeypatch.setattr(wo_gemm.gemv, "gemv_supported", lambda x2, pw: False)
    monkeypatch.setattr(wo_gemm, "launch_fwd", lambda x2, pw, c, epi=None: ("tc", c))
    x = torch.zeros(m, 1024, dtype=torch.bfloat16)
    monkeypatch.setattr(type(x), "is_cuda", property(lambda self: True))
    kind, cfg = wo_gemm.wo_matmul(x, _pw(n), tune=False)
    assert kind == want
    if want == "wgmma":
        assert cfg == wgmma_decode.default_config(m, n, 0)


def test_dispatch_falls_back_when_wgmma_fails_to_build(monkeypatch):
    import triton
    from quarl_kernels import mma_decode

    def broken(*a, **k):
        raise triton.compiler.errors.CompilationError("src", None, "hopper gluon API moved")

    monkeypatch.setenv(wgmma_decode.ENV, "1")
    monkeypatch.setattr(wo_gemm, "_WGMMA_DECODE_BROKEN", None)
    monkeypatch.setattr(wo_gemm, "_MMA_DECODE_BROKEN", None)
    monkeypatch.setattr(wo_gemm, "_interpreting", lambda: False)
    monkeypatch.setattr(wgmma_decode, "wgmma_decode_supported", lambda x2, pw: True)
    monkeypatch.setattr(mma_decode, "mma_decode_supported", lambda x2, pw: True)
    monkeypatch.setattr(wgmma_decode, "launch_wgmma_decode", broken)
    monkeypatch.setattr(mma_decode, "launch_mma_decode", lambda x2, pw, c, epi=None: "mma")
    x = torch.zeros(64, 1024, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="falls back to the mma.sync kernel"):
        assert wo_gemm.wo_matmul(x, _pw(), tune=False) == "mma"
    assert wo_gemm._wgmma_decode() is None and wo_gemm.wo_matmul(x, _pw(), tune=False) == "mma"


@pytest.mark.parametrize("bkw", [8, 16])
def test_k_permutation_pairs_a_and_x(bkw):
    """The kernel's reshape / permute of the decoded pairs (A) and of x give the same logical
    k order: sum over logical k of A * x equals the natural product. The decode's pair order
    is emulated: output e = 2 r + h of a word is code r + 4 h."""
    torch.manual_seed(bkw)
    r_, nt, j = 8, 4, bkw // 4
    w = torch.randn(r_, bkw * 8, dtype=torch.float64)  # natural order: word q, code c at 8 q + c
    x = torch.randn(nt, bkw * 8, dtype=torch.float64)
    words = w.reshape(r_, bkw, 8)
    p = [words[:, :, (e // 2) + 4 * (e % 2)] for e in range(8)]  # p_e = code r + 4 h, e = 2 r + h
    # gl.join stacks on a new last dim: [R, BKW, a, b, c] = p[a + 2b + 4c]
    q = torch.stack([torch.stack([torch.stack([p[a + 2 * b + 4 * c] for a in (0, 1)], -1) for b in (0, 1)], -1)
                     for c in (0, 1)], -1)
    q = q.reshape(r_, 4, j, 2, 2, 2)  # [R, t, j, h, r0, r1]
    a = q.permute(0, 2, 5, 4, 1, 3).reshape(r_, bkw * 8)  # the kernel's A permutation
    xl = x.reshape(nt, 4, j, 2, 2, 2).permute(0, 2, 4, 5, 1, 3).reshape(nt, bkw * 8)  # the kernel's _x_logical
    assert torch.allclose(a @ xl.T, w @ x.T)
    # and the logical k of (word J t + j, code r + 4 h) is 32 j + 16 r1 + 8 r0 + 2 t + h (module docstring)
    for t in range(4):
        for jj in range(j):
            for code in range(8):
                r, h = code % 4, code // 4
                kl = 32 * jj + 16 * (r // 2) + 8 * (r % 2) + 2 * t + h
                assert a[0, kl] == w[0, 8 * (j * t + jj) + code] and xl[0, kl] == x[0, 8 * (j * t + jj) + code]
