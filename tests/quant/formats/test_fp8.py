"""FP8 E4M3 weights and 1x128 activations, checked against compressed-tensors and hand-built values."""

import math

import pytest
import torch

from quarl.quant.base import QuantError
from quarl.quant.formats import fp8
from quarl.quant.formats.fp8 import FORMAT, FP8Config

try:  # a project dependency; absent only on the bare GPU image that runs the `gpu` test
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, compute_dynamic_scales_and_zp
except ImportError:
    QuantizationArgs = None
needs_ct = pytest.mark.skipif(QuantizationArgs is None, reason="compressed-tensors is not installed")


def sqnr_db(x, y):
    return 10 * math.log10((x.double().pow(2).sum() / (x.double() - y.double()).pow(2).sum()).item())


def all_e4m3_values():
    v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return v[torch.isfinite(v)]


def test_exact_value_set_round_trips():
    vals = all_e4m3_values()  # 254 finite values (0x7f/0xff are NaN), incl. +-0 and subnormals
    assert vals.numel() == 254 and vals.abs().max() == 448
    w = vals.repeat(2).view(2, 254)
    q = FORMAT.quantize(w, FP8Config())
    assert q.tensors["weight_scale"].item() == 1.0  # amax 448 -> scale exactly 1
    assert torch.equal(q.dequantize(), w)


def test_round_to_nearest_even_ties():
    # with scale 1: 1 + 1/16 is halfway between 1 and 1.125 (-> 1, even mantissa);
    # 1.1875 between 1.125 and 1.25 (-> 1.25); 2**-10 between 0 and the smallest subnormal 2**-9 (-> 0)
    w = torch.tensor([[448.0, 1.0625, 1.1875, 2**-10, 3 * 2**-10, -1.0625, 240.0 + 8.0]])
    out = FORMAT.fake_quant(w, FP8Config())
    assert out.tolist() == [[448.0, 1.0, 1.25, 0.0, 2**-8, -1.0, 256.0]]


def test_saturates_instead_of_nan_with_a_shared_scale():
    w = torch.tensor([[1.0, -3.0, 0.5]])
    out = FORMAT.quantize(w, FP8Config(), state={"scale": torch.tensor([1 / 448])}).dequantize()
    assert torch.isfinite(out).all() and out[0, 0] == 1.0 and out[0, 1] == -1.0


@needs_ct
def test_per_tensor_matches_compressed_tensors():
    torch.manual_seed(0)
    w = torch.randn(96, 320) * 0.05
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="tensor")
    scale, zp = calculate_qparams(w.min().reshape(1), w.max().reshape(1), args)
    q = FORMAT.quantize(w, FP8Config())
    assert torch.equal(q.tensors["weight_scale"], scale)
    assert q.tensors["weight"].dtype == torch.float8_e4m3fn
    assert torch.equal(q.dequantize(), fake_quantize(w, scale, zp, args))


@needs_ct
def test_blockwise_matches_compressed_tensors_and_shapes():
    torch.manual_seed(1)
    w = torch.randn(200, 384)  # N not a multiple of 128: last row tile has 72 rows
    w[130:, 256:] *= 10  # a tile with a different range
    q = FORMAT.quantize(w, FP8Config("block"))
    s = q.tensors["weight_scale"]
    assert s.shape == (2, 3) and s.dtype == torch.float32
    assert s[1, 2] == w[128:, 256:].abs().max() / 448 and s[0, 0] == w[:128, :128].abs().max() / 448
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[128, 128])
    assert torch.equal(q.dequantize(), fake_quantize(w, s, None, args))


def test_sqnr_gaussian():
    torch.manual_seed(2)
    w = torch.randn(512, 1024)
    # measured 31.5 dB for both granularities (E4M3's 3 mantissa bits, nearly scale-independent)
    assert sqnr_db(w, FORMAT.fake_quant(w, FP8Config())) > 31.0
    assert sqnr_db(w, FORMAT.fake_quant(w, FP8Config("block"))) > 31.0


@needs_ct
def test_act_1x128_matches_compressed_tensors_dynamic_group():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 384) * torch.tensor([0.01, 1.0, 100.0]).repeat_interleave(128)
    xq, xs = fp8.quantize_act_1x128(x)
    assert xq.shape == x.shape and xq.dtype == torch.float8_e4m3fn and xs.shape == (2, 5, 3)
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="group", group_size=128, dynamic=True)
    scale, _ = compute_dynamic_scales_and_zp(x, args, None)
    assert torch.equal(xs, scale.reshape(xs.shape))
    ref = torch.clamp(x.view(2, 5, 3, 128) / xs[..., None], -448, 448).to(torch.float8_e4m3fn).float() * xs[..., None]
    assert torch.equal(fp8.dequantize_act_1x128(xq, xs), ref.view_as(x))
    assert sqnr_db(x[..., :128], fp8.fake_quant_act_1x128(x)[..., :128]) > 30  # small group unaffected by big ones


def test_act_ste_zero_groups_and_bad_shape():
    x = torch.randn(4, 256, requires_grad=True)
    with torch.no_grad():
        x[1, :128] = 0
    y = fp8.fake_quant_act_1x128(x)
    assert torch.isfinite(y).all() and (y[1, :128] == 0).all()
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, g)
    # a K that is not a multiple of 128: the last group is short, as if padded with zeros
    x = torch.randn(3, 200)
    q, s = fp8.quantize_act_1x128(x)
    qp, sp = fp8.quantize_act_1x128(torch.nn.functional.pad(x, (0, 56)))
    assert q.shape == (3, 200) and s.shape == (3, 2)
    assert torch.equal(s, sp) and torch.equal(q.view(torch.uint8), qp[:, :200].view(torch.uint8))
    assert torch.equal(fp8.dequantize_act_1x128(q, s), fp8.dequantize_act_1x128(qp, sp)[:, :200])


