"""The large-M register-A mixed-input GEMM (``quarl_kernels.mixed_gemm``) on the GPU.

Its output against the float64 product with the format's dequantized weight (the bf16 output's rounding, < 5e-3
relative) and against the dense path (the same bf16 weight, fp32 sums in another order: a few bf16 ulps of the
output), for NVFP4 and MXFP4, with and without the overlapped decode, the A fragment in the permuted or in x's own (natural) k
order, at M and N that are and are not whole tiles
(the permuted x padded, rows past N zero-filled by TMA and never stored), one and several tiles a CTA; on blocked
words exactly the row-major words' bits; and the dispatch: switched on (off by default), ``dense.dense_matmul``
sends it the forwards ``mixed_gemm.takes`` names.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _weights(spec: str, n: int, k: int, seed: int = 0):
    from tests.kernels.gpu_weights import packed_weights

    return packed_weights(spec, n, k, seed)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize(("m", "n", "k"), [(2048, 1536, 1024), (300, 1000, 512), (4100, 384, 3584), (256, 128, 64)])
@pytest.mark.parametrize(("overlap", "natural"), [(False, False), (True, False), (False, True), (True, True)])
def test_matches_the_float_product_and_the_dense_path(spec, m, n, k, overlap, natural):
    from quarl_kernels import dense, mixed_gemm

    q, row, blk = _weights(spec, n, k, seed=m + n)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    if not mixed_gemm.supported(x, row):
        pytest.skip("not an sm_90 GPU")
    ref = x.double() @ q.dequantize(torch.float64).T
    got = mixed_gemm.mixed_matmul(x, row, overlap=overlap, natural=natural)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert _rel(got, ref) < 5e-3
    want = x @ dense.dequantize(row).T
    assert _rel(got, want.double()) < 5e-3
    if blk is not None:  # blocked words: the same kernel on the same values, so the same bits
        assert torch.equal(mixed_gemm.mixed_matmul(x, blk, overlap=overlap, natural=natural), got)


@pytest.mark.parametrize("stages", [3, 5])
def test_ring_depths_agree(stages):
    from quarl_kernels import mixed_gemm

    _, row, _ = _weights("nvfp4", 640, 2048, seed=stages)
    x = torch.randn(1024, 2048, device="cuda").to(torch.bfloat16)
    if not mixed_gemm.supported(x, row):
        pytest.skip("not an sm_90 GPU")
    assert torch.equal(mixed_gemm.mixed_matmul(x, row, stages=stages), mixed_gemm.mixed_matmul(x, row))


def test_dense_matmul_routes_large_m_on_wide_weights_here(monkeypatch):
    """Switched on, ``dense.dense_matmul`` takes the kernel for ``min_m() <= M <= MAX_M`` on weights of >= ``MIN_N``
    rows, the dense path elsewhere and when switched off (the default)."""
    from quarl_kernels import dense, mixed_gemm

    _, wide, _ = _weights("nvfp4", mixed_gemm.MIN_N, 256, seed=5)
    _, narrow, _ = _weights("nvfp4", 512, 256, seed=6)
    x = torch.randn(512, 256, device="cuda").to(torch.bfloat16)
    if not mixed_gemm.supported(x, wide):
        pytest.skip("not an sm_90 GPU")
    assert not mixed_gemm.takes(x, wide)  # off by default
    monkeypatch.setenv("QUARL_KERNELS_MIXED_GEMM", "1")
    monkeypatch.setenv("QUARL_KERNELS_MIXED_GEMM_MIN_M", "512")
    assert mixed_gemm.takes(x, wide) and not mixed_gemm.takes(x, narrow)
    assert not mixed_gemm.takes(x[:511], wide)
    assert torch.equal(dense.dense_matmul(x, wide), mixed_gemm.mixed_matmul(x, wide))
    assert torch.equal(dense.dense_matmul(x, narrow), x @ dense.dequantize(narrow).T)
    monkeypatch.setenv("QUARL_KERNELS_MIXED_GEMM", "0")
    assert not mixed_gemm.takes(x, wide)
    assert torch.equal(dense.dense_matmul(x, wide), x @ dense.dequantize(wide).T)
