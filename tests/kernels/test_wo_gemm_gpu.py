"""GPU correctness of the weight-only 4-bit GEMMs against the format's reference.

Every check draws fresh random weights and activations, poisons the output
memory with NaN first (an unwritten element fails), and compares with a float64
product of the same activations and the reference dequantized weight:
``||out - ref|| / ||ref||`` must stay under 5e-3 (bf16 output rounding alone is
~1e-3; INT4 adds the bf16 rounding of its fp32 group scales). Shapes cover odd
M, N not a multiple of the tile, K ending inside a tile and exactly at a block
boundary, split-K, both M regimes, every candidate config, both decode paths
(inline PTX and portable) and both tile orders.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels``. Skips without CUDA.
"""

from __future__ import annotations

import pytest
import quarl_kernels
import torch
import torch.nn.functional as F
from quarl_kernels.ops import _packed_weight, layer_args
from torch import nn

from quarl.quant import QuantLinear, dispatch, make_config
from quarl.quant.linear import LoRAConfig
from tests.kernels.helpers import poison, qweight, rel

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import wo_gemm  # after the skip: it imports Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SPECS = ["nvfp4", "mxfp4", "int4-g128", "int4-g128-sym"]
TOL = 5e-3
D, P, B = wo_gemm.DECODE_CONFIGS, wo_gemm.PREFILL_CONFIGS, wo_gemm.BWD_CONFIGS
DECODE_SHAPES = [  # M, N, K -- one per decode config, round robin
    (1, 512, 3584),  # GEMV, split-K
    (7, 520, 1024),  # odd M, N tail
    (16, 640, 384),  # K ends inside a 256/512 tile
    (33, 256, 4096),  # BM 64, split-K
    (64, 384, 128),  # K = one INT4 group / four NVFP4 blocks
    (5, 1000, 2048),
]
PREFILL_SHAPES = [
    (100, 520, 1024),  # odd M, N tail
    (257, 768, 3584),
    (512, 1024, 2048),
    (130, 256, 640),  # K = 5 INT4 groups: tail
    (300, 1000, 1024),
]
FWD_CASES = [(*DECODE_SHAPES[i % len(DECODE_SHAPES)], c) for i, c in enumerate(D)] + [
    (*PREFILL_SHAPES[i % len(PREFILL_SHAPES)], c) for i, c in enumerate(P)
]


_qweight, _poison, _rel = qweight, poison, rel  # shared scaffolding (tests/kernels/helpers.py)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("m,n,k,cfg", FWD_CASES, ids=[f"M{c[0]}N{c[1]}K{c[2]}-{c[3]}" for c in FWD_CASES])
def test_forward_matches_reference(spec, m, n, k, cfg):
    torch.manual_seed(m * 7 + n)
    args, w = _qweight(spec, n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    _poison((m, n), torch.bfloat16)
    y = wo_gemm.launch_fwd(x, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert _rel(y, x.double() @ w.T) < TOL


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("use_asm,pair_order,swap", [(False, False, False), (False, True, True), (True, True, True)])
def test_forward_paths_agree(spec, use_asm, pair_order, swap):
    """The portable decode, both tile orders and both operand orders compute the same."""
    torch.manual_seed(1)
    args, w = _qweight(spec, 384, 1024)
    pw = _packed_weight(*args)
    for m, cfg in ((5, D[0]), (150, P[0])):
        x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
        y = wo_gemm.launch_fwd(x, pw, cfg, use_asm=use_asm, pair_order=pair_order, swap_ab=swap)
        fast = wo_gemm.launch_fwd(x, pw, cfg)
        assert _rel(y, x.double() @ w.T) < TOL
        # identical decoded weights -> identical products, up to accumulation order
        assert (y.float() - fast.float()).abs().max() <= 1e-2 * fast.float().abs().max()


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("cfg", B, ids=str)
@pytest.mark.parametrize("m,n,k", [(3, 520, 1024), (300, 768, 3584)])
def test_backward_matches_reference(spec, cfg, m, n, k):
    torch.manual_seed(m + n)
    args, w = _qweight(spec, n, k)
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    _poison((m, k), torch.bfloat16)
    dx = wo_gemm.launch_bwd(dy, _packed_weight(*args), cfg)
    torch.cuda.synchronize()
    assert _rel(dx, dy.double() @ w) < TOL


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4", "int4-g128"])
def test_quantlinear_dispatches_and_trains_lora(spec):
    torch.manual_seed(0)
    lin = nn.Linear(1024, 512, bias=True, device="cuda").to(torch.bfloat16)
    q = QuantLinear.from_linear(lin, spec, lora=LoRAConfig(r=8, alpha=16))
    q.lora_B.data.normal_(0, 0.02)
    x = torch.randn(4, 9, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    assert dispatch.select(x, q).name == f"triton-wo-{make_config(spec).name}"
    assert not quarl_kernels.applies(x.float(), q)  # fp32 activations keep the reference
    y = q(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    gx, gA = x.grad.clone(), q.lora_A.grad.clone()
    x.grad = None
    q.lora_A.grad = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUARL_KERNELS", "reference")
        assert dispatch.select(x, q) is None
        y_ref = q(x)
        y_ref.backward(dy)
    assert _rel(y, y_ref.double()) < TOL
    assert _rel(gx, x.grad.double()) < TOL
    assert _rel(gA, q.lora_A.grad.double()) < TOL
    assert all(b.grad is None for b in q.buffers())


@pytest.mark.parametrize("m,n,k", [(1, 1024, 4096), (12, 1024, 4096), (200, 1024, 4096), (1100, 4096, 8192)])
def test_op_default_config_per_regime(m, n, k):
    """torch.ops.quarl.wo_linear with the per-regime default config (incl. BM=256 prefill)."""
    torch.manual_seed(m)
    args, w = _qweight("nvfp4", n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    assert _rel(torch.ops.quarl.wo_linear(x, *args), x.double() @ w.T) < TOL


def test_cuda_graph_capture_of_split_k_decode():
    torch.manual_seed(0)
    args, w = _qweight("nvfp4", 512, 3584)
    x = torch.randn(1, 3584, device="cuda").to(torch.bfloat16)
    torch.ops.quarl.wo_linear(x, *args)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.ops.quarl.wo_linear(x, *args)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert _rel(y, x.double() @ w.T) < TOL


def test_torch_compile_fullgraph_on_cuda():
    torch.manual_seed(0)
    lin = nn.Linear(512, 256, device="cuda").to(torch.bfloat16)
    q = QuantLinear.from_linear(lin, "nvfp4")
    args = layer_args(q)

    def f(x):
        return F.silu(torch.ops.quarl.wo_linear(x, *args))

    x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(out, f(x))
