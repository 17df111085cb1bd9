"""GPU correctness of the TMA-ring wgmma decode GEMM (``quarl_kernels.wgmma_ring``), FP4 formats: M = 17..64 and,
with the wide token tiles (``WIDE_CONFIGS``), M >= 65 over several tiles.

``test_wgmma_decode_gpu.py``'s contract: fresh random weights and activations, the output poisoned with NaN first,
``||out - ref|| / ||ref|| < 5e-3`` against a float64 product with the format's dequantized weight, and agreement
with ``wgmma_decode`` (same decode, another summation order). Cases: NVFP4 and MXFP4, every ring config, both token
tiles and odd M (tokens past M are TMA's zero fill), N not a multiple of the CTA's rows (rows past N: zero words),
split-K and a single split, splits capped by the scale buffer (K = 18944), CUDA graph capture, ``wo_matmul`` by
default, a group sharing one permuted x, and repeated launches bit-identical (eager and replayed).

Run on an H100 / H200: ``pytest -q -m gpu tests/kernels/test_wgmma_ring_gpu.py``."""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from tests.kernels.helpers import pdl_chain_runs, poison, qweight, rel, replayed

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
pytest.importorskip("triton.experimental.gluon", reason="wgmma_ring is written in Gluon (Triton >= 3.5)")
from quarl_kernels import wgmma_decode, wgmma_ring, wo_gemm  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="wgmma / TMA here need sm_90"),
]

SPECS = ["nvfp4", "mxfp4"]
TOL = 5e-3
C = wgmma_ring.RING_CONFIGS
SHAPES = [  # M, N, K (K a multiple of 64)
    (17, 520, 3584),  # NT = 32, split-K, N tail
    (24, 1000, 1280),
    (32, 3584, 2048),
    (33, 640, 384),  # NT = 64 from M = 33; 6 steps
    (64, 256, 128),  # two steps: no split
    (64, 3584, 3584),
    (40, 18944, 1024),  # many row tiles
    (48, 3584, 18944),  # 296 steps: the split is set by the scale buffer
]
WIDE = wgmma_ring.WIDE_CONFIGS
WIDE_SHAPES = [  # M, N, K: one or several token tiles, a token tail, an N tail, a scale-capped split
    (65, 520, 3584),
    (128, 3584, 3584),
    (200, 1000, 1280),
    (256, 18944, 1024),
    (300, 3584, 18944),
    (1000, 640, 384),
]
CASES = ([(*SHAPES[i % len(SHAPES)], c) for i, c in enumerate(C)]
         + [(m, n, k, wgmma_ring.default_config(m, n)) for m, n, k in SHAPES]
         + [(*WIDE_SHAPES[i % len(WIDE_SHAPES)], c) for i, c in enumerate(WIDE)]
         + [(*s, WIDE[i % len(WIDE)]) for i, s in enumerate(WIDE_SHAPES)])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("m,n,k,cfg", CASES, ids=[f"M{c[0]}N{c[1]}K{c[2]}-{c[3]}" for c in CASES])
def test_wgmma_ring_matches_reference(spec, m, n, k, cfg):
    """The decode tiles (17..64 rows) and the wide ones (more, over several token tiles): against the float64
    product; x not padded to whole tiles (the last TMA box zero-filled past M) gives the same bits; and a later
    token tile computed alone agrees with its rows of the whole launch."""
    torch.manual_seed(m * 7 + n + k)
    args, w = qweight(spec, n, k)
    pw = _packed_weight(*args)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    poison((m, n), torch.bfloat16)
    y = wgmma_ring.launch_wgmma_ring(x, pw, cfg)
    torch.cuda.synchronize()
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel(y, x.double() @ w.T) < TOL
    assert torch.equal(wgmma_ring.launch_wgmma_ring(x, pw, cfg, xp=wgmma_ring.permute_x(x, cfg.bkw)), y)
    t = cfg.tile(m)
    if m > t:
        y1 = wgmma_ring.launch_wgmma_ring(x[t:].contiguous(), pw, cfg)
        assert (y1.float() - y[t:].float()).abs().max() <= 1e-2 * y.float().abs().max()


