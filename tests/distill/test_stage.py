"""run_distill / run_kd_coldstart end to end on tiny-llama: artifact, reuse of a generated set, the rl
stage taking the output as its policy, and a bad teacher refused before any work."""

import json

import pytest

from quarl.artifacts import open_artifact
from quarl.config import load_config
from quarl.distill import DistillConfig, KDColdStartConfig, run_distill, run_kd_coldstart
from quarl.distill.student import PairingError
from quarl.quant import QuantLinear
from tests.datasets import synthetic_dataset

SMALL = ["train.steps=2", "train.device=cpu", "optim.batch_size=2", "optim.micro_batch_size=2", "optim.lr=1e-4",
         "data.num_sequences=4", "data.seq_len=48", "data.max_new_tokens=8", "eval.num_sequences=2",
         "eval.seq_len=48", "eval.accuracy_samples=2", "eval.max_new_tokens=4", "loss.chunk=32"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return synthetic_dataset(tmp_path_factory.mktemp("data") / "dataset")


def test_run_distill_writes_a_quantized_model_the_rl_stage_takes(dataset, tmp_path):
    cfg = load_config(DistillConfig, None, [*SMALL, "data.source=bos"])
    out = tmp_path / "distill" / "model"
    res = run_distill(cfg, model_uri="tiny-llama", teacher_uri="tiny-llama", data_uri=dataset, output_uri=str(out))
    assert res["complete"] and res["total_steps"] == 2 and res["data_source"] == "bos"
    assert res["eval_before"]["kl"] > 0 and res["eval_after"]["tokens"] == res["eval_before"]["tokens"]
    assert res["accuracy_after"] is not None and "accuracy" in res["teacher_eval"]
    art = open_artifact(str(out), kind="model")
    for f in ("config.json", "quarl_quantization.json", "metrics.jsonl", "summary.json", "config.yaml", "report.md",
              "curves.png"):
        assert (art.path / f).exists(), f
    assert json.loads((art.path / "quarl_quantization.json").read_text())["source_model"] == "tiny-llama"

    # the generated set is a dataset artifact; a second run trains on exactly it
    gen = open_artifact(res["generated_data_uri"], kind="dataset")
    assert gen.metadata["content"] == "distill-sequences" and gen.metadata["source"] == "bos"
    cfg2 = load_config(DistillConfig, None, [*SMALL, "eval.accuracy_samples=0"])
    res2 = run_distill(cfg2, model_uri="tiny-llama", teacher_uri="tiny-llama", data_uri=res["generated_data_uri"],
                       output_uri=str(tmp_path / "reuse" / "model"))
    assert res2["data_source"] == "tokens (bos)" and res2["generated_data_uri"] is None

    # the rl stage's policy builder takes the output as a calibrated checkpoint and adds LoRA
    from quarl.models import load_model
    from quarl.rl.config import PolicyConfig
    from quarl.train.policy import build_policy

    model, _ = load_model(str(out))
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.mode == "frozen" and m.format_name == "nvfp4" for m in layers)
    rep = build_policy(model, PolicyConfig(lora_r=4))
    assert rep["mode"] == "lora" and rep["trainable_params"] > 0


def test_kd_coldstart_defaults_and_stage_name(dataset, tmp_path):
    d = KDColdStartConfig()
    assert d.student.format == "w3g128" and d.data.source == "teacher" and d.optim.warmup_ratio > 0
    assert d.optim.schedule == "cosine" and d.loss.objective == "forward_kl"
    cfg = load_config(KDColdStartConfig, None, [*SMALL, "student.format=int4-g64", "eval.accuracy_samples=0"])
    out = tmp_path / "kd" / "model"
    res = run_kd_coldstart(cfg, model_uri="tiny-llama", teacher_uri="tiny-llama", data_uri=dataset,
                           output_uri=str(out))
    assert res["complete"] and open_artifact(str(out)).stage == "kd_coldstart"

    # reasoning_qat's next step: the rl stage takes the cold-started model as its policy (LoRA on its codes)
    from quarl.rl import RLConfig, run_rl
    from tests.rl.conftest import TINY_OVERRIDES

    rl = run_rl(load_config(RLConfig, None, [*TINY_OVERRIDES, "train.steps=1"]), model_uri=str(out),
                data_uri=dataset, output_uri=str(tmp_path / "rl" / "adapter"))
    adapter = open_artifact(rl["output_uri"], kind="adapter")
    assert rl["complete"] and adapter.manifest["inputs"][0] == str(out)
    assert json.loads((adapter.path / "summary.json").read_text())["policy"]["format"] == "calibrated checkpoint"


def test_mismatched_teacher_fails_before_any_work(dataset, tmp_path):
    from quarl.models import save_model, tiny_model

    other, tok = tiny_model("llama", vocab_size=1024)
    save_model(other, tok, tmp_path / "other")
    cfg = load_config(DistillConfig, None, [*SMALL, "data.source=teacher"])
    out = tmp_path / "bad" / "model"
    with pytest.raises(PairingError, match="different vocabularies"):
        run_distill(cfg, model_uri="tiny-llama", teacher_uri=str(tmp_path / "other"), data_uri=dataset,
                    output_uri=str(out))
    assert not (tmp_path / "bad").exists()  # no work directory, no generated data, no checkpoint


def test_config_errors_name_the_field():
    with pytest.raises(Exception, match="loss.objective"):
        load_config(DistillConfig, None, ["loss.objective=kl"])
    with pytest.raises(Exception, match="data.source"):
        load_config(DistillConfig, None, ["data.source=web"])
    with pytest.raises(Exception, match="random tokens have no meaningful labels"):
        load_config(DistillConfig, None, ["loss.objective=ce", "data.source=random"])
