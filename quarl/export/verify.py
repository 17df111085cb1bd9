"""Verification of an export by the ecosystem's own readers, not by ours.

A quarl checkpoint is written by quarl and read back by quarl in every other
stage, so a symmetric bug (say, a nibble order swapped in both writer and
reader) would go unnoticed there. Here the export is decoded by the libraries
users run, and compared with the in-memory quantized model that produced it:

  1. compressed-tensors itself: every quantized layer's tensors go through the
     compressor its scheme names (``PackedQuantizationCompressor``,
     ``NVFP4PackedCompressor`` ...), the scheme picked by compressed-tensors'
     own target matching, into a plain dense transformers model. This works
     for any mix of schemes and is the check of the bytes;
  2. the users' path: ``AutoModelForCausalLM.from_pretrained(dir,
     quantization_config=CompressedTensorsConfig(dequantize=True))``. In
     transformers 5.x that path applies ONE scheme to every dense layer
     (``get_dense_scheme``), so it is run for single-scheme checkpoints and
     recorded as skipped for mixed-precision ones. (Its other route,
     ``dequantize=False``, cannot load asymmetric INT checkpoints with
     compressed-tensors 0.20: on the meta device its compressor leaves the
     zero point unpacked, so the packed tensor mismatches; vLLM and the
     decompressors expect it packed, as we write it.)

Checks:

  * weights, element by element: ``|W_ct - W_quarl| <= rtol * |W_quarl|``.
    compressed-tensors decompresses INT and FP8 weights in float32 (identical
    arithmetic: rtol 1e-6) but FP4 in bfloat16 (``unpack_fp4_from_uint8``'s
    default dtype): E2M1 x E4M3/global-scale goes through two bfloat16
    roundings, so NVFP4 gets rtol 2^-7 (MXFP4's power-of-two scales happen to
    be exact). A wrong byte is a whole quantization step (>= 1/3 relative for
    E2M1, 1/(2^bits - 1) of the range for INT), so this check cannot miss one;
  * logits on a fixed prompt: ``max|delta| <= atol + rtol * max|logits|``.
    The bfloat16 weight rounding accumulates through the layers: SmolLM2-135M
    NVFP4 gave 0.36 on logits of magnitude 33 with an older compressed-tensors,
    but 2.5 on 28 (95% argmax agreement) with 0.20, past FP4's loose logit rtol
    of 5e-2, with no byte of the export wrong. So when the loader's FP4 weights
    are bfloat16 values (``loader_rounding``: 0.20 stores each as quarl's weight
    rounded once), quarl's model is run under that same rounding
    (``fp4_weights_rounded``) and held to the float32 rtol of 1e-5 -- the logits
    then check the architecture and config, not the loader's precision; the
    unrounded difference is still reported. The 5e-2 rtol remains for a loader
    that rounds otherwise.
The measured errors go into the report and the model card whatever they are.

A PEFT adapter is checked the same way: ``peft.PeftModel.from_pretrained``
on the decompressed HF model must give the logits of quarl's QuantLinear
model with the adapter's LoRA branches loaded.
"""

from __future__ import annotations

import contextlib
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


