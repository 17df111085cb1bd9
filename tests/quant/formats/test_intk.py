"""INT-k weights against compressed-tensors' qparams, fake_quantize, packing and pack-quantized decompressor."""

import math

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams

from quarl.quant.base import QuantError
from quarl.quant.formats import intk
from quarl.quant.formats.intk import FORMAT, IntConfig

ALL = [(b, s) for b in (2, 3, 4, 8) for s in (False, True)]


def sqnr_db(x, y):
    return 10 * math.log10((x.double().pow(2).sum() / (x.double() - y.double()).pow(2).sum()).item())


def _ct_dense_layout() -> bool:
    # compressed-tensors >= 0.13 packs 3-bit densely (32 values in 3 words); older releases did not
    return pack_to_int32(torch.zeros(1, 32, dtype=torch.int8), 3).shape[1] == 3


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packing_matches_compressed_tensors(bits):
    if bits == 3 and not _ct_dense_layout():
        pytest.skip("installed compressed-tensors predates the dense 3-bit layout")
    torch.manual_seed(bits)
    codes = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (7, 320), dtype=torch.int8)
    ours = intk.pack_int32(codes.long() - intk.IntConfig(bits).qmin, bits)
    ct = pack_to_int32(codes, bits)
    assert ours.dtype == torch.int32 and torch.equal(ours, ct)
    assert torch.equal(intk.unpack_int32(ct, bits, 320) + intk.IntConfig(bits).qmin, codes.long())
    assert torch.equal(unpack_from_int32(ours, bits, torch.Size((7, 320))), codes)


def test_packing_known_words():
    # int4: element 0 in the low nibble; 0x76543210 after the +8 offset is undone
    assert intk.pack_int32(torch.arange(8)[None], 4).tolist() == [[0x76543210]]
    # int3: element 10 straddles words 0 (bits 30-31) and 1 (bit 0)
    u = torch.zeros(1, 32, dtype=torch.long)
    u[0, 10] = 0b111
    assert intk.pack_int32(u, 3).tolist() == [[-(1 << 31) + (1 << 30), 1, 0]]
    # odd widths pad to whole words
    assert intk.unpack_int32(intk.pack_int32(torch.arange(5)[None] % 4, 2), 2, 5).tolist() == [[0, 1, 2, 3, 0]]


@pytest.mark.parametrize("bits,sym", ALL)
def test_qparams_and_values_match_compressed_tensors(bits, sym):
    torch.manual_seed(10 * bits + sym)
    w = torch.randn(64, 384) * 0.03 + 0.01
    cfg = IntConfig(bits, symmetric=sym)
    q = FORMAT.quantize(w, cfg)
    args = QuantizationArgs(**intk.quantization_args(cfg))
    wg = w.view(64, 3, 128)
    scale, zp = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    assert torch.equal(q.tensors["weight_scale"], scale)
    if sym:
        assert "weight_zero_point" not in q.tensors
    else:
        assert q.tensors["weight_zero_point"].dtype == torch.int8 and torch.equal(q.tensors["weight_zero_point"], zp)
    assert torch.equal(q.dequantize(), fake_quantize(w, scale, zp, args))


@pytest.mark.parametrize("bits,sym", [(3, False), (4, False), (4, True), (8, False)])
def test_compressed_tensors_decompressor_reads_our_tensors(bits, sym):
    if bits == 3 and not _ct_dense_layout():
        pytest.skip("installed compressed-tensors predates the dense 3-bit layout")
    w = torch.randn(48, 256)
    cfg = IntConfig(bits, symmetric=sym)
    q = FORMAT.quantize(w, cfg)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**intk.quantization_args(cfg)))
    sd = PackedQuantizationCompressor.decompress(intk.to_compressed_tensors(q), scheme)
    assert torch.equal(sd["weight"], q.dequantize())


def test_hand_values_and_round_half_even():
    # symmetric int4, amax 7.5 -> scale exactly 1: x.5 ties go to even, +7.5 clips to 7, -7.5 -> -8
    cfg = IntConfig(4, group_size=8, symmetric=True)
    w = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 7.5, -7.5, 3.2]])
    q = FORMAT.quantize(w, cfg)
    assert q.tensors["weight_scale"].item() == 1.0
    assert q.dequantize().tolist() == [[0.0, 2.0, 2.0, -0.0, -2.0, 7.0, -8.0, 3.0]]
    # asymmetric int2 on [0, 3]: scale 1, zero point -2 (unsigned 0), codes reproduce 0..3 exactly
    q = FORMAT.quantize(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), IntConfig(2, group_size=4))
    assert q.tensors["weight_scale"].item() == 1.0 and q.tensors["weight_zero_point"].item() == -2
    assert q.dequantize().tolist() == [[0.0, 1.0, 2.0, 3.0]]
    # every value lies on the group's grid (q - zp) * scale with q in [-2**(b-1), 2**(b-1) - 1]
    w = torch.randn(4, 128)
    q = FORMAT.quantize(w, IntConfig(3))
    s, z = q.tensors["weight_scale"], q.tensors["weight_zero_point"].float()
    codes = q.dequantize() / s + z
    assert torch.allclose(codes, codes.round(), atol=1e-4) and codes.round().min() >= -4 and codes.round().max() <= 3


