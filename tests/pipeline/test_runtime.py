"""quarl.pipeline.runtime: config precedence, the S3 layout, pointers, step records, reuse and failures.

Driven through a fake ``echo`` stage (tests/pipeline/fake_stage.py) so each test is milliseconds;
tests/components runs the real stages the same way.
"""

import json

import pytest
from kfp import dsl

from quarl.artifacts import open_artifact
from quarl.config import ConfigError
from quarl.pipeline.runtime import (
    FAILURE_MARKER,
    StepError,
    artifact_uri,
    read_step_record,
    resolve_config,
    run_component,
)
from quarl.pipeline.stages import get_stage


def outputs(tmp_path, name="out"):
    return {
        name: dsl.Artifact(uri=str(tmp_path / "kfp" / name)),
        "metrics": dsl.Metrics(uri=str(tmp_path / "kfp" / "metrics")),
        "report": dsl.Markdown(uri=str(tmp_path / "kfp" / "report")),
    }


def args(root, **kw):
    base = {"s3_root": str(root), "run_id": "r1", "kfp_run_id": "", "step": "echo", "message": "hi", "size": 4, "limit": 0,
                "config_yaml": "", "overrides": [], "source": None}
    base.update(kw)
    return base


def test_config_precedence_defaults_yaml_typed_overrides(echo_stage, caplog):
    spec = get_stage("echo")
    cfg = resolve_config(spec, "message: from-yaml\ninner: {size: 9, limit: 5}\ntags: [a]\n",
                         {"message": "typed", "limit": 0}, ["tags=[b, c]"])
    assert cfg.message == "typed"  # typed parameter beats config_yaml (and says so)
    assert cfg.inner.size == 9  # config_yaml beats the dataclass default
    assert cfg.inner.limit is None  # limit=0 stands for None
    assert cfg.tags == ["b", "c"]  # overrides come last
    assert "typed parameter message='typed' wins" in caplog.text
    with pytest.raises(ConfigError, match="has no typed parameter 'nope'"):
        resolve_config(spec, "", {"nope": 1})
    with pytest.raises(ConfigError, match="unknown config key 'inner.sise'"):
        resolve_config(spec, "inner: {sise: 1}")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        resolve_config(spec, "- a\n- b\n")


def test_writes_artifact_pointer_metrics_report_and_step_record(echo_stage, tmp_path):
    out = outputs(tmp_path)
    rec = run_component("echo", **args(tmp_path / "s3"), **out)
    uri = str(tmp_path / "s3" / "r1" / "echo" / "out")
    assert rec["status"] == "succeeded" and rec["outputs"] == {"out": uri}
    art = open_artifact(uri, kind="report")
    assert (art.path / "echo.md").read_text() == "# hi\n\nxxxx\n"
    # the KFP output is a pointer: metadata + a JSON file at its path
    assert out["out"].metadata["quarl_uri"] == uri and out["out"].metadata["kind"] == "report"
    ptr = json.loads((tmp_path / "kfp" / "out").read_text())
    assert ptr["quarl_uri"] == uri and ptr["run_id"] == "r1" and ptr["step"] == "echo"
    # metrics: numeric leaves under the spec's prefixes only (no bools, no strings, no "flag")
    assert {k: v for k, v in out["metrics"].metadata.items() if k != "quarl_uri"} == {"nested.score": 0.5,
                                                                                      "chars": 4.0}
    # report: the stage's own markdown file
    assert (tmp_path / "kfp" / "report").read_text() == "# hi\n\nxxxx\n"
    stored = read_step_record(str(tmp_path / "s3"), "r1", "echo")
    assert stored["status"] == "succeeded" and stored["config"]["message"] == "hi"
    assert stored["result"]["chars"] == 4 and stored["seconds"] >= 0


def test_kfp_run_id_used_when_run_id_empty(echo_stage, tmp_path):
    run_component("echo", **args(tmp_path / "s3", run_id="", kfp_run_id="kfp-123"), **outputs(tmp_path))
    assert (tmp_path / "s3" / "kfp-123" / "echo" / "out" / "manifest.json").is_file()
    with pytest.raises(StepError, match="no run id"):
        run_component("echo", **args(tmp_path / "s3", run_id="", kfp_run_id=""), **outputs(tmp_path / "b"))


def test_same_config_is_reused_other_config_is_refused(echo_stage, tmp_path):
    run_component("echo", **args(tmp_path / "s3"), **outputs(tmp_path / "a"))
    assert len(echo_stage.CALLS) == 1
    out = outputs(tmp_path / "b")
    rec = run_component("echo", **args(tmp_path / "s3"), **out)  # e.g. a KFP retry after the work was done
    assert rec["reused"] and len(echo_stage.CALLS) == 1
    assert out["out"].metadata["quarl_uri"].endswith("r1/echo/out")
    with pytest.raises(StepError, match="different config or inputs; use a new run_id"):
        run_component("echo", **args(tmp_path / "s3", size=7), **outputs(tmp_path / "c"))
    assert len(echo_stage.CALLS) == 1


