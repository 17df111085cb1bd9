"""Tiny random models: structure, determinism, generation, RNG hygiene."""

from __future__ import annotations

import pytest
import torch

from quarl.models import TINY_MODELS, ModelError, load_model, tiny_model

KINDS = ["llama", "qwen2", "qwen3"]


def test_tiny_names():
    assert TINY_MODELS == ("tiny-llama", "tiny-qwen2", "tiny-qwen3")


@pytest.mark.parametrize("kind", KINDS)
def test_structure(kind):
    model, tok = tiny_model(kind)
    cfg = model.config
    assert cfg.model_type == kind and cfg.architectures == [type(model).__name__]
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (2, 64, 128)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (4 * 16, 64) and attn.k_proj.weight.shape == (2 * 16, 64)
    assert cfg.vocab_size == len(tok) == 49152
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, like SmolLM2
    assert (attn.q_proj.bias is not None) == (kind == "qwen2")  # Qwen2 has q/k/v biases
    assert hasattr(attn, "q_norm") == (kind == "qwen3")
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert tok.padding_side == "left" and tok.pad_token is not None


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_and_seeded(kind):
    a, _ = tiny_model(kind)
    b, _ = load_model(f"tiny-{kind}")
    c, _ = tiny_model(kind, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    tiny_model("llama", seed=7)
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_left_padded_batch(kind):
    model, tok = load_model(f"tiny-{kind}")
    enc = tok(["What is 2+2?", "Hi"], return_tensors="pt", padding=True)
    assert enc["attention_mask"][1, 0] == 0  # the short prompt is padded on the left
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, enc["input_ids"].shape[1] + 4)
    # greedy's first token is the argmax of the last-position logits (reference: a plain forward)
    with torch.no_grad():
        logits = model(**enc).logits[:, -1]  # [B, V]
    assert torch.equal(out[:, enc["input_ids"].shape[1]], logits.argmax(-1))
    again = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, again)


def test_dtype_and_device_args():
    model, _ = load_model("tiny-qwen3", dtype="bf16", device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    model, _ = load_model("tiny-llama", dtype=torch.float16)
    assert next(model.parameters()).dtype == torch.float16
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model("tiny-llama", dtype="float7")


def test_small_vocab_warns_and_works():
    with pytest.warns(UserWarning, match="smaller than the SmolLM2 tokenizer"):
        model, _ = tiny_model("llama", vocab_size=256)
    assert model.lm_head.weight.shape == (256, 64)
    assert model(torch.randint(0, 256, (1, 5))).logits.shape == (1, 5, 256)


def test_unknown_kind():
    with pytest.raises(ModelError, match="unknown tiny model kind 'gpt2'.*llama, qwen2, qwen3"):
        tiny_model("gpt2")