def _blockwise_sum(x, q):
    """What a blockwise scaled-mm kernel does: fp8 partial products per 128-wide K block, scaled, summed."""
    xq, xs = fp8.quantize_act_1x128(x)
    wq, ws = q.tensors["weight"].float(), q.tensors["weight_scale"]
    n, k = q.shape
    ws_rows = ws.repeat_interleave(128, dim=0)[:n]  # [N, K/128]
    out = torch.zeros(x.shape[0], n, dtype=torch.float64)
    for kb in range(k // 128):
        part = xq.float()[:, kb * 128 : (kb + 1) * 128].double() @ wq[:, kb * 128 : (kb + 1) * 128].double().t()
        out += part * xs[:, kb : kb + 1].double() * ws_rows[:, kb].double()[None]
    return out


def test_blockwise_matmul_reference():
    torch.manual_seed(4)
    x, w = torch.randn(16, 512), torch.randn(200, 512) * 0.02
    q = FORMAT.quantize(w, FP8Config("block"))
    y = fp8.fp8_blockwise_matmul_reference(x, q)
    assert y.shape == (16, 200) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _blockwise_sum(x, q), rtol=1e-5, atol=1e-5)
    assert sqnr_db(x @ w.t(), y) > 25  # both operands in fp8: ~3 dB under the weight-only figure
    assert fp8.fp8_blockwise_matmul_reference(x[None], q).shape == (1, 16, 200)


@pytest.mark.parametrize("gran", ["tensor", "block"])
def test_zero_weights_no_nan_and_ste(gran):
    w = torch.randn(160, 256)
    w[:128, :128] = 0
    out = FORMAT.fake_quant(w, FP8Config(gran))
    assert torch.isfinite(out).all() and (out[:128, :128] == 0).all()
    assert (FORMAT.fake_quant(torch.zeros(3, 128), FP8Config(gran)) == 0).all()
    wb = torch.randn(8, 128, dtype=torch.bfloat16, requires_grad=True)
    y = FORMAT.fake_quant(wb, FP8Config(gran))
    g = torch.randn_like(y)
    y.backward(g)
    assert y.dtype == torch.bfloat16 and torch.equal(wb.grad, g)


def test_bad_input():
    with pytest.raises(QuantError, match="granularity 'channel'"):
        FP8Config("channel")
    # K not a multiple of 128 (SmolLM2: 576): the last column tile is short, scaled by its own amax
    w = torch.randn(130, 200)
    q = FORMAT.quantize(w, FP8Config("block"))
    qp = FORMAT.quantize(torch.nn.functional.pad(w, (0, 56)), FP8Config("block"))
    assert q.tensors["weight_scale"].shape == (2, 2) and torch.equal(q.tensors["weight_scale"], qp.tensors["weight_scale"])
    assert q.tensors["weight_scale"][1, 1] == w[128:, 128:].abs().max() / 448
    assert torch.equal(q.dequantize(), qp.dequantize()[:, :200])
    FORMAT.quantize(torch.randn(5, 200), FP8Config())  # per-tensor has no K constraint
    w = torch.randn(4, 128)
    w[0, 0] = float("nan")
    with pytest.raises(QuantError, match="NaN/Inf"):
        FORMAT.quantize(w, FP8Config())
    w[0, 0] = float("-inf")
    with pytest.raises(QuantError, match="NaN/Inf"):
        FORMAT.quantize(w, FP8Config("block"))


@pytest.mark.parametrize("gran", ["tensor", "block"])
def test_gptq_hooks_equal_fake_quant(gran):
    torch.manual_seed(5)
    cfg = FP8Config(gran)
    w = torch.randn(200, 384)
    state = FORMAT.tensor_state(w, cfg)
    out = torch.empty_like(w)
    for g0 in range(0, 384, 128):
        scales = FORMAT.block_scales(w[:, g0 : g0 + 128], cfg, state)
        c = g0
        for n in (1, 31, 64, 32):
            out[:, c : c + n] = FORMAT.qdq_with_scales(w[:, c : c + n], scales, cfg, state)
            c += n
    assert torch.equal(out, FORMAT.fake_quant(w, cfg))


def test_config_bits():
    assert FP8Config().bits == 8 and FP8Config().memory_bits == 8
    assert FP8Config("block").memory_bits == pytest.approx(8 + 32 / 128**2)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="blockwise FP8 scaled_mm (BlockWise1x128 x BlockWise128x128) needs an SM90 GPU",
)
@pytest.mark.parametrize("m,n,k", [(64, 256, 512), (60, 272, 640), (128, 384, 384)])
def test_cublas_blockwise_scaled_mm_matches_reference(m, n, k):
    """The layouts documented in fp8.py, checked on the GPU against the fp32 oracle."""
    F = torch.nn.functional
    torch.manual_seed(6)
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda") * 0.02
    q = FORMAT.quantize(w, FP8Config("block"))
    xq, xs = fp8.quantize_act_1x128(x)
    sa, sb = fp8.cublas_blockwise_scales(xs, q.tensors["weight_scale"])
    y = F.scaled_mm(xq, q.tensors["weight"].t(), sa, F.ScalingType.BlockWise1x128, sb,
                    F.ScalingType.BlockWise128x128, output_dtype=torch.float32)  # fmt: skip
    ref = fp8.fp8_blockwise_matmul_reference(x, q)
    assert (y - ref).abs().max() < 1e-4 * ref.abs().max() * k**0.5  # fp32 summation order only
