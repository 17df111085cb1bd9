"""NF4 against bitsandbytes' published constants and a straightforward reference implementation."""

import math

import pytest
import torch

from quarl.quant.base import QuantError
from quarl.quant.formats import nf4
from quarl.quant.formats.nf4 import FORMAT, NF4Config

# bitsandbytes csrc/kernels.cu dQuantizeNF4: the decision-tree thresholds, ascending (x > t -> upper code)
BNB_THRESHOLDS = [
    -0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
    -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
    0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
    0.5016634166240692, 0.6427869200706482, 0.8614784181118011,
]  # fmt: skip


def sqnr_db(x, y):
    return 10 * math.log10((x.double().pow(2).sum() / (x.double() - y.double()).pow(2).sum()).item())


def ref_quantize(w, block=64):
    """bitsandbytes' pure-PyTorch backend, transcribed: flat blocks, argmin over the code, high nibble first."""
    flat = w.float().reshape(-1, block)
    absmax = flat.abs().amax(dim=1)
    scaled = torch.clamp(flat * (1 / absmax[:, None]), -1, 1).reshape(-1)
    code = torch.tensor(nf4.NF4_CODE)
    q = torch.argmin((scaled[:, None] - code).abs(), dim=-1).to(torch.uint8)
    return (q[::2] << 4 | q[1::2]), absmax


def ref_dequantize(packed, absmax, shape, block=64):
    code = torch.tensor(nf4.NF4_CODE)
    q = torch.empty(packed.numel() * 2, dtype=torch.long)
    q[::2], q[1::2] = packed >> 4, packed & 0xF
    return (code[q].view(-1, block) * absmax[:, None]).reshape(shape)


def test_codebook_structure_and_bnb_thresholds():
    code = torch.tensor(nf4.NF4_CODE)
    assert code.numel() == 16 and torch.all(code[1:] > code[:-1])
    assert code[0] == -1.0 and code[7] == 0.0 and code[15] == 1.0
    # the midpoints we bucketize with are bitsandbytes' thresholds, as float32
    assert torch.equal(nf4._MIDS, torch.tensor(BNB_THRESHOLDS, dtype=torch.float32))


def test_matches_reference_implementation():
    torch.manual_seed(0)
    w = torch.randn(48, 256) * 0.02
    q = FORMAT.quantize(w, NF4Config())
    ref_packed, ref_absmax = ref_quantize(w)
    assert torch.equal(q.tensors["weight_packed"].flatten(), ref_packed)
    assert torch.equal(q.tensors["weight_scale"].flatten(), ref_absmax)
    assert torch.equal(q.dequantize(), ref_dequantize(ref_packed, ref_absmax, w.shape))


def test_nibble_order_high_first():
    w = torch.zeros(1, 64)
    w[0, 0], w[0, 1], w[0, 2], w[0, 3] = 1.0, -1.0, 0.0, 0.7229568362236023
    packed = FORMAT.quantize(w, NF4Config()).tensors["weight_packed"]
    assert packed.dtype == torch.uint8 and packed.shape == (1, 32)
    assert packed[0, 0].item() == 0xF0  # code 15 (1.0) high, code 0 (-1.0) low
    assert packed[0, 1].item() == 0x7E  # code 7 (0.0) high, code 14 low
    assert torch.equal(
        nf4.unpack_nibbles(nf4.pack_nibbles(torch.arange(16).repeat(3, 4))),
        torch.arange(16).repeat(3, 4).to(torch.uint8),
    )


def test_exact_value_set_and_ties_go_to_lower_code():
    mids = torch.tensor(BNB_THRESHOLDS, dtype=torch.float32)
    above = torch.nextafter(mids, torch.tensor(2.0))
    row = torch.cat([torch.tensor([1.0]), mids, above, torch.zeros(64 - 31)])  # absmax exactly 1
    codes = nf4.unpack_nibbles(FORMAT.quantize(row[None], NF4Config()).tensors["weight_packed"])[0].long()
    assert torch.equal(codes[1:16], torch.arange(15))  # exactly on the midpoint -> lower code
    assert torch.equal(codes[16:31], torch.arange(1, 16))  # one ulp above -> upper code
    # every dequantized value is absmax * a code value
    w = torch.randn(8, 128)
    q = FORMAT.quantize(w, NF4Config())
    grid = torch.tensor(nf4.NF4_CODE) * q.tensors["weight_scale"][..., None]  # [8, 2, 16]
    assert (q.dequantize().view(8, 2, 64, 1) == grid[:, :, None, :]).any(-1).all()


def test_sqnr_gaussian():
    torch.manual_seed(1)
    w = torch.randn(512, 1024)
    # measured 20.7 dB (both with and without double quantization)
    assert sqnr_db(w, FORMAT.fake_quant(w, NF4Config())) > 20.3
    assert sqnr_db(w, FORMAT.fake_quant(w, NF4Config(double_quant=True))) > 20.3


def test_dynamic_map_matches_bnb_construction():
    m = nf4.dynamic_map_signed()
    assert m.numel() == 256 and torch.all(m[1:] > m[:-1])
    assert m[-1] == 1.0 and (m == 0).sum() == 1 and (m > 0).sum() == 128
    # smallest magnitude: 1e-6 * mean(0.1, 1); largest below 1: mean of the last two linspace(0.1, 1, 65) points
    assert m[128].item() == pytest.approx(0.55e-6, rel=1e-6)
    assert m[-2].item() == pytest.approx((1 - 0.9 / 64 + 1) / 2, rel=1e-6)
    assert m[0].item() == pytest.approx(-m[-2].item())


