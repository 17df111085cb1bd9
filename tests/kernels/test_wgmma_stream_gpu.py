"""The stream-K wgmma decode kernel at 1..16 rows (``benchmarks/kernels/wgmma_stream.py``, an experiment) on the GPU.

Its output against the float64 product with the format's dequantized weight (the bf16 output's rounding, < 5e-3
relative) and against the kernel ``wo_gemm.wo_matmul`` routes the same call to (fp32 sums in another order: < 5e-3),
for NVFP4 and MXFP4 at 1..16 rows (both token tiles, rows past M zero-filled by TMA or padded); on blocked words
exactly the row-major words' bits; stream-K shares that split tiles over several CTAs (partials summed in slot order,
unused slots zeroed) and that give each tile one CTA (bf16 stored directly) equal to each other up to fp32 sums;
ring depths; the launch's last pass (bias and LoRA) as ``launch.finish`` adds it.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _stream():
    """The experiment's module, from benchmarks/kernels."""
    import sys
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels")
    if path not in sys.path:
        sys.path.insert(0, path)
    import wgmma_stream

    return wgmma_stream


def _weights(spec: str, n: int, k: int, seed: int = 0):
    from tests.kernels.gpu_weights import packed_weights

    return packed_weights(spec, n, k, seed)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize(("n", "k"), [(1024, 2048), (384, 3584), (18944, 3584), (3584, 18944)])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 16])
def test_matches_the_float_product_and_the_routed_kernel(spec, n, k, m):
    from quarl_kernels import wo_gemm

    wgmma_stream = _stream()

    q, row, blk = _weights(spec, n, k, seed=m + n)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    if not wgmma_stream.supported(x, row):
        pytest.skip("not an sm_90 GPU")
    ref = x.double() @ q.dequantize(torch.float64).T
    got = wgmma_stream.launch_wgmma_stream(x, row)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert _rel(got, ref) < 5e-3
    assert _rel(got, wo_gemm.wo_matmul(x, row).double()) < 5e-3
    # blocked words: the same kernel on the same values, so the same bits
    assert torch.equal(wgmma_stream.launch_wgmma_stream(x, blk), got)
    # a band's four K steps as one TMA box: the same words in shared memory, so the same bits
    assert torch.equal(wgmma_stream.launch_wgmma_stream(x, blk, wide=True), got)
    # a whole TMA box of x (zero rows past M) instead of TMA's zero fill: the same bits
    assert torch.equal(wgmma_stream.launch_wgmma_stream(x, row, x_rows=wgmma_stream.token_tile(m)), got)


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4"])
def test_stream_k_shares_agree(spec):
    """Tiles split over CTAs (partials, zeroed slots) vs one CTA a tile (direct bf16 store) vs a few CTAs."""
    wgmma_stream = _stream()

    n, k = 1024, 4096
    q, row, _ = _weights(spec, n, k, seed=3)
    x = torch.randn(5, k, device="cuda").to(torch.bfloat16)
    if not wgmma_stream.supported(x, row):
        pytest.skip("not an sm_90 GPU")
    ref = x.double() @ q.dequantize(torch.float64).T
    tiles, chunks = n // wgmma_stream.R, k // 256
    assert wgmma_stream.slots(tiles, chunks, tiles) == 1  # each CTA exactly one tile: the direct store
    outs = {c: wgmma_stream.launch_wgmma_stream(x, row, ctas=c) for c in (tiles, 3, 7, 13, 100, 132)}
    for c, y in outs.items():
        assert _rel(y, ref) < 5e-3, c
        assert _rel(y, outs[tiles].double()) < 2e-3, c


@pytest.mark.parametrize("stages", [2, 3, 6])
def test_ring_depths_agree(stages):
    wgmma_stream = _stream()

    _, row, _ = _weights("nvfp4", 640, 2048, seed=stages)
    x = torch.randn(4, 2048, device="cuda").to(torch.bfloat16)
    if not wgmma_stream.supported(x, row):
        pytest.skip("not an sm_90 GPU")
    assert torch.equal(wgmma_stream.launch_wgmma_stream(x, row, stages=stages),
                       wgmma_stream.launch_wgmma_stream(x, row))


def test_epilogue_bias_and_lora():
    wgmma_stream = _stream()
    from quarl_kernels.launch import Epilogue

    n, k, r = 1536, 2048, 16
    q, row, _ = _weights("nvfp4", n, k, seed=11)
    x = torch.randn(6, k, device="cuda").to(torch.bfloat16)
    if not wgmma_stream.supported(x, row):
        pytest.skip("not an sm_90 GPU")
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    a = torch.randn(6, r, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, r, device="cuda").to(torch.bfloat16) * 0.1
    got = wgmma_stream.launch_wgmma_stream(x, row, epi=Epilogue(bias=bias, a=a, b=b, scaling=0.5))
    ref = x.double() @ q.dequantize(torch.float64).T + bias.double() + 0.5 * a.double() @ b.double().T
    assert _rel(got, ref) < 5e-3


def test_rejects_what_it_cannot_run():
    wgmma_stream = _stream()

    _, row, _ = _weights("nvfp4", 1024, 2048)
    x = torch.randn(17, 2048, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="launch_wgmma_stream"):
        wgmma_stream.launch_wgmma_stream(x, row)
