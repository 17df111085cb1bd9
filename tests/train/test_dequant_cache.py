"""``quarl.train.dequant_cache``: the RL trainer's ``optim.dequant_cache`` knob -- its check, the auto budget's
arithmetic, and that on CPU (the reference path: nothing decoded per call) it holds nothing. The GPU side (the
same run with and without it, bit for bit, and the base held) is ``test_dequant_cache_gpu.py``."""

from __future__ import annotations

import re

import pytest
import torch

from quarl.train.dequant_cache import GIB, DequantCache, auto_budget, base_bf16_bytes, check_setting, holdable
from tests.lora_stacks import FakeDeviceMemory, cpu_cache, stand_in_kernels


def test_setting_is_checked_and_the_rl_config_rejects_a_bad_one():
    assert check_setting("AUTO") == "auto" and check_setting(True) == "true"
    with pytest.raises(ValueError, match=re.escape("optim.dequant_cache must be auto|true|false, got 'always'")):
        check_setting("always")
    from tests.rl.conftest import tiny_cfg

    assert tiny_cfg().optim.dequant_cache == "auto"
    with pytest.raises(ValueError, match="optim.dequant_cache must be auto"):
        tiny_cfg("optim.dequant_cache=maybe")


@pytest.mark.parametrize("need,avail,ws,total,expect", [
    (13 * GIB, 70 * GIB, None, 80 * GIB, 0),  # the first phase measures
    (13 * GIB, 70 * GIB, 8 * GIB, 80 * GIB, 13 * GIB),  # all of it fits
    (62 * GIB, 60 * GIB, 20 * GIB, 80 * GIB, 60 * GIB - 25 * GIB - 4 * GIB),  # part of it: 60 - 1.25 * 20 - 5 % of 80
    (13 * GIB, 10 * GIB, 8 * GIB, 80 * GIB, 0),  # nothing fits
    (0, 70 * GIB, 8 * GIB, 80 * GIB, 0),  # nothing to hold
    (2 * GIB, 4 * GIB, 0, 8 * GIB, 2 * GIB),  # a small device: the 1 GiB margin
])
def test_auto_budget(need, avail, ws, total, expect):
    assert auto_budget(need, avail, ws, total) == expect


def test_on_cpu_nothing_is_held_and_the_phase_is_inert():
    from tests.rl.conftest import small_tiny_model

    model, _ = small_tiny_model()
    for setting in ("auto", "true"):
        cache = DequantCache(model, setting, torch.device("cpu"))
        assert cache.need == 0
        with cache.phase():
            pass
        assert cache.last == {} and cache.working_set is None


def test_bf16_bytes_count_frozen_quantized_projections_with_a_kernel(monkeypatch):
    from torch import nn

    from quarl.quant import QuantLinear, dispatch

    model = nn.Sequential(QuantLinear.from_linear(nn.Linear(64, 32), "nvfp4"), nn.Linear(64, 64),
                          QuantLinear.from_linear(nn.Linear(32, 16), "nvfp4"))
    monkeypatch.setattr(dispatch, "has_kernel", lambda fmt: fmt == "nvfp4")
    assert base_bf16_bytes(model) == 2 * (32 * 64 + 16 * 32)
    monkeypatch.setattr(dispatch, "has_kernel", lambda fmt: False)  # no kernels: the reference path decodes nothing
    assert base_bf16_bytes(model) == 0 and holdable(model) == []


def _lora_stack(monkeypatch):
    """Three frozen NVFP4 projections with LoRA (fp32, CPU), the kernels stood in for by the reference decode."""
    from torch import nn

    from quarl.quant import LoRAConfig, QuantLinear, attach_lora

    torch.manual_seed(0)
    model = nn.Sequential(QuantLinear.from_linear(nn.Linear(64, 128), "nvfp4"), nn.Tanh(),
                          QuantLinear.from_linear(nn.Linear(128, 64), "nvfp4"), nn.Tanh(),
                          QuantLinear.from_linear(nn.Linear(64, 64), "nvfp4"))
    attach_lora(model, LoRAConfig(r=4, alpha=8, targets=["0", "2", "4"]))
    for p in model.parameters():
        if p.requires_grad:
            p.data.normal_(0, 0.1)
    stand_in_kernels(monkeypatch)
    return model


def test_a_held_phase_computes_what_the_per_call_path_does(monkeypatch):
    """Inside ``phase`` (setting true) every projection runs on its held weight: the outputs and the adapter
    gradients equal the per-call path's; the base gets no gradient; leaving the phase gives every weight back."""
    model = _lora_stack(monkeypatch)
    x = torch.randn(5, 7, 64)

    def run():
        model.zero_grad(set_to_none=True)
        y = model(x)
        y.square().sum().backward()
        return [y.detach()] + [p.grad.clone() for p in model.parameters() if p.requires_grad]

    ref = run()
    cache = cpu_cache(model, "true", FakeDeviceMemory(10**9, 10**9, 0))
    with cache.phase():
        assert all(m._held is not None for m in holdable(model))
        got = run()
    assert all(m._held is None for m in holdable(model))
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert cache.last["dequant_cache/held_gb"] * GIB == cache.need == 2 * (64 * 128 + 128 * 64 + 64 * 64)


