"""GPU checks of the dense path's side-stream decode (``quarl_kernels.dequant_ahead``).

* A chain of dense calls (a small decoder layer's projections, twice over: the first pass learns the order) gives
  outputs bit-equal to the same chain with the side stream off, and the second pass takes its weights from the side
  stream (``stats["taken"]``);
* a changed order (a guess not followed) and a packed weight written in place between passes still give the exact
  product: the stale entries are dropped, never used;
* the backward direction (``dy @ W``) likewise, learned apart from the forward.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels``. Skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config

pytest.importorskip("triton", reason="the GPU kernels need Triton (CPU CI has none)")
from quarl_kernels import dense, dequant_ahead  # after the skip: they import Triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPES = [(256, 256), (64, 256), (256, 256), (1024, 256), (256, 1024)]  # q, k/v, o, up, down: N x K


def _weights(spec: str = "nvfp4") -> list:
    cfg = make_config(spec)
    out = []
    for n, k in SHAPES:
        t = get_format(cfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, cfg).tensors
        out.append(_packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                                  t.get("weight_global_scale"), cfg.name, cfg.block_size, n, k))
    return out


def _chain(pws: list, xs: dict, direction: str) -> list[torch.Tensor]:
    if direction == "fwd":
        return [dense.dense_matmul(xs[p.k], p) for p in pws]
    return [dense.dense_matmul_t(xs[p.n], p) for p in pws[::-1]]


@pytest.fixture
def clean():
    dequant_ahead.reset()
    yield
    dequant_ahead.reset()


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
def test_chain_bit_equal_and_taken(spec, direction, clean, monkeypatch):
    torch.manual_seed(0)
    pws = _weights(spec)
    xs = {d: torch.randn(512, d, device="cuda").to(torch.bfloat16) for d in (64, 256, 1024)}
    monkeypatch.setenv(dequant_ahead.ENV, "0")
    ref = _chain(pws, xs, direction)
    monkeypatch.setenv(dequant_ahead.ENV, "1")
    before = dict(dequant_ahead.stats)
    _chain(pws, xs, direction)  # learns the order
    got = _chain(pws, xs, direction)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    taken = dequant_ahead.stats["taken"] - before["taken"]
    assert taken >= len(pws) - 1, dequant_ahead.stats


def test_changed_order_and_inplace_write_stay_exact(clean, monkeypatch):
    torch.manual_seed(1)
    pws = _weights()
    xs = {d: torch.randn(512, d, device="cuda").to(torch.bfloat16) for d in (64, 256, 1024)}
    monkeypatch.setenv(dequant_ahead.ENV, "1")
    _chain(pws, xs, "fwd")
    _chain(pws, xs, "fwd")
    wasted = dequant_ahead.stats["wasted"]
    shuffled = [pws[i] for i in (4, 0, 3, 1, 2)]  # every guess now wrong
    got = _chain(shuffled, xs, "fwd")
    assert dequant_ahead.stats["wasted"] > wasted
    monkeypatch.setenv(dequant_ahead.ENV, "0")
    assert all(torch.equal(a, b) for a, b in zip(got, _chain(shuffled, xs, "fwd")))
    # an in-place write to a weight whose decode is already in flight: the entry's versions no longer match
    monkeypatch.setenv(dequant_ahead.ENV, "1")
    _chain(pws[:2], xs, "fwd")
    _chain(pws[:2], xs, "fwd")
    dense.dense_matmul(xs[pws[0].k], pws[0])  # starts pws[1]'s decode on the side stream
    pws[1].words.bitwise_xor_(0x11111111)  # on the main stream, after the decode was queued
    got = dense.dense_matmul(xs[pws[1].k], pws[1])
    monkeypatch.setenv(dequant_ahead.ENV, "0")
    assert torch.equal(got, dense.dense_matmul(xs[pws[1].k], pws[1]))


@pytest.mark.parametrize("sms,prio", [(0, 1), (16, 1), (16, 0)])
def test_gemm_on_priority_stream_and_carveout_give_the_product(sms, prio, clean, monkeypatch):
    torch.manual_seed(2)
    pws = _weights()
    xs = {d: torch.randn(512, d, device="cuda").to(torch.bfloat16) for d in (64, 256, 1024)}
    monkeypatch.setenv(dequant_ahead.ENV, "0")
    ref = _chain(pws, xs, "fwd") + _chain(pws, xs, "bwd")
    monkeypatch.setenv(dequant_ahead.ENV, "1")
    monkeypatch.setenv(dequant_ahead.SMS_ENV, str(sms))
    monkeypatch.setenv(dequant_ahead.PRIO_ENV, str(prio))
    for _ in range(2):
        got = _chain(pws, xs, "fwd") + _chain(pws, xs, "bwd")
    torch.cuda.synchronize()
    assert torch._C._get_sm_carveout_experimental() is None  # restored after each GEMM
    for a, b in zip(got, ref):
        if sms == 0:
            assert torch.equal(a, b)  # the same cuBLAS call, on another stream
        else:  # cuBLAS may pick another kernel for fewer SMs: the BF16 output's rounding
            assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 1e-2
