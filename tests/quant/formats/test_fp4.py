"""E2M1 codec: value set, tie rounding, saturation, sign of zero, packing --
checked by hand and against compressed-tensors' own cast + pack."""

import pytest
import torch

from quarl.quant.base import QuantError
from quarl.quant.formats.fp4 import (
    E2M1_MAX,
    E2M1_VALUES,
    decode_e2m1,
    encode_e2m1,
    pack_fp4,
    qdq_e2m1,
    round_e2m1,
    unpack_fp4,
)

POS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def test_value_set_is_exactly_e2m1():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = decode_e2m1(codes)
    assert torch.equal(vals[:8], POS)
    assert torch.equal(vals[8:], -POS)
    assert E2M1_MAX == 6.0 and tuple(POS.tolist()) == E2M1_VALUES
    # every representable value encodes to its own code (+0 and -0 both decode to 0)
    assert torch.equal(encode_e2m1(vals[1:8]), codes[1:8])
    assert torch.equal(encode_e2m1(vals[9:]), codes[9:])
    assert torch.equal(round_e2m1(vals), vals)


@pytest.mark.parametrize(
    "x,expected",
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)],
)
def test_ties_round_to_even(x, expected):
    t = torch.tensor([x, -x])
    assert round_e2m1(t).tolist() == [expected, -expected]


def test_just_off_ties_round_to_nearest():
    eps = 1e-6
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    above = round_e2m1(mids + eps)
    below = round_e2m1(mids - eps)
    assert torch.equal(above, POS[1:])
    assert torch.equal(below, POS[:-1])


def test_round_is_nearest_on_random_values():
    x = torch.empty(20000).uniform_(-6.5, 6.5, generator=torch.Generator().manual_seed(0))
    r = round_e2m1(x)
    grid = torch.cat([-POS.flip(0), POS])
    best = (x[:, None] - grid[None, :]).abs().min(dim=1).values
    assert torch.equal((x - r).abs(), best)


def test_saturates_at_six():
    x = torch.tensor([6.0, 6.5, 100.0, 3e38, -7.0, -1e30])
    assert round_e2m1(x).tolist() == [6.0, 6.0, 6.0, 6.0, -6.0, -6.0]


def test_sign_of_zero_codes():
    # a negative value that rounds to zero keeps its sign bit (code 8);
    # an exact -0.0 encodes as +0 -- the compressed-tensors convention
    codes = encode_e2m1(torch.tensor([-0.1, -0.0, 0.0, 0.1]))
    assert codes.tolist() == [8, 0, 0, 0]


def test_encode_and_pack_match_compressed_tensors():
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
    from compressed_tensors.quantization.utils.fp4_utils import cast_to_fp4

    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g) * 3
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.1, 6.0, 9.0])
    x[:2, : 2 * len(ties)] = torch.cat([ties, -ties]).repeat(2, 1)
    ours = pack_fp4(encode_e2m1(x))
    ref = pack_fp4_to_uint8(cast_to_fp4(x.clamp(-6, 6)))
    assert torch.equal(ours, ref)
    assert torch.equal(decode_e2m1(unpack_fp4(ours)), unpack_fp4_from_uint8(ref, 64, 256, torch.float32))


def test_pack_layout_even_column_low_nibble():
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    assert pack_fp4(codes).tolist() == [[0x21, 0x8F]]


def test_pack_unpack_round_trip():
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    packed = pack_fp4(codes)
    assert packed.shape == (3, 5, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_fp4(packed), codes)
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_fp4(unpack_fp4(every_byte)), every_byte)


def test_qdq_uses_divisor_per_element():
    x = torch.tensor([[0.3, 2.9], [10.0, -0.2]])
    div = torch.tensor([[0.5], [2.0]])
    assert qdq_e2m1(x, div).tolist() == [[0.25, 3.0], [8.0, -0.0]]


def test_bad_codec_inputs_raise():
    with pytest.raises(QuantError, match="even last dimension"):
        pack_fp4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(QuantError, match="uint8"):
        pack_fp4(torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(QuantError, match="uint8"):
        decode_e2m1(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(QuantError, match="uint8"):
        unpack_fp4(torch.zeros(4, dtype=torch.float32))


def test_round_equals_the_codec_bit_for_bit():
    # round_e2m1 is arithmetic (round(|x| / step) * step); it must give decode(encode(x)) exactly,
    # sign of zero included, at every midpoint, one ulp either side, and over a dense random sweep
    g = torch.Generator().manual_seed(1)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0])
    near = torch.cat([mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    x = torch.cat([near, -near, POS, -POS, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 7.0, -3e38, float("inf")]),
                   torch.empty(200_000).uniform_(-7, 7, generator=g),
                   torch.randn(50_000, generator=g) * 1e-3])
    ours, codec = round_e2m1(x), decode_e2m1(encode_e2m1(x))
    assert torch.equal(ours.view(torch.int32), codec.view(torch.int32))  # bits, not values: -0.0 != +0.0
