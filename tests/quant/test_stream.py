"""Streamed (layer-by-layer, quantized-as-read) loading of sharded safetensors checkpoints:
byte-identical to load + quantize_model, bounded peak, packed checkpoints without a dense
detour, and clear errors for a bad checkpoint. Tiny models saved to disk, seconds in all."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from quarl.models import ModelError, load_model, tiny_config, tiny_model
from quarl.quant import QuantError, QuantLinear, quantize_model
from quarl.quant.checkpoint import save_quantized
from quarl.quant.stream import build_streamed, checkpoint_filler, empty_model, materialized_bytes
from tests.threads import one_thread_fixture

VOCAB = 256
MIXED = {  # full qualified names in the patterns: the plan must be made on the whole model, not per layer
    "default": "nvfp4",
    "overrides": [{"pattern": "re:model\\.layers\\.1\\.mlp\\..*", "format": "int4-g32"},
                  {"pattern": "model.layers.2.self_attn.o_proj", "format": "bf16"}],
}


_one_thread = one_thread_fixture()


def _tokenizer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model("llama", vocab_size=VOCAB)[1]


def save_tiny(path, kind="llama", tied=True, layers=4, shard="60KB"):
    """A seeded tiny model (4 layers, small vocabulary so the layers dominate) saved as several shards."""
    from transformers import AutoConfig

    c = tiny_config(kind, vocab_size=VOCAB).to_dict()
    c.update(num_hidden_layers=layers, tie_word_embeddings=tied)
    c.pop("layer_types", None)  # derived from the layer count
    cfg = AutoConfig.for_model(c.pop("model_type"), **c)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path, max_shard_size=shard)
    _tokenizer().save_pretrained(path)
    return path


def _raw(t):
    return t.detach().contiguous().view(torch.uint8) if t.element_size() == 1 else t.detach()


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(_raw(sa[k]), _raw(sb[k])), k


@pytest.mark.parametrize(("kind", "tied", "recipe"), [("llama", True, {"default": "nvfp4"}),
                                                      ("qwen2", False, MIXED)])
def test_streamed_load_equals_dense_load_then_quantize(tmp_path, kind, tied, recipe):
    d = save_tiny(tmp_path / "m", kind, tied)
    assert len(list(d.glob("*.safetensors"))) > 2 and (d / "model.safetensors.index.json").is_file()
    dense, _ = load_model(d)
    quantize_model(dense, recipe)
    streamed, tok = load_model(d, quantize=recipe)
    assert_same_state(streamed, dense)  # every packed code, scale, shared global scale and dense tensor
    assert streamed.quarl_recipe == dense.quarl_recipe and tok.padding_side == "left"
    assert (streamed.lm_head.weight is streamed.model.embed_tokens.weight) == tied
    assert isinstance(streamed.model.layers[1].mlp.up_proj, QuantLinear)
    if recipe is MIXED:
        assert streamed.model.layers[1].mlp.up_proj.format_name == "int"
        assert streamed.model.layers[2].self_attn.o_proj.config is None  # kept in bf16 by the full-name pattern
    ids = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        assert torch.equal(streamed(ids).logits, dense(ids).logits)
    assert not any(p.requires_grad for p in streamed.parameters())


def test_peak_is_the_packed_model_plus_one_layer(tmp_path):
    """An independent count: the real tensors of the model right after each part is filled (the
    high point, before that part is quantized) never exceed the finished packed model plus one
    decoder layer in full precision, and stay well below the dense model."""
    from quarl.quant.checkpoint import check_checkpoint
    from quarl.quant.stream import TensorReader

    d = save_tiny(tmp_path / "m", layers=6)
    from transformers import AutoConfig

    model = empty_model(AutoConfig.from_pretrained(d), torch.float32)
    dense_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])  # + RoPE
    layer_bytes = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    seen = []
    with TensorReader(check_checkpoint(d, require_quantized=False)) as reader:
        fill = checkpoint_filler(model, reader, "cpu", torch.float32)

        def counting_fill(module, prefix):
            fill(module, prefix)
            seen.append(sum(t.numel() * t.element_size() for t in {id(t): t for t in
                        [*model.parameters(), *model.buffers()] if not t.is_meta}.values()))

        report = build_streamed(model, counting_fill, {"default": "nvfp4"})
    final = materialized_bytes(model)
    assert len(seen) == 2 + 6  # embeddings (the tied head comes with them), final norm, 6 layers
    assert max(seen) <= final + layer_bytes
    assert max(seen) < 0.6 * dense_bytes
    assert report.build["peak_bytes"] == max(seen) and report.build["dense_bytes"] == dense_bytes
    assert report.build["final_bytes"] == final and report.build["layers"] == 6


def test_load_model_records_the_streamed_build(tmp_path):
    d = save_tiny(tmp_path / "m")
    m, _ = load_model(d, quantize={"default": "nvfp4"})
    b = m.quarl_load
    assert b["mode"] == "stream" and b["final_bytes"] < b["peak_bytes"] < b["dense_bytes"]


def test_a_calibrated_checkpoint_loads_packed_without_a_dense_copy(tmp_path):
    """What calibrate writes (save_quantized of a quantized model) comes back as the same modules:
    the quantized layers are built from their stored codes and scales, so the peak of real
    tensors while loading is the packed model itself; a `quantize` request does not re-quantize it."""
    d = save_tiny(tmp_path / "m", tied=False)
    m, tok = load_model(d)
    quantize_model(m, {"default": "int4-g32", "overrides": [{"pattern": "*.down_proj", "format": "nvfp4"}]})
    save_quantized(m, tok, tmp_path / "ckpt", max_shard_size="40KB")
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    loaded, _ = load_model(tmp_path / "ckpt", quantize={"default": "nvfp4"})
    from quarl.quant.spec import spec_string

    assert loaded.quarl_layers == {n: spec_string(x.config) for n, x in m.named_modules() if isinstance(x, QuantLinear)}
    q = loaded.model.layers[0].self_attn.q_proj
    assert isinstance(q, QuantLinear) and q.format_name == "int"  # its own format, not the requested nvfp4
    assert loaded.model.layers[0].mlp.down_proj.format_name == "nvfp4"
    sa, sb = loaded.state_dict(), m.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(_raw(sa[k]), _raw(sb[k])), k
    ids = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, m(ids).logits)
    b = loaded.quarl_load
    assert b["mode"] == "packed" and b["peak_bytes"] <= b["final_bytes"] < b["dense_bytes"]


def test_streamed_build_refuses_lora_and_qat_recipes_and_a_fill_that_leaves_meta():
    cfg = tiny_config("llama", vocab_size=VOCAB)
    for recipe, what in (({"default": "nvfp4", "lora": {"r": 4}}, "no lora"),
                         ({"default": "nvfp4", "mode": "qat"}, "mode=frozen")):
        with pytest.raises(QuantError, match=what):
            build_streamed(empty_model(cfg, torch.float32), lambda m, p: None, recipe)
    with pytest.raises(QuantError, match="still on the meta device"):  # a fill that forgets a part
        build_streamed(empty_model(cfg, torch.float32), lambda m, p: None, None)


# --------------------------------------------------------------------------- bad checkpoints
def test_missing_shard_is_named(tmp_path):
    d = save_tiny(tmp_path / "m")
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ModelError, match=rf"{shard.name}.*missing.*partial"):
        load_model(d, quantize={"default": "nvfp4"})


def test_shape_that_config_does_not_describe_is_named(tmp_path):
    d = save_tiny(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 256  # config.json of another model beside these weights
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight has shape \[128, 64\].*"
                                         r"expects \[256, 64\].*config\.json does not describe"):
        load_model(d, quantize={"default": "nvfp4"})


def test_missing_tensor_is_named(tmp_path):
    d = save_tiny(tmp_path / "m", shard="10GB")  # one file
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.3.self_attn.k_proj.weight"]
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"no tensor model\.layers\.3\.self_attn\.k_proj\.weight.*partial"):
        load_model(d, quantize={"default": "nvfp4"})


def test_truncated_shard_is_named(tmp_path):
    d = save_tiny(tmp_path / "m")
    shard = max(d.glob("model-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ModelError, match=rf"{shard.name} is truncated"):
        load_model(d, quantize={"default": "nvfp4"})
