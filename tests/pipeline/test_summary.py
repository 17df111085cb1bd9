"""Run summaries read back from step records (what `quarl run` prints)."""

import json

from quarl.pipeline.summary import collect_summary


def write(root, run, step, rec):
    p = root / run / step / "step.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rec))


def test_summary_from_records(tmp_path):
    write(tmp_path, "r", "data_prep", {"status": "succeeded", "seconds": 3.25,
                                       "outputs": {"dataset": "s3://b/r/data_prep/dataset"},
                                       "result": {"rows": {"train": 64, "eval": 16}, "seconds": 2.0}})
    write(tmp_path, "r", "rl", {"status": "failed", "seconds": 12.0, "outputs": {"adapter": "s3://b/r/rl/adapter"},
                                "error": "ValueError: boom"})
    s = collect_summary(str(tmp_path), "r", [("data_prep", "data_prep"), ("rl", "rl"), ("eval", "eval")],
                        pipeline="qerl", recipe="qerl", model="default", wall_seconds=200.0)
    assert s.status == "failed" and s.failed_step.step == "rl"
    assert [x.status for x in s.steps] == ["succeeded", "failed", "not run"]
    # metrics follow the StageSpec's prefixes: rows.* for data_prep, not its "seconds"
    assert s.steps[0].metrics == {"rows.train": 64.0, "rows.eval": 16.0}
    text = s.to_text()
    assert "FAILED" in text and "rows.train=64" in text and "error: ValueError: boom" in text
    assert "wall time 3m20s" in text and "s3://b/r/data_prep/dataset" in text
    md = s.to_markdown()
    assert "| rl | rl | failed | 12.0s |" in md and "**error**: ValueError: boom" in md


def test_all_succeeded(tmp_path):
    write(tmp_path, "r", "eval", {"status": "succeeded", "seconds": 1.0, "outputs": {"results": "x"},
                                  "result": {"benchmarks": {"heldout": {"accuracy": 0.25, "problems": 16}}}})
    s = collect_summary(str(tmp_path), "r", [("eval", "eval")])
    assert s.status == "succeeded"
    assert s.steps[0].metrics == {"benchmarks.heldout.accuracy": 0.25, "benchmarks.heldout.problems": 16.0}
