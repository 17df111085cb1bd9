"""Paired comparison of eval artifacts against hand-computed values, and ``quarl eval-compare``."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from quarl.artifacts import write_artifact
from quarl.cli.main import app
from quarl.eval.compare import compare_markdown, compare_runs


def _artifact(uri, quant, verdicts, answers):
    """verdicts[p] = list of bools per sample; answers likewise (extracted answers)."""
    samples = [
        {"benchmark": "toy", "problem_id": f"p{p}", "sample": j, "completion": f"answer {a}", "extracted_answer": a,
         "correct": c}
        for p, (vs, ans) in enumerate(zip(verdicts, answers)) for j, (c, a) in enumerate(zip(vs, ans))
    ]  # fmt: skip
    acc = [sum(v) / len(v) for v in verdicts]
    metrics = {
        "model": {"quantization": quant, "recipe": {"default": "nvfp4"}, "dtype": "bfloat16"},
        "benchmarks": {"toy": {"problems": len(verdicts), "samples_per_problem": len(verdicts[0]),
                               "accuracy": sum(acc) / len(acc), "accuracy_stderr": 0.1, "format_rate": 0.0,
                               "response_tokens": {"mean": 10.0}}},
    }  # fmt: skip
    with write_artifact(uri, kind="metrics", stage="eval") as art:
        (art.path / "metrics.json").write_text(json.dumps(metrics))
        (art.path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return str(uri)


@pytest.fixture
def runs(tmp_path):
    a = _artifact(
        tmp_path / "a", "none", [[1, 1], [1, 0], [0, 0], [1, 1]], [["1", "1"], ["2", "x"], ["y", "z"], ["4", "4"]]
    )
    b = _artifact(
        tmp_path / "b", "rtn", [[1, 1], [0, 0], [1, 0], [1, 0]], [["1", "1"], ["q", "x"], ["3", "z"], ["4", "w"]]
    )
    return a, b


def test_paired_stats_against_hand_values(runs):
    rows = compare_runs(list(runs))
    assert [r["run"].split(" (")[0] for r in rows] == ["bfloat16", "RTN nvfp4"]
    assert "delta" not in rows[0]
    r = rows[1]
    d = [0.0, -0.5, 0.5, -0.5]  # per-problem accuracy differences b - a
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert r["delta"] == pytest.approx(mean) and r["delta_stderr"] == pytest.approx(sd / 2)
    assert r["same_answer"] == pytest.approx(5 / 8)  # 1,1 | x | z | 4
    assert r["same_text"] == pytest.approx(5 / 8)
    assert (r["gained"], r["lost"]) == (1, 1)  # p2 newly solved, p1 lost
    md = compare_markdown(rows)
    assert "| -12.5 ± 23.9 |" in md and "| 1 / 1 |" in md  # s.d. of d = 0.479, / sqrt(4)


def test_compare_cli(runs):
    r = CliRunner().invoke(app, ["eval-compare", *runs])
    assert r.exit_code == 0, r.output
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("|")]) == 4 and "RTN nvfp4" in r.stdout
    r = CliRunner().invoke(app, ["eval-compare", runs[0]])
    assert r.exit_code == 1 and "at least two" in r.output
    r = CliRunner().invoke(app, ["eval-compare", runs[0], runs[0] + "-missing"])
    assert r.exit_code == 1 and "error:" in r.output
