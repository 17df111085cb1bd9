"""``quarl eval`` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from quarl.cli.main import app


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    p = tmp_path_factory.mktemp("cli") / "toy.jsonl"
    p.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    return str(p)


def test_eval_cli_writes_the_artifact(data, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("sampling:\n  n: 2\n  max_new_tokens: 3\npass_k: [1, 2]\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["eval", "--model", "tiny-llama", "--data", f"toy={data}", "--config", str(cfg),
                                 "--set", "quant=nvfp4", "--output", str(out), "--no-progress"])  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["benchmarks"]["toy"]["problems"] == 3 and set(summary["benchmarks"]["toy"]["pass_at_k"]) == {
        "1",
        "2",
    }
    m = json.loads((out / "metrics.json").read_text())
    assert m["model"]["quantization"] == "rtn" and m["sampling"]["max_new_tokens"] == 3
    # the artifact is complete: a second run refuses to overwrite it, --overwrite replaces it
    r = CliRunner().invoke(app, ["eval", "-m", "tiny-llama", "-d", f"toy={data}", "-c", str(cfg), "-o", str(out),
                                 "--no-progress"])  # fmt: skip
    assert r.exit_code == 1 and "already holds a complete metrics artifact" in r.output


def test_eval_cli_errors_are_one_line(data, tmp_path):
    r = CliRunner().invoke(app, ["eval", "-m", "tiny-llama", "-o", str(tmp_path / "o"), "--set", "benchmarks=[gsm9k]"])
    assert r.exit_code == 1 and "unknown benchmark 'gsm9k'" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(
        app, ["eval", "-m", "tiny-llama", "-o", str(tmp_path / "o"), "-d", f"x={tmp_path}/nope.jsonl"]
    )
    assert r.exit_code == 1 and "no such file" in r.output
    assert not (tmp_path / "o").exists()


def test_print_config_resolves_benchmarks(data, tmp_path):
    import yaml

    r = CliRunner().invoke(app, ["eval", "-m", "x", "-o", "y", "-d", f"toy={data}", "--set", "sampling.greedy=true",
                                 "--print-config"])  # fmt: skip
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load(r.stdout)
    assert cfg["benchmarks"][0]["path"] == data and cfg["sampling"]["n"] == 1
