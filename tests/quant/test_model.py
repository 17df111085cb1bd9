"""quantize_model on a tiny random Llama: recipes, exclusions, fused scales, memory,
gradient flow, and the PEFT adapter round trip."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quarl.quant import QuantError, QuantLinear, QuantRecipe, load_adapter, merge_lora, quantize_model, save_adapter


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_default_recipe_quantizes_linears_but_not_head_or_embeddings():
    m = tiny_llama()
    rep = quantize_model(m, {"default": "nvfp4"})
    assert isinstance(m.model.layers[0].self_attn.q_proj, QuantLinear)
    assert not isinstance(m.lm_head, QuantLinear)
    assert len(rep.layers) == 2 * 7 and set(rep.layers.values()) == {"nvfp4"}
    nv = rep.memory["by_format"]["nvfp4"]
    # 4-bit payload + one E4M3 scale per 16 values (+ a global scale per tensor): ~4.5 bits
    assert 4.5 <= nv["bits_per_param"] < 4.6
    assert "lm_head" not in rep.layers and "total_bytes" in rep.memory
    assert "nvfp4" in rep.summary()


def test_overrides_first_match_wins_and_regex():
    m = tiny_llama()
    rep = quantize_model(m, {
        "default": "int4-g128",
        "overrides": [{"pattern": "*.mlp.down_proj", "format": "int8"},
                      {"pattern": "re:model\\.layers\\.0\\..*", "format": "bf16"},
                      {"pattern": "*.mlp.*", "format": "nf4"}],
    })
    assert rep.layers["model.layers.1.mlp.down_proj"] == "int8-g128"
    assert rep.layers["model.layers.0.mlp.down_proj"] == "int8-g128"  # earlier pattern wins
    assert rep.layers["model.layers.0.self_attn.q_proj"] == "bf16"
    assert rep.layers["model.layers.1.mlp.up_proj"] == "nf4"
    assert rep.layers["model.layers.1.self_attn.o_proj"] == "int4-g128"


def test_fused_shards_share_nvfp4_global_scale():
    m = tiny_llama()
    with torch.no_grad():
        m.model.layers[0].self_attn.k_proj.weight.mul_(5)  # make the shards' amax differ
    quantize_model(m, {"default": "nvfp4"})
    attn, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
    gs = [attn.q_proj.weight_global_scale, attn.k_proj.weight_global_scale, attn.v_proj.weight_global_scale]
    assert all(torch.equal(gs[0], g) for g in gs)
    assert torch.equal(mlp.gate_proj.weight_global_scale, mlp.up_proj.weight_global_scale)
    m2 = tiny_llama()
    quantize_model(m2, {"default": "nvfp4", "share_fused_scales": False})
    a2 = m2.model.layers[0].self_attn
    assert not torch.equal(a2.q_proj.weight_global_scale, a2.v_proj.weight_global_scale)


def test_lora_recipe_only_lora_trains_and_logits_match_dequantized_model():
    m = tiny_llama()
    ids = torch.randint(0, 256, (2, 12))
    quantize_model(m, {"default": "nvfp4", "lora": {"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}})
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all(("lora_A" in n or "lora_B" in n) for n in trainable)
    assert len(trainable) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    out = m(ids, labels=ids)
    out.loss.backward()
    assert all(p.grad is None for n, p in m.named_parameters() if not p.requires_grad)
    assert all(p.grad is not None for n, p in m.named_parameters() if p.requires_grad)


def test_peft_adapter_round_trip_and_peft_loads_it(tmp_path):
    from peft import PeftModel

    base = tiny_llama()
    m = tiny_llama()
    quantize_model(m, {"default": "bf16", "lora": {"r": 4, "alpha": 8}})
    for n, p in m.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05)
    save_adapter(m, tmp_path / "adapter", base_model_name_or_path="tiny")
    ids = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        ours = m(ids).logits
        # 1) PEFT loads it onto the full-precision base and computes the same function
        peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
        theirs = peft_model(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    # 2) our loader puts it back into a freshly quantized model
    m2 = tiny_llama()
    quantize_model(m2, {"default": "bf16", "lora": {"r": 4, "alpha": 8}})
    load_adapter(m2, tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(m2(ids).logits, ours)
        # 3) merging gives a plain model with the same function
        torch.testing.assert_close(merge_lora(m2)(ids).logits, ours, atol=1e-4, rtol=1e-4)


def test_load_adapter_errors(tmp_path):
    m = tiny_llama()
    quantize_model(m, {"default": "nvfp4"})
    with pytest.raises(QuantError, match="adapter_config.json is missing"):
        load_adapter(m, tmp_path)
    with pytest.raises(QuantError, match="no LoRA layers"):
        save_adapter(m, tmp_path / "x")


def test_bad_recipes():
    with pytest.raises(QuantError, match="unknown quantization recipe keys"):
        QuantRecipe.load({"defualt": "nvfp4"})
    with pytest.raises(QuantError, match="unknown format spec"):
        QuantRecipe.load({"overrides": [{"pattern": "*", "format": "fp3"}]})
    with pytest.raises(QuantError, match="selects no linear layers"):
        quantize_model(tiny_llama(), {"exclude": ["*"]})
    with pytest.raises(QuantError, match="not found"):
        QuantRecipe.load("/nonexistent/recipe.yaml")


def test_recipe_from_yaml_file(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("default: mxfp4\noverrides:\n  - {pattern: '*.o_proj', format: fp8-block}\n")
    m = tiny_llama()
    rep = quantize_model(m, p)
    assert rep.layers["model.layers.0.self_attn.o_proj"] == "fp8-block"
    assert rep.layers["model.layers.0.mlp.up_proj"] == "mxfp4"
