"""The eval stage end to end on the tiny random model: full precision, RTN NVFP4, a calibrated
checkpoint, LoRA adapters (local and S3), data URI binding, and bad inputs failing before any
model is loaded. A random model scores ~0; these tests check plumbing and equivalences, not skill."""

from __future__ import annotations

import json

import pytest
import torch

from quarl.artifacts import open_artifact
from quarl.config import load_config
from quarl.eval import EvalConfig, EvalError, resolve_benchmarks, run_eval
from quarl.eval.config import BenchmarkConfig

PROBLEMS = [
    {"problem": "What is 2 + 3?", "answer": "5"},
    {"problem": "Compute 6 * 7.", "answer": "42"},
    {"problem": "A box holds 12 eggs. How many eggs are in 3 boxes?", "answer": "36"},
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    p = d / "toy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in PROBLEMS))
    return str(p)


def _cfg(*overrides):
    return load_config(EvalConfig, None, ["sampling.max_new_tokens=4", "sampling.batch_size=8", *overrides])


def _completions(out):
    return [json.loads(x)["completion"] for x in (open_artifact(out).path / "samples.jsonl").read_text().splitlines()]


def _logits(cfg, adapter=None):
    """Next-token logits of the model eval builds for ``cfg`` (+ adapter) on a fixed prompt."""
    from quarl.eval import load_eval_model

    model, tok, _ = load_eval_model("tiny-llama", cfg, adapter_uri=adapter)
    ids = tok("What is 2 + 3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits[0, -1]


@pytest.fixture(scope="module")
def lora_model():
    """tiny-llama, RTN NVFP4 with a LoRA branch whose B is non-zero (so the adapter changes outputs)."""
    from quarl.models import load_model
    from quarl.quant import QuantLinear, quantize_model

    model, tok = load_model("tiny-llama")
    quantize_model(model, {"default": "nvfp4", "lora": {"r": 4, "alpha": 8.0}})
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.lora_cfg is not None:
            m.lora_B.data = torch.randn(m.lora_B.shape, generator=g) * 0.5
    return model, tok


@pytest.fixture(scope="module")
def adapter_dir(lora_model, tmp_path_factory):
    from quarl.quant import save_adapter

    return str(save_adapter(lora_model[0], tmp_path_factory.mktemp("adapter") / "adapter"))


def test_full_precision_end_to_end(data, tmp_path):
    out = str(tmp_path / "fp")
    res = run_eval(_cfg("sampling.n=2"), model_uri="tiny-llama", data_uris={"toy": data}, output_uri=out,
                   progress=False)  # fmt: skip
    assert set(res["benchmarks"]) == {"toy"} and res["benchmarks"]["toy"]["problems"] == 3
    art = open_artifact(out, kind="metrics")
    assert art.manifest["stage"] == "eval" and set(art.manifest["files"]) == {
        "metrics.json", "samples.jsonl", "report.md", "report.html"}  # fmt: skip
    assert art.manifest["inputs"] == ["tiny-llama", data]
    assert art.manifest["config"]["benchmarks"][0]["path"] == data  # the resolved config, data bound
    m = json.loads((art.path / "metrics.json").read_text())
    toy = m["benchmarks"]["toy"]
    assert toy["samples_per_problem"] == 2 and toy["samples"] == 6 and set(toy["pass_at_k"]) == {"1", "2"}
    assert 0 <= toy["accuracy"] <= 1 and toy["response_tokens"]["max"] <= 4
    assert m["model"]["quantization"] == "none" and m["config"]["sampling"]["n"] == 2
    assert art.manifest["metrics"]["toy"]["accuracy"] == toy["accuracy"]
    assert len(_completions(out)) == 6


def test_rtn_nvfp4_and_calibrated_checkpoint_agree(data, tmp_path):
    """quant=nvfp4 on the fly and the same NVFP4 model saved as a compressed-tensors checkpoint
    (the calibrate stage's output format) must decode identically."""
    from quarl.models import load_model
    from quarl.quant import quantize_model
    from quarl.quant.checkpoint import save_quantized

    rtn = str(tmp_path / "rtn")
    run_eval(_cfg("sampling.greedy=true", "quant=nvfp4"), model_uri="tiny-llama", data_uris=[f"toy={data}"],
             output_uri=rtn, progress=False)  # fmt: skip
    m = json.loads((open_artifact(rtn).path / "metrics.json").read_text())["model"]
    assert m["quantization"] == "rtn" and m["layers"] == {"nvfp4": 14}

    model, tok = load_model("tiny-llama")
    quantize_model(model, {"default": "nvfp4"})
    ckpt = save_quantized(model, tok, tmp_path / "ckpt")
    cal = str(tmp_path / "cal")
    run_eval(_cfg("sampling.greedy=true"), model_uri=str(ckpt), data_uris=[f"toy={data}"], output_uri=cal,
             progress=False)  # fmt: skip
    m_cal = json.loads((open_artifact(cal).path / "metrics.json").read_text())["model"]
    assert m_cal["quantization"] == "calibrated checkpoint" and m_cal["layers"] == {"nvfp4": 14}
    assert m_cal["parameters"] == m["parameters"]  # quantized weights counted, not only nn.Parameters
    assert _completions(cal) == _completions(rtn)

    assert not torch.equal(_logits(_cfg()), _logits(_cfg("quant=nvfp4")))  # NVFP4 is not a no-op here

    with pytest.raises(EvalError, match="already quantized"):
        run_eval(_cfg("quant=nvfp4"), model_uri=str(ckpt), data_uris=[f"toy={data}"], output_uri=str(tmp_path / "x"),
                 progress=False)  # fmt: skip


def test_adapter_is_applied(data, lora_model, adapter_dir, tmp_path):
    """Eval with quant=nvfp4 + the saved adapter decodes exactly like the in-memory model that wrote it."""
    from quarl.eval.benchmarks import load_benchmark, render_prompts
    from quarl.eval.generate import sample_completions

    cfg = _cfg("sampling.greedy=true", "quant=nvfp4")
    out = str(tmp_path / "lora")
    run_eval(cfg, model_uri="tiny-llama", data_uris={"toy": data}, adapter_uri=adapter_dir, output_uri=out,
             progress=False)  # fmt: skip
    m = json.loads((open_artifact(out).path / "metrics.json").read_text())["model"]
    assert m["adapter"]["r"] == 4 and m["adapter"]["uri"] == adapter_dir
    assert adapter_dir in open_artifact(out).manifest["inputs"]

    model, tok = lora_model
    bench = render_prompts(load_benchmark(BenchmarkConfig(name="toy", source="custom", path=data)), tok)
    ref, _ = sample_completions(model, tok, [p.prompt for p in bench.problems], cfg.sampling, progress=False)
    assert _completions(out) == [g[0].text for g in ref]

    assert not torch.equal(_logits(cfg), _logits(cfg, adapter_dir))  # and the adapter is not a no-op


def test_adapter_on_full_precision_model(data, adapter_dir, tmp_path):
    out = str(tmp_path / "fp-lora")
    run_eval(_cfg("sampling.greedy=true"), model_uri="tiny-llama", data_uris={"toy": data}, adapter_uri=adapter_dir,
             output_uri=out, progress=False)  # fmt: skip
    m = json.loads((open_artifact(out).path / "metrics.json").read_text())["model"]
    assert m["quantization"] == "none" and m["adapter"]["targets"]


def test_bad_inputs_fail_before_the_model_loads(tmp_path, monkeypatch, data):
    from quarl.eval import stage

    def boom(*a, **k):
        raise AssertionError("the model must not be loaded for bad data")

    monkeypatch.setattr(stage, "load_eval_model", boom)
    out = tmp_path / "never"
    with pytest.raises(EvalError, match="no such file"):
        run_eval(_cfg(), model_uri="tiny-llama", data_uris={"gsm8k": str(tmp_path / "missing.jsonl")},
                 output_uri=str(out))  # fmt: skip
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(EvalError, match="has no problems"):
        run_eval(_cfg(), model_uri="tiny-llama", data_uris=[f"mine={tmp_path / 'empty.jsonl'}"], output_uri=str(out))
    with pytest.raises(EvalError, match="cannot tell which benchmark"):
        run_eval(_cfg(), model_uri="tiny-llama", data_uris=[data], output_uri=str(out))
    assert not out.exists()


def test_bad_model_and_adapter(tmp_path, data):
    with pytest.raises(EvalError, match="does not exist"):
        run_eval(_cfg(), model_uri=str(tmp_path / "no-model"), data_uris={"toy": data}, output_uri=str(tmp_path / "o"))
    with pytest.raises(EvalError, match="adapter .* does not exist"):
        run_eval(_cfg(), model_uri="tiny-llama", data_uris={"toy": data}, adapter_uri=str(tmp_path / "no-adapter"),
                 output_uri=str(tmp_path / "o"), progress=False)  # fmt: skip
    (tmp_path / "empty-adapter").mkdir()
    with pytest.raises(EvalError, match="no adapter_config.json"):
        run_eval(_cfg(), model_uri="tiny-llama", data_uris={"toy": data}, adapter_uri=str(tmp_path / "empty-adapter"),
                 output_uri=str(tmp_path / "o"), progress=False)  # fmt: skip


def test_data_uri_binding(tmp_path, data):
    from quarl.data import DataPrepConfig, run_data_prep

    ds = str(tmp_path / "ds")
    run_data_prep(DataPrepConfig(sources=[{"name": "synthetic", "num_samples": 40}], validation={"enabled": False}),
                  output_uri=ds)  # fmt: skip
    gsm = tmp_path / "gsm8k" / "test.jsonl"
    gsm.parent.mkdir()
    gsm.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    cfg = load_config(EvalConfig, None, ["benchmarks=[{name: gsm8k, max_problems: 5}]"])
    got = {b.name: b for b in resolve_benchmarks(cfg, [ds, str(gsm), f"toy={data}"])}
    assert set(got) == {"gsm8k", "heldout", "toy"}
    assert got["heldout"].source == "dataset" and got["heldout"].path == ds
    assert got["gsm8k"].path == str(gsm) and got["gsm8k"].max_problems == 5  # configured fields kept
    assert got["toy"].source == "custom"
    assert [b.name for b in resolve_benchmarks(EvalConfig(), None)] == ["heldout"]  # the embedded default
    assert resolve_benchmarks(EvalConfig(), None)[0].path is None


@pytest.mark.s3
def test_s3_data_adapter_and_output(s3_bucket, data, adapter_dir, tmp_path):
    from pathlib import Path

    from quarl.storage import S3Store

    store = S3Store()
    store.upload_file(data, f"s3://{s3_bucket}/bench/toy.jsonl")
    store.upload_dir(adapter_dir, f"s3://{s3_bucket}/adapters/a1")
    out = f"s3://{s3_bucket}/run/eval/metrics"
    run_eval(_cfg("sampling.greedy=true", "quant=nvfp4"), model_uri="tiny-llama",
             data_uris={"toy": f"s3://{s3_bucket}/bench/toy.jsonl"}, adapter_uri=f"s3://{s3_bucket}/adapters/a1",
             output_uri=out, progress=False)  # fmt: skip
    art = open_artifact(out, kind="metrics")
    assert json.loads(Path(art.path, "metrics.json").read_text())["model"]["adapter"]["r"] == 4
    local = str(tmp_path / "local")
    run_eval(_cfg("sampling.greedy=true", "quant=nvfp4"), model_uri="tiny-llama", data_uris={"toy": data},
             adapter_uri=adapter_dir, output_uri=local, progress=False)  # fmt: skip
    assert [json.loads(x)["completion"] for x in Path(art.path, "samples.jsonl").read_text().splitlines()] == \
        _completions(local)  # fmt: skip


def test_adapter_recipe_rebuilds_the_trained_base(lora_model, adapter_dir, tmp_path):
    """An rl adapter's quant_recipe.json (the base it was trained on) is applied to a full-precision base
    when quant is unset: the scored policy is the trained one (NVFP4 + LoRA), not BF16 + LoRA."""
    import shutil

    from quarl.eval import load_eval_model
    from quarl.quant import QuantRecipe

    rl_adapter = tmp_path / "rl-adapter"
    shutil.copytree(adapter_dir, rl_adapter)
    (rl_adapter / "quant_recipe.json").write_text(json.dumps(QuantRecipe.load(
        {"default": "nvfp4", "lora": {"r": 4, "alpha": 8.0}}).to_dict()))
    trained = _logits(_cfg("quant=nvfp4"), adapter_dir)
    assert torch.equal(_logits(_cfg(), str(rl_adapter)), trained)
    _, _, info = load_eval_model("tiny-llama", _cfg(), adapter_uri=str(rl_adapter))
    assert info["quantization"] == "adapter's base recipe" and info["layers"] == {"nvfp4": 14}
    # opting out scores the adapter on the model as given (BF16 wrappers), which differs
    assert not torch.equal(_logits(_cfg("adapter_recipe=false"), str(rl_adapter)), trained)
    # a full-precision recipe (the BF16 LoRA baseline) changes nothing
    (rl_adapter / "quant_recipe.json").write_text(json.dumps({"default": "bf16", "lora": None}))
    assert torch.equal(_logits(_cfg(), str(rl_adapter)), _logits(_cfg(), adapter_dir))
