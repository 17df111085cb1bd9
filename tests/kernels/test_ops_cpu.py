"""quarl_kernels on CPU: the custom ops fall back to the reference, trace, and
differentiate; QuantLinear's dispatcher keeps the reference path on CPU.

The Triton kernels themselves are exercised on CPU through Triton's
interpreter (portable decode path; skipped when Triton is not installed) and
on the GPU by ``test_wo_gemm_gpu.py``.
"""

from __future__ import annotations

import pytest
import quarl_kernels
import torch
import torch.nn.functional as F
from quarl_kernels.ops import layer_args
from torch import nn

from quarl.quant import QuantLinear, dispatch, get_format, make_config

SPECS = ["nvfp4", "mxfp4", "int4-g128", "int4-g128-sym", "int4-g64"]


def _layer(spec: str, n: int = 48, k: int = 256, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=False)
    lin.weight.data.normal_(0, 0.05)
    return QuantLinear.from_linear(lin, spec)


def test_kernels_registered_for_each_format():
    dispatch.load_kernels()  # what the first CUDA call does: import quarl_kernels, register its kernel_specs()
    reg = dispatch.registered()
    for fmt in ("nvfp4", "mxfp4", "int"):
        assert f"triton-wo-{fmt}" in reg.get(fmt, []), reg
    assert set(quarl_kernels.KERNELS) == {"triton-wo-nvfp4", "triton-wo-mxfp4", "triton-wo-int"}


@pytest.mark.parametrize("spec", SPECS)
def test_cpu_dispatch_uses_reference(spec):
    q = _layer(spec)
    x = torch.randn(3, 256)
    assert dispatch.select(x, q) is None  # CPU tensor: no kernel applies
    assert not quarl_kernels.applies(x, q)
    w = q.qtensor().dequantize(torch.float32)
    torch.testing.assert_close(q(x), x @ w.T, rtol=0, atol=0)


@pytest.mark.parametrize("spec", SPECS)
def test_op_cpu_equals_reference_and_backward(spec):
    q = _layer(spec)
    w = q.qtensor().dequantize(torch.float32)  # [N, K]
    x = torch.randn(2, 5, 256, requires_grad=True)
    y = torch.ops.quarl.wo_linear(x, *layer_args(q))
    torch.testing.assert_close(y, F.linear(x, w), rtol=0, atol=0)
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, dy @ w, rtol=1e-6, atol=1e-6)
    dx = torch.ops.quarl.wo_linear_t(dy, *layer_args(q))
    torch.testing.assert_close(dx, dy @ w, rtol=0, atol=0)


@pytest.mark.parametrize("spec", SPECS)
def test_eager_autograd_equals_the_op(spec):
    """``ops.WoLinearEager`` (the op's kernels and backward without the dispatcher: the eager training path of
    ``registration.forward``) gives the op's output and input gradient exactly, saves no more, and differentiates
    nothing but x."""
    from quarl_kernels.ops import WoLinearEager

    q = _layer(spec)
    x = torch.randn(2, 5, 256, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y = torch.ops.quarl.wo_linear(x, *layer_args(q))
    y2 = WoLinearEager.apply(x2, *layer_args(q))
    assert torch.equal(y, y2) and y2.requires_grad
    dy = torch.randn_like(y)
    y.backward(dy)
    y2.backward(dy)
    assert torch.equal(x.grad, x2.grad)
    assert all(not t.requires_grad for t in layer_args(q) if isinstance(t, torch.Tensor))


def test_applies_rejects_what_the_kernel_does_not_compute():
    q = _layer("int3-g128")
    assert not quarl_kernels.applies(torch.randn(2, 256), q)
    q = _layer("nf4")
    assert not quarl_kernels.applies(torch.randn(2, 256), q)


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4", "int4-g128"])
def test_opcheck_schema_fake_and_autograd(spec):
    q = _layer(spec)
    # torch's schema checker compares inputs bitwise with a CPU kernel that has no
    # float8 support; NVFP4's e4m3 scales skip that one check (not an op property).
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    utils = utils if spec == "nvfp4" else utils + ("test_schema",)
    x = torch.randn(3, 256, requires_grad=True)
    torch.library.opcheck(torch.ops.quarl.wo_linear.default, (x, *layer_args(q)), test_utils=utils)
    dy = torch.randn(3, 48)
    torch.library.opcheck(torch.ops.quarl.wo_linear_t.default, (dy, *layer_args(q)), test_utils=utils)


def test_default_config_follows_the_measured_regimes():
    pytest.importorskip("triton")
    from quarl_kernels import wo_gemm

    d, p = wo_gemm.DECODE_CONFIGS, wo_gemm.PREFILL_CONFIGS
    assert wo_gemm.default_config("fwd", 1, 3584, 3584) == d[0]
    assert wo_gemm.default_config("fwd", 16, 3584, 3584) == d[1]
    assert wo_gemm.default_config("fwd", 64, 3584, 3584) == d[2]
    assert wo_gemm.default_config("fwd", 128, 3584, 3584) == p[1]
    assert wo_gemm.default_config("fwd", 2048, 3584, 3584) == p[0]
    assert wo_gemm.default_config("fwd", 2048, 18944, 3584) == p[2]
    assert wo_gemm.default_config("bwd", 2048, 18944, 3584) == wo_gemm.BWD_CONFIGS[0]


def test_traces_under_torch_compile_fullgraph():
    q = _layer("nvfp4")
    args = layer_args(q)

    def f(x):
        return torch.ops.quarl.wo_linear(x, *args).relu()

    x = torch.randn(4, 256)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x))


