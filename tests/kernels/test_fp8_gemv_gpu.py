"""The FP8 decode GEMM on the GPU: equal to cuBLAS's blockwise-scaled GEMM (``F.scaled_mm``, 1x128 x 128x128)
to FP32 summation order at Qwen3-8B projection shapes and decode row counts, inside a CUDA graph too, and through
the FP8 linear's routing."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import fp8_gemv as g

from quarl.quant import fp8_linear as fl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an SM90 GPU (cuBLAS's blockwise FP8 GEMM is the reference)"),
]

SHAPES = [(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288)]  # (N, K): q/o, k/v, gate/up, down


def _operands(m, n, k, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    a, sa, _, _ = fl.quantize_act_gemm(x, m, k)  # the linear's own quantizer and layouts
    b, sb = fl.quantize_weight_padded(w)
    return a, sa, b, sb


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [4, 8, 16, 64])
def test_matches_cublas(m, n, k, monkeypatch):
    a, sa, b, sb = _operands(m, n, k)
    monkeypatch.setenv("QUARL_FP8_GEMV", "0")
    ref32 = fl.blockwise_gemm(a, sa, b, sb, True, torch.float32)  # cuBLAS
    ref16 = fl.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16)
    for cfg in (g.default_config(m, n, k), g.Fp8GemvConfig(bn=128, stages=5), g.Fp8GemvConfig(bn=32, stages=3)):
        got32 = g.fp8_gemv(a, sa, b, sb, torch.float32, cfg)
        # Hopper's FP8 tensor cores accumulate a block with fewer than 24 mantissa bits (DeepSeek-V3 measured ~14);
        # this kernel's f16 MMAs accumulate in FP32: agreement to ~1e-5, bounded at 2e-4
        assert ((got32 - ref32).norm() / ref32.norm()).item() < 2e-4, cfg
        got16 = g.fp8_gemv(a, sa, b, sb, torch.bfloat16, cfg)
        near = (got16.float() - ref16.float()).abs() <= ref16.float().abs() * 2.0**-7 + 1e-6  # <= 1 bf16 ulp
        assert near.all(), (cfg, int((~near).sum()))
        assert (got16 == ref16).float().mean().item() > 0.9, cfg  # mostly the same bits


def test_in_a_cuda_graph_and_through_the_linear(monkeypatch):
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("QUARL_FP8_GEMV", "0")
    with torch.no_grad():
        ref = fl.fp8_linear(x, w)
    monkeypatch.setenv("QUARL_FP8_GEMV", "1")
    calls = []
    real = g.fp8_gemv
    monkeypatch.setattr(g, "fp8_gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        fl.fp8_linear(x, w)  # compile and cache the weight tiles off the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fl.fp8_linear(x, w)
        graph.replay()
        torch.cuda.synchronize()
    assert calls
    near = (out.float() - ref.float()).abs() <= ref.float().abs() * 2.0**-7 + 1e-6
    assert near.all()
