"""``quarl_kernels.recent_weights``: the dense path's BF16 weights kept from a training forward for its backward.

Pure bookkeeping (no Triton): what is kept (only inside ``keeping(True)``: a forward whose backward needs W), when an entry is reused (the same packed tensors,
views included, unchanged since) and dropped (a write, the LRU bound, ``release``), and the activation-checkpointing
pattern it exists for -- a checkpointed layer's backward reuses the weight its recompute just made. The GPU side
(the same gradients with and without, through ``wo_linear``) is ``test_dense_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from quarl_kernels import recent_weights as rw
from torch.utils.checkpoint import checkpoint

from quarl.quant import dispatch


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(rw.ENV, raising=False)
    rw.release()
    yield
    rw.release()


class _Maker:
    """``make`` for get(): counts its calls and returns a fresh tensor each time."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return torch.full((2, 2), float(self.calls))


def _packed(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 255, (4, 16), dtype=torch.uint8, generator=g)
    return codes, torch.ones(4, 1, dtype=torch.uint8), None, torch.ones(1)


def _get(p, make):
    with rw.keeping(True):
        return rw.get(p, make)


def test_kept_for_a_backward_and_reused():
    p, make = _packed(), _Maker()
    w = _get(p, make)
    assert rw.get(p, make) is w and make.calls == 1 and rw.kept() == 1  # a lookup outside keeping() hits too


def test_not_kept_outside_keeping():
    p, make = _packed(), _Maker()
    rw.get(p, make)
    with rw.keeping(False):
        rw.get(p, make)
    assert make.calls == 2 and rw.kept() == 0


def test_a_view_of_the_same_codes_hits():
    """FP4 codes arrive as a fresh int32 view of the uint8 tensor on every call."""
    codes, s, z, gs = _packed()
    make = _Maker()
    w = _get((codes.view(torch.int32), s, z, gs), make)
    assert rw.get((codes.view(torch.int32), s, z, gs), make) is w and make.calls == 1


@pytest.mark.parametrize("which", [0, 1, 3])  # codes, scales, global scale
def test_a_write_to_any_packed_tensor_misses(which):
    p, make = _packed(), _Maker()
    old = _get(p, make)
    with torch.no_grad():
        p[which].add_(1)  # an in-place write (a checkpoint load, calibration) bumps the version
    new = rw.get(p, make)
    assert make.calls == 2 and new is not old


def test_inference_mode_weights_are_made_not_kept():
    """Tensors created under ``torch.inference_mode`` track no version: such a weight is decoded every call."""
    with torch.inference_mode():
        p = _packed()
    make = _Maker()
    _get(p, make)
    _get(p, make)
    assert make.calls == 2 and rw.kept() == 0


def test_another_weight_misses():
    make = _Maker()
    _get(_packed(0), make)
    _get(_packed(1), make)
    assert make.calls == 2


def test_least_recently_used_goes_first(monkeypatch):
    monkeypatch.setenv(rw.ENV, "2")
    a, b, c = _packed(0), _packed(1), _packed(2)
    make = _Maker()
    _get(a, make)
    _get(b, make)
    _get(a, make)  # a is now the most recent
    _get(c, make)  # evicts b
    assert rw.kept() == 2 and make.calls == 3
    _get(a, make)
    assert make.calls == 3
    _get(b, make)
    assert make.calls == 4


def test_zero_keeps_nothing_and_bad_values_say_the_fix(monkeypatch):
    monkeypatch.setenv(rw.ENV, "0")
    p, make = _packed(), _Maker()
    _get(p, make)
    _get(p, make)
    assert make.calls == 2 and rw.kept() == 0
    monkeypatch.setenv(rw.ENV, "seven")
    with pytest.raises(ValueError, match="0 to keep none"):
        rw.capacity()
    monkeypatch.setenv(rw.ENV, "-1")
    with pytest.raises(ValueError, match="negative"):
        rw.capacity()


def test_release_empties_and_dispatch_calls_it(monkeypatch):
    _get(_packed(), _Maker())
    assert rw.kept() == 1
    monkeypatch.setattr(dispatch, "_loaded", True)  # as after the first CUDA call
    dispatch.release_transients()
    assert rw.kept() == 0


class _DenseLike(torch.autograd.Function):
    """y = x @ W^T with W from get() in forward and in backward, as dense_matmul / dense_matmul_t take it (the
    op runs under no-grad, so the caller says whether to keep: ``_dense_like``, as ``registration.forward``)."""

    @staticmethod
    def forward(ctx, x, packed, w_true, make):
        ctx.packed, ctx.w_true, ctx.make = packed, w_true, make
        return x @ rw.get(packed, make).T

    @staticmethod
    def backward(ctx, dy):
        return dy @ rw.get(ctx.packed, ctx.make), None, None, None


def _dense_like(x, packed, w_true, make):
    with rw.keeping(x.requires_grad and torch.is_grad_enabled()):
        return _DenseLike.apply(x, packed, w_true, make)


@pytest.mark.parametrize("keep,decodes", [("1", 5), ("0", 9), ("3", 3)])
def test_checkpointed_layers_decode_each_weight_twice_not_three_times(monkeypatch, keep, decodes):
    """Three checkpointed layers, one weight each, one layer's weight kept (``keep=1``, what the default 7 is for
    a 7-projection decoder layer): the forward decodes each weight once, the backward decodes each again for the
    recompute (the last layer's is still kept from the forward) and reuses it for ``dy @ W``: 5 decodes, not 9
    (``keep=0``); with room for all three, the forward's serve everything. Gradients equal the uncached ones."""
    monkeypatch.setenv(rw.ENV, keep)
    torch.manual_seed(0)
    layers = []
    for i in range(3):
        w = torch.randn(8, 8)
        layers.append((_packed(i), w, lambda w=w, m=[0]: (m.__setitem__(0, m[0] + 1), w.clone())[1]))
    calls = {"n": 0}

    def counted(make):
        def f():
            calls["n"] += 1
            return make()
        return f

    makes = [counted(mk) for _, _, mk in layers]
    x = torch.randn(4, 8, requires_grad=True)
    h = x
    for (p, w, _), mk in zip(layers, makes, strict=True):
        h = checkpoint(lambda t, p=p, w=w, mk=mk: torch.tanh(_dense_like(t, p, w, mk)), h, use_reentrant=False)
    h.sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    r = ref_x
    for _, w, _ in layers:
        r = torch.tanh(r @ w.T)
    r.sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    assert calls["n"] == decodes
