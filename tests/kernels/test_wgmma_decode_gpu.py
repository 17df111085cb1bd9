"""GPU correctness of the Hopper wgmma decode GEMM (``quarl_kernels.wgmma_decode``), M = 17..64.

Same contract as ``test_mma_decode_gpu.py``: fresh random weights and activations, the
output memory poisoned with NaN first, ``||out - ref|| / ||ref|| < 5e-3`` against a float64
product with the format's reference dequantized weight, and agreement with ``mma_decode``
(same PTX decode, another summation order). Cases: every format, odd M at both token tiles,
every candidate config, N not a multiple of the CTA's rows, a K tail inside a step, split-K
and a single split, CUDA graph capture, and ``wo_matmul`` behind the switch.

Run on an H100 / H200: ``pytest -q -m gpu tests/kernels/test_wgmma_decode_gpu.py``. Skips
without CUDA, without Gluon, or on a GPU that is not sm_90 (wgmma is Hopper only)."""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from tests.kernels.helpers import poison, qweight, rel, replayed

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
pytest.importorskip("triton.experimental.gluon", reason="wgmma_decode is written in Gluon (Triton >= 3.5)")
from quarl_kernels import mma_decode, wgmma_decode, wo_gemm  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="wgmma needs sm_90"),
]

SPECS = ["nvfp4", "mxfp4", "int4-g128", "int4-g128-sym"]
TOL = 5e-3
C = wgmma_decode.WGMMA_DECODE_CONFIGS
SHAPES = [  # M, N, K (K a multiple of 128 so that every spec applies)
    (17, 520, 3584),  # NT = 32, split-K, N tail (520 = 4 * 128 + 8)
    (24, 1000, 1280),  # N tail inside the last CTA's second m64 tile
    (32, 3584, 2048),
    (33, 640, 384),  # NT = 64 from M = 33; K = 48 words
    (48, 1000, 1280),
    (64, 256, 128),  # K = one INT4 group: one K step, no split (bf16 stored directly)
    (64, 3584, 3584),
    (40, 18944, 1024),  # many row tiles
]
CASES = [(*SHAPES[i % len(SHAPES)], c) for i, c in enumerate(C)] + [
    (m, n, k, wgmma_decode.default_config(m, n)) for m, n, k in SHAPES]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("m,n,k,cfg", CASES, ids=[f"M{c[0]}N{c[1]}K{c[2]}-{c[3]}" for c in CASES])
def test_wgmma_decode_matches_reference(spec, m, n, k, cfg):
    torch.manual_seed(m * 7 + n + k)
    args, w = qweight(spec, n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    poison((m, n), torch.bfloat16)
    y = wgmma_decode.launch_wgmma_decode(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,k,cfg", [(24, 1056, C[0]), (48, 1056, C[1]), (40, 1088, C[3]), (64, 64, C[0])],
                         ids=["M24K1056", "M48K1056-bk128", "M40K1088-w8", "M64K64"])
def test_fp4_k_tail(spec, m, k, cfg):
    """132 / 136 words: 4- / 8-word tails of 8- / 16-word steps; K = 64: one step."""
    if spec == "mxfp4" and k % 32:
        pytest.skip("MXFP4 blocks are 32 weights")
    torch.manual_seed(k + m)
    args, w = qweight(spec, 384, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    poison((m, 384), torch.bfloat16)
    y = wgmma_decode.launch_wgmma_decode(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", SPECS)
def test_agrees_with_mma_decode(spec):
    torch.manual_seed(5)
    args, _ = qweight(spec, 2048, 3584)
    pw = _packed_weight(*args)
    for m in (17, 32, 48, 64):
        x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
        y = wgmma_decode.launch_wgmma_decode(x, pw, wgmma_decode.default_config(m, 2048)).float()
        ref = mma_decode.launch_mma_decode(x, pw, mma_decode.default_config(m, 2048)).float()
        assert (y - ref).abs().max() <= 1e-2 * ref.abs().max()


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
def test_cuda_graph_capture_of_split_k(spec):
    torch.manual_seed(1)
    args, w = qweight(spec, 512, 3584)
    pw = _packed_weight(*args)
    x = torch.randn(64, 3584, device="cuda").to(torch.bfloat16)
    cfg = wgmma_decode.default_config(64, 512)
    y = replayed(lambda x: wgmma_decode.launch_wgmma_decode(x, pw, cfg), x)
    assert rel(y, x.double() @ w.T) < TOL


def test_wo_matmul_takes_it_by_the_measured_rule_and_the_switch(monkeypatch):
    torch.manual_seed(2)
    args, w = qweight("nvfp4", 6144, 3584)  # 22M weights: above LARGE_MIN_WEIGHTS
    pw = _packed_weight(*args)
    x = torch.randn(48, 3584, device="cuda").to(torch.bfloat16)
    called = []
    real = wgmma_decode.launch_wgmma_decode
    monkeypatch.setattr(wgmma_decode, "launch_wgmma_decode", lambda *a, **k: called.append(1) or real(*a, **k))
    monkeypatch.delenv(wgmma_decode.ENV, raising=False)
    monkeypatch.setenv("QUARL_KERNELS_WGMMA_RING", "0")  # the TMA-ring kernel comes first where it applies
    y0 = wo_gemm.wo_matmul(x, pw, tune=False)
    assert not called  # auto (the default): NVFP4 at 33..64 tokens with N > K stays on mma_decode
    y32 = wo_gemm.wo_matmul(x[:32], pw, tune=False)
    assert len(called) == 1  # auto: 17..32 tokens take wgmma
    monkeypatch.setenv(wgmma_decode.ENV, "1")
    y1 = wo_gemm.wo_matmul(x, pw, tune=False)
    assert len(called) == 2 and rel(y1, x.double() @ w.T) < TOL and rel(y0, x.double() @ w.T) < TOL
    assert rel(y32, x[:32].double() @ w.T) < TOL
    monkeypatch.setenv(wgmma_decode.ENV, "0")
    wo_gemm.wo_matmul(x[:32], pw, tune=False)
    assert len(called) == 2  # off


@pytest.mark.parametrize("m", [33, 64])
def test_wo_matmul_takes_14b_kv_shaped_nvfp4_at_33_to_64_rows(monkeypatch, m):
    """Session 19's rules: an NVFP4 weight of 5M..12M entries (14B k / v: 1024 x 5120) runs here at 33..64 rows (the
    Triton tensor-core kernel before), and an NVFP4 one with N >= 5120 at 17..32 rows on config 1; both right."""
    torch.manual_seed(m)
    args, w = qweight("nvfp4", 1024, 5120)
    pw = _packed_weight(*args)
    x = torch.randn(m, 5120, device="cuda").to(torch.bfloat16)
    called = []
    real = wgmma_decode.launch_wgmma_decode
    monkeypatch.setattr(wgmma_decode, "launch_wgmma_decode",
                        lambda x2, p, c, **k: called.append(c) or real(x2, p, c, **k))
    monkeypatch.delenv(wgmma_decode.ENV, raising=False)
    poison((m, 1024), torch.bfloat16)
    y = wo_gemm.wo_matmul(x, pw, tune=False)
    assert called == [C[1]] and rel(y, x.double() @ w.T) < TOL
    args, w = qweight("nvfp4", 5120, 5120)  # 14B q / o: 26M entries, below the ring's 32M at 17..32 rows
    pw = _packed_weight(*args)
    x24 = torch.randn(24, 5120, device="cuda").to(torch.bfloat16)
    y = wo_gemm.wo_matmul(x24, pw, tune=False)
    assert called[-1] == C[1] and rel(y, x24.double() @ w.T) < TOL