def _config_and_tensors(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    cfg = json.loads((path / "config.json").read_text())
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return cfg, sd


def load_with_compressed_tensors(path: str | Path, dtype: torch.dtype = torch.float32):
    """A plain dense HF model whose quantized weights were decompressed by compressed-tensors itself.

    The skeleton comes from transformers (``from_config``); each quantized linear's
    tensors go through the compressor its scheme names
    (``BaseCompressor.get_value_from_registry(format).decompress``), the scheme being
    chosen by compressed-tensors' own matching (``match_named_modules`` /
    ``match_targets``, ignore list honoured) -- what ``apply_quantization_config`` +
    ``decompress_model`` do, for any mix of schemes. (transformers' ``dequantize=True``
    path applies one scheme to every dense layer; it is checked separately, where it
    applies, by :func:`load_with_transformers`.)
    """
    from collections import OrderedDict

    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import match_named_modules, match_targets
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    path = Path(path)
    raw_cfg, sd = _config_and_tensors(path)
    qc = raw_cfg.get("quantization_config")
    config = AutoConfig.from_pretrained(str(path))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if qc:
        try:
            qcfg = QuantizationConfig.model_validate(qc)
        except Exception as e:  # (pydantic's message says what is wrong)
            raise ExportError(f"{path}: compressed-tensors rejects the quantization_config: {e}") from e
        target_to_scheme = OrderedDict((t, sch) for sch in qcfg.config_groups.values() for t in sch.targets)
        for name, module in list(match_named_modules(model, target_to_scheme, qcfg.ignore)):
            scheme = target_to_scheme[match_targets(name, module, target_to_scheme)[0]]
            local = {k[len(name) + 1 :]: sd.pop(k) for k in [k for k in sd if k.startswith(name + ".")]}
            bias = local.pop("bias", None)
            fmt = scheme.format or qcfg.format
            try:
                out = BaseCompressor.get_value_from_registry(fmt).decompress(local, scheme)
            except Exception as e:  # (a layout compressed-tensors cannot read is the finding)
                raise ExportError(
                    f"{path}: compressed-tensors cannot decompress {name} ({fmt}): {type(e).__name__}: {e}"
                ) from e
            sd[f"{name}.weight"] = out["weight"].to(dtype)
            if bias is not None:
                sd[f"{name}.bias"] = bias
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        missing = [k for k in missing if not k.startswith("lm_head")]
    if missing or unexpected:
        raise ExportError(
            f"{path}: after decompression the weights do not fit {type(model).__name__}: "
            f"missing {missing[:5]}, unexpected {list(unexpected)[:5]}"
        )
    return model.eval()


def load_with_transformers(path: str | Path, dtype: torch.dtype = torch.float32):
    """What users run: ``AutoModelForCausalLM.from_pretrained(dir, quantization_config=
    CompressedTensorsConfig(dequantize=True))`` (a plain load for a dense checkpoint)."""
    from transformers import AutoModelForCausalLM

    kw = {}
    if json.loads((Path(path) / "config.json").read_text()).get("quantization_config"):
        from transformers import CompressedTensorsConfig

        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    try:
        with warnings.catch_warnings():  # "the model's quantization_config will be used": yes, on purpose
            warnings.filterwarnings("ignore", message="You passed `quantization_config`")
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw)
    except Exception as e:  # (any loader failure means users cannot load it: say so)
        raise ExportError(f"transformers cannot load the export at {path}: {type(e).__name__}: {str(e)[:2000]}") from e
    return model.eval()


def transformers_can_dequantize(path: str | Path) -> bool:
    """transformers 5.x's dequantize=True path applies ONE scheme to all dense layers
    (``get_dense_scheme``): it serves single-scheme checkpoints, not mixed-precision ones."""
    qc = json.loads((Path(path) / "config.json").read_text()).get("quantization_config") or {}
    return len(qc.get("config_groups") or {}) <= 1


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
def loader_rounding(ours: nn.Module, theirs: nn.Module) -> torch.dtype | None:
    """``torch.bfloat16`` when the loader stored every FP4 layer's decompressed weight in bfloat16
    (compressed-tensors 0.20 does: the reloaded weight is quarl's dequantized weight rounded once to
    bfloat16, element for element), else None. That one rounding per weight moves a whole model's
    logits (SmolLM2: 2.5 of a max logit 28, 95% argmax agreement) without any byte of the export
    being wrong, so the logits are then compared against quarl's model under the same rounding."""
    mods = dict(theirs.named_modules())
    fp4 = [name for name, m in ours.named_modules() if isinstance(m, QuantLinear) and m.format_name in FP4]
    for name in fp4:
        w = getattr(mods.get(name), "weight", None)
        if w is None or not torch.equal(w.float(), w.to(torch.bfloat16).float()):
            return None
    return torch.bfloat16 if fp4 else None