def test_auto_measures_first_then_holds_what_fits_in_model_order(monkeypatch):
    """``auto``: the first phase holds nothing and measures its working set; the next holds, in model order, each
    projection that still fits the budget (free memory - 1.25 x working set - margin)."""
    model = _lora_stack(monkeypatch)
    layers = holdable(model)
    sizes = [2 * m.out_features * m.in_features for m in layers]  # bytes a projection holds (reported as bf16)
    ws = 4 * GIB  # the phase's working set (peak - start)
    fake = FakeDeviceMemory(avail=0, total=8 * GIB, peak=ws)
    cache = cpu_cache(model, "auto", fake)
    with cache.phase():
        assert not any(m._held is not None for m in layers)
    assert cache.working_set == ws and cache.last["dequant_cache/held_gb"] == 0
    # room for the first and the last projection but not the second (margin 1 GiB on an 8 GiB device)
    fake.avail = int(1.25 * ws) + GIB + sizes[0] + sizes[2]
    with cache.phase():
        assert [m._held is not None for m in layers] == [True, False, True]
    assert cache.last["dequant_cache/budget_gb"] * GIB == sizes[0] + sizes[2]


def test_a_held_weight_serves_only_the_calls_the_dense_path_would_take(monkeypatch):
    """``HeldWeight.serves``: the kernels' own route answers, once per M for a layer; a call in another dtype, or one
    no kernel takes (the reference path), is never served -- so a run computes the same held or not."""
    from types import SimpleNamespace

    from torch import nn

    from quarl.quant import QuantLinear, dispatch

    layer = QuantLinear.from_linear(nn.Linear(64, 32), "nvfp4")
    asked = []

    def route(x, lay):
        asked.append(x.shape[0])
        return x.shape[0] >= 256

    monkeypatch.setattr(dispatch, "select", lambda x, lay: SimpleNamespace(dense_route=route))
    held = dispatch.HeldWeight(torch.zeros(32, 64))
    assert held.serves(torch.zeros(512, 64), layer) and not held.serves(torch.zeros(8, 64), layer)
    assert held.serves(torch.zeros(2, 256, 64), layer) and held.serves(torch.zeros(512, 64), layer)  # 512 rows again
    assert asked == [512, 8] and not held.serves(torch.zeros(512, 64, dtype=torch.bfloat16), layer)
    monkeypatch.setattr(dispatch, "select", lambda x, lay: None)
    assert not dispatch.HeldWeight(torch.zeros(32, 64)).serves(torch.zeros(512, 64), layer)


def test_auto_scales_the_working_set_to_the_phase_tokens(monkeypatch):
    """RL answers grow over a run, and the update's activations with them: ``auto`` leaves room for the measured
    working set times the new phase's micro-batch tokens over the measured one's (never less than measured)."""
    model = _lora_stack(monkeypatch)
    need = base_bf16_bytes(model)
    ws = 4 * GIB
    fake = FakeDeviceMemory(avail=int(1.25 * ws) + GIB + need, total=8 * GIB, peak=ws)
    cache = cpu_cache(model, "auto", fake)
    with cache.phase(tokens=1000):
        pass
    assert cache.working_tokens == 1000
    with cache.phase(tokens=1000):  # the same answers: room for everything
        pass
    assert cache.last["dequant_cache/held_gb"] * GIB == need
    with cache.phase(tokens=2000):  # twice the tokens: twice the working set, nothing fits
        pass
    assert cache.last["dequant_cache/held_gb"] == 0 and cache.last["dequant_cache/budget_gb"] == 0
    with cache.phase(tokens=500):  # shorter: no less room than measured (held again: the base fits)
        pass
    assert cache.last["dequant_cache/held_gb"] * GIB == need


def test_running_out_of_memory_while_holding_names_the_knob(monkeypatch):
    """An out-of-memory error inside a phase that holds weights says how much was held and the fix; one in a phase
    that holds nothing passes through unchanged; either way the weights are given back."""
    model = _lora_stack(monkeypatch)
    cache = cpu_cache(model, "true", FakeDeviceMemory(10**9, 10**9, 0))
    with pytest.raises(torch.OutOfMemoryError, match=r"(?s)CUDA out of memory.*held in BF16 \(optim.dequant_cache=true"
                       r"\)\. Set optim.dequant_cache=false"), cache.phase():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert all(m._held is None for m in holdable(model))
    idle = cpu_cache(model, "auto", FakeDeviceMemory(10**9, 10**9, 0))  # first phase: measures, holds nothing
    with pytest.raises(torch.OutOfMemoryError) as err, idle.phase():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "dequant_cache" not in str(err.value)