def test_sqnr_gaussian():
    torch.manual_seed(3)
    w = torch.randn(512, 1024)
    # measured (asym / sym): int8 44.5 / 43.7, int4 19.9 / 19.1, int3 13.3 / 12.5, int2 5.9 / 5.2 dB
    bounds = {(8, False): 44.0, (8, True): 43.2, (4, False): 19.5, (4, True): 18.7,
              (3, False): 13.0, (3, True): 12.1, (2, False): 5.6, (2, True): 4.9}  # fmt: skip
    for (bits, sym), lo in bounds.items():
        assert sqnr_db(w, FORMAT.fake_quant(w, IntConfig(bits, symmetric=sym))) > lo, (bits, sym)


@pytest.mark.parametrize("sym", [False, True])
def test_zero_and_constant_groups(sym):
    w = torch.randn(6, 256)
    w[:, :128] = 0
    w[2, 128:] = 0.25  # constant positive group: 0 joins the range, 0.25 is the top code
    out = FORMAT.fake_quant(w, IntConfig(4, symmetric=sym))
    assert torch.isfinite(out).all() and (out[:, :128] == 0).all()
    assert torch.allclose(out[2, 128:], torch.full((128,), 0.25), rtol=0.1 if sym else 1e-6)


def test_ste_gradient_and_dtype():
    w = torch.randn(8, 128, dtype=torch.bfloat16, requires_grad=True)
    out = FORMAT.fake_quant(w, IntConfig(4))
    g = torch.randn_like(out)
    out.backward(g)
    assert out.dtype == torch.bfloat16 and torch.equal(w.grad, g)


def test_bad_input():
    with pytest.raises(QuantError, match="bits=5 is not supported"):
        IntConfig(bits=5)
    with pytest.raises(QuantError, match="multiple of the block size 128"):
        FORMAT.quantize(torch.randn(4, 192), IntConfig(4))
    w = torch.randn(4, 128)
    w[3, 3] = float("nan")
    with pytest.raises(QuantError, match="NaN/Inf"):
        FORMAT.quantize(w, IntConfig(8))
    with pytest.raises(QuantError, match="group_size"):
        IntConfig(4, group_size=0)


@pytest.mark.parametrize("bits,sym", ALL)
def test_gptq_hooks_equal_fake_quant(bits, sym):
    torch.manual_seed(bits)
    cfg = IntConfig(bits, symmetric=sym)
    w = torch.randn(40, 384)
    state = FORMAT.tensor_state(w, cfg)
    out = torch.empty_like(w)
    for g0 in range(0, 384, 128):
        scales = FORMAT.block_scales(w[:, g0 : g0 + 128], cfg, state)
        c = g0
        for n in (1, 2, 61, 64):
            out[:, c : c + n] = FORMAT.qdq_with_scales(w[:, c : c + n], scales, cfg, state)
            c += n
    assert torch.equal(out, FORMAT.fake_quant(w, cfg))


def test_memory_bits_and_nbytes():
    assert IntConfig(4).memory_bits == pytest.approx(4 + (32 + 4) / 128)
    assert IntConfig(4, symmetric=True).memory_bits == pytest.approx(4 + 32 / 128)
    q = FORMAT.quantize(torch.randn(64, 256), IntConfig(3, symmetric=True))
    assert q.tensors["weight_packed"].shape == (64, 24) and q.nbytes == 64 * 24 * 4 + 64 * 2 * 4


@pytest.mark.parametrize("bits,sym", ALL)
def test_fake_quant_equals_dequantize_of_quantize(bits, sym):
    # fake_quant skips the bit packing; its values must be the packed round trip's exactly
    cfg = IntConfig(bits, group_size=64, symmetric=sym)
    w = torch.randn(24, 320, generator=torch.Generator().manual_seed(bits))
    w[3, :64] = 0.0  # an all-zero group (eps scale)
    assert torch.equal(FORMAT.fake_quant(w, cfg), FORMAT.dequantize(FORMAT.quantize(w, cfg)))


@pytest.mark.parametrize("sym", [False, True])
def test_frozen_group_parameters_in_state(sym):
    # a state carrying a QTensor's scales (and zero points) keeps that grid: what QAT from a calibrated model uses
    cfg = IntConfig(3, group_size=64, symmetric=sym)
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(0))
    qt = FORMAT.quantize(w, cfg)
    state = {k: v for k, v in qt.tensors.items() if k != "weight_packed"}
    moved = w * 0.5  # its own parameters would differ; the frozen ones must be used
    q2 = FORMAT.quantize(moved, cfg, state=state)
    assert all(torch.equal(q2.tensors[k], v) for k, v in state.items())
    assert torch.equal(q2.dequantize(), FORMAT.fake_quant(moved, cfg, state=state))
    assert not torch.equal(q2.dequantize(), FORMAT.fake_quant(moved, cfg))
    with pytest.raises(QuantError, match="frozen state"):
        FORMAT.quantize(w[:4], cfg, state=state)
