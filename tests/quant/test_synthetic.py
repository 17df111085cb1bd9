"""Random-weight quantized checkpoints (quarl.quant.synthetic): the artifact written layer by layer is
byte for byte what quantizing the same dense weights and saving them gives, and it loads through the
calibrated-checkpoint path (load_model -> load_quantized) with the same outputs. Tiny Qwen2, seconds."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file

from quarl.models import load_model, tiny_config, tiny_model
from quarl.quant import QuantLinear, quantize_model
from quarl.quant.checkpoint import CheckpointError, check_quantization_config, save_quantized
from quarl.quant.synthetic import build_random, planned_quantization_config, write_random_checkpoint

RECIPE = {"default": "nvfp4"}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _config():
    from transformers import AutoConfig

    c = tiny_config("qwen2", vocab_size=512).to_dict()
    c.update(num_hidden_layers=3, tie_word_embeddings=False)
    c.pop("layer_types", None)
    return AutoConfig.for_model(c.pop("model_type"), **c)


def _tokenizer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model("qwen2", vocab_size=512)[1]


def _tensors(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_written_artifact_is_the_dense_model_quantized_and_saved(tmp_path):
    cfg, tok = _config(), _tokenizer()
    info = write_random_checkpoint(tmp_path / "synth", cfg, tok, RECIPE, seed=3, max_shard_size="40KB")
    assert info["files"] > 3 and info["build"]["peak_bytes"] < info["build"]["dense_bytes"]
    # the dense route: the same seeded weights, whole, then quantize_model + save_quantized (what calibrate writes)
    dense, _ = build_random(cfg, None, seed=3)
    quantize_model(dense, RECIPE)
    save_quantized(dense, tok, tmp_path / "ref", max_shard_size="40KB",
                   extra={"method": "rtn", "recipe": RECIPE})
    a, b = _tensors(tmp_path / "synth"), _tensors(tmp_path / "ref")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    assert a["model.layers.0.self_attn.q_proj.weight_packed"].dtype == torch.uint8
    assert a["lm_head.weight"].dtype == torch.bfloat16
    qa = json.loads((tmp_path / "synth" / "config.json").read_text())["quantization_config"]
    qb = json.loads((tmp_path / "ref" / "config.json").read_text())["quantization_config"]
    assert qa == qb and qa["quant_method"] == "compressed-tensors"
    manifest = json.loads((tmp_path / "synth" / "manifest.json").read_text())
    assert manifest["kind"] == "model" and manifest["complete"] and manifest["synthetic"]

    # both load through the calibrated-checkpoint path, packed, with the same outputs
    ma, _ = load_model(tmp_path / "synth", dtype=torch.float32)
    mb, _ = load_model(tmp_path / "ref", dtype=torch.float32)
    assert ma.quarl_load["mode"] == "packed"
    assert sum(isinstance(m, QuantLinear) for m in ma.modules()) == 3 * 7
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ma(ids).logits, mb(ids).logits)


def test_quantization_config_computed_elsewhere_is_checked(tmp_path):
    cfg, tok = _config(), _tokenizer()
    qc = planned_quantization_config(cfg, RECIPE)  # on the meta device, as for a machine without compressed-tensors
    write_random_checkpoint(tmp_path / "a", cfg, tok, RECIPE, qconfig=qc)
    write_random_checkpoint(tmp_path / "b", cfg, tok, RECIPE)
    ca = json.loads((tmp_path / "a" / "config.json").read_text())
    cb = json.loads((tmp_path / "b" / "config.json").read_text())
    assert ca["quantization_config"] == cb["quantization_config"]
    layers = {f"model.layers.0.mlp.{p}": "nvfp4" for p in ("up_proj", "down_proj")}
    with pytest.raises(CheckpointError, match="ignore list"):
        check_quantization_config(qc, layers, ["lm_head", "model.layers.0.mlp.gate_proj"])
    with pytest.raises(CheckpointError, match="does not describe"):
        check_quantization_config(qc, {"x": "int4-g32"}, ["lm_head"])
    check_quantization_config(qc, layers, ["lm_head"])
