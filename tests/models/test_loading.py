"""load_model / save_model: local round trips, artifacts, S3, and every refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from quarl.artifacts import ArtifactError, write_artifact
from quarl.models import ModelError, load_model, resolve_model_dir, save_model, tiny_model

KINDS = ["llama", "qwen2", "qwen3"]
PROMPTS = ["What is 2+2?", "The capital of France is"]


def _logits(model, tok):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**enc).logits  # [B, L, V]


@pytest.mark.parametrize("kind", KINDS)
def test_local_round_trip_identical_logits(kind, tmp_path):
    model, tok = tiny_model(kind, seed=3)
    out = save_model(model, tok, tmp_path / "m")
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))
    assert not list(out.glob("*.bin"))
    loaded, ltok = load_model(out)  # a Path works as well as a str
    assert type(loaded) is type(model)
    assert torch.equal(_logits(model, tok), _logits(loaded, ltok))
    assert ltok.padding_side == "left" and ltok.pad_token == tok.pad_token
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # loadable by transformers 4.x too


def test_round_trip_into_existing_dir_and_auto_dtype(tmp_path):
    model, tok = tiny_model("llama")
    (tmp_path / "notes.txt").write_text("kept")
    save_model(model.to(torch.bfloat16), tok, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "kept"
    loaded, _ = load_model(str(tmp_path), dtype="auto")
    assert next(loaded.parameters()).dtype == torch.bfloat16
    loaded32, _ = load_model(str(tmp_path))  # default float32: lossless upcast of the bf16 file
    assert torch.equal(loaded32.model.embed_tokens.weight, model.model.embed_tokens.weight.float())


def test_missing_pad_token_gets_eos(tmp_path):
    model, tok = tiny_model("qwen3")
    save_model(model, tok, tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("pad_token", None)
    cfg["padding_side"] = "right"
    cfg_path.write_text(json.dumps(cfg))
    _, ltok = load_model(tmp_path)
    assert ltok.pad_token == ltok.eos_token == "<|im_end|>"
    assert ltok.padding_side == "left"


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tok = tiny_model("llama")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tok)))
    save_model(gpt2, tok, tmp_path)
    with pytest.raises(ModelError, match=r"unsupported architecture model_type='gpt2'.*llama.*qwen2.*qwen3"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: p / "nope", "does not exist"),
        (lambda p: (p / "w.gguf").write_bytes(b"GGUF") and p / "w.gguf", "is a file.*GGUF"),
        (lambda p: p, "has no config.json"),
        (lambda p: (p / "config.json").write_text('{"model_type": "llama"}') and p, r"has no \*\.safetensors"),
        (
            lambda p: (p / "config.json").write_text("{}") and (p / "pytorch_model.bin").write_bytes(b"x") and p,
            r"pickle weights \['pytorch_model.bin'\]",
        ),
    ],
    ids=["missing", "file", "no-config", "no-weights", "pickle-only"],
)
def test_bad_local_paths(tmp_path, setup, match):
    with pytest.raises(ModelError, match=match):
        load_model(setup(tmp_path))


def test_relative_path_that_does_not_exist():
    with pytest.raises(ModelError, match="does not exist"):
        load_model("./definitely/not/here")


def test_corrupt_weights_are_reported(tmp_path):
    model, tok = tiny_model("llama")
    save_model(model, tok, tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="failed to load the weights"):
        load_model(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any directory")
def test_unreadable_dir(tmp_path):
    model, tok = tiny_model("llama")
    d = save_model(model, tok, tmp_path / "m")
    d.chmod(0)
    try:
        with pytest.raises(ModelError, match="permission denied"):
            load_model(d)
    finally:
        d.chmod(0o755)


def test_hub_offline_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelError,
        match=r"could not load someorg/somemodel from the Hugging Face hub \(offline\?\); "
        r"pass a local directory or s3:// URI",
    ):
        load_model("someorg/somemodel")


def test_uninterpretable_ref():
    with pytest.raises(ModelError, match="cannot interpret model reference"):
        load_model("not a model!")
    with pytest.raises(ModelError, match="empty model reference"):
        load_model("  ")
    with pytest.raises(ModelError, match="built in memory"):
        resolve_model_dir("tiny-llama")


def test_remote_code_not_trusted_by_default(tmp_path):
    model, tok = tiny_model("llama")
    save_model(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "evil"
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(ModelError, match="trust_remote_code"):  # refused before any of evil.py runs
        load_model(tmp_path)


# ----------------------------------------------------------------- artifacts and S3
# `s3_bucket` (tests/conftest.py): a fresh bucket on a session SeaweedFS, AWS_* env set.


def test_local_artifact_is_verified(tmp_path):
    model, tok = tiny_model("qwen2", seed=5)
    uri = str(tmp_path / "art")
    with write_artifact(uri, "model", "test") as art:
        save_model(model, tok, art.path)
    loaded, ltok = load_model(uri)
    assert torch.equal(_logits(model, tok), _logits(loaded, ltok))
    # truncate a payload file: the artifact check, not safetensors, must complain
    weights = next(Path(uri).glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="corrupt: model.safetensors"):
        load_model(uri)


def test_s3_round_trip_plain_prefix(s3_bucket, tmp_path, monkeypatch):
    from quarl.storage import S3Store

    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "cache"))
    store = S3Store()
    model, tok = tiny_model("qwen3", seed=9)
    local = save_model(model, tok, tmp_path / "m")
    uri = f"s3://{s3_bucket}/plain/tiny-qwen3"
    store.upload_dir(local, uri)
    loaded, ltok = load_model(uri + "/")
    assert torch.equal(_logits(model, tok), _logits(loaded, ltok))
    # re-uploading a different model to the same prefix replaces the cached copy
    other, otok = tiny_model("qwen3", seed=10)
    save_model(other, otok, local)
    store.upload_dir(local, uri)
    reloaded, rtok = load_model(uri)
    assert torch.equal(_logits(other, otok), _logits(reloaded, rtok))


def test_s3_round_trip_artifact(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "cache"))
    model, tok = tiny_model("llama", seed=11)
    uri = f"s3://{s3_bucket}/run-1/test/model"
    with write_artifact(uri, "model", "test") as art:
        save_model(model, tok, art.path)
    loaded, ltok = load_model(uri)
    assert torch.equal(_logits(model, tok), _logits(loaded, ltok))
    # a non-model artifact is refused by kind, before anything is downloaded
    data_uri = f"s3://{s3_bucket}/run-1/data-prep/train"
    with write_artifact(data_uri, "dataset", "data-prep") as art:
        (art.path / "train.jsonl").write_text("{}\n")
    with pytest.raises(ArtifactError, match="is a dataset artifact.*model artifact was expected"):
        load_model(data_uri)


def test_s3_empty_prefix_and_incomplete_artifact(s3_bucket, tmp_path, monkeypatch):
    from quarl.storage import S3Store

    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match=f"no model at s3://{s3_bucket}/nothing-here/"):
        load_model(f"s3://{s3_bucket}/nothing-here")
    # an artifact whose manifest says it is not complete is refused, not loaded as a plain prefix
    model, tok = tiny_model("llama")
    local = save_model(model, tok, tmp_path / "m")
    (local / "manifest.json").write_text(json.dumps({"kind": "model", "stage": "rl", "files": {}, "complete": False}))
    S3Store().upload_dir(local, f"s3://{s3_bucket}/crashed")
    with pytest.raises(ArtifactError, match="incomplete"):
        load_model(f"s3://{s3_bucket}/crashed")
