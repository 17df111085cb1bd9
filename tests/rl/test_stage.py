"""run_rl end to end on the tiny random model: dataset artifact in, adapter artifact out; CLI face."""

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from quarl.artifacts import ArtifactExistsError, open_artifact
from quarl.config import load_config
from quarl.rl import RLConfig, run_rl
from tests.datasets import synthetic_dataset
from tests.rl.conftest import TINY_OVERRIDES


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return synthetic_dataset(tmp_path_factory.mktemp("data") / "dataset")


def test_run_rl_writes_a_verified_adapter_artifact(dataset, tmp_path):
    cfg = load_config(RLConfig, None, [*TINY_OVERRIDES, "reward.format_weight=0.5"])
    out = tmp_path / "rl" / "adapter"
    res = run_rl(cfg, model_uri="tiny-llama", data_uri=dataset, output_uri=str(out))
    assert res["complete"] and res["kind"] == "adapter" and res["total_steps"] == 3

    art = open_artifact(str(out), kind="adapter")  # checksums verified
    assert art.stage == "rl" and art.manifest["inputs"] == ["tiny-llama", dataset]
    for f in ("adapter_config.json", "adapter_model.safetensors", "quant_recipe.json", "metrics.jsonl",
              "summary.json", "config.yaml", "report.md", "report.html", "samples.jsonl"):
        assert (art.path / f).exists(), f
    assert any(p.name.startswith("events.out.tfevents") for p in (art.path / "tensorboard").iterdir())
    assert json.loads((art.path / "quant_recipe.json").read_text())["default"] == "nvfp4"
    rows = [json.loads(x) for x in (art.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    summary = json.loads((art.path / "summary.json").read_text())
    assert summary["time/step_s_mean"] > 0 and summary["algo"] == "grpo"
    html = (art.path / "report.html").read_text()
    assert html.count("<svg") >= 4 and "accuracy reward" in html
    # the resolved config is recorded (algorithm defaults filled in)
    assert art.config["algo"]["loss_agg"] == "sequence" and art.config["algo"]["eps_high"] == 0.28

    # the adapter loads onto a freshly quantized base and reproduces the trained policy exactly
    from quarl.models import load_model
    from quarl.quant import load_adapter, quantize_model

    m, _ = load_model("tiny-llama")
    quantize_model(m, json.loads((art.path / "quant_recipe.json").read_text()))
    load_adapter(m, art.path)
    from safetensors.torch import load_file

    final_ckpt = out.parent / "adapter.work" / "checkpoints" / "step-000003" / "trainable.safetensors"
    sd = load_file(str(final_ckpt))
    params = dict(m.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in sd.items())

    # a second run into the same output is refused before any training
    with pytest.raises(ArtifactExistsError):
        run_rl(cfg, model_uri="tiny-llama", data_uri=dataset, output_uri=str(out))


def test_a_wall_clock_budget_ends_the_run_with_an_artifact(dataset, tmp_path):
    # a budget that the first step already exceeds: one step, then a complete artifact of it
    cfg = load_config(RLConfig, None, [*TINY_OVERRIDES, "train.max_time_s=1e-6"])
    res = run_rl(cfg, model_uri="tiny-llama", data_uri=dataset, output_uri=str(tmp_path / "a"))
    assert res["complete"] and res["timed_out"] and res["end_step"] == 1 and res["total_steps"] == 3
    art = open_artifact(str(tmp_path / "a"), kind="adapter")
    assert [json.loads(x)["step"] for x in (art.path / "metrics.jsonl").read_text().splitlines()] == [0]
    with pytest.raises(ValueError, match="max_time_s"):
        load_config(RLConfig, None, ["train.max_time_s=-1"]).resolved()


def test_cli_print_config_and_errors(dataset, tmp_path):
    from quarl.cli.main import app

    runner = CliRunner()
    r = runner.invoke(app, ["rl", "--print-config", "--set", "algo.algo=dapo"])
    assert r.exit_code == 0, r.output
    assert "loss_agg: token" in r.output and "dynamic_sampling: true" in r.output
    r = runner.invoke(app, ["rl", "--set", "algo.algo=ppo", "--data", dataset, "--output", str(tmp_path / "o")])
    assert r.exit_code == 1 and "algo.algo" in r.output
    r = runner.invoke(app, ["rl", "--set", "optim.lrr=1", "--print-config"])
    assert r.exit_code == 1 and "did you mean" in r.output


def test_fp8_dense_switch_without_is_correction_warns(caplog, monkeypatch):
    from quarl.rl import RLConfig
    from quarl.rl.stage import warn_fp8_dense

    cfg = RLConfig()
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8", "1")
    with caplog.at_level("WARNING", logger="quarl.rl.stage"):
        assert warn_fp8_dense(cfg)
    assert "precision.rollout_is_threshold" in caplog.text
    corrected = dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision, rollout_is_threshold=2.0))
    assert not warn_fp8_dense(corrected)
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8", "0")
    assert not warn_fp8_dense(cfg)
    monkeypatch.delenv("QUARL_KERNELS_DENSE_FP8")
    assert not warn_fp8_dense(cfg)
