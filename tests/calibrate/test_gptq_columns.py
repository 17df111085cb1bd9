"""The static-shape column loop (what CUDA graphs replay) equals the reference loop bit for bit."""

import pytest
import torch

from quarl.calibrate import gptq_columns
from quarl.calibrate.gptq import gptq_quantize
from quarl.quant import QuantError, make_config
from tests.calibrate.test_gptq import _tensors_equal, correlated_hessian


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(48, 384, generator=g)
    H = correlated_hessian(384, tokens=2048, seed=4)
    H[5, :] = 0  # a dead input channel (zeroed column), as real activations have
    H[:, 5] = 0
    return w, H


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4", "int4-g128", "int3-g128"])
@pytest.mark.parametrize("act_order", [True, False])
@pytest.mark.parametrize("block_size", [128, 96])  # 96: lazy blocks that cut groups (segments, spanning scales)
def test_static_loop_equals_reference(spec, act_order, block_size, layer):
    w, H = layer
    cfg = make_config(spec)
    gptq_columns.clear_graphs()
    ref = gptq_quantize(w, H, cfg, act_order=act_order, block_size=block_size, column_loop="reference")
    fast = gptq_quantize(w, H, cfg, act_order=act_order, block_size=block_size, column_loop="graph")
    assert torch.equal(fast.q, ref.q)
    assert fast.loss == ref.loss
    assert _tensors_equal(fast.qtensor.tensors, ref.qtensor.tensors)
    # a second layer of the same shape reuses the cached buffers: still equal (nothing stale leaks)
    w2 = w.flip(0) * 0.5
    ref2 = gptq_quantize(w2, H, cfg, act_order=act_order, block_size=block_size, column_loop="reference")
    fast2 = gptq_quantize(w2, H, cfg, act_order=act_order, block_size=block_size, column_loop="graph")
    assert torch.equal(fast2.q, ref2.q) and not torch.equal(fast2.q, fast.q)


def test_shared_state_reaches_the_cached_buffers(layer):
    """NVFP4's global scale lives in the cached state buffers: a new state must replace the old one."""
    w, H = layer
    cfg = make_config("nvfp4")
    for gs in (1.0, 7.0):
        st = {"global_scale": torch.tensor([gs * 448 * 6 / float(w.abs().amax())])}
        ref = gptq_quantize(w, H, cfg, state=st, column_loop="reference")
        fast = gptq_quantize(w, H, cfg, state=st, column_loop="graph")
        assert torch.equal(fast.q, ref.q)


def test_unknown_column_loop_is_refused(layer):
    w, H = layer
    with pytest.raises(QuantError, match="column_loop"):
        gptq_quantize(w, H, make_config("int4-g128"), column_loop="fast")


def test_native_hessian_is_the_fp32_one_off_cuda_and_bad_names_are_refused():
    """"native" only changes CUDA 16-bit inputs (tensor-core GEMM, fp32 accumulate); elsewhere it is the fp32 path."""
    from quarl.calibrate.gptq import HessianAccumulator

    x = torch.randn(3, 40, 16).bfloat16()
    a, b = HessianAccumulator(16), HessianAccumulator(16, matmul="native")
    for xi in x:
        a.add(xi)
        b.add(xi)
    assert torch.equal(a.H, b.H) and a.n == b.n == 120
    with pytest.raises(QuantError, match="matmul"):
        HessianAccumulator(16, matmul="tf32")
