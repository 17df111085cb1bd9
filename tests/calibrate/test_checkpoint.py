"""The quantized checkpoint: compressed-tensors layout, quarl's reader, and broken-checkpoint detection."""

import json
import shutil

import pytest
import torch

from quarl.calibrate.sequential import calibrate_model
from quarl.quant import QuantLinear, QuantRecipe, quantize_model
from quarl.quant.checkpoint import CheckpointError, check_checkpoint, load_quantized, save_quantized
from quarl.quant.model import plan_formats


def _calibrated(tiny, batches, recipe, kind="qwen2", method="gptq"):
    m, tok = tiny(kind)
    calibrate_model(m, plan_formats(m, QuantRecipe.load(recipe)), batches, method=method, progress=False)
    return m, tok


def _raw(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("recipe", [
    {"default": "nvfp4"}, {"default": "int4-g32"}, {"default": "int3-g64-sym"}, {"default": "fp8"},
    {"default": "fp8-block-b32"}, {"default": "mxfp4"}, {"default": "nf4-dq"},
    {"default": "nvfp4", "overrides": [{"pattern": "*.down_proj", "format": "int8-g64"},
                                       {"pattern": "*.layers.1.self_attn.*", "format": "bf16"}]},
], ids=lambda r: "mixed" if "overrides" in r else r["default"])  # fmt: skip
def test_save_load_round_trip_is_exact(tiny, calib_batches, eval_ids, tmp_path, recipe):
    m, tok = _calibrated(tiny, calib_batches, recipe)
    save_quantized(m, tok, tmp_path, max_shard_size="1MB")  # tiny shards: exercises the index
    assert (tmp_path / "model.safetensors.index.json").is_file()
    m2, tok2 = load_quantized(tmp_path)
    assert tok2 is not None and tok2.padding_side == "left"
    for n, mod in m.named_modules():
        if isinstance(mod, QuantLinear):
            got = m2.get_submodule(n)
            assert isinstance(got, QuantLinear) and got.config == mod.config
            a, b = mod.qtensor().tensors, got.qtensor().tensors
            assert a.keys() == b.keys() and all(torch.equal(_raw(a[k]), _raw(b[k])) for k in a), n
            if mod.bias is not None:
                assert torch.equal(mod.bias, got.bias)
    with torch.no_grad():
        assert torch.equal(m(eval_ids).logits, m2(eval_ids).logits)
    assert m2.lm_head.weight.data_ptr() == m2.model.embed_tokens.weight.data_ptr()  # still tied


def test_quantization_config_follows_compressed_tensors(tiny, calib_batches, tmp_path):
    m, tok = _calibrated(tiny, calib_batches, {"default": "nvfp4"}, method="rtn")
    save_quantized(m, tok, tmp_path / "nv")
    qc = json.loads((tmp_path / "nv" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    assert qc["quantization_status"] == "compressed" and qc["ignore"] == ["lm_head"]
    (g,) = qc["config_groups"].values()
    assert g["targets"] == ["Linear"] and g["weights"]["group_size"] == 16 and g["weights"]["type"] == "float"
    from compressed_tensors.quantization import QuantizationConfig

    QuantizationConfig.model_validate({k: v for k, v in qc.items() if k not in ("quant_method", "version")})

    m, tok = _calibrated(tiny, calib_batches, {"default": "int4-g32", "overrides": [
        {"pattern": "*.down_proj", "format": "fp8"}, {"pattern": "*.layers.0.mlp.up_proj", "format": "bf16"}]},
        method="rtn")  # fmt: skip
    save_quantized(m, tok, tmp_path / "mixed")
    qc = json.loads((tmp_path / "mixed" / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision"
    by_fmt = {g["format"]: g["targets"] for g in qc["config_groups"].values()}
    assert set(by_fmt) == {"pack-quantized", "float-quantized"}
    assert by_fmt["float-quantized"] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert "model.layers.0.mlp.up_proj" in qc["ignore"] and "lm_head" in qc["ignore"]
    # without quarl's own record, the reader derives every layer's format from quantization_config
    record = json.loads((tmp_path / "mixed" / "quarl_quantization.json").read_text())["layers"]
    (tmp_path / "mixed" / "quarl_quantization.json").unlink()
    m2, _ = load_quantized(tmp_path / "mixed")
    assert m2.quarl_layers == record and len(record) == 13
    assert m2.model.layers[1].mlp.down_proj.format_name == "fp8"
    assert m2.model.layers[0].self_attn.q_proj.config == m.model.layers[0].self_attn.q_proj.config
    assert type(m2.model.layers[0].mlp.up_proj) is torch.nn.Linear


def test_nf4_is_saved_for_quarl_only(tiny, calib_batches, tmp_path):
    m, tok = _calibrated(tiny, calib_batches, {"default": "nf4"}, method="rtn")
    save_quantized(m, tok, tmp_path)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "quarl" and "NF4 has no compressed-tensors format" in qc["note"]
    assert load_quantized(tmp_path)[0].model.layers[0].mlp.up_proj.format_name == "nf4"


def test_models_from_quantize_model_and_qat_and_lora_guards(tiny, tmp_path):
    m, tok = tiny("llama")
    quantize_model(m, {"default": "int8-g64", "overrides": [{"pattern": "*.o_proj", "format": "bf16"}]})
    save_quantized(m, tok, tmp_path / "a")  # bf16 QuantLinear layers are stored as dense weights
    m2, _ = load_quantized(tmp_path / "a")
    assert type(m2.model.layers[0].self_attn.o_proj) is torch.nn.Linear
    m, tok = tiny("llama")
    quantize_model(m, {"default": "nvfp4", "mode": "qat"})
    with pytest.raises(CheckpointError, match="freeze"):
        save_quantized(m, tok, tmp_path / "b")
    m, tok = tiny("llama")
    quantize_model(m, {"default": "nvfp4", "lora": {"r": 4, "alpha": 8}})
    with pytest.raises(CheckpointError, match="LoRA"):
        save_quantized(m, tok, tmp_path / "c")
    m, tok = tiny("llama")
    with pytest.raises(CheckpointError, match="no quantized layers"):
        save_quantized(m, tok, tmp_path / "d")


@pytest.fixture
def saved(tiny, calib_batches, tmp_path):
    m, tok = _calibrated(tiny, calib_batches, {"default": "int4-g32"}, method="rtn")
    d = tmp_path / "ck"
    save_quantized(m, tok, d, max_shard_size="1MB")
    return d


def test_check_checkpoint_accepts_a_good_one(saved):
    info = check_checkpoint(saved)
    assert info.is_compressed_tensors and len(info.files) >= 2
    assert "model.layers.0.mlp.down_proj.weight_packed" in info.tensors


def test_missing_shard_is_detected(saved):
    index = json.loads((saved / "model.safetensors.index.json").read_text())
    shard = max(set(index["weight_map"].values()))
    (saved / shard).unlink()
    with pytest.raises(CheckpointError, match=f"{shard}.*missing.*partial"):
        load_quantized(saved)


def test_truncated_safetensors_is_detected(saved):
    f = min(saved.glob("*.safetensors"))
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="truncated"):
        check_checkpoint(saved)
    f.write_bytes(data[:4])
    with pytest.raises(CheckpointError, match="truncated"):
        check_checkpoint(saved)


def test_missing_quantization_config_or_config_is_detected(saved):
    cfg = json.loads((saved / "config.json").read_text())
    del cfg["quantization_config"]
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no quantization_config"):
        load_quantized(saved)
    (saved / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        check_checkpoint(saved)


def test_index_promising_absent_tensors_is_detected(saved):
    p = saved / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight_packed"] = next(iter(index["weight_map"].values()))
    p.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="in no shard"):
        check_checkpoint(saved)


def test_missing_layer_tensors_are_detected(saved, tmp_path):
    """A shard that lost one layer's tensors (e.g. rewritten by hand) fails with the layer named."""
    from safetensors.torch import load_file, save_file

    index = json.loads((saved / "model.safetensors.index.json").read_text())
    for f in set(index["weight_map"].values()):
        sd = load_file(str(saved / f))
        sd = {k: v for k, v in sd.items() if not k.startswith("model.layers.1.mlp.up_proj.")}
        save_file(sd, str(saved / f))
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "layers.1.mlp.up_proj." not in k}
    (saved / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj"):
        load_quantized(saved)
    shutil.rmtree(saved)
    with pytest.raises(CheckpointError, match="does not exist"):
        check_checkpoint(saved)
