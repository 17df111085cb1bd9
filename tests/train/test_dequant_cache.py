"""``quarl.train.dequant_cache``: the RL trainer's ``optim.dequant_cache`` knob -- its check, the auto budget's
arithmetic, and that on CPU (the reference path: nothing decoded per call) it holds nothing. The GPU side (the
same run with and without it, bit for bit, and the base held) is ``test_dequant_cache_gpu.py``."""

from __future__ import annotations

import re

import pytest
import torch

from quarl.train.dequant_cache import GIB, DequantCache, auto_budget, base_bf16_bytes, check_setting


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
    assert base_bf16_bytes(model) == 0
