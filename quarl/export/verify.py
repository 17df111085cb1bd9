"""Verification of an export by the ecosystem's own readers, not by ours.

A quarl checkpoint is written by quarl and read back by quarl in every other
stage, so a symmetric bug (say, a nibble order swapped in both writer and
reader) would go unnoticed there. Here the export is loaded the way users will
load it -- ``transformers.AutoModelForCausalLM.from_pretrained`` with
``CompressedTensorsConfig(dequantize=True)``, which runs compressed-tensors'
own decompressors (``PackedQuantizationCompressor``, ``NVFP4PackedCompressor``
...) into a plain dense HF model -- and compared with the in-memory quantized
model that produced it:

  * weights, element by element: ``|W_ct - W_quarl| <= rtol * |W_quarl|``.
    compressed-tensors decompresses INT and FP8 weights in float32 (identical
    arithmetic: rtol 1e-6) but FP4 in bfloat16 (``unpack_fp4_from_uint8``'s
    default dtype): E2M1 x E4M3/global-scale goes through two bfloat16
    roundings, so NVFP4 gets rtol 2^-7 (MXFP4's power-of-two scales happen to
    be exact). A wrong byte is a whole quantization step (>= 1/3 relative for
    E2M1, 1/(2^bits - 1) of the range for INT), so this check cannot miss one;
  * logits on a fixed prompt: ``max|delta| <= atol + rtol * max|logits|``;
    the bfloat16 weight rounding accumulates through the layers (SmolLM2-135M
    NVFP4: 0.36 on logits of magnitude 33, i.e. 1.1%), hence FP4's looser
    logit rtol of 5e-2, against 1e-5 for float32 decompression.
The measured errors go into the report and the model card whatever they are.

A PEFT adapter is checked the same way: ``peft.PeftModel.from_pretrained``
on the decompressed HF model must give the logits of quarl's QuantLinear
model with the adapter's LoRA branches loaded.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

from quarl.quant.base import QuantError
from quarl.quant.linear import QuantLinear

FP4 = ("nvfp4", "mxfp4")


class ExportError(QuantError):
    """The export cannot be written or failed its own verification; the message has the numbers."""


def load_with_compressed_tensors(path: str | Path, dtype: torch.dtype = torch.float32):
    """A plain dense HF model from a checkpoint, decompressed by compressed-tensors (if quantized)."""
    from transformers import AutoModelForCausalLM

    kw = {}
    cfg = json.loads((Path(path) / "config.json").read_text())
    if cfg.get("quantization_config"):
        from transformers import CompressedTensorsConfig

        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    try:
        with warnings.catch_warnings():  # "the model's quantization_config will be used": yes, on purpose
            warnings.filterwarnings("ignore", message="You passed `quantization_config`")
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw)
    except Exception as e:
        raise ExportError(
            f"transformers/compressed-tensors cannot load the export at {path}: {type(e).__name__}: {e}"
        ) from e
    return model.eval()


def _has_fp4(model: nn.Module) -> bool:
    return any(isinstance(m, QuantLinear) and m.format_name in FP4 for m in model.modules())


@torch.no_grad()
def compare_weights(ours: nn.Module, theirs: nn.Module, *, rtol: float, rtol_fp4: float) -> dict:
    """Element-wise check of every quantized layer: |W_theirs - W_ours| <= rtol * |W_ours|.

    This is the guard that catches a wrong byte (a swapped nibble, a wrong scale): such an
    error is a whole quantization step, far above any rounding of the decompression."""
    worst_rel, worst, bad_layers, n = 0.0, None, [], 0
    mods = dict(theirs.named_modules())
    for name, m in ours.named_modules():
        if not isinstance(m, QuantLinear) or m.config is None:
            continue
        other = mods.get(name)
        if other is None or not hasattr(other, "weight"):
            raise ExportError(f"the reloaded export has no layer {name}")
        w = m.dequantized_weight(torch.float32)
        d = (other.weight.float() - w).abs()
        tol = (rtol_fp4 if m.format_name in FP4 else rtol) * w.abs()
        rel = float((d / w.abs().clamp(min=torch.finfo(torch.float32).tiny)).max())
        n += 1
        if bool((d > tol).any()):
            bad_layers.append(name)
        if rel > worst_rel:
            worst_rel, worst = rel, name
    return {"layers": n, "max_elem_rel": worst_rel, "worst_layer": worst, "failed_layers": bad_layers}


@torch.no_grad()
def compare_logits(ours: nn.Module, theirs: nn.Module, ids: torch.Tensor) -> dict:
    a = ours(input_ids=ids, use_cache=False).logits.float()
    b = theirs(input_ids=ids.to(next(theirs.parameters()).device), use_cache=False).logits.float().to(a.device)
    return {
        "max_abs": float((a - b).abs().max()),
        "max_logit": float(a.abs().max()),
        "argmax_agreement": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
    }


def verify_checkpoint(
    ours: nn.Module,
    path: str | Path,
    ids: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    rtol_fp4: float,
    weights_rtol: float,
    weights_rtol_fp4: float,
) -> dict:
    """Load ``path`` through compressed-tensors and compare with ``ours``; raise ExportError beyond tolerance."""
    theirs = load_with_compressed_tensors(path)
    fp4 = _has_fp4(ours)
    lrtol = rtol_fp4 if fp4 else rtol
    weights = compare_weights(ours, theirs, rtol=weights_rtol, rtol_fp4=weights_rtol_fp4)
    logits = compare_logits(ours, theirs, ids)
    tol = atol + lrtol * logits["max_logit"]
    report = {
        "loader": "transformers AutoModelForCausalLM + CompressedTensorsConfig(dequantize=True)",
        "tolerance": {
            "logits_max_abs": tol,
            "atol": atol,
            "rtol": lrtol,
            "weights_elem_rtol": weights_rtol_fp4 if fp4 else weights_rtol,
            "why": "FP4 layers present: compressed-tensors decompresses FP4 in bfloat16"
            if fp4
            else "float32 decompression: only summation order differs",
        },
        "weights": weights,
        "logits": logits,
        "tokens": int(ids.numel()),
    }
    report["passed"] = logits["max_abs"] <= tol and not weights["failed_layers"]
    del theirs
    if weights["failed_layers"]:
        raise ExportError(
            f"export at {path}: compressed-tensors decodes different weights than quarl in "
            f"{len(weights['failed_layers'])} layer(s), e.g. {weights['failed_layers'][:3]} (max "
            f"element-wise relative delta {weights['max_elem_rel']:.3g}); not publishing it"
        )
    if not report["passed"]:
        raise ExportError(
            f"export at {path} does not reproduce the model: max |logit delta| "
            f"{logits['max_abs']:.4g} > tolerance {tol:.4g}; not publishing it"
        )
    return report


# --- adapters -----------------------------------------------------------------------------
def check_adapter_files(adapter_dir: Path, model: nn.Module) -> dict:
    """PEFT structure: config parses, keys are PEFT's, targets exist, shapes fit the model."""
    from peft import LoraConfig
    from safetensors import safe_open

    cfg_p, w_p = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
    if not cfg_p.is_file() or not w_p.is_file():
        raise ExportError(
            f"adapter {adapter_dir} is partial: needs adapter_config.json and "
            f"adapter_model.safetensors (found {sorted(p.name for p in adapter_dir.iterdir())})"
        )
    try:
        lcfg = LoraConfig.from_pretrained(str(adapter_dir))
    except Exception as e:
        raise ExportError(f"adapter {adapter_dir}: adapter_config.json is not a valid PEFT LoRA config ({e})") from e
    mods = dict(model.named_modules())
    n = 0
    try:
        fh = safe_open(str(w_p), framework="pt", device="cpu")
    except Exception as e:
        raise ExportError(f"adapter {adapter_dir}: adapter_model.safetensors is corrupt or truncated ({e})") from e
    with fh:
        keys = list(fh.keys())
        for k in keys:
            if not k.startswith("base_model.model.") or not k.endswith((".lora_A.weight", ".lora_B.weight")):
                raise ExportError(f"adapter {adapter_dir}: key {k!r} is not a PEFT LoRA weight name")
            name, which = k[len("base_model.model.") : -len(".weight")].rsplit(".", 1)
            m = mods.get(name)
            if m is None or not hasattr(m, "in_features"):
                raise ExportError(f"adapter {adapter_dir}: targets {name!r}, which is not a linear layer of the model")
            shape = tuple(fh.get_slice(k).get_shape())
            want = (lcfg.r, m.in_features) if which == "lora_A" else (m.out_features, lcfg.r)
            if shape != want:
                raise ExportError(f"adapter {adapter_dir}: {k} has shape {shape}, expected {want} for this model")
            n += 1
    if not n:
        raise ExportError(f"adapter {adapter_dir} holds no LoRA weights")
    return {"r": lcfg.r, "alpha": lcfg.lora_alpha, "target_modules": sorted(lcfg.target_modules or []), "tensors": n}


