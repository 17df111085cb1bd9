"""benchmarks/rollout.py on CPU (seconds): the fp8 variant is the rl stage's Jet-RL rollout recipe and runs through
the engine beside BF16, and the 8b shape is Qwen3-8B's."""

import importlib.util
import json
import sys
from pathlib import Path

from quarl.rl.precision import JETRL_RECIPE
from tests.threads import one_thread_fixture

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rollout_bench", ROOT / "benchmarks" / "rollout.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

_one_thread = one_thread_fixture()


def test_fp8_variant_is_jetrl_and_runs(tmp_path, monkeypatch):
    assert bench.RECIPES["fp8"] == JETRL_RECIPE  # the rollout the rl stage runs in precision.mode=jetrl
    assert {k: bench.MODELS["8b"][k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers")} == {
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36}
    monkeypatch.setattr(sys, "argv", ["rollout.py", "--device", "cpu", "--models", "tiny", "--variants", "bf16,fp8",
                                      "--batches", "1", "--new-tokens", "64", "--hf-new-tokens", "0",
                                      "--budget-s", "120", "--out", str(tmp_path)])
    bench.main()
    cells = {c["variant"]: c for c in json.loads((tmp_path / "rollout.json").read_text())["cells"]}
    assert cells["fp8"]["kernel"] == "FP8 flow (emulated)" and cells["fp8"]["new_tokens"] == 64
    assert cells["bf16"]["step_ms"] > 0 and cells["fp8"]["step_ms"] > 0


def test_a_cell_cut_short_by_its_time_share_says_so():
    cell = {"model": "7b", "variant": "nvfp4+lora", "engine": "engine", "batch": 64, "kernel": "k", "new_tokens": 1212,
            "step_ms": 6.73}
    full = dict(cell, new_tokens=2048)
    hf = dict(cell, engine="hf", new_tokens=100)  # HF generate's tokens are sized to its share by design
    md = bench.table({"args": {"new_tokens": 2048}, "cells": [cell, full, hf]}).splitlines()
    assert "short: 1212 of 2048 new tokens" in md[2]
    assert "short" not in md[3] and "short" not in md[4]


def test_the_prefill_is_the_fastest_of_its_calls(monkeypatch):
    """The step's time is taken net of the prefill, timed as the fastest of ``PREFILL_CALLS`` one-token calls (one
    call swung by up to 0.15 s at 14B, session 40): a slow call among them does not lower the step."""
    import torch

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    model = bench.build_model(bench.qwen25_config("tiny"))
    real, calls = bench._sync_time, []
    fake = {2: 0.30, 3: 0.10, 4: 0.20}  # the three prefill calls (after the warm-up's)

    def timed(fn):
        out, t = real(fn)
        calls.append(t)
        return out, fake.get(len(calls), t)

    monkeypatch.setattr(bench, "_sync_time", timed)
    with torch.no_grad():
        cell = bench.engine_cell(model, 1, 8, 2 * bench.MIN_NEW_TOKENS, 60.0)
    assert bench.PREFILL_CALLS == 3 and len(calls) == 6  # warm-up, three prefills, the probe, the timed run
    assert cell["prefill_s"] == 0.10
