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


def _exact(a, sa, b, sb):
    """The blockwise-scaled product in float64 from the exactly dequantized operands."""
    from quarl.quant.formats.fp8 import dequantize_act_1x128

    a64 = dequantize_act_1x128(a, sa).double()
    b64 = (b.double() * sb.double().repeat_interleave(128, 0)[: b.shape[0]].repeat_interleave(128, 1))
    return a64 @ b64.t()


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [4, 8, 16, 64])
def test_matches_the_exact_product_at_least_as_well_as_cublas(m, n, k, monkeypatch):
    a, sa, b, sb = _operands(m, n, k)
    exact = _exact(a, sa, b, sb)
    monkeypatch.setenv("QUARL_FP8_GEMV", "0")
    ref32 = fl.blockwise_gemm(a, sa, b, sb, True, torch.float32)  # cuBLAS
    ref16 = fl.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16)
    floor = 1e-4 * exact.pow(2).mean().sqrt().item()  # outputs near 0: a cancellation, judged at the output scale
    for cfg in (g.default_config(m, n, k), g.Fp8GemvConfig(bn=128, stages=5), g.Fp8GemvConfig(bn=32, stages=3)):
        got32 = g.fp8_gemv(a, sa, b, sb, torch.float32, cfg)
        # FP32 accumulation of exact E4M3 products: ~1e-7 from the exact product; cuBLAS's FP8 tensor cores keep
        # fewer bits in a block's accumulation, so the GEMV is at least as close as cuBLAS
        assert _rel(got32, exact) < 2e-6, (cfg, _rel(got32, exact))
        assert _rel(got32, exact) <= _rel(ref32, exact) * 1.5 + 1e-7, cfg
        got16 = g.fp8_gemv(a, sa, b, sb, torch.bfloat16, cfg)
        bad = ((got16.double() - exact).abs() > exact.abs() * 2.0**-8 + floor).sum().item()  # one bf16 rounding
        assert bad == 0, (cfg, bad)
        same = (got16 == ref16).float().mean().item()
        assert same > 0.8, (cfg, same)  # mostly cuBLAS's very bits


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
    assert _rel(out, ref.double()) < 2e-3  # both bf16: the GEMV and cuBLAS round differently at ~1e-3 of elements


def test_decode_chain_with_pdl_is_bit_equal_to_without_in_a_cuda_graph(monkeypatch):
    """Three FP8 projections chained as at rollout (each output the next one's input; the 1x128 quantizer and the
    GEMV launched with programmatic dependent launch since session 29): eager and replayed from a CUDA graph with
    new inputs, the same bits with ``QUARL_KERNELS_PDL`` late (the default), early and 0."""
    from quarl_kernels import pdl

    gen = torch.Generator(device="cuda").manual_seed(2)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
          for n, k in ((4096, 4096), (12288, 4096), (4096, 12288))]
    xs = [torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)]

    def chain(x):
        for w in ws:
            x = fl.fp8_linear(x, w)
        return x

    results = {}
    for flag in ("0", "late", "early"):
        monkeypatch.setenv(pdl.ENV, flag)
        with torch.no_grad():
            eager = [chain(x) for x in xs]
            static = xs[0].clone()
            chain(static)  # compile off the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = chain(static)
            replayed = []
            for x in xs:
                static.copy_(x)
                graph.replay()
                replayed.append(out.clone())
            torch.cuda.synchronize()
        for e, r in zip(eager, replayed, strict=True):
            assert torch.equal(e, r), flag
        results[flag] = eager
    for flag in ("late", "early"):
        for a, b in zip(results[flag], results["0"], strict=True):
            assert torch.equal(a, b), flag
