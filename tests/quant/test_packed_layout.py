"""The blocked layout of packed 4-bit words (``quarl.quant.packed_layout``) and QuantLinear's life with it, on CPU:
the permutation and its inverse against the address formula the kernels use, which layers qualify, and that a
blocked layer computes, exports and saves exactly what the row-major layer does (saved bytes compressed-tensors')."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quarl.quant import QuantLinear, dispatch, packed_layout


def _layer(spec: str = "nvfp4", n: int = 128, k: int = 256, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=False)
    return QuantLinear.from_linear(lin, spec)


@pytest.mark.parametrize("dtype,per_row", [(torch.uint8, 128), (torch.int32, 32)])
def test_block_is_the_kernels_address_formula(dtype, per_row):
    n, kw = 192, per_row * torch.tensor([], dtype=dtype).element_size() // 4  # 32 words a row
    packed = torch.randint(0, 120, (n, per_row), dtype=torch.int32).to(dtype)
    b = packed_layout.block(packed)
    assert b.dtype == dtype and b.dim() == 4 and packed_layout.is_blocked(b) and b.is_contiguous()
    assert torch.equal(packed_layout.row_major(b), packed)
    words, flat = packed.contiguous().view(torch.int32), b.view(torch.int32).flatten()
    for r, w in ((0, 0), (5, 9), (70, kw - 1), (191, 17), (64, 8)):
        assert flat[((r // 64) * (kw // 8) + w // 8) * 512 + (r % 64) * 8 + w % 8] == words[r, w]
    assert packed_layout.row_major(packed) is packed  # row-major already: no copy


def test_block_refuses_shapes_that_do_not_split():
    with pytest.raises(ValueError, match="N % 64 == 0 and K % 64 == 0"):
        packed_layout.block(torch.zeros(96, 32, dtype=torch.uint8))  # 96 rows
    with pytest.raises(ValueError, match="N % 64 == 0 and K % 64 == 0"):
        packed_layout.block(torch.zeros(64, 16, dtype=torch.uint8))  # 4 words a row
    with pytest.raises(ValueError, match="2 dimensions"):
        packed_layout.block(packed_layout.block(torch.zeros(64, 32, dtype=torch.uint8)))


def test_blockable_layers(monkeypatch):
    layer = _layer()
    assert not packed_layout.blockable(layer)  # on CPU: the kernels never read it
    assert packed_layout.block_model(nn.Sequential(layer)) == 0
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(dispatch, "_KERNELS", {"nvfp4": ["a GPU kernel"]})
    monkeypatch.setattr(dispatch, "_loaded", True)
    assert packed_layout.blockable(layer)
    monkeypatch.setenv("QUARL_KERNELS", "reference")  # no kernel reads it: the reference path would copy it back
    assert not packed_layout.blockable(layer)
    monkeypatch.delenv("QUARL_KERNELS")
    assert not packed_layout.blockable(_layer(n=96))  # not whole 64-row bands
    assert not packed_layout.blockable(_layer("int8-g64"))  # not a 4-bit format the kernels read
    assert not packed_layout.blockable(_layer("nf4"))
    model = nn.Sequential(layer, _layer(n=96))
    assert packed_layout.block_model(model) == 1 and packed_layout.count_blocked(model) == 1
    assert packed_layout.block_model(model) == 0  # blocked already
    assert packed_layout.is_blocked(layer.weight_packed)
    before = layer.qtensor().tensors["weight_packed"]
    assert packed_layout.unblock_model(model) == 1 and packed_layout.count_blocked(model) == 0
    assert torch.equal(layer.weight_packed, before)


def test_the_switch_picks_the_layout_by_rows(monkeypatch):
    monkeypatch.delenv(packed_layout.ENV, raising=False)
    assert packed_layout.mode() == "auto"
    assert not packed_layout.wanted(1) and packed_layout.wanted(2) and packed_layout.wanted(64)
    monkeypatch.setenv(packed_layout.ENV, "1")
    assert packed_layout.wanted(1)
    monkeypatch.setenv(packed_layout.ENV, "off")
    assert not packed_layout.wanted(64)
    monkeypatch.setenv(packed_layout.ENV, "blocks")
    with pytest.raises(ValueError, match="QUARL_KERNELS_BLOCKED='blocks': expected auto"):
        packed_layout.wanted(8)


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4", "int4-g128"])
def test_a_blocked_layer_computes_exports_and_saves_the_row_major_bytes(spec):
    ref, layer = _layer(spec), _layer(spec)
    layer.weight_packed = packed_layout.block(layer.weight_packed)
    assert packed_layout.is_blocked(layer.weight_packed)
    x = torch.randn(3, 256)
    assert torch.equal(layer(x), ref(x))  # the reference path reads the layout off the tensor
    q, want = layer.qtensor(), ref.qtensor()
    assert all(torch.equal(q.tensors[k], want.tensors[k]) for k in want.tensors)
    sd, want_sd = layer.state_dict(), ref.state_dict()
    assert sd.keys() == want_sd.keys() and all(torch.equal(sd[k], want_sd[k]) for k in sd)
    assert packed_layout.is_blocked(layer.weight_packed)  # saving left the layer as it was
    # a row-major state dict loads into the blocked layer blocked
    other = _layer(spec, seed=1)
    layer.load_state_dict(other.state_dict())
    assert packed_layout.is_blocked(layer.weight_packed)
    assert torch.equal(layer(x), other(x))
    wrong = {**other.state_dict(), "weight_packed": torch.zeros(64, 8, dtype=layer.weight_packed.dtype)}
    with pytest.raises(RuntimeError, match="size mismatch for weight_packed"):  # torch's own message, not ours
        layer.load_state_dict(wrong)


def test_the_reference_op_reads_blocked_words():
    from quarl.quant.dispatch import load_kernels  # noqa: F401  (registers the ops where Triton is present)

    pytest.importorskip("quarl_kernels.ops")
    from quarl_kernels.ops import _reference_weight

    layer = _layer()
    t = layer.qtensor().tensors
    args = (t["weight_packed"], t["weight_scale"], None, t["weight_global_scale"], "nvfp4", 16, 128, 256)
    want = _reference_weight(*args, dtype=torch.float32)
    got = _reference_weight(packed_layout.block(args[0]), *args[1:], dtype=torch.float32)
    assert torch.equal(got, want)
