"""Export: round trips through compressed-tensors/transformers and PEFT, merge, model card, broken inputs, CLI."""

import json
import shutil

import pytest
import torch

from quarl.artifacts import ArtifactExistsError, open_artifact
from quarl.calibrate import CalibrateConfig, load_quantized, run_calibrate, save_quantized
from quarl.config import load_config
from quarl.export import ExportConfig, ExportError, load_with_compressed_tensors, run_export
from quarl.export.verify import verify_checkpoint
from quarl.quant import QuantLinear, quantize_model, save_adapter
from tests.threads import one_thread_fixture

SMALL = ["data.num_samples=4", "data.seq_len=32", "data.batch_size=2", "eval.num_samples=2"]


_one_thread = one_thread_fixture(scope="session")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "corpus.jsonl"
    rows = [{"text": f"Question {i}: Sam has {i} pens and buys {2 * i + 1} more. Answer: {3 * i + 1}."}
            for i in range(60)]  # fmt: skip
    p.write_text("\n".join(json.dumps(r) for r in rows))
    return str(p)


@pytest.fixture(scope="session")
def calibrated(tmp_path_factory, corpus):
    """fmt -> calibrate artifact URI (tiny Llama, GPTQ), built once per session and per format."""
    cache = {}

    def get(fmt: str, model: str = "tiny-llama") -> str:
        if (fmt, model) not in cache:
            out = tmp_path_factory.mktemp("cal") / "model"
            cfg = load_config(CalibrateConfig, None, ["method=gptq", f"format={fmt}", f"data.path={corpus}", *SMALL])
            run_calibrate(cfg, model_uri=model, output_uri=str(out), progress=False)
            cache[(fmt, model)] = str(out)
        return cache[(fmt, model)]

    return get


@pytest.fixture(scope="session")
def adapter_dir(tmp_path_factory):
    """A PEFT adapter for tiny-llama with non-zero B (so it changes the outputs)."""
    from quarl.models import load_model

    m, _ = load_model("tiny-llama")
    quantize_model(m, {"default": "bf16", "lora": {"r": 4, "alpha": 8}})
    g = torch.Generator().manual_seed(0)
    for n, p in m.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05, generator=g)
    d = tmp_path_factory.mktemp("adapter") / "adapter"
    save_adapter(m, d, base_model_name_or_path="tiny-llama")
    return d


