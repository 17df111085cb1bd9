"""The export stage: a calibrated (and possibly RL-adapted) model -> checkpoints the ecosystem loads unchanged.

    run_export(cfg, model_uri=..., adapter_uri=None, output_uri=..., overwrite=False) -> report

Output artifact (kind ``model``):

    ./                  the quantized base: compressed-tensors checkpoint copied byte for byte from
                        the calibrate artifact (config.json quantization_config, pack-quantized
                        safetensors, ignore list, tokenizer) -- vLLM serves it as is
    adapter/            the PEFT LoRA adapter, copied and verified (when adapter_uri is given)
    merged/             merge=true: the LoRA merged into a full-precision copy and re-quantized (RTN)
    README.md           model card: recipe, data, metrics, verification, lineage
    export_report.json  verification numbers + lineage, machine-readable
    calibration_metrics.json   the calibrate stage's metrics, carried along

Order of work, so that nothing unverified is ever marked complete:
  1. open the inputs: artifacts are checksum-verified by ``open_artifact`` (a flipped byte fails
     here with the file named); plain directories get ``check_checkpoint`` (missing shard,
     truncated safetensors, missing quantization_config); NF4 checkpoints are refused (no
     compressed-tensors representation);
  2. rebuild the in-memory quantized model with quarl's reader;
  3. write the files into the artifact's staging directory;
  4. reload them with transformers + compressed-tensors (and PEFT for the adapter) and compare
     with the in-memory model within the stated tolerance -- on failure the artifact is not
     published (``write_artifact`` leaves only an incomplete staging directory);
  5. the artifact layer writes checksums of every file and marks it complete.
An existing complete export is never replaced unless ``overwrite=True``.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import torch

from quarl.export.card import model_card
from quarl.export.config import ExportConfig
from quarl.export.verify import ExportError, attach_adapter, check_adapter_files, verify_adapter, verify_checkpoint
from quarl.quant.checkpoint import QUARL_META, CheckpointError, check_checkpoint, load_quantized
from quarl.quant.linear import QuantLinear

log = logging.getLogger(__name__)
STAGE = "export"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "summary.json", "quant_recipe.json")
NOT_COPIED = {"manifest.json", "metrics.json", "report.md", "README.md", "export_report.json"}


def _open_dir(uri: str, kind: str) -> tuple[Path, dict | None]:
    """A verified local directory for an artifact URI (s3 or local), or a plain local directory."""
    from quarl.artifacts import ArtifactError, open_artifact

    p = Path(str(uri)).expanduser()
    if str(uri).startswith("s3://") or (p / "manifest.json").is_file():
        try:
            art = open_artifact(str(uri), kind=kind)
        except ArtifactError as e:
            raise ExportError(f"{kind} input {uri} is not usable: {e}") from e
        return Path(art.path), art.manifest
    if not p.is_dir() and kind == "model":  # a model reference: "default", a Hugging Face id
        from quarl.models import ModelError, resolve_model_dir

        try:
            return resolve_model_dir(str(uri)), None
        except ModelError as e:
            raise ExportError(f"model input {uri} is neither an artifact, a local directory nor a model "
                              f"reference: {e}") from e
    if not p.is_dir():
        raise ExportError(f"{kind} input {uri} is neither an artifact nor a local directory")
    return p, None


def _find_adapter(root: Path) -> Path:
    if (root / "adapter_config.json").is_file():
        return root
    found = sorted(p.parent for p in root.rglob("adapter_config.json"))
    if len(found) != 1:
        raise ExportError(f"adapter input {root}: expected one PEFT adapter (adapter_config.json), found {len(found)}")
    return found[0]


def _copy_checkpoint(src: Path, dst: Path) -> list[str]:
    files = []
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in NOT_COPIED:
            shutil.copy2(f, dst / f.name)
            files.append(f.name)
    if (src / "metrics.json").is_file():
        shutil.copy2(src / "metrics.json", dst / "calibration_metrics.json")
    return files


def _verify_ids(tok, cfg: ExportConfig) -> torch.Tensor:
    ids = tok(cfg.verify_text, add_special_tokens=False, return_tensors="pt")["input_ids"][:, : cfg.verify_tokens]
    if ids.numel() < 2:
        raise ExportError("export.verify_text is too short to verify anything; give a sentence or more")
    return ids


def _merge(cfg: ExportConfig, ours_lora, quant_meta: dict, model_manifest: dict | None, model_uri: str):
    """LoRA merged into full-precision weights, then RTN re-quantized to the layers' formats."""
    from quarl.models import load_model
    from quarl.quant import quantize_model
    from quarl.quant.lora import lora_layers, merge_lora

    layers = dict(getattr(ours_lora, "quarl_layers", {}))
    if cfg.merge_base == "source":
        base_uri = (
            cfg.base_model or quant_meta.get("source_model") or ((model_manifest or {}).get("inputs") or [None])[0]
        )
        if not base_uri:
            raise ExportError(
                "merge_base=source needs the full-precision model: set base_model (the model the "
                "calibrate stage started from), or use merge_base=dequantized"
            )
        fp, _ = load_model(base_uri, dtype=torch.float32)
        mods = dict(fp.named_modules())
        with torch.no_grad():
            for name, m in lora_layers(ours_lora).items():
                lin = mods.get(name)
                if lin is None or tuple(lin.weight.shape) != (m.out_features, m.in_features):
                    raise ExportError(f"base model {base_uri} does not match the quantized model at {name}")
                lin.weight.add_(m.lora_delta().float().to(lin.weight.dtype))
        what = f"full-precision source model `{base_uri}`"
    else:
        fp = merge_lora(copy.deepcopy(ours_lora))  # dequantized base + B@A*scaling, as nn.Linear
        what = "dequantized quantized base"
    if cfg.requant_format:
        recipe = {"default": cfg.requant_format}
    else:  # each layer back to its own format; layers that were dense stay dense
        recipe = {"default": "bf16", "overrides": [{"pattern": n, "format": s} for n, s in sorted(layers.items())]}
    quantize_model(fp, recipe)
    for p in fp.parameters():
        p.requires_grad_(False)
    return fp.eval(), {"base": what, "method": "rtn", "recipe": recipe}