def test_double_quant_matches_reference():
    torch.manual_seed(2)
    w = torch.randn(40, 640) * torch.rand(40, 1)  # 400 absmax values -> 2 nested blocks, the last partial
    cfg = NF4Config(double_quant=True)
    q = FORMAT.quantize(w, cfg)
    a = w.view(-1, 64).abs().amax(dim=1)  # flat fp32 absmax, bnb order
    offset = a.mean()
    c = a - offset
    a2 = torch.stack([c[:256].abs().max(), c[256:].abs().max()])
    per = torch.cat([a2[0].expand(256), a2[1].expand(144)])
    dyn = nf4.dynamic_map_signed()
    codes = torch.argmin(((c * (1 / per))[:, None] - dyn).abs(), dim=1)
    assert torch.equal(q.tensors["weight_scale_offset"], offset.reshape(1))
    assert torch.equal(q.tensors["weight_scale_absmax"], a2)
    assert torch.equal(q.tensors["weight_scale"].flatten().long(), codes)
    decoded = dyn[codes] * per + offset
    ref_codes = torch.argmin(
        ((w.view(-1, 64) * (1 / decoded[:, None]))[..., None] - torch.tensor(nf4.NF4_CODE)).abs(), -1
    )
    assert torch.equal(q.dequantize(), (torch.tensor(nf4.NF4_CODE)[ref_codes] * decoded[:, None]).view(w.shape))
    # the 8-bit dynamic map keeps the decoded absmax within ~1% of the true one
    assert (decoded - a).abs().max() < 0.01 * a2.max()


def test_memory_bits():
    assert NF4Config().bits == 4 and NF4Config().memory_bits == 4.5
    assert NF4Config(double_quant=True).memory_bits == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))
    q = FORMAT.quantize(torch.randn(64, 256), NF4Config())
    assert q.nbytes * 8 == 64 * 256 * 4.5


@pytest.mark.parametrize("dq", [False, True])
def test_zero_blocks_no_nan(dq):
    w = torch.randn(16, 256)
    w[:, 64:128] = 0
    w[3] = 0
    out = FORMAT.fake_quant(w, NF4Config(double_quant=dq))
    assert torch.isfinite(out).all() and (out[:, 64:128] == 0).all() and (out[3] == 0).all()
    assert (FORMAT.fake_quant(torch.zeros(4, 128), NF4Config(double_quant=dq)) == 0).all()


def test_ste_gradient_and_dtype():
    w = torch.randn(8, 128, dtype=torch.bfloat16, requires_grad=True)
    out = FORMAT.fake_quant(w, NF4Config())
    assert out.dtype == torch.bfloat16
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(w.grad, g)


def test_bad_input():
    with pytest.raises(QuantError, match="multiple of the block size 64"):
        FORMAT.quantize(torch.randn(4, 96), NF4Config())
    for bad in (float("nan"), float("inf")):
        w = torch.randn(4, 64)
        w[1, 2] = bad
        with pytest.raises(QuantError, match="NaN/Inf"):
            FORMAT.quantize(w, NF4Config())
    with pytest.raises(QuantError, match="2-D"):
        FORMAT.quantize(torch.randn(64), NF4Config())
    with pytest.raises(QuantError, match="even"):
        NF4Config(block_size=63)


def _gptq_walk(w, cfg, chunks=(1, 7, 24, 32)):
    """Drive the hooks the way GPTQ does: state once, scales per group, qdq in column chunks."""
    state = FORMAT.tensor_state(w, cfg)
    out = torch.empty_like(w)
    for g0 in range(0, w.shape[1], cfg.block_size):
        scales = FORMAT.block_scales(w[:, g0 : g0 + cfg.block_size], cfg, state)
        c = g0
        for n in chunks:
            out[:, c : c + n] = FORMAT.qdq_with_scales(w[:, c : c + n], scales, cfg, state)
            c += n
    return out, state


@pytest.mark.parametrize("dq", [False, True])
def test_gptq_hooks_equal_fake_quant(dq):
    torch.manual_seed(3)
    cfg = NF4Config(double_quant=dq)
    w = torch.randn(72, 512)
    out, state = _gptq_walk(w, cfg)
    assert torch.equal(out, FORMAT.fake_quant(w, cfg))
    if dq:
        with pytest.raises(QuantError, match="tensor_state again"):
            FORMAT.block_scales(w[:, :64], cfg, state)


def test_double_quant_state_from_fused_shards_is_ignored():
    torch.manual_seed(4)
    cfg = NF4Config(double_quant=True)
    q_w, k_w = torch.randn(64, 256), torch.randn(32, 256) * 3
    shared = FORMAT.tensor_state(torch.cat([q_w, k_w]), cfg)  # what quantize_model's fused sharing computes
    for w in (q_w, k_w):
        assert torch.equal(FORMAT.quantize(w, cfg, state=shared).dequantize(), FORMAT.fake_quant(w, cfg))
    own = FORMAT.tensor_state(k_w, cfg)
    assert torch.equal(FORMAT.quantize(k_w, cfg, state=own).tensors["weight_scale_absmax"], own["absmax2"])