def attach_adapter(model: nn.Module, adapter_dir: Path) -> None:
    """quarl's side: QuantLinear LoRA branches (dense target layers are wrapped as frozen QuantLinear)."""
    from safetensors import safe_open

    from quarl.quant import load_adapter

    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt", device="cpu") as fh:
        names = {k[len("base_model.model.") :].rsplit(".", 2)[0] for k in fh.keys()}  # noqa: SIM118
    for name in names:
        m = model.get_submodule(name)
        if isinstance(m, nn.Linear) and not isinstance(m, QuantLinear):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, QuantLinear.from_linear(m, None))
    load_adapter(model, adapter_dir)


@torch.no_grad()
def verify_adapter(
    ours_with_lora: nn.Module,
    checkpoint: Path,
    adapter_dir: Path,
    ids: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    rtol_fp4: float,
) -> dict:
    """PEFT on the compressed-tensors-decompressed base == quarl's base + LoRA, within tolerance."""
    from peft import PeftModel

    base = load_with_compressed_tensors(checkpoint)
    try:
        peft_model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    except Exception as e:
        raise ExportError(f"PEFT cannot load the exported adapter {adapter_dir}: {type(e).__name__}: {e}") from e
    rtol = rtol_fp4 if _has_fp4(ours_with_lora) else rtol
    logits = compare_logits(ours_with_lora, peft_model, ids)
    tol = atol + rtol * logits["max_logit"]
    rep = {
        "loader": "peft.PeftModel.from_pretrained on the decompressed base",
        "logits": logits,
        "tolerance": {"logits_max_abs": tol, "atol": atol, "rtol": rtol},
        "passed": logits["max_abs"] <= tol,
    }
    if not rep["passed"]:
        raise ExportError(
            f"adapter {adapter_dir} through PEFT does not reproduce quarl's LoRA model: max |logit "
            f"delta| {logits['max_abs']:.4g} > {tol:.4g}"
        )
    return rep
