"""Each component's python_func on tiny inputs against the suite's SeaweedFS, chained as a pipeline would.

The component functions are called exactly as the KFP executor calls them (typed parameters,
KFP artifact objects for inputs and outputs), so these tests cover the real entry points:
the signature, the runtime (config, S3 layout, pointers, step records) and the library stage.
Models are the seeded tiny-llama; data is the built-in generator.
"""

import json
from pathlib import Path

import pytest
from kfp import dsl
from quarl_components import COMPONENTS

from quarl.artifacts import open_artifact
from quarl.pipeline.runtime import read_step_record
from quarl.pipeline.stages import get_stage
from tests.threads import one_thread_fixture

RUN = "comp-test"
STATE: dict = {}


@pytest.fixture(scope="module")
def s3_env(s3_server):
    """The session SeaweedFS in os.environ for this module, and one bucket for its chained artifacts."""
    import uuid

    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_server.env().items():
            mp.setenv(k, v)
        bucket = f"comp-{uuid.uuid4().hex[:10]}"
        s3_server.store().ensure_bucket(bucket)
        yield f"s3://{bucket}/runs"


_one_thread = one_thread_fixture()


def outs(tmp_path, stage):
    spec = get_stage(stage)
    kfp_type = {"Dataset": dsl.Dataset, "Model": dsl.Model, "Artifact": dsl.Artifact}[spec.output.kfp_type]
    return {spec.output.name: kfp_type(uri=str(tmp_path / spec.output.name)),
            "metrics": dsl.Metrics(uri=str(tmp_path / "metrics")), "report": dsl.Markdown(uri=str(tmp_path / "report"))}


def downstream(art):
    """What the next task receives: an input artifact with the producer's metadata (KFP carries it)."""
    return type(art)(uri=art.uri, metadata=dict(art.metadata))


def call(stage, root, tmp_path, **kw):
    fn = COMPONENTS[stage].python_func
    o = outs(tmp_path, stage)
    fn(**o, s3_root=root, run_id=RUN, **kw)
    return o


def check_step(root, stage, o):
    spec = get_stage(stage)
    uri = o[spec.output.name].metadata["quarl_uri"]
    assert uri == f"{root}/{RUN}/{stage}/{spec.output.name}"
    rec = read_step_record(root, RUN, stage)
    assert rec["status"] == "succeeded" and rec["outputs"][spec.output.name] == uri
    assert json.loads(Path(o[spec.output.name].path).read_text())["quarl_uri"] == uri  # the pointer file
    assert Path(o["report"].path).read_text().strip()
    return uri


def test_data_prep(s3_env, tmp_path):
    o = call("data_prep", s3_env, tmp_path, sources=[{"name": "synthetic", "num_samples": 60}], eval_size=8,
             config_yaml="validation: {min_train_rows: 8}")
    uri = check_step(s3_env, "data_prep", o)
    art = open_artifact(uri, kind="dataset")
    assert art.metadata["rows"] == {"train": 52, "eval": 8}
    assert o["metrics"].metadata["rows.train"] == 52.0
    assert Path(o["report"].path).read_text() == (art.path / "summary.md").read_text()  # the stage's own summary
    STATE["dataset"] = downstream(o["dataset"])


def test_calibrate(s3_env, tmp_path):
    o = call("calibrate", s3_env, tmp_path, base=None, data=STATE["dataset"], recipe=None, base_model="tiny-llama",
             method="rtn", format="nvfp4", num_samples=4, seq_len=32, device="cpu",
             config_yaml="eval: {num_samples: 2}")
    uri = check_step(s3_env, "calibrate", o)
    art = open_artifact(uri, kind="model")
    assert json.loads((art.path / "config.json").read_text())["quantization_config"]
    assert art.manifest["inputs"][:2] == ["tiny-llama", STATE["dataset"].metadata["quarl_uri"]]
    assert o["metrics"].metadata["quality.kl"] >= 0
    STATE["model"] = downstream(o["model"])


def test_rl(s3_env, tmp_path):
    o = call("rl", s3_env, tmp_path, data=STATE["dataset"], model=None, init_adapter=None, base_model="tiny-llama",
             optimizer="adamw", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, device="cpu",
             lora_r=4, updates_per_rollout=1, overrides=["train.checkpoint_every=0", "aqn.num_stages=3"])
    uri = check_step(s3_env, "rl", o)
    art = open_artifact(uri, kind="adapter")
    assert (art.path / "adapter_config.json").is_file() and art.config["policy"]["lora_r"] == 4
    assert o["metrics"].metadata["total_steps"] == 1.0
    STATE["adapter"] = downstream(o["adapter"])


def test_eval(s3_env, tmp_path):
    o = call("eval", s3_env, tmp_path, model=None, adapter=STATE["adapter"], data=STATE["dataset"],
             base_model="tiny-llama", samples=1, greedy=True, max_new_tokens=4, device="cpu",
             config_yaml="sampling: {batch_size: 8}")
    uri = check_step(s3_env, "eval", o)
    art = open_artifact(uri, kind="metrics")
    assert "heldout" in art.metadata["metrics"] and art.metadata["metrics"]["heldout"]["problems"] == 8
    assert 0.0 <= o["metrics"].metadata["benchmarks.heldout.accuracy"] <= 1.0
    assert art.manifest["inputs"][-1] == STATE["adapter"].metadata["quarl_uri"]


def test_export(s3_env, tmp_path):
    o = call("export", s3_env, tmp_path, base=STATE["model"], adapter=STATE["adapter"], config_yaml="verify_tokens: 8")
    uri = check_step(s3_env, "export", o)
    art = open_artifact(uri, kind="model")
    assert (art.path / "adapter" / "adapter_config.json").is_file() and (art.path / "README.md").is_file()
    assert all(k.startswith("verification.") for k in o["metrics"].metadata if k != "quarl_uri")
    assert Path(o["report"].path).read_text() == (art.path / "README.md").read_text()  # the model card


def test_bad_data_fails_clearly_and_marks_nothing_done(s3_env, tmp_path, capsys):
    from quarl.data import DataValidationError

    with pytest.raises(DataValidationError):
        call("data_prep", s3_env, tmp_path, step="bad_data", sources=[{"name": "synthetic", "num_samples": 6}],
             eval_size=1, config_yaml="validation: {min_train_rows: 50}")
    assert "QUARL_STEP_FAILED" in capsys.readouterr().out
    rec = read_step_record(s3_env, RUN, "bad_data")
    assert rec["status"] == "failed" and "DataValidationError" in rec["error"]
    from quarl.storage import S3Store

    # no dataset at the output (the validation report is a separate, complete artifact)
    assert not S3Store().exists(f"{s3_env}/{RUN}/bad_data/dataset/manifest.json")