IDS = torch.randint(0, 49152, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("fmt", ["nvfp4", "int4-g32", "fp8", "fp8-block-b32", "mxfp4"])
def test_export_round_trips_through_compressed_tensors(tmp_path, calibrated, fmt):
    out = tmp_path / "export"
    rep = run_export(ExportConfig(), model_uri=calibrated(fmt), output_uri=str(out))
    v = rep["verification"]["base"]
    assert v["passed"] and v["weights"]["layers"] == 14 and not v["weights"]["failed_layers"]
    assert v["transformers"]["logits"]["argmax_agreement"] == 1.0  # the users' loader ran too
    assert v["logits"]["argmax_agreement"] == 1.0
    if fmt in ("nvfp4", "mxfp4"):  # compressed-tensors stores FP4 weights in bf16: quarl's model is compared
        # under that same one rounding per weight, at the float32 tolerance
        assert v["loader_rounding"]["dtype"] == "bfloat16" and v["tolerance"]["rtol"] == 1e-5
        if fmt == "nvfp4":  # the rounding is real (small, stated) ...
            assert 0 < v["weights"]["max_elem_rel"] <= 2**-7
        else:  # ... E2M1 x 2^k is exact in bf16
            assert v["weights"]["max_elem_rel"] == 0
    else:  # float32 decompression: identical weights
        assert v["weights"]["max_elem_rel"] == 0 and v["tolerance"]["rtol"] == 1e-5
    # independently of run_export: the ecosystem's loader vs quarl's reader on the exported files
    hf = load_with_compressed_tensors(out)
    assert all(type(m) is torch.nn.Linear for n, m in hf.named_modules() if n.endswith("proj"))
    ours, _ = load_quantized(out)
    with torch.no_grad():
        a, b = ours(IDS).logits, hf(IDS).logits
    tol = 1e-3 + (0.05 if fmt in ("nvfp4", "mxfp4") else 1e-5) * float(a.abs().max())
    assert float((a - b).abs().max()) <= tol
    # checksums by the artifact layer; the quantized payload is the calibrate artifact's, byte for byte
    art = open_artifact(str(out), kind="model")
    src = open_artifact(calibrated(fmt), kind="model")
    assert art.manifest["files"]["model.safetensors"]["sha256"] == src.manifest["files"]["model.safetensors"]["sha256"]
    assert art.manifest["inputs"] == [calibrated(fmt)]
    card = (out / "README.md").read_text()
    for must in ("## Verification", "## Lineage", "## Metrics", "gptq", calibrated(fmt), "vllm serve"):
        assert must in card, must
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"


def test_adapter_copy_verify_and_merge(tmp_path, calibrated, adapter_dir):
    out = tmp_path / "export"
    cfg = load_config(ExportConfig, None, ["merge=true"])
    rep = run_export(cfg, model_uri=calibrated("nvfp4"), adapter_uri=str(adapter_dir), output_uri=str(out))
    assert rep["adapter"]["r"] == 4 and rep["adapter"]["tensors"] == 28
    assert rep["verification"]["adapter"]["passed"] and rep["verification"]["merged"]["passed"]
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == (
        adapter_dir / "adapter_model.safetensors"
    ).read_bytes()
    # PEFT on the decompressed base differs from the base alone: the adapter really is applied
    from peft import PeftModel

    base = load_with_compressed_tensors(out)
    with torch.no_grad():
        plain = base(IDS).logits
        adapted = PeftModel.from_pretrained(base, str(out / "adapter"))(IDS).logits
    assert float((plain - adapted).abs().max()) > 1e-3
    # merged/: a compressed-tensors checkpoint whose layers keep their format, close to base + LoRA
    merged, _ = load_quantized(out / "merged")
    assert merged.model.layers[0].mlp.up_proj.format_name == "nvfp4"
    assert (
        json.loads((out / "merged" / "config.json").read_text())["quantization_config"]["format"]
        == "nvfp4-pack-quantized"
    )
    assert rep["merged"]["base"].startswith("full-precision source model") and rep["merged"]["vs_lora"]["max_abs"] < 1
    assert "adapter/" in (out / "README.md").read_text() and "--enable-lora" in (out / "README.md").read_text()
    with pytest.raises(ExportError, match="needs an adapter"):
        run_export(cfg, model_uri=calibrated("nvfp4"), output_uri=str(tmp_path / "x"))


def test_merge_into_dequantized_base_with_a_new_format(tmp_path, calibrated, adapter_dir):
    cfg = load_config(ExportConfig, None, ["merge=true", "merge_base=dequantized", "requant_format=int8-g64"])
    out = tmp_path / "e"
    rep = run_export(cfg, model_uri=calibrated("int4-g32"), adapter_uri=str(adapter_dir), output_uri=str(out))
    assert rep["verification"]["merged"]["weights"]["max_elem_rel"] == 0
    assert load_quantized(out / "merged")[0].model.layers[1].self_attn.o_proj.format_name == "int"


def test_overwrite_is_refused_unless_asked(tmp_path, calibrated):
    out = str(tmp_path / "e")
    run_export(ExportConfig(verify=False), model_uri=calibrated("int4-g32"), output_uri=out)
    with pytest.raises(ArtifactExistsError):
        run_export(ExportConfig(verify=False), model_uri=calibrated("int4-g32"), output_uri=out)
    run_export(ExportConfig(verify=False), model_uri=calibrated("int4-g32"), output_uri=out, overwrite=True)


def _plain_copy(src: str, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("manifest.json"))
    return dst


def test_broken_inputs_are_refused_with_clear_errors(tmp_path, calibrated):
    src = calibrated("int4-g32")
    # an artifact with a flipped byte: the checksum catches it
    bad = _plain_copy(src, tmp_path / "bad_art")
    shutil.copy2(f"{src}/manifest.json", bad / "manifest.json")
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-10] ^= 0xFF
    (bad / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ExportError, match="sha256|checksum|corrupt"):
        run_export(ExportConfig(), model_uri=str(bad), output_uri=str(tmp_path / "o1"))
    # plain directories: truncated safetensors, quantization_config lost, missing config
    d = _plain_copy(src, tmp_path / "trunc")
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[:-64])
    with pytest.raises(ExportError, match="truncated"):
        run_export(ExportConfig(), model_uri=str(d), output_uri=str(tmp_path / "o2"))
    d = _plain_copy(src, tmp_path / "noqc")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["quantization_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match="no quantization_config"):
        run_export(ExportConfig(), model_uri=str(d), output_uri=str(tmp_path / "o3"))
    assert not (tmp_path / "o3").exists()  # nothing published


def test_missing_shard_is_refused(tmp_path, tiny_sharded):
    shard = max(set(json.loads((tiny_sharded / "model.safetensors.index.json").read_text())["weight_map"].values()))
    (tiny_sharded / shard).unlink()
    with pytest.raises(ExportError, match="missing.*partial"):
        run_export(ExportConfig(), model_uri=str(tiny_sharded), output_uri=str(tmp_path / "o"))


@pytest.fixture
def tiny_sharded(tmp_path):
    from quarl.models import load_model

    m, tok = load_model("tiny-qwen2")
    quantize_model(m, {"default": "int8-g64"})
    return save_quantized(m, tok, tmp_path / "sharded", max_shard_size="1MB")


def test_nf4_and_bad_adapters_are_refused(tmp_path, calibrated, adapter_dir):
    with pytest.raises(ExportError, match="not a compressed-tensors checkpoint.*NF4"):
        run_export(ExportConfig(), model_uri=calibrated("nf4"), output_uri=str(tmp_path / "o"))
    bad = tmp_path / "ad"
    shutil.copytree(adapter_dir, bad)
    raw = (bad / "adapter_model.safetensors").read_bytes()
    (bad / "adapter_model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ExportError, match="corrupt or truncated"):
        run_export(ExportConfig(), model_uri=calibrated("nvfp4"), adapter_uri=str(bad), output_uri=str(tmp_path / "p"))
    (bad / "adapter_model.safetensors").unlink()
    with pytest.raises(ExportError, match="partial"):
        run_export(ExportConfig(), model_uri=calibrated("nvfp4"), adapter_uri=str(bad), output_uri=str(tmp_path / "q"))


def test_verification_catches_a_wrong_byte(tmp_path, calibrated):
    out = tmp_path / "e"
    run_export(ExportConfig(), model_uri=calibrated("int4-g32"), output_uri=str(out))
    ours, _ = load_quantized(out)
    lin = ours.model.layers[1].mlp.down_proj
    assert isinstance(lin, QuantLinear)
    lin.weight_packed[0, 0] ^= 0x7  # the checkpoint no longer matches this model
    with pytest.raises(ExportError, match="decodes different weights.*layers.1.mlp.down_proj"):
        verify_checkpoint(
            ours, out, IDS, atol=1e-3, rtol=1e-5, rtol_fp4=0.05, weights_rtol=1e-6, weights_rtol_fp4=2**-7
        )


def test_cli(tmp_path, calibrated):
    from typer.testing import CliRunner

    from quarl.cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli"
    r = runner.invoke(app, ["export", "--model", calibrated("fp8"), "--output", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["verification"]["base"]["passed"] and "model.safetensors" in summary["files"]
    r = runner.invoke(app, ["export", "--model", calibrated("fp8"), "--output", str(out)])
    assert r.exit_code == 1 and "error:" in r.output
    r = runner.invoke(app, ["export", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "z")])
    assert r.exit_code == 1 and "is neither an artifact, a local directory nor a model" in r.output


def test_s3_calibrate_then_export(s3_bucket, corpus):
    """recipe object on S3 -> calibrate artifact on S3 -> export artifact on S3, read back verified."""
    from quarl.storage import S3Store

    store = S3Store()
    recipe_uri = f"s3://{s3_bucket}/recipes/mixed.yaml"
    store.put_bytes(b"default: int4-g32\noverrides:\n  - {pattern: '*.down_proj', format: fp8}\n", recipe_uri)
    cal = f"s3://{s3_bucket}/run-1/calibrate/model"
    cfg = load_config(CalibrateConfig, None, ["method=gptq", f"data.path={corpus}", *SMALL])
    run_calibrate(cfg, model_uri="tiny-llama", recipe_uri=recipe_uri, output_uri=cal, progress=False)
    out = f"s3://{s3_bucket}/run-1/export/model"
    rep = run_export(ExportConfig(), model_uri=cal, output_uri=out)
    assert rep["verification"]["base"]["passed"] and rep["layers"]["model.layers.0.mlp.down_proj"] == "fp8"
    # mixed precision: decoded per layer by compressed-tensors; transformers' one-scheme path is skipped, and said so
    assert rep["verification"]["base"]["weights"]["max_elem_rel"] == 0
    assert "mixed-precision" in rep["verification"]["base"]["transformers"]["skipped"]
    art = open_artifact(out, kind="model")
    assert art.manifest["inputs"] == [cal] and (art.path / "README.md").is_file()
    model, _ = load_quantized(art.path)
    assert model.model.layers[1].self_attn.q_proj.format_name == "int"


def test_adapter_artifact_from_the_rl_stage(tmp_path, calibrated, adapter_dir):
    """An RL adapter artifact: PEFT files + training files; only the PEFT files (+ summary) are exported,
    and the stage's metadata and lineage reach the model card."""
    from quarl.artifacts import write_artifact

    uri = tmp_path / "rl" / "adapter"
    with write_artifact(uri, "adapter", "rl", config={"algo": "dapo"}, inputs=[calibrated("int4-g32"), "data"]) as art:
        for f in adapter_dir.iterdir():
            shutil.copy2(f, art.path / f.name)
        (art.path / "tensorboard").mkdir()
        (art.path / "tensorboard" / "events.out").write_text("x")
        (art.path / "summary.json").write_text('{"total_steps": 3}')
        art.metadata.update(reward_last=0.61, accuracy_last=0.5, steps=3)
    out = tmp_path / "e"
    rep = run_export(ExportConfig(), model_uri=calibrated("int4-g32"), adapter_uri=str(uri), output_uri=str(out))
    assert rep["verification"]["adapter"]["passed"]
    assert sorted(p.name for p in (out / "adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "summary.json"]  # fmt: skip
    card = (out / "README.md").read_text()
    assert "reward_last" in card and "0.61" in card and "stage `rl`" in card and "algo: dapo" in card


def test_model_input_may_be_a_model_reference(tmp_path):
    """`quarl run jetrl` passes the base as "default" (no calibrate step): export resolves the reference."""
    from quarl.export.stage import _open_dir
    from quarl.models import default_model_dir

    path, manifest = _open_dir("default", "model")
    assert path == default_model_dir() and manifest is None
    with pytest.raises(ExportError, match="neither an artifact, a local directory nor a model reference"):
        _open_dir("tiny-llama", "model")  # built in memory: no directory to export from
    with pytest.raises(ExportError, match="neither an artifact nor a local directory"):
        _open_dir(str(tmp_path / "missing"), "adapter")
