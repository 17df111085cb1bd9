"""The model under evaluation: full precision, RTN-quantized, or calibrated -- with or without LoRA.

    model, tokenizer, info = load_eval_model(model_uri, cfg, adapter_uri=None)

Four ways a model reaches eval, all ending as the same ``nn.Module``:

* **full precision**: ``quarl.models.load_model`` (local dir, ``s3://``,
  artifact, hub id, ``default``, ``tiny-*``) in ``cfg.dtype``;
* **RTN** (``cfg.quant: nvfp4`` or ``cfg.quant_recipe``): the full-precision
  model through ``quarl.quant.quantize_model`` -- round-to-nearest, no
  calibration data; QeRL's NVFP4 policy is exactly this;
* **calibrated** (GPTQ/AWQ from the calibrate stage): the directory's
  ``config.json`` carries a ``quantization_config``, and
  ``quarl.quant.checkpoint.load_quantized`` rebuilds its QuantLinear layers
  from the packed tensors (not re-quantizing: the calibrated bytes are what is
  scored). Asking to RTN-quantize such a model again is refused;
* **+ LoRA** (``adapter_uri``: a PEFT directory, an ``adapter`` artifact, or an
  ``s3://`` prefix): loaded with ``quarl.quant.load_adapter`` into the
  QuantLinear layers. A full-precision model first gets its linears wrapped as
  frozen high-precision QuantLinear (format ``bf16``; the weights are not
  changed) so the adapter has a LoRA branch to live in -- the "BF16 LoRA"
  baseline of the papers runs through the same code.

On CPU every QuantLinear caches its dequantized weight after the first call
(``cache_dequantized``): generation calls each layer once per token, and
re-decoding FP4 bytes every step would dominate the run. The numbers are the
same -- the cache holds exactly what the reference path computes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from quarl import devices
from quarl.eval.benchmarks import EvalError
from quarl.eval.config import EvalConfig

__all__ = ["load_eval_model", "resolve_adapter_dir", "resolve_device", "resolve_dtype"]

log = logging.getLogger(__name__)

def resolve_device(device: str) -> torch.device:
    return devices.resolve_device(device, error=EvalError)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    return devices.resolve_dtype(dtype, device, error=EvalError)


def _quantization_config(model_uri: str) -> tuple[Path | None, dict | None]:
    """The local model directory and its quantization_config (None for tiny/in-memory models)."""
    from quarl.models import TINY_MODELS, resolve_model_dir

    if str(model_uri).lower() in TINY_MODELS:
        return None, None
    path = resolve_model_dir(model_uri)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return path, None
    try:
        qc = json.loads(cfg_file.read_text()).get("quantization_config")
    except ValueError as e:
        raise EvalError(f"{model_uri}: config.json is not valid JSON ({e})") from e
    return path, qc


def resolve_adapter_dir(adapter_uri: str) -> Path:
    """A local directory holding ``adapter_config.json`` for a PEFT dir, artifact or ``s3://`` prefix."""
    from quarl.storage import is_s3

    uri = str(adapter_uri)
    if is_s3(uri):
        from quarl.storage import S3Store

        store = S3Store()
        if store.exists(uri.rstrip("/") + "/manifest.json"):
            from quarl.artifacts import open_artifact

            root = Path(open_artifact(uri, kind="adapter").path)
        else:
            from quarl.models import cache_dir

            root = cache_dir() / "adapters" / uri.removeprefix("s3://").strip("/")
            store.download_dir(uri, root)
    else:
        root = Path(uri).expanduser()
        if not root.is_dir():
            raise EvalError(
                f"adapter {uri} does not exist or is not a directory; pass a PEFT adapter dir, "
                "an adapter artifact or an s3:// prefix"
            )
        if (root / "manifest.json").is_file():
            from quarl.artifacts import open_artifact

            root = Path(open_artifact(str(root), kind="adapter").path)
    if (root / "adapter_config.json").is_file():
        return root
    found = sorted(p.parent for p in root.rglob("adapter_config.json"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise EvalError(f"adapter {uri}: no adapter_config.json in it; expected a PEFT LoRA adapter directory")
    raise EvalError(
        f"adapter {uri}: several adapters inside ({', '.join(str(p.relative_to(root)) for p in found)}); "
        "point at one of them"
    )


def _adapter_recipe(adir: Path) -> dict | None:
    """The base recipe an rl adapter was trained on (its ``quant_recipe.json``, LoRA left out), or None
    when it has none or the base was full precision (nothing to rebuild)."""
    from quarl.quant import QuantRecipe
    from quarl.quant.spec import make_config

    f = Path(adir) / "quant_recipe.json"
    if not f.is_file():
        return None
    raw = json.loads(f.read_text() or "{}")
    if not raw or "default" not in raw:  # {} (unknown) or a calibrated base's {"base": ..., "layers": ...}
        return None
    recipe = QuantRecipe.load({**raw, "lora": None})
    quantized = any(make_config(x) is not None for x in [recipe.default, *(o["format"] for o in recipe.overrides)])
    return recipe.to_dict() if quantized or recipe.act_quant else None


def load_eval_model(model_uri: str, cfg: EvalConfig, adapter_uri: str | None = None) -> tuple[Any, Any, dict]:
    """Load, quantize and adapt the model as ``cfg`` says -> ``(model, tokenizer, info)``."""
    from quarl.models import ModelError, load_model
    from quarl.quant import QuantError, QuantLinear, load_adapter, quantize_model

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    info: dict[str, Any] = {
        "model_uri": str(model_uri),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
    }
    try:
        path, qc = _quantization_config(model_uri)
        if qc is not None:
            if cfg.quant is not None or cfg.quant_recipe is not None:
                raise EvalError(
                    f"{model_uri} is already quantized ({qc.get('format', qc.get('quant_method', '?'))}); "
                    "unset quant/quant_recipe to evaluate it as calibrated, or pass the full-precision model to RTN it"
                )
            from quarl.quant.checkpoint import load_quantized

            model, tokenizer = load_quantized(path, device=device, dtype=dtype)
            if tokenizer is None:
                raise EvalError(f"{model_uri}: the quantized checkpoint has no tokenizer; save it beside the weights")
            info["quantization"] = "calibrated checkpoint"
            info["layers"] = _format_counts(getattr(model, "quarl_layers", {}))
        else:
            model, tokenizer = load_model(
                path if path is not None else model_uri,
                dtype=dtype,
                device=device,
                trust_remote_code=cfg.trust_remote_code,
            )
            info["quantization"] = "none"
            if cfg.quant is not None or cfg.quant_recipe is not None:
                recipe = cfg.quant_recipe if cfg.quant_recipe is not None else {"default": cfg.quant}
                report = quantize_model(model, recipe)
                info["quantization"] = "rtn"
                info["recipe"] = recipe
                info["layers"] = _format_counts(report.layers)
        if adapter_uri:
            adir = resolve_adapter_dir(adapter_uri)
            trained_on = _adapter_recipe(adir)
            if (trained_on and cfg.adapter_recipe and info["quantization"] == "none"
                    and not any(isinstance(m, QuantLinear) for m in model.modules())):
                report = quantize_model(model, trained_on)  # the base the adapter was trained on
                info.update(quantization="adapter's base recipe", recipe=trained_on,
                            layers=_format_counts(report.layers))
                log.info("eval: %s was trained on a quantized base; rebuilt it from quant_recipe.json (%s)",
                         adapter_uri, trained_on.get("default"))
            if not any(isinstance(m, QuantLinear) for m in model.modules()):
                quantize_model(model, {"default": "bf16"})  # wrap linears (weights unchanged) for the LoRA branch
            lcfg = load_adapter(model, adir)
            info["adapter"] = {"uri": str(adapter_uri), "r": lcfg.r, "alpha": lcfg.alpha, "targets": lcfg.targets}
    except (ModelError, QuantError) as e:
        raise EvalError(str(e)) from e
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.cache_dequantized = device.type == "cpu"
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    info["parameters"] = _logical_parameters(model)
    return model, tokenizer, info


def _logical_parameters(model) -> int:
    """Weights the model computes with, quantized ones included (they are buffers, not
    parameters, in a frozen QuantLinear); LoRA factors are counted apart in ``adapter``."""
    from quarl.quant import QuantLinear

    n = sum(p.numel() for name, p in model.named_parameters() if "lora_A" not in name and "lora_B" not in name)
    return n + sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear)
                   and not isinstance(getattr(m, "weight", None), torch.nn.Parameter))  # fmt: skip


def _format_counts(layers: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in layers.values():
        out[spec] = out.get(spec, 0) + 1
    return out
