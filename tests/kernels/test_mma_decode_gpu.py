"""GPU correctness of the Gluon mma.sync decode GEMM (``quarl_kernels.mma_decode``).

Same contract as ``test_wo_gemm_gpu.py``: fresh random weights and activations,
the output memory poisoned with NaN first (an unwritten element fails), and
``||out - ref|| / ||ref|| < 5e-3`` against a float64 product of the activations
and the format's reference dequantized weight. Cases cover every format (NVFP4,
MXFP4, INT4 g128 asymmetric and symmetric), token counts 1..64 (odd ones, every
token tile: NT = 8 / 16 / 32 / 64 for M <= 8 / 16 / 32 / 64, each with the configs
meant for it, x staged through shared memory or not), N not a multiple of the CTA's rows
(rows past N are re-read, never stored), K ending inside a K step (masked tail)
and exactly on a scale-block / group boundary, split-K (the deterministic
reduction) and a single split (bf16 stored directly), every candidate config,
agreement with the Triton tensor-core path, the support predicate, and CUDA
graph capture.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels/test_mma_decode_gpu.py``.
Skips without CUDA or without Triton's Gluon.
"""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from tests.kernels.helpers import pdl_chain_runs, poison, qweight, rel, replayed

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
pytest.importorskip("triton.experimental.gluon", reason="mma_decode is written in Gluon (Triton >= 3.5)")
from quarl_kernels import mma_decode, wo_gemm  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SPECS = ["nvfp4", "mxfp4", "int4-g128", "int4-g128-sym"]
FP4 = ["nvfp4", "mxfp4"]
TOL = 5e-3
C = mma_decode.MMA_DECODE_CONFIGS
SHAPES = [  # M, N, K (K a multiple of 128 so that every spec applies)
    (8, 512, 3584),  # k/v layer: split-K
    (5, 520, 1024),  # odd M, N tail (520 = 4 * 128 + 8)
    (16, 640, 384),  # NT = 16; K = 48 words: a 16-word tail for 32-word steps
    (13, 1000, 2048),  # N tail inside the last CTA's second warp
    (4, 256, 128),  # K = one INT4 group = 16 words: one K step, no split (bf16 stored directly)
    (9, 3584, 1280),  # NT = 16 at M = 9
]
CASES = [(*SHAPES[i % len(SHAPES)], c) for i, c in enumerate(C[:6])] + [
    (m, 384, 1280, C[0]) for m in (1, 3, 4, 6, 7, 8, 11, 15, 16)  # every token-tile path with the first config
]
LARGE_CASES = [  # M = 17..64 (NT = 32 / 64): every candidate config of each tile, odd M, N and K tails
    (17, 520, 3584, C[6]),  # split-K, N tail (520 = 4 * 128 + 8)
    (24, 1000, 1280, C[7]),  # N tail inside the last CTA's second warp
    (32, 640, 384, C[8]),  # 8 warps; K = 48 words: 6 steps of 8
    (32, 3584, 2048, C[0]),  # a 16-word step at NT = 32
    (33, 520, 2048, C[6]),  # NT = 64 from M = 33
    (48, 1000, 1280, C[7]),
    (63, 3584, 1280, C[8]),
    (64, 256, 128, C[9]),  # K = one INT4 group
    (64, 640, 3584, C[10]),  # 4-word steps
    (20, 520, 2048, C[11]),  # x through shared memory (double buffer, barriers): NT = 32
    (40, 1000, 1280, C[11]),  # ... NT = 64, 4 warps: two token octets per warp
    (64, 3584, 3584, C[12]),  # ... 8 warps, one octet each
    (31, 640, 384, C[13]),  # ... 8 warps at NT = 32: two warps per octet (same values stored twice)
]


