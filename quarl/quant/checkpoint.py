"""Quantized checkpoints in compressed-tensors' layout: write, check, and read back.

    save_quantized(model, tokenizer, dir, extra={...})   # config.json + *.safetensors + tokenizer
    check_checkpoint(dir) -> CheckpointInfo              # structure, shards, headers; raises CheckpointError
    load_quantized(dir) -> (model, tokenizer)            # rebuilds QuantLinear layers (quarl's own reader)

Layout. A calibrated model is saved the way llm-compressor saves one, so that
vLLM and ``transformers`` (through compressed-tensors) load it unchanged and
the export stage only has to verify it:

  * ``config.json`` carries ``quantization_config`` with ``quant_method:
    "compressed-tensors"``, one ``config_groups`` entry per weight format (a
    QuantizationScheme built with compressed-tensors' own classes, so the JSON
    is always schema-valid), the checkpoint ``format``
    (``nvfp4-pack-quantized`` | ``mxfp4-pack-quantized`` | ``pack-quantized`` |
    ``float-quantized``, or ``mixed-precision`` with a format per group) and an
    ``ignore`` list of the linears kept in high precision (``lm_head`` ...);
  * a uniform model targets ``["Linear"]``; a mixed one names every layer;
  * each quantized linear stores compressed-tensors' tensors:
    NVFP4 ``weight_packed`` uint8 / ``weight_scale`` e4m3 / ``weight_global_scale``;
    MXFP4 ``weight_packed`` / ``weight_scale`` uint8 (E8M0);
    INT-k ``weight_packed`` int32 / ``weight_scale`` / ``weight_zero_point``
    (packed along N) / ``weight_shape``; FP8 ``weight`` e4m3 / ``weight_scale``.
    quarl's formats already produce these bytes (see ``quarl/quant/formats``),
    so writing is a rename-free copy;
  * shards of at most ``max_shard_size`` with ``model.safetensors.index.json``
    (``huggingface_hub``'s splitter, as ``save_pretrained`` does);
  * ``quarl_quantization.json``: quarl's own record (format spec per layer,
    method, recipe). Our reader prefers it; without it (a checkpoint written by
    llm-compressor) the layer formats are derived from ``quantization_config``.

NF4 has no compressed-tensors representation (vLLM loads NF4 only from
bitsandbytes checkpoints). A model with NF4 layers is still saved -- same
tensor names, quarl's layout -- but its ``quantization_config`` says
``quant_method: "quarl"``: it is for quarl stages only, and the export stage
refuses it with that explanation.

Integrity. ``check_checkpoint`` catches what a crashed copy or a bad upload
leaves behind before any weight is used: a missing ``config.json`` or
``quantization_config``, a missing shard named by the index, a truncated
safetensors file (header length or data size disagreeing with the file size),
and tensors the index promises but no shard holds. Checksums are the artifact
manifest's job (``quarl.artifacts.open_artifact``).
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from quarl.quant.base import FormatConfig, QTensor, QuantError, available_formats, get_format
from quarl.quant.linear import QuantLinear
from quarl.quant.spec import make_config, spec_string

log = logging.getLogger(__name__)
QUARL_META = "quarl_quantization.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class CheckpointError(QuantError):
    """A checkpoint that is missing, partial, corrupt or not quantized as expected."""


# --- format <-> compressed-tensors scheme (each format module owns its mapping: Format.ct_*) ------------
def ct_representable(cfg: FormatConfig) -> str | None:
    """None if compressed-tensors can store ``cfg``, else the reason it cannot."""
    return get_format(cfg.name).ct_unrepresentable(cfg)


def ct_scheme(cfg: FormatConfig, targets: list[str]):
    """compressed-tensors ``QuantizationScheme`` for a quarl weight format (weight-only)."""
    why = ct_representable(cfg)
    if why:
        raise CheckpointError(f"cannot describe {spec_string(cfg)} in compressed-tensors: {why}")
    return get_format(cfg.name).ct_scheme(cfg, targets)


def format_from_scheme(scheme: dict) -> FormatConfig:
    """Inverse of :func:`ct_scheme` for a scheme dict read from config.json."""
    w = scheme.get("weights") or {}
    if scheme.get("input_activations"):
        raise CheckpointError(
            "activation-quantized compressed-tensors schemes (W*A*) are not supported by quarl's "
            "reader; load this checkpoint with vLLM or transformers"
        )
    for name in available_formats():
        try:
            cfg = get_format(name).from_ct_weights(w)
        except QuantError as e:
            raise CheckpointError(str(e)) from None
        if cfg is not None:
            return cfg
    raise CheckpointError(
        f"unsupported compressed-tensors weight scheme {w}; quarl reads nvfp4, mxfp4, "
        f"int group-wise and fp8 (tensor/block) weights"
    )


def to_ct_tensors(q: QTensor) -> dict[str, torch.Tensor]:
    """A QTensor's tensors under compressed-tensors' checkpoint names and layout."""
    return get_format(q.config.name).to_ct_tensors(q)


def from_ct_tensors(cfg: FormatConfig, shape: tuple[int, int], t: dict[str, torch.Tensor]) -> QTensor:
    """Inverse of :func:`to_ct_tensors` (unpacks INT zero points, drops ``weight_shape``)."""
    t = dict(t)
    t.pop("weight_shape", None)
    return QTensor(cfg, shape, get_format(cfg.name).from_ct_tensors(cfg, shape, t))


# --- writing ----------------------------------------------------------------------------
def _quant_layers(model: nn.Module) -> dict[str, QuantLinear]:
    out = {}
    for n, m in model.named_modules():
        if isinstance(m, QuantLinear):
            if m.mode != "frozen":
                raise CheckpointError(
                    f"{n} is a QAT layer; call .freeze() on it (or the model's QuantLinears) "
                    f"before saving a quantized checkpoint"
                )
            if m.lora_cfg is not None:
                raise CheckpointError(
                    f"{n} has a LoRA branch; save the adapter with quarl.quant.save_adapter and "
                    f"write the base without it (or merge and re-quantize on export)"
                )
            out[n] = m
    return out


def quantization_config(model: nn.Module) -> tuple[dict, dict[str, str]]:
    """(``quantization_config`` for config.json, layer -> format spec)."""
    from compressed_tensors.quantization import QuantizationConfig

    qlayers = _quant_layers(model)
    layers = {n: spec_string(m.config) for n, m in qlayers.items() if m.config is not None}
    dense = sorted(
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and not isinstance(m, QuantLinear)
        or (isinstance(m, QuantLinear) and m.config is None)
    )
    if not layers:
        raise CheckpointError("the model has no quantized layers; nothing to save as a quantized checkpoint")
    by_spec: dict[str, list[str]] = {}
    for n, s in layers.items():
        by_spec.setdefault(s, []).append(n)
    reasons = {s: ct_representable(make_config(s)) for s in by_spec}
    if any(reasons.values()):
        why = "; ".join(f"{s}: {r}" for s, r in reasons.items() if r)
        return {
            "quant_method": "quarl",
            "format": "quarl-packed",
            "layers": layers,
            "ignore": dense,
            "note": f"not a compressed-tensors checkpoint ({why}); read it with quarl.calibrate.load_quantized",
        }, layers
    groups = {}
    for i, (s, names) in enumerate(sorted(by_spec.items())):
        targets = ["Linear"] if len(by_spec) == 1 else sorted(names)
        groups[f"group_{i}"] = ct_scheme(make_config(s), targets)
    fmt = next(iter(groups.values())).format if len(groups) == 1 else "mixed-precision"
    qc = QuantizationConfig(config_groups=groups, format=fmt, ignore=dense, quantization_status="compressed")
    import compressed_tensors

    d = {
        "quant_method": "compressed-tensors",
        "version": compressed_tensors.__version__,
        **qc.model_dump(exclude={"quant_method"}, mode="json"),
    }
    return d, layers


def checkpoint_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor to save: dense params/buffers (tied copies once) + quantized layers in CT names."""
    qlayers = _quant_layers(model)
    sd: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict().items():
        mod = name.rpartition(".")[0]
        if mod in qlayers:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:  # tied (lm_head <-> embed_tokens): stored once, as save_pretrained does
            continue
        seen[key] = name
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        sd[name] = t.detach().contiguous()
    for name, m in qlayers.items():
        if m.config is None:
            sd[f"{name}.weight"] = m.weight.detach().to(dtype or m.weight.dtype).contiguous()
        else:
            for k, t in to_ct_tensors(m.qtensor()).items():
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
                # fused shards share one global-scale tensor in memory; safetensors wants copies
                sd[f"{name}.{k}"] = t.detach().clone() if key in seen else t.detach().contiguous()
                seen[key] = f"{name}.{k}"
        if m.bias is not None:
            sd[f"{name}.bias"] = m.bias.detach().to(dtype or m.bias.dtype).contiguous()
    return {k: v.cpu() for k, v in sd.items()}