@pytest.mark.parametrize("spec", SPECS)
def test_agrees_with_wgmma_decode(spec):
    torch.manual_seed(5)
    args, _ = qweight(spec, 2048, 3584)
    pw = _packed_weight(*args)
    for m in (17, 32, 48, 64):
        x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
        y = wgmma_ring.launch_wgmma_ring(x, pw, wgmma_ring.default_config(m, 2048)).float()
        ref = wgmma_decode.launch_wgmma_decode(x, pw, wgmma_decode.default_config(m, 2048)).float()
        assert (y - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_cuda_graph_capture_of_split_k():
    torch.manual_seed(1)
    args, w = qweight("nvfp4", 512, 3584)
    pw = _packed_weight(*args)
    x = torch.randn(64, 3584, device="cuda").to(torch.bfloat16)
    cfg = wgmma_ring.default_config(64, 512)
    y = replayed(lambda x: wgmma_ring.launch_wgmma_ring(x, pw, cfg), x)
    assert rel(y, x.double() @ w.T) < TOL


def test_wo_matmul_takes_it_by_default(monkeypatch):
    torch.manual_seed(2)
    args, w = qweight("nvfp4", 6144, 3584)  # 22M weights: above LARGE_MIN_WEIGHTS
    pw = _packed_weight(*args)
    x = torch.randn(48, 3584, device="cuda").to(torch.bfloat16)
    called = []
    real = wgmma_ring.launch_wgmma_ring
    monkeypatch.setattr(wgmma_ring, "launch_wgmma_ring", lambda *a, **k: called.append(1) or real(*a, **k))
    monkeypatch.setenv(wgmma_ring.ENV, "0")
    wo_gemm.wo_matmul(x, pw, tune=False)
    assert not called
    monkeypatch.delenv(wgmma_ring.ENV, raising=False)
    y = wo_gemm.wo_matmul(x, pw, tune=False)
    assert called == [1] and rel(y, x.double() @ w.T) < TOL


def test_a_group_shares_one_permuted_x():
    """gate / up through ``wo_matmul_group`` (x permuted once for both) against the float64 reference."""
    torch.manual_seed(3)
    (ga, gw), (ua, uw) = qweight("nvfp4", 18944, 3584), qweight("nvfp4", 18944, 3584)
    pws = [_packed_weight(*ga), _packed_weight(*ua)]
    x = torch.randn(64, 3584, device="cuda").to(torch.bfloat16)
    ys = wo_gemm.wo_matmul_group(x, pws, [None, None])
    for y, w in zip(ys, (gw, uw)):
        assert rel(y, x.double() @ w.T) < TOL



@pytest.mark.parametrize("n,k,m,cfg", [(18944, 3584, 64, None), (3584, 18944, 64, None), (3584, 3584, 64, None),
                                       (18944, 3584, 256, WIDE[0]), (3584, 18944, 200, WIDE[0]),
                                       (3584, 18944, 128, WIDE[5])])
def test_repeated_launches_are_bit_identical(n, k, m, cfg):
    """A rollout replays the same launch thousands of times: every replay (eager and from a CUDA graph, with other
    work between them) must give the same bits -- a stage reused while still being read would show as a
    difference here long before it moves a relative error."""
    torch.manual_seed(n + k)
    args, w = qweight("nvfp4", n, k)
    pw = _packed_weight(*args)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = cfg or wgmma_ring.default_config(m, n, k)
    y0 = wgmma_ring.launch_wgmma_ring(x, pw, cfg).clone()
    noise = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        noise @ noise  # other work on the GPU between launches
        assert torch.equal(wgmma_ring.launch_wgmma_ring(x, pw, cfg), y0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = wgmma_ring.launch_wgmma_ring(x, pw, cfg)
    for _ in range(50):
        g.replay()
        assert torch.equal(y, y0)
    # and every element near the float64 product (a corrupted K step moves single outputs, not the norm)
    ref = x.double() @ w.T
    assert ((y0.double() - ref).abs().max() / ref.abs().max()).item() < 1e-2


def test_pdl_chain_with_weights_before_the_wait(monkeypatch):
    """``QUARL_KERNELS_RING_W_EARLY=1`` (the ring's first weight copies and the scales before the PDL wait, x's after;
    session 36): RMSNorm -> ring -> last pass chained at 64 rows, PDL late / early / off, eager and from a CUDA graph
    with new inputs -- bit-equal, so no program read x or wrote before the kernel before had finished."""
    monkeypatch.setenv(wgmma_ring.W_EARLY_ENV, "1")
    from quarl_kernels import pdl

    if not pdl.on(torch.device("cuda")):
        pytest.skip("PDL needs sm_90+ and a CUDA 12.3 driver")
    assert wgmma_ring.w_early(torch.device("cuda"))
    torch.manual_seed(4)
    pws = [_packed_weight(*qweight("nvfp4", 3584, 3584)[0]) for _ in range(6)]
    cfg = wgmma_ring.default_config(64, 3584, 3584)

    def step(x, pw, epi):
        return wgmma_ring.launch_wgmma_ring(x, pw, cfg, epi=epi)

    pdl_chain_runs(monkeypatch, step, pws, rows=64)
