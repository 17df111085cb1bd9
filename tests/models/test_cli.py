"""`quarl model prepare-default` and `quarl model info` (CliRunner, in process)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from quarl.cli.main import app
from quarl.models import save_model, tiny_model

runner = CliRunner()


def test_prepare_default_prints_path(smollm2_dir):
    res = runner.invoke(app, ["model", "prepare-default"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(smollm2_dir)


def test_info_default(smollm2_dir):
    res = runner.invoke(app, ["model", "info", "default"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "LlamaForCausalLM (model_type=llama, supported)" in out
    assert "134,515,008" in out and "bfloat16 100%" in out and "Q4_1, dequantized" in out


def test_info_json_matches_model(tmp_path):
    model, tok = tiny_model("qwen2")
    save_model(model, tok, tmp_path)
    res = runner.invoke(app, ["model", "info", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    # header-only count must equal the real parameter count (tied embedding counted once)
    assert info["params"] == sum(p.numel() for p in model.parameters())
    assert info["dtypes"] == {"float32": info["params"]}
    assert (info["model_type"], info["layers"], info["kv_heads"], info["head_dim"]) == ("qwen2", 2, 2, 16)
    assert info["size_bytes"] > 4 * info["params"]


def test_info_tiny_and_errors():
    res = runner.invoke(app, ["model", "info", "tiny-qwen3"])
    assert res.exit_code == 0 and "Qwen3ForCausalLM" in res.stdout and "(built in memory)" in res.stdout
    res = runner.invoke(app, ["model", "info", "/no/such/model"])
    assert res.exit_code == 1 and "does not exist" in res.output