def save_quantized(
    model: nn.Module,
    tokenizer,
    out_dir: str | Path,
    *,
    extra: dict | None = None,
    max_shard_size: str | int = "5GB",
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a compressed-tensors checkpoint (or quarl's, for NF4) of a model with QuantLinear layers."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    qcfg, layers = quantization_config(model)
    sd = checkpoint_state_dict(model, dtype)
    split = split_torch_state_dict_into_shards(sd, max_shard_size=max_shard_size)
    for fname, keys in split.filename_to_tensors.items():
        save_file({k: sd[k] for k in keys}, str(out / fname), metadata={"format": "pt"})
    if split.is_sharded:
        index = {
            "metadata": {**split.metadata, "total_size": sum(t.numel() * t.element_size() for t in sd.values())},
            "weight_map": split.tensor_to_filename,
        }
        (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    model.config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        try:
            model.generation_config.save_pretrained(out)
        except ValueError as e:  # an invalid generation config must not cost the checkpoint
            log.warning("not saving generation_config.json: %s", e)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    if dtype is not None:
        cfg["dtype"] = str(dtype).replace("torch.", "")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    meta = {"version": 1, "layers": layers, **(extra or {})}
    (out / QUARL_META).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
        _portable_tokenizer(out / "tokenizer_config.json")
    return out


def _portable_tokenizer(path: Path) -> None:
    """transformers 5 writes tokenizer_class "TokenizersBackend", unknown to 4.x (and to some
    vLLM images); "PreTrainedTokenizerFast" loads the same tokenizer.json in both."""
    if path.is_file():
        cfg = json.loads(path.read_text())
        if cfg.get("tokenizer_class") == "TokenizersBackend":
            cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
            path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


# --- checking ---------------------------------------------------------------------------
@dataclass
class CheckpointInfo:
    path: Path
    config: dict
    quantization_config: dict
    files: list[str]
    tensors: dict[str, tuple[str, str, list[int]]] = field(default_factory=dict)  # name -> (file, dtype, shape)

    @property
    def is_compressed_tensors(self) -> bool:
        return self.quantization_config.get("quant_method") == "compressed-tensors"


def _read_header(path: Path) -> dict:
    """safetensors header, checking that the file is as long as the header says."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(
                f"{path.name} is truncated ({size} bytes, not even a safetensors header); "
                f"re-copy or re-run the stage that wrote it"
            )
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(f"{path.name} is truncated: its header claims {n} bytes but the file has {size}")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path.name} has a corrupt safetensors header ({e})") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise CheckpointError(
            f"{path.name} is truncated or padded: tensors need {8 + n + end} bytes, the file "
            f"has {size}; re-copy or re-run the stage that wrote it"
        )
    return header


def check_checkpoint(path: str | Path, *, require_quantized: bool = True) -> CheckpointInfo:
    """Structural check of a (quantized) checkpoint directory; raises CheckpointError naming the problem."""
    d = Path(path)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {d} does not exist")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{d}: config.json is missing; this is not a model checkpoint")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{d}: config.json is not valid JSON ({e})") from None
    qcfg = cfg.get("quantization_config")
    if require_quantized and not qcfg:
        raise CheckpointError(
            f"{d}: config.json has no quantization_config, so no loader will know how the "
            f"weights are packed; re-run calibrate (or export) to rewrite the checkpoint"
        )
    if (d / INDEX).is_file():
        index = json.loads((d / INDEX).read_text())
        wmap = index.get("weight_map") or {}
        files = sorted(set(wmap.values()))
        missing = [f for f in files if not (d / f).is_file()]
        if missing:
            raise CheckpointError(f"{d}: shard(s) {missing} named in {INDEX} are missing; the checkpoint is partial")
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
        wmap = None
        if not files:
            raise CheckpointError(f"{d}: no *.safetensors weights found")
    info = CheckpointInfo(d, cfg, qcfg or {}, files)
    for f in files:
        for k, v in _read_header(d / f).items():
            if k != "__metadata__":
                info.tensors[k] = (f, v["dtype"], v["shape"])
    if not qcfg:
        packed = [k for k in info.tensors if k.endswith((".weight_packed", ".weight_scale"))]
        if packed:
            raise CheckpointError(
                f"{d}: holds quantized tensors (e.g. {packed[0]}) but config.json has no "
                f"quantization_config; the config was lost or overwritten -- restore it or re-run "
                f"calibrate"
            )
    if wmap is not None:
        lost = [k for k, f in wmap.items() if k not in info.tensors]
        if lost:
            raise CheckpointError(
                f"{d}: {len(lost)} tensor(s) listed in {INDEX} are in no shard "
                f"(e.g. {lost[:3]}); the checkpoint is partial"
            )
    return info


# --- reading ----------------------------------------------------------------------------
def layer_formats(info: CheckpointInfo, module_names: list[str]) -> dict[str, FormatConfig]:
    """layer -> FormatConfig, from quarl's record when present, else from quantization_config."""
    meta = info.path / QUARL_META
    if meta.is_file():
        layers = json.loads(meta.read_text()).get("layers") or {}
        return {n: make_config(s) for n, s in layers.items()}
    q = info.quantization_config
    if q.get("quant_method") != "compressed-tensors":
        raise CheckpointError(
            f"{info.path}: quant_method {q.get('quant_method')!r} without {QUARL_META}; cannot tell the layers' formats"
        )
    from compressed_tensors.utils.match import match_name

    ignore = q.get("ignore") or []
    out: dict[str, FormatConfig] = {}
    for scheme in (q.get("config_groups") or {}).values():
        cfg = format_from_scheme(scheme)
        for n in module_names:
            if n in out or any(match_name(n, i) for i in ignore):
                continue
            if any(t == "Linear" or match_name(n, t) for t in scheme.get("targets", [])):
                out[n] = cfg
    return out


def load_quantized(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Rebuild a model with QuantLinear layers from a quantized checkpoint -> ``(model, tokenizer)``.

    Reads what :func:`save_quantized` writes (and compressed-tensors checkpoints of
    the formats quarl has). ``dtype``: compute dtype of the model (default: the
    checkpoint's dense dtype). The model is built on the meta device and filled one
    decoder layer at a time straight onto ``device`` (:mod:`quarl.quant.stream`): the
    quantized layers take their stored codes and scales as they are, so no dense copy
    of the model exists at any point, on the host or the device -- a 32B NVFP4
    checkpoint needs its ~19 GiB, not the 61 GiB of its BF16 form."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from quarl.models.hf import check_architecture, prepare_tokenizer
    from quarl.quant.stream import TensorReader, build_streamed, checkpoint_filler, dense_dtype, empty_model

    d = Path(path)
    info = check_checkpoint(d)
    config = AutoConfig.from_pretrained(d)
    check_architecture(config, str(d))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = dtype or dense_dtype(info) or torch.float32
    model = empty_model(config, dtype)
    if (d / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(d)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    formats = layer_formats(info, linears)
    unknown = sorted(set(formats) - set(linears))
    if unknown:
        raise CheckpointError(f"{d}: quantized layers {unknown[:3]} do not exist in the {config.model_type} model")
    with TensorReader(info) as reader:
        report = build_streamed(model, checkpoint_filler(model, reader, device, dtype, packed=formats), None,
                                device=device)
        unexpected = reader.unused()
    if unexpected:
        raise CheckpointError(
            f"{d}: the weights do not fit the model: unexpected {unexpected[:5]} (config.json describes "
            f"another model, or the checkpoint was written by something else)"
        )
    model.eval()
    model.quarl_layers = {n: spec_string(c) for n, c in formats.items()}
    model.quarl_load = {"mode": "packed", **report.build}
    tok = AutoTokenizer.from_pretrained(d) if (d / "tokenizer_config.json").is_file() else None
    if tok is not None:
        prepare_tokenizer(tok, model, ref=str(d))
    return model, tok
