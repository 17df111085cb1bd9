"""QuantLinear: forward == dequantize-then-matmul, LoRA trains and the base does not,
QAT mode, activation quantizer, kernel dispatch falls back to the reference on CPU."""

import pytest
import torch
from torch import nn

from quarl.quant import QuantError, QuantLinear, dispatch, get_format, make_config
from quarl.quant.linear import LoRAConfig

FORMATS = ["nvfp4", "mxfp4", "nf4", "nf4-dq", "fp8", "fp8-block", "int4-g128", "int3-g128", "int8-g128-sym", "int2-g128"]


def _linear(n=256, k=256, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    lin.weight.data.normal_(0, 0.02)
    return lin


@pytest.mark.parametrize("spec", FORMATS)
def test_forward_equals_dequantize_then_matmul(spec):
    lin = _linear()
    q = QuantLinear.from_linear(lin, spec)
    x = torch.randn(3, 5, 256)
    cfg = make_config(spec)
    w_ref = get_format(cfg.name).dequantize(get_format(cfg.name).quantize(lin.weight.detach(), cfg), torch.float32)
    torch.testing.assert_close(q(x), x @ w_ref.T + lin.bias.detach(), rtol=0, atol=1e-5)
    # and the quantized layer stays close to the original one (a loose sanity bound per format)
    rel = (q(x) - lin(x)).norm() / lin(x).norm()
    assert rel < 0.7, f"{spec}: relative output error {rel:.3f}"


def test_bf16_frozen_base_is_exact():
    lin = _linear()
    q = QuantLinear.from_linear(lin, "bf16")
    x = torch.randn(4, 256)
    torch.testing.assert_close(q(x), lin(x))
    assert q.format_name == "bf16"


@pytest.mark.parametrize("spec", ["nvfp4", "bf16"])
def test_lora_gets_gradients_and_base_none(spec):
    lin = _linear()
    q = QuantLinear.from_linear(lin, spec, lora=LoRAConfig(r=4, alpha=8))
    x = torch.randn(8, 256, requires_grad=True)
    y0 = q(x)
    # B starts at zero: a fresh adapter is a no-op
    torch.testing.assert_close(y0, QuantLinear.from_linear(lin, spec)(x))
    q.lora_B.data.normal_(0, 0.1)
    q(x).pow(2).sum().backward()
    assert q.lora_A.grad is not None and q.lora_A.grad.abs().sum() > 0
    assert q.lora_B.grad is not None and q.lora_B.grad.abs().sum() > 0
    assert x.grad is not None  # upstream layers still get their gradient
    assert [n for n, p in q.named_parameters() if p.requires_grad] == ["lora_A", "lora_B"]
    for n, b in q.named_buffers():
        assert b.grad is None and not b.requires_grad, n


def test_lora_matches_manual_formula():
    lin = _linear(bias=False)
    q = QuantLinear.from_linear(lin, "int8-g128", lora=LoRAConfig(r=2, alpha=6))
    q.lora_B.data.normal_()
    x = torch.randn(5, 256)
    expected = x @ q.dequantized_weight().T + (x @ q.lora_A.T @ q.lora_B.T) * 3.0
    torch.testing.assert_close(q(x), expected)
    torch.testing.assert_close(q.to_linear()(x), expected, atol=1e-4, rtol=1e-4)


def test_qat_mode_trains_master_weight_and_freezes():
    lin = _linear()
    q = QuantLinear.from_linear(lin, "nvfp4", mode="qat")
    x = torch.randn(4, 256)
    q(x).sum().backward()
    assert q.weight.grad is not None  # STE passes the gradient to the master weight
    frozen = QuantLinear.from_linear(lin, "nvfp4")
    torch.testing.assert_close(q(x), frozen(x), atol=1e-5, rtol=0)
    q.freeze()
    assert q.mode == "frozen" and hasattr(q, "weight_packed")
    torch.testing.assert_close(q(x), frozen(x), atol=1e-5, rtol=0)


def test_fp8_activation_quantizer_changes_output_slightly():
    lin = _linear()
    plain = QuantLinear.from_linear(lin, "fp8-block")
    actq = QuantLinear.from_linear(lin, "fp8-block", act_quant="fp8-1x128")
    x = torch.randn(4, 256)
    a, b = plain(x), actq(x)
    rel = (a - b).norm() / a.norm()
    assert 0 < rel < 0.1


def test_bad_inputs_give_clear_errors():
    with pytest.raises(QuantError, match="unknown format spec"):
        QuantLinear.from_linear(_linear(), "fp5")
    with pytest.raises(QuantError, match="multiple of the block"):
        QuantLinear.from_linear(nn.Linear(100, 64), "nvfp4")
    lin = _linear()
    lin.weight.data[0, 0] = float("nan")
    with pytest.raises(QuantError, match="NaN"):
        QuantLinear.from_linear(lin, "nvfp4")
    with pytest.raises(QuantError, match="activation quantizer"):
        QuantLinear.from_linear(_linear(), "nvfp4", act_quant="int8-per-token")


def test_dispatch_falls_back_to_reference_on_cpu():
    q = QuantLinear.from_linear(_linear(), "nvfp4")
    called = []
    dispatch.register_kernel(dispatch.Kernel("spy", "nvfp4", lambda x, l: called.append(1), lambda x, l: True, 99))
    try:
        x = torch.randn(2, 256)
        assert dispatch.select(x, q) is None  # CPU tensors never take a GPU kernel
        q(x)
        assert not called
    finally:
        dispatch._KERNELS["nvfp4"] = [k for k in dispatch._KERNELS["nvfp4"] if k.name != "spy"]


def test_dequant_cache_is_opt_in_and_consistent():
    q = QuantLinear.from_linear(_linear(), "nf4")
    x = torch.randn(2, 256)
    y = q(x)
    assert q._wcache is None
    q.cache_dequantized = True
    torch.testing.assert_close(q(x), y)
    assert q._wcache is not None


@pytest.mark.parametrize("spec", ["nvfp4", "fp8-block", "int4-g128"])
def test_module_to_dtype_keeps_packed_tensors_bit_exact(spec):
    """model.to(bf16) must not cast FP8 scales / the FP32 global scale (lossy, and the GPU
    kernels only take the packed dtypes); it changes the compute dtype instead."""
    torch.manual_seed(0)
    q = QuantLinear.from_linear(nn.Linear(256, 64, bias=True), spec)
    before = {n: getattr(q, n).clone() for n in q._tensor_names}
    x = torch.randn(3, 256)
    y32 = q(x)
    model = nn.Sequential(q).to(torch.bfloat16)
    for n, t in before.items():
        got = getattr(q, n)
        assert got.dtype == t.dtype, (n, got.dtype, t.dtype)
        assert torch.equal(got.view(torch.uint8), t.view(torch.uint8)), n
    assert q.compute_dtype == torch.bfloat16 and q.bias.dtype == torch.bfloat16
    y16 = model(x.to(torch.bfloat16))
    assert y16.dtype == torch.bfloat16
    assert ((y16.float() - y32).norm() / y32.norm()).item() < 1e-2
    model.to(device="meta").to_empty(device="cpu")  # device moves still apply to packed tensors
    assert all(getattr(q, n).device.type == "cpu" and getattr(q, n).dtype == t.dtype for n, t in before.items())


def test_forward_never_takes_the_engines_fused_route(monkeypatch):
    """The trainer's no-grad old-log-prob pass must be its training forward bit for bit: even where a
    kernel offers the fused last pass (``epilogue_kernel``, the rollout engine's), ``forward`` /
    ``base_forward`` keep their own ops with and without autograd."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 32, bias=True)
    q = QuantLinear.from_linear(lin, "nvfp4", lora=LoRAConfig(r=4, alpha=8.0))
    with torch.no_grad():
        q.lora_B.normal_(0, 0.1)

    def offered(x):
        def fused(*a, **k):
            raise AssertionError("QuantLinear took the engine's fused route")
        return fused

    monkeypatch.setattr(QuantLinear, "epilogue_kernel", lambda self, x: offered(x))
    x = torch.randn(3, 64)
    with torch.no_grad():
        a = q(x)
    b = q(x)
    assert torch.equal(a, b.detach())
