"""benchmarks/lora_update_step.py on CPU (seconds): the arms are the trainer's own policy (frozen 4-bit or BF16
base + fp32 LoRA on all seven projections, activation checkpointing on), a timed step trains the adapter only, the
modifiers set their switch, and the report's per-layer arithmetic is the documented one."""

import json
import os

import pytest
import torch

from quarl.quant import QuantLinear
from tests.benchmarks.bench_module import load_bench
from tests.threads import one_thread_fixture

bench = load_bench("lora_update_step.py", "lora_update_step")

_one_thread = one_thread_fixture()


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_arm_is_the_trainers_lora_policy_and_trains_the_adapter(fmt):
    model = bench.build_arm("tiny", 1, fmt, 4, "cpu")
    q = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(q) == 7 and all(m.lora_cfg is not None and m.lora_cfg.r == 4 for m in q)
    if fmt != "bf16":
        assert all(m.format_name == fmt for m in q)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    before = [p.detach().clone() for p in trainable]
    frozen = model.lm_head.weight.detach().clone()
    bench.fms.step_fn(model, opt, torch.randint(0, 1000, (2, 16)), "rl")()
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, trainable, strict=True))
    assert torch.equal(frozen, model.lm_head.weight)


def test_modifiers_and_bad_arms():
    assert bench.parse_arm("nvfp4:nokeep") == ("nvfp4", {"QUARL_KERNELS_DENSE_KEEP": "0"})
    assert bench.parse_arm("nvfp4:fp8") == ("nvfp4", {"QUARL_KERNELS_DENSE_FP8": "1"})
    assert bench.parse_arm("nvfp4:fp8:allgemms") == ("nvfp4", {"QUARL_KERNELS_DENSE_FP8": "1",
                                                               "QUARL_KERNELS_DENSE_FP8_MIN_GFLOP": "0"})
    with pytest.raises(SystemExit, match="unknown modifier"):
        bench.parse_arm("nvfp4:fast")


def test_run_and_report(tmp_path, monkeypatch):
    monkeypatch.delenv("QUARL_KERNELS_DENSE_KEEP", raising=False)
    bench.main(["--device", "cpu", "--shape", "tiny", "--layers", "1", "--tokens", "32", "--seq", "16", "--iters",
                "1", "--lora-r", "4", "--arms", "bf16,nvfp4:nokeep", "--out", str(tmp_path)])
    assert "QUARL_KERNELS_DENSE_KEEP" not in os.environ  # the arm's switch is undone
    res = json.loads((tmp_path / "lora_update_step.json").read_text())
    assert [r["arm"] for r in res["rows"]] == ["bf16", "nvfp4:nokeep"] and all("ms" in r for r in res["rows"])
    res["rows"] = [{"arm": "bf16", "ms": 100.0}, {"arm": "nvfp4", "ms": 110.0}]
    res["layers"] = 4
    text = bench.render(res)  # (110 - 100) / 4 = 2.5 ms per layer; x 28 x 16 = 1.12 s
    assert "| nvfp4 | 110.0 | 1.100x | +2.50 | +1.12 |" in text