_qweight, _poison, _rel = qweight, poison, rel  # shared scaffolding (tests/kernels/helpers.py)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("m,n,k,cfg", CASES, ids=[f"M{c[0]}N{c[1]}K{c[2]}-{c[3]}" for c in CASES])
def test_mma_decode_matches_reference(spec, m, n, k, cfg):
    torch.manual_seed(m * 7 + n + k)
    args, w = _qweight(spec, n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    _poison((m, n), torch.bfloat16)
    y = mma_decode.launch_mma_decode(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert _rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("m,n,k,cfg", LARGE_CASES, ids=[f"M{c[0]}N{c[1]}K{c[2]}-{c[3]}" for c in LARGE_CASES])
def test_mma_decode_large_m_matches_reference(spec, m, n, k, cfg):
    test_mma_decode_matches_reference(spec, m, n, k, cfg)


@pytest.mark.parametrize("spec", FP4)
@pytest.mark.parametrize("m,k,cfg", [(24, 1056, C[6]), (48, 1056, C[7]), (40, 1040, C[10]), (64, 64, C[7]),
                                     (24, 1056, C[13]), (56, 1056, C[12]), (64, 64, C[11])],
                         ids=["M24K1056", "M48K1056", "M40K1040", "M64K64", "M24K1056-xs", "M56K1056-xs", "M64K64-xs"])
def test_fp4_large_m_k_tail(spec, m, k, cfg):
    """132 / 130 words: 4- / 2-word tails of 8- / 4-word steps; K = 64: one step, no split
    (bf16 stored directly). MXFP4 needs K % 32 == 0: 1040 only for NVFP4."""
    if spec == "mxfp4" and k % 32:
        pytest.skip("MXFP4 blocks are 32 weights")
    torch.manual_seed(k + m)
    args, w = _qweight(spec, 384, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    _poison((m, 384), torch.bfloat16)
    y = mma_decode.launch_mma_decode(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert _rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", FP4)
@pytest.mark.parametrize("cfg", C[:3], ids=str)
@pytest.mark.parametrize("k", [1088, 1056])  # 136 / 132 words: 8- / 4-word tails (whole blocks)
def test_fp4_k_tail_inside_a_step(spec, cfg, k):
    torch.manual_seed(k)
    args, w = _qweight(spec, 384, k)
    x = torch.randn(7, k, device="cuda").to(torch.bfloat16)
    _poison((7, 384), torch.bfloat16)
    y = mma_decode.launch_mma_decode(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert _rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", SPECS)
def test_agrees_with_tensor_core_path(spec):
    """Same decoded weights as wo_gemm (same PTX): outputs differ only by accumulation order."""
    torch.manual_seed(3)
    args, _ = _qweight(spec, 1024, 2048)
    pw = _packed_weight(*args)
    for m in (4, 8, 16, 32, 64):
        x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
        y = mma_decode.launch_mma_decode(x, pw, mma_decode.default_config(m, 1024)).float()
        ref = wo_gemm.launch_fwd(x, pw, wo_gemm.default_config("fwd", m, 1024, 2048)).float()
        assert (y - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_supported_predicate_and_errors():
    args, _ = _qweight("nvfp4", 256, 512)
    pw = _packed_weight(*args)
    ok = torch.randn(8, 512, device="cuda").to(torch.bfloat16)
    assert mma_decode.mma_decode_supported(ok, pw)
    assert mma_decode.mma_decode_supported(torch.randn(64, 512, device="cuda").to(torch.bfloat16), pw)
    assert not mma_decode.mma_decode_supported(torch.randn(65, 512, device="cuda").to(torch.bfloat16), pw)
    assert not mma_decode.mma_decode_supported(ok.float(), pw)
    assert not mma_decode.mma_decode_supported(ok.cpu(), pw)
    with pytest.raises(ValueError, match="wo_gemm.launch_fwd"):
        mma_decode.launch_mma_decode(torch.randn(65, 512, device="cuda").to(torch.bfloat16), pw, C[0])


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
@pytest.mark.parametrize("m,cfg", [(8, C[0]), (64, None), (64, C[12])], ids=["M8", "M64-default", "M64-xs"])
def test_cuda_graph_capture_of_split_k(spec, m, cfg):
    torch.manual_seed(m)
    args, w = _qweight(spec, 512, 3584)
    pw = _packed_weight(*args)
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    cfg = cfg or mma_decode.default_config(m, 512)
    y = replayed(lambda x: mma_decode.launch_mma_decode(x, pw, cfg), x)
    assert _rel(y, x.double() @ w.T) < TOL


def test_config_helpers():
    assert [mma_decode.token_tile(m) for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [8, 8, 16, 16, 32, 32, 64, 64]
    assert mma_decode.default_config(8, 512) is C[1] and mma_decode.default_config(16, 18944) is C[4]
    for m in (2, 16, 17, 32, 33, 64):
        assert mma_decode.default_config(m, 3584) in mma_decode.candidate_configs(m)
    with pytest.raises(ValueError, match="outside"):
        mma_decode.token_tile(65)


@pytest.mark.parametrize("m", [2, 8, 13])
def test_pdl_chain_equals_plain_launches_in_a_graph(monkeypatch, m):
    """The mma.sync kernel chained with programmatic dependent launch (``pdl_gluon.py``, both modes): bit-equal to
    plain launches, eager and from a CUDA graph (``helpers.pdl_chain_runs``)."""
    from quarl_kernels import pdl

    if not pdl.on(torch.device("cuda")):
        pytest.skip("PDL needs sm_90+")
    torch.manual_seed(m)
    pws = [_packed_weight(*_qweight("nvfp4", 3584, 3584)[0]) for _ in range(6)]

    def step(x, pw, epi):
        return mma_decode.launch_mma_decode(x, pw, mma_decode.default_config(x.shape[0], pw.n), epi=epi)

    pdl_chain_runs(monkeypatch, step, pws, rows=m)


@pytest.mark.parametrize("m,n", [(8, 3584), (13, 3584), (8, 512)])
def test_pdl_chain_with_weights_before_the_wait(monkeypatch, m, n):
    """``QUARL_KERNELS_MMA_W_EARLY=1`` (the first step's words before the PDL wait; config 4 peels it, config 1
    prefetches it; session 36): chained launches bit-equal to plain ones, eager and from a CUDA graph."""
    from quarl_kernels import pdl

    if not pdl.on(torch.device("cuda")):
        pytest.skip("PDL needs sm_90+")
    monkeypatch.setenv(mma_decode.W_EARLY_ENV, "1")
    assert mma_decode.w_early(torch.device("cuda"))
    torch.manual_seed(m + n)
    pws = [_packed_weight(*_qweight("nvfp4", n, n)[0]) for _ in range(6)]

    def step(x, pw, epi):
        return mma_decode.launch_mma_decode(x, pw, mma_decode.default_config(x.shape[0], pw.n), epi=epi)

    pdl_chain_runs(monkeypatch, step, pws, rows=m)
