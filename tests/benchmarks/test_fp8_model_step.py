"""benchmarks/fp8_model_step.py on CPU (seconds): the FP8 arms run the rl stage's own full-parameter Jet-RL recipe
(every projection a trainable ``QuantLinear`` on the FP8 flow, embedding and LM head left BF16), a timed step trains
(the weights move), and the report's per-layer and whole-model arithmetic is the documented one."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from quarl.quant import QuantLinear
from tests.threads import one_thread_fixture

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("fp8_model_step", ROOT / "benchmarks" / "fp8_model_step.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

_one_thread = one_thread_fixture()


@pytest.mark.parametrize("arm,wgrad", [("jetrl", "1x128"), ("jetrl-xtiles", "tiles")])
def test_fp8_arms_are_the_rl_stage_recipe_and_train(arm, wgrad):
    model = bench.build("tiny", 1, "cpu")
    bench.prepare(model, arm)
    q = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(q) == 7 and all(m.mode == "qat" and m.fp8_flow and m.fp8_wgrad == wgrad for m in q)
    assert not isinstance(model.lm_head, QuantLinear) and model.lm_head.weight.dtype == torch.bfloat16
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = q[0].weight.detach().clone()
    bench.step_fn(model, opt, torch.randint(0, 1000, (2, 16)))()
    assert not torch.equal(before, q[0].weight.detach())


def test_run_and_report(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fp8_model_step.py", "--device", "cpu", "--shape", "tiny", "--layers", "1",
                                      "--tokens", "32", "--seq", "16", "--iters", "1", "--arms", "bf16,jetrl",
                                      "--out", str(tmp_path)])
    bench.main()
    res = json.loads((tmp_path / "fp8_model_step.json").read_text())
    assert [(r["arm"], r["layers"]) for r in res["rows"]] == [("bf16", 0), ("bf16", 1), ("jetrl", 1)]
    assert all("ms" in r for r in res["rows"]), res["rows"]
    res["rows"] = [{"arm": "bf16", "layers": 0, "ms": 10.0}, {"arm": "bf16", "layers": 1, "ms": 30.0},
                   {"arm": "jetrl", "layers": 1, "ms": 25.0}]
    text = bench.render(res)  # per layer 20 / 15 ms; 4-layer (tiny's "real" depth) estimate 90 / 70 ms
    assert "| bf16 | 30.0 | 1.00x | 10.0 | 20.00 | 1.00x | 90.0 | 1.00x |" in text
    assert "| jetrl | 25.0 | 1.20x | 10.0 | 15.00 | 1.33x | 70.0 | 1.29x |" in text