def test_layer_args_names_the_compressed_tensors_buffers():
    q = _layer("int4-g128")
    packed, scale, zero, gs, fmt, group, n, k = layer_args(q)
    assert packed is q.weight_packed and scale is q.weight_scale and zero is q.weight_zero_point
    assert (gs, fmt, group, n, k) == (None, "int", 128, 48, 256)
    q = _layer("nvfp4")
    assert layer_args(q)[3] is q.weight_global_scale and layer_args(q)[4:6] == ("nvfp4", 16)
    cfg = make_config("mxfp4")
    assert get_format("mxfp4").quantize(torch.randn(4, 64), cfg).tensors["weight_scale"].dtype == torch.uint8


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
def test_epilogue_op_cpu_reference_fake_and_layer_entry(spec):
    """``wo_linear_epilogue`` = ``x @ W^T + bias + scaling * a @ b^T`` (a a column slice, as the engine
    passes it); its fake shape; ``registration.forward_epilogue`` passes the layer's bias."""
    from quarl_kernels.registration import forward_epilogue

    q = _layer(spec)
    w = q.qtensor().dequantize(torch.float32)
    x = torch.randn(2, 3, 256)
    bias = torch.randn(48)
    a = torch.randn(2, 3, 24)[..., 8:16]
    b = torch.randn(48, 8)
    y = torch.ops.quarl.wo_linear_epilogue(x, *layer_args(q), bias, a, b, 0.5)
    torch.testing.assert_close(y, F.linear(x, w) + bias + 0.5 * a @ b.T, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(torch.ops.quarl.wo_linear_epilogue(x, *layer_args(q), None, None, None, 1.0),
                               F.linear(x, w), rtol=0, atol=0)
    utils = ("test_faketensor",) if spec == "nvfp4" else ("test_faketensor", "test_schema")
    torch.library.opcheck(torch.ops.quarl.wo_linear_epilogue.default,
                          (x, *layer_args(q), bias, a.contiguous(), b, 0.5), test_utils=utils)
    q.bias = nn.Parameter(bias, requires_grad=False)
    torch.testing.assert_close(forward_epilogue(x, q, a, b, 0.5), y, rtol=0, atol=0)
    gate = torch.randn(2, 3, 48)  # the up projection with the MLP's SiLU in its last pass
    torch.testing.assert_close(forward_epilogue(x, q, a, b, 0.5, gate=gate), F.silu(gate) * y, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
def test_epilogue_a_op_cpu_reference_and_fake(spec):
    """``wo_linear_epilogue_a``: the group's ``x @ a_w^T`` as ``splits`` fp32 partials (``F.linear``'s value in split
    0, zeros after) and ``y`` = ``wo_linear_epilogue`` with columns ``[a_lo, a_lo + r)`` of them; its fake shapes."""
    q = _layer(spec)
    x = torch.randn(2, 3, 256)
    a_w = torch.randn(24, 256) * 0.1
    b = torch.randn(48, 8)
    bias = torch.randn(48)
    y, parts = torch.ops.quarl.wo_linear_epilogue_a(x, *layer_args(q), bias, a_w, 8, b, 0.5, 3)
    assert parts.shape == (3, 2, 3, 24) and parts.dtype == torch.float32
    torch.testing.assert_close(parts[0], F.linear(x, a_w), rtol=0, atol=0)
    assert not parts[1:].any()
    want = torch.ops.quarl.wo_linear_epilogue(x, *layer_args(q), bias, F.linear(x, a_w)[..., 8:16], b, 0.5)
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.quarl.wo_linear_epilogue_a.default,
                          (x, *layer_args(q), bias, a_w, 8, b, 0.5, 3), test_utils=("test_faketensor",))
