"""GPU correctness of the decode GEMV (``quarl_kernels.gemv``) against the format's reference.

Same contract as ``test_wo_gemm_gpu.py``: fresh random weights and activations,
the output memory poisoned with NaN first, and ``||out - ref|| / ||ref|| < 5e-3``
against a float64 product of the activations and the reference dequantized
weight. Cases cover every format, every token count 1..16 (odd ones included),
N not a multiple of BN (rows past N are re-read, never stored), K ending exactly
on a block / group boundary and K ending inside a K step (masked tail), split-K
(the deterministic reduction), every candidate config, INT4 group sizes whose
tiles take each scale path (several groups per thread, one group per thread,
one group per tile), the portable decode (bit-identical to the PTX), and the
dispatch from ``wo_matmul`` / ``torch.ops.quarl.wo_linear`` incl. CUDA graphs.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels``. Skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from tests.kernels.helpers import pdl_chain_runs, poison, qweight, rel

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import gemv, wo_gemm  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SPECS = ["nvfp4", "mxfp4", "int4-g128", "int4-g128-sym"]
TOL = 5e-3
G = gemv.GEMV_CONFIGS
SHAPES = [  # M, N, K
    (1, 512, 3584),  # k/v GEMV: split-K
    (3, 520, 1024),  # odd M, N tail
    (16, 256, 384),  # M at the limit; K = 3 INT4 groups = 24 NVFP4 blocks
    (5, 1000, 640),  # K = 80 words: a masked tail with 32-word steps; N tail
    (7, 64, 128),  # K = one INT4 group / four MXFP4 blocks
    (2, 3584, 4096),
]
CASES = [(*SHAPES[i % len(SHAPES)], c) for i, c in enumerate(G)] + [  # every M with its default config
    (m, 384, 1280, gemv.default_gemv_config(gemv.FMT_NVFP4, m, 384, 1280)) for m in range(1, gemv.GEMV_LIMIT_M + 1)
]


_qweight, _poison, _rel = qweight, poison, rel  # shared scaffolding (tests/kernels/helpers.py)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("m,n,k,cfg", CASES, ids=[f"M{c[0]}N{c[1]}K{c[2]}-{c[3]}" for c in CASES])
def test_gemv_matches_reference(spec, m, n, k, cfg):
    torch.manual_seed(m * 7 + n + k)
    args, w = _qweight(spec, n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    _poison((m, n), torch.bfloat16)
    y = gemv.launch_gemv(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert _rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("cfg", (G[0], G[1], G[5], G[6]), ids=str)
def test_portable_decode_is_bit_identical(spec, cfg):
    """The plain-Triton decode computes the same fp32 weights in the same order: equal outputs."""
    torch.manual_seed(3)
    args, w = _qweight(spec, 520, 2048)
    pw = _packed_weight(*args)
    for m in (1, 4, 9):
        x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
        fast = gemv.launch_gemv(x, pw, cfg)
        port = gemv.launch_gemv(x, pw, cfg, use_asm=False)
        assert torch.equal(fast, port)
        assert _rel(port, x.double() @ w.T) < TOL


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("sym", [False, True])
def test_int4_group_sizes(group, sym):
    """INT4 groups of 4..32 words: several groups / one group per thread, one group per tile."""
    torch.manual_seed(group)
    spec = f"int4-g{group}" + ("-sym" if sym else "")
    args, w = _qweight(spec, 300, 1024)
    pw = _packed_weight(*args)
    for cfg in (G[0], G[1], G[2], G[6]):
        for m in (1, 6):
            x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
            assert _rel(gemv.launch_gemv(x, pw, cfg), x.double() @ w.T) < TOL


def test_split_k_is_deterministic():
    torch.manual_seed(0)
    args, _ = _qweight("nvfp4", 512, 3584)
    pw = _packed_weight(*args)
    x = torch.randn(2, 3584, device="cuda").to(torch.bfloat16)
    cfg = gemv.default_gemv_config(gemv.FMT_NVFP4, 2, 512, 3584)
    y0 = gemv.launch_gemv(x, pw, cfg)
    assert gemv._gemv_split(cfg, 512, 3584 // 8, torch.cuda.get_device_properties(0).multi_processor_count)[0] > 1
    for _ in range(5):
        assert torch.equal(gemv.launch_gemv(x, pw, cfg), y0)


def test_rejects_what_it_cannot_run():
    args, _ = _qweight("nvfp4", 64, 256)
    pw = _packed_weight(*args)
    with pytest.raises(ValueError, match="GEMV serves"):
        gemv.launch_gemv(torch.zeros(17, 256, device="cuda", dtype=torch.bfloat16), pw, G[0])
    with pytest.raises(ValueError, match="bf16"):
        gemv.launch_gemv(torch.zeros(2, 256, device="cuda", dtype=torch.float16), pw, G[0])
    assert not gemv.gemv_supported(torch.zeros(2, 256, device="cuda", dtype=torch.float16), pw)


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_op_dispatch_by_m(spec, m):
    """torch.ops.quarl.wo_linear: GEMV up to GEMV_MAX_M, the tensor-core kernel above; same answer."""
    torch.manual_seed(m)
    args, w = _qweight(spec, 1024, 4096)
    x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
    pw = _packed_weight(*args)
    assert gemv.gemv_supported(x, pw) == (m <= gemv.GEMV_MAX_M)
    y = torch.ops.quarl.wo_linear(x, *args)
    assert _rel(y, x.double() @ w.T) < TOL
    tc = wo_gemm.launch_fwd(x, pw, wo_gemm.default_config("fwd", m, 1024, 4096))
    assert (y.float() - tc.float()).abs().max() <= 1e-2 * tc.float().abs().max()


def test_cuda_graph_capture_of_split_k_gemv():
    torch.manual_seed(0)
    args, w = _qweight("mxfp4", 512, 3584)
    x = torch.randn(2, 3584, device="cuda").to(torch.bfloat16)
    torch.ops.quarl.wo_linear(x, *args)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.ops.quarl.wo_linear(x, *args)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert _rel(y, x.double() @ w.T) < TOL



@pytest.mark.parametrize("n,k", [(3584, 3584), (1024, 1024)])
def test_pdl_chain_equals_plain_launches_in_a_graph(monkeypatch, n, k):
    """Programmatic dependent launch (``quarl_kernels.pdl``, on by default on Hopper; both modes): the chained
    kernels are placed before the ones before them have ended -- bit-equal to plain launches, eager and replayed from
    a CUDA graph with new inputs (``helpers.pdl_chain_runs``)."""
    pws = [_packed_weight(*_qweight("nvfp4", n, k)[0]) for _ in range(8)]
    la = gemv.gemv_launch(torch.zeros(1, k, device="cuda", dtype=torch.bfloat16), pws[0],
                          gemv.default_gemv_config(pws[0].fmt, 1, n, k))
    if not la.constexprs["PDL"]:
        pytest.skip("PDL needs sm_90+")

    def step(x, pw, epi):
        return gemv.launch_gemv(x, pw, gemv.default_gemv_config(pw.fmt, 1, pw.n, pw.k), epi=epi)

    pdl_chain_runs(monkeypatch, step, pws, rows=1)


@pytest.mark.parametrize("mode", ["1", "l2"])
@pytest.mark.parametrize("n,k", [(3584, 3584), (5120, 5120)])
def test_pdl_chain_with_weights_before_the_wait(monkeypatch, n, k, mode):
    """``QUARL_KERNELS_GEMV_W_EARLY=1`` (each program's first weight tile loaded before its PDL wait, session 36) and
    ``=l2`` (its lines prefetched to L2 there instead, session 37): the chain of RMSNorm -> GEMV -> last pass, late /
    early / off, eager and from a CUDA graph -- bit-equal to plain launches, so no program read x or wrote before the
    kernel before had finished."""
    pws = [_packed_weight(*_qweight("nvfp4", n, k)[0]) for _ in range(8)]
    monkeypatch.setenv(gemv.W_EARLY_ENV, mode)
    la = gemv.gemv_launch(torch.zeros(1, k, device="cuda", dtype=torch.bfloat16), pws[0],
                          gemv.default_gemv_config(pws[0].fmt, 1, n, k))
    if not la.constexprs["PDL"]:
        pytest.skip("PDL needs sm_90+")
    assert la.constexprs["W_EARLY"] == (gemv.L2_FIRST if mode == "l2" else True)

    def step(x, pw, epi):
        return gemv.launch_gemv(x, pw, gemv.default_gemv_config(pw.fmt, 1, pw.n, pw.k), epi=epi)

    pdl_chain_runs(monkeypatch, step, pws, rows=1)