def test_artifact_done_but_record_lost_is_adopted(echo_stage, tmp_path):
    """A crash between the artifact's manifest and the step record: the retry adopts the artifact."""
    run_component("echo", **args(tmp_path / "s3"), **outputs(tmp_path / "a"))
    rec_path = tmp_path / "s3" / "r1" / "echo" / "step.json"
    rec = json.loads(rec_path.read_text())
    rec.update(status="running", result=None)
    rec_path.write_text(json.dumps(rec))
    again = run_component("echo", **args(tmp_path / "s3"), **outputs(tmp_path / "b"))
    assert again["status"] == "succeeded" and again["adopted"] and len(echo_stage.CALLS) == 1


def test_failure_prints_marker_records_error_and_marks_nothing_complete(echo_stage, tmp_path, capsys):
    with pytest.raises(RuntimeError, match="asked to fail"):
        run_component("echo", **args(tmp_path / "s3", overrides=["fail=true"]), **outputs(tmp_path))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(FAILURE_MARKER))
    assert json.loads(line[len(FAILURE_MARKER):]) == {"step": "echo", "stage": "echo",
                                                       "error": "RuntimeError: asked to fail half-way"}
    rec = read_step_record(str(tmp_path / "s3"), "r1", "echo")
    assert rec["status"] == "failed" and "asked to fail" in rec["error"] and "Traceback" in rec["traceback"]
    assert not (tmp_path / "s3" / "r1" / "echo" / "out").exists()  # only a staging dir, never the artifact
    assert not (tmp_path / "kfp" / "out").exists()  # no pointer for downstream steps


def test_storage_down_fails_with_a_clear_error(echo_stage, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("QUARL_S3_MAX_ATTEMPTS", "1")
    from quarl.storage import StorageError

    with pytest.raises(StorageError, match="127.0.0.1:9"):
        run_component("echo", **args("s3://quarl/runs"), **outputs(tmp_path))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(FAILURE_MARKER))
    assert "127.0.0.1:9" in json.loads(line[len(FAILURE_MARKER):])["error"]
    assert echo_stage.CALLS == []  # the stage never started


def test_input_resolution_order(echo_stage, tmp_path):
    a = dsl.Artifact(uri=str(tmp_path / "x"))
    a.metadata["quarl_uri"] = "s3://b/r/step/out"
    assert artifact_uri(a) == "s3://b/r/step/out"
    b = dsl.Artifact(uri=str(tmp_path / "ptr"))
    (tmp_path / "ptr").write_text(json.dumps({"quarl_uri": "s3://b/r/other/out"}))
    assert artifact_uri(b) == "s3://b/r/other/out"
    c = dsl.Artifact(uri="s3://b/imported/model/")  # dsl.importer of an existing quarl artifact
    assert artifact_uri(c) == "s3://b/imported/model"
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "manifest.json").write_text("{}")
    assert artifact_uri(dsl.Artifact(uri=str(tmp_path / "dir"))) == str(tmp_path / "dir")
    assert artifact_uri(None) is None
    with pytest.raises(StepError, match="does not point at a quarl artifact"):
        artifact_uri(dsl.Artifact(uri=str(tmp_path / "nothing")), "model")


def test_upstream_pointer_feeds_downstream_input(echo_stage, tmp_path):
    first = outputs(tmp_path / "a")
    run_component("echo", **args(tmp_path / "s3"), **first)
    # downstream receives the KFP artifact (metadata travels with it, as in kfp.local and on a cluster)
    src = dsl.Artifact(uri=first["out"].uri, metadata=dict(first["out"].metadata))
    rec = run_component("echo", **args(tmp_path / "s3", step="echo2", source=src), **outputs(tmp_path / "b"))
    assert rec["inputs"] == {"source": str(tmp_path / "s3" / "r1" / "echo" / "out")}
    assert echo_stage.CALLS[-1]["source_uri"] == rec["inputs"]["source"]
    assert rec["outputs"]["out"].endswith("r1/echo2/out")


def test_on_s3_layout(echo_stage, s3_bucket, tmp_path):
    root = f"s3://{s3_bucket}/runs"
    out = outputs(tmp_path)
    run_component("echo", **args(root), **out)
    uri = f"{root}/r1/echo/out"
    assert out["out"].metadata["quarl_uri"] == uri
    assert open_artifact(uri, kind="report").manifest["complete"]
    assert read_step_record(root, "r1", "echo")["status"] == "succeeded"