def run_export(
    cfg: ExportConfig, *, model_uri: str, adapter_uri: str | None = None, output_uri: str, overwrite: bool = False
) -> dict:
    """Export ``model_uri`` (+ ``adapter_uri``) to ``output_uri``; returns the verification report."""
    from quarl.devices import cpu_threads

    with cpu_threads(cfg.threads):
        return _run_export(cfg, model_uri=model_uri, adapter_uri=adapter_uri, output_uri=output_uri,
                           overwrite=overwrite)


def _run_export(cfg: ExportConfig, *, model_uri: str, adapter_uri: str | None, output_uri: str,
                overwrite: bool) -> dict:
    from quarl.artifacts import git_commit, write_artifact
    from quarl.config import config_to_dict

    if cfg.merge and not adapter_uri:
        raise ExportError("merge=true needs an adapter to merge (adapter_uri / --adapter)")
    src, model_manifest = _open_dir(model_uri, "model")
    try:
        info = check_checkpoint(src, require_quantized=False)
    except CheckpointError as e:
        raise ExportError(f"model input {model_uri}: {e}") from e
    qc = info.quantization_config
    if qc and not info.is_compressed_tensors:
        raise ExportError(
            f"model input {model_uri} is not a compressed-tensors checkpoint "
            f"(quant_method={qc.get('quant_method')!r}: {qc.get('note', '')}); re-calibrate with a "
            f"compressed-tensors format (nvfp4, mxfp4, int4/int8, fp8) to export it"
        )
    adapter_dir = adapter_manifest = None
    if adapter_uri:
        root, adapter_manifest = _open_dir(adapter_uri, "adapter")
        adapter_dir = _find_adapter(root)

    if qc:
        ours, tok = load_quantized(src, dtype=torch.float32)
    else:
        from quarl.models import load_model

        ours, tok = load_model(str(src), dtype=torch.float32)
    if tok is None:
        raise ExportError(f"model input {model_uri} has no tokenizer; an export must be servable as is")
    for p in ours.parameters():
        p.requires_grad_(False)
    ids = _verify_ids(tok, cfg)
    tol = {"atol": cfg.logits_atol, "rtol": cfg.logits_rtol, "rtol_fp4": cfg.logits_rtol_fp4}
    wtol = {"weights_rtol": cfg.weights_rtol, "weights_rtol_fp4": cfg.weights_rtol_fp4}
    quant_meta = json.loads((src / QUARL_META).read_text()) if (src / QUARL_META).is_file() else {}
    calib_metrics = json.loads((src / "metrics.json").read_text()) if (src / "metrics.json").is_file() else None
    inputs = [u for u in (model_uri, adapter_uri) if u]

    with write_artifact(output_uri, "model", STAGE, config=cfg, inputs=inputs, overwrite=overwrite) as art:
        out = art.path
        files = _copy_checkpoint(src, out)
        verification: dict = {}
        if cfg.verify:
            verification["base"] = verify_checkpoint(ours, out, ids, **tol, **wtol)
        adapter_info = merged = None
        if adapter_dir is not None:
            adapter_info = check_adapter_files(adapter_dir, ours)
            (out / "adapter").mkdir()
            for f in ADAPTER_FILES:  # the PEFT files, plus the training stage's summary for provenance
                if (adapter_dir / f).is_file():
                    shutil.copy2(adapter_dir / f, out / "adapter" / f)
            attach_adapter(ours, out / "adapter")
            if cfg.verify:
                verification["adapter"] = verify_adapter(ours, out, out / "adapter", ids, **tol)
        if cfg.merge:
            from quarl.quant.checkpoint import save_quantized

            merged_model, merged = _merge(cfg, ours, quant_meta, model_manifest, model_uri)
            if not any(isinstance(m, QuantLinear) and m.config is not None for m in merged_model.modules()):
                raise ExportError("the re-quantization recipe quantizes nothing; set requant_format")
            save_quantized(
                merged_model,
                tok,
                out / "merged",
                extra={**quant_meta, "method": "merge+rtn", "merged_from": inputs, "recipe": merged["recipe"]},
            )
            if cfg.verify:
                verification["merged"] = verify_checkpoint(merged_model, out / "merged", ids, **tol, **wtol)
            with torch.no_grad():
                a = ours(input_ids=ids, use_cache=False).logits
                b = merged_model(input_ids=ids, use_cache=False).logits
            merged["vs_lora"] = {"max_abs": float((a - b).abs().max())}
        layers = dict(getattr(ours, "quarl_layers", {}))
        name = cfg.model_name or f"{Path(str(quant_meta.get('source_model') or model_uri)).name}-quarl"
        report = {
            "stage": STAGE,
            "inputs": inputs,
            "files": files,
            "verification": verification,
            "adapter": adapter_info,
            "merged": merged,
            "layers": layers,
            "lineage": {"model": model_manifest, "adapter": adapter_manifest},
        }
        (out / "export_report.json").write_text(json.dumps(report, indent=2, default=str))
        (out / "README.md").write_text(
            model_card(
                name=name,
                layers=layers,
                quant_meta=quant_meta,
                calib_metrics=calib_metrics,
                model_manifest=model_manifest,
                adapter_manifest=adapter_manifest,
                adapter_info=adapter_info,
                verification=verification,
                export_config=config_to_dict(cfg),
                export_inputs=inputs,
                git_commit=git_commit(),
                merged=merged,
            )
        )
        art.metadata["verification"] = {
            k: {"logits_max_abs": v["logits"]["max_abs"], "tolerance": v["tolerance"]["logits_max_abs"]}
            for k, v in verification.items()
        }
    log.info("export: %s -> %s (%s)", model_uri, output_uri, {k: v["passed"] for k, v in verification.items()})
    return report
