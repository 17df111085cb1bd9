"""Small full-parameter Jet-RL Qwen2 models for the FP8 MLP / q-k-v tests (tests/quant/test_fp8_swiglu.py,
test_fp8_stack.py): a random BF16 Qwen2 put on the rl stage's own FP8 recipe, a fixture that gives transformers back
the RoPE function the compiled glue patches process-wide, and the loss with every gradient."""

import pytest
import torch


def jetrl_qwen2(hidden: int = 64, inter: int = 160, heads: int = 4, kv: int = 2, lora: bool = False, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from quarl.quant import quantize_model
    from quarl.rl.precision import _jetrl_recipe

    cfg = Qwen2Config(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv,
                      vocab_size=97, num_hidden_layers=2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    quantize_model(model, _jetrl_recipe("lora" if lora else "full"))
    return model


@pytest.fixture
def glue_restored():
    from transformers.models.qwen2 import modeling_qwen2

    rope = modeling_qwen2.apply_rotary_pos_emb
    yield
    modeling_qwen2.apply_rotary_pos_emb = rope


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def with_and_without(monkeypatch, model, function, switch: str, ids):
    """The loss and gradients of ``model`` on ``ids`` with ``function`` (an autograd Function the compiled glue routes
    to) and again with ``switch=0``; asserts it ran once per decoder layer the first time and not the second.
    -> ``(loss, grads, loss0, grads0)``."""
    calls = []
    apply = function.apply
    monkeypatch.setattr(function, "apply", lambda *a: calls.append(1) or apply(*a))
    loss, grads = loss_and_grads(model, ids)
    assert len(calls) == model.config.num_hidden_layers
    monkeypatch.setenv(switch, "0")
    loss0, grads0 = loss_and_grads(model, ids)
    assert len(calls) == model.config.num_hidden_layers and grads.keys() == grads0.keys()
    return loss, grads, loss0, grads0