@contextlib.contextmanager
def fp4_weights_rounded(model: nn.Module, dtype: torch.dtype | None):
    """Within the block, ``model``'s FP4 QuantLinears dequantize through ``dtype`` (the loader's storage)."""
    patched = []
    if dtype is not None:
        for m in model.modules():
            if isinstance(m, QuantLinear) and m.format_name in FP4:
                exact = m.dequantized_weight
                m.dequantized_weight = lambda out, exact=exact: exact(torch.float32).to(dtype).to(out)
                patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.dequantized_weight  # the instance attribute goes; the method shows again


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
    """Reload ``path`` by compressed-tensors (and transformers, where it can) and compare with ``ours``.

    Raises ExportError when a layer decodes differently or the logits leave the tolerance."""
    theirs = load_with_compressed_tensors(path)
    fp4 = _has_fp4(ours)
    lrtol = rtol_fp4 if fp4 else rtol
    weights = compare_weights(ours, theirs, rtol=weights_rtol, rtol_fp4=weights_rtol_fp4)
    rounding = loader_rounding(ours, theirs) if fp4 else None
    if rounding is not None:  # the loader's one rounding per weight, reproduced: then only summation order differs
        lrtol = rtol
        unrounded = compare_logits(ours, theirs, ids)
    with fp4_weights_rounded(ours, rounding):
        logits = compare_logits(ours, theirs, ids)
    del theirs
    tol = atol + lrtol * logits["max_logit"]
    if rounding is not None:
        why = ("FP4 layers stored by the loader in bfloat16 (each weight = quarl's rounded once, checked element for "
               "element): logits compared with quarl's model under the same rounding")
    elif fp4:
        why = "FP4 layers present: compressed-tensors decompresses FP4 in bfloat16"
    else:
        why = "float32 decompression: only summation order differs"
    report = {
        "loader": "compressed-tensors compressors (per-layer scheme) into a transformers model",
        "tolerance": {
            "logits_max_abs": tol,
            "atol": atol,
            "rtol": lrtol,
            "weights_elem_rtol": weights_rtol_fp4 if fp4 else weights_rtol,
            "why": why,
        },
        "weights": weights,
        "logits": logits,
        "tokens": int(ids.numel()),
    }
    if rounding is not None:
        report["loader_rounding"] = {"dtype": str(rounding).replace("torch.", ""), "logits_vs_unrounded": unrounded}
    if weights["failed_layers"]:
        raise ExportError(
            f"export at {path}: compressed-tensors decodes different weights than quarl in "
            f"{len(weights['failed_layers'])} layer(s), e.g. {weights['failed_layers'][:3]} (max "
            f"element-wise relative delta {weights['max_elem_rel']:.3g}); not publishing it"
        )
    if transformers_can_dequantize(path):  # the users' own loading path must work as well
        hf = load_with_transformers(path)
        with fp4_weights_rounded(ours, rounding if rounding is not None and loader_rounding(ours, hf) else None):
            tl = compare_logits(ours, hf, ids)
        del hf
        report["transformers"] = {
            "loader": "AutoModelForCausalLM.from_pretrained + CompressedTensorsConfig(dequantize=True)",
            "logits": tl,
        }
    else:
        report["transformers"] = {
            "skipped": "mixed-precision: transformers' dequantize path applies one scheme to all dense layers; "
            "compressed-tensors (above) and vLLM read the schemes per layer"
        }
    worst = max(logits["max_abs"], report["transformers"].get("logits", {}).get("max_abs", 0.0))
    report["passed"] = worst <= tol
    if not report["passed"]:
        tf = report["transformers"].get("logits", {}).get("max_abs")
        raise ExportError(
            f"export at {path} does not reproduce the model: max |logit delta| {worst:.4g} > tolerance "
            f"{tol:.4g} (compressed-tensors load: {logits['max_abs']:.4g}, argmax agreement "
            f"{logits['argmax_agreement']:.3f}; transformers load: {'skipped' if tf is None else f'{tf:.4g}'}); "
            f"not publishing it"
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
    fp4 = _has_fp4(ours_with_lora)
    rounding = loader_rounding(ours_with_lora, base) if fp4 else None  # as in verify_checkpoint (before PEFT wraps)
    try:
        peft_model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    except Exception as e:
        raise ExportError(f"PEFT cannot load the exported adapter {adapter_dir}: {type(e).__name__}: {e}") from e
    rtol = rtol_fp4 if fp4 and rounding is None else rtol
    with fp4_weights_rounded(ours_with_lora, rounding):
        logits = compare_logits(ours_with_lora, peft_model, ids)
    tol = atol + rtol * logits["max_logit"]
    rep = {
        "loader": "peft.PeftModel.from_pretrained on the decompressed base",
        "logits": logits,
        "tolerance": {"logits_max_abs": tol, "atol": atol, "rtol": rtol},
        "passed": logits["max_abs"] <= tol,
    }
    if rounding is not None:
        rep["loader_rounding"] = {"dtype": str(rounding).replace("torch.", "")}
    if not rep["passed"]:
        raise ExportError(
            f"adapter {adapter_dir} through PEFT does not reproduce quarl's LoRA model: max |logit "
            f"delta| {logits['max_abs']:.4g} > {tol:.4g}"
        )
    return rep
