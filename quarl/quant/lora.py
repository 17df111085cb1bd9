"""LoRA adapters in PEFT's on-disk format.

quarl keeps its own LoRA branch inside QuantLinear (so the quantized base and the
adapter live in one module and one kernel call), but adapters are written exactly
as PEFT writes them -- ``adapter_config.json`` (via ``peft.LoraConfig``) and
``adapter_model.safetensors`` with keys
``base_model.model.<module path>.lora_{A,B}.weight`` -- so that
``peft.PeftModel.from_pretrained(full_precision_base, dir)`` loads them unchanged
and vLLM serves them.

The adapter is trained on the *quantized* base; loading it onto the
full-precision base is what PEFT users will do, and is the QLoRA deployment
trade-off (the quantization error is not undone by the adapter).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from quarl.quant.base import QuantError
from quarl.quant.linear import LoRAConfig, QuantLinear

PREFIX = "base_model.model."
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def lora_layers(model: nn.Module) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.lora_cfg is not None}


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    sd = {}
    for name, m in lora_layers(model).items():
        sd[f"{PREFIX}{name}.lora_A.weight"] = m.lora_A.detach().contiguous()
        sd[f"{PREFIX}{name}.lora_B.weight"] = m.lora_B.detach().contiguous()
    return sd


def save_adapter(model: nn.Module, out_dir: str | Path, base_model_name_or_path: str = "", dtype=None) -> Path:
    """Write a PEFT adapter directory for every QuantLinear that has a LoRA branch."""
    from peft import LoraConfig

    layers = lora_layers(model)
    if not layers:
        raise QuantError("the model has no LoRA layers to save; quantize it with a recipe that sets 'lora'")
    cfg = next(iter(layers.values())).lora_cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    targets = sorted({n.rsplit(".", 1)[-1] for n in layers})
    LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
               task_type="CAUSAL_LM", bias="none", base_model_name_or_path=base_model_name_or_path or None,
               ).save_pretrained(str(out))
    sd = lora_state_dict(model)
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    save_file(sd, str(out / WEIGHTS), metadata={"format": "pt"})
    return out


def read_adapter_config(adapter_dir: str | Path) -> LoRAConfig:
    import json

    p = Path(adapter_dir) / CONFIG
    if not p.exists():
        raise QuantError(f"{adapter_dir} is not a PEFT adapter: {CONFIG} is missing")
    c = json.loads(p.read_text())
    if c.get("peft_type", "LORA") != "LORA":
        raise QuantError(f"{adapter_dir}: only LoRA adapters are supported, got peft_type={c.get('peft_type')}")
    targets = c.get("target_modules") or []
    if isinstance(targets, str):
        raise QuantError(f"{adapter_dir}: regex target_modules are not supported; list the module names")
    return LoRAConfig(r=c["r"], alpha=c["lora_alpha"], dropout=c.get("lora_dropout", 0.0), targets=list(targets))


def load_adapter(model: nn.Module, adapter_dir: str | Path, strict: bool = True) -> LoRAConfig:
    """Load PEFT LoRA weights into a quantized model's QuantLinear layers (adding the
    LoRA branch where the layer has none yet)."""
    adapter_dir = Path(adapter_dir)
    cfg = read_adapter_config(adapter_dir)
    wpath = adapter_dir / WEIGHTS
    if not wpath.exists():
        raise QuantError(f"{adapter_dir}: {WEIGHTS} is missing (a partial adapter?); re-export it")
    sd = load_file(str(wpath))
    mods = dict(model.named_modules())
    used = set()
    for key, t in sd.items():
        if not key.startswith(PREFIX) or not key.endswith(".weight"):
            raise QuantError(f"{adapter_dir}: unexpected key {key!r} in a PEFT LoRA adapter")
        name, which = key[len(PREFIX):-len(".weight")].rsplit(".", 1)
        which = which.split(".")[0]  # lora_A / lora_B (PEFT may write lora_A.default in old versions)
        m = mods.get(name)
        if not isinstance(m, QuantLinear):
            if strict:
                raise QuantError(f"adapter targets {name!r}, which is not a QuantLinear in this model "
                                 f"(quantize the model with the same targets first)")
            continue
        if m.lora_cfg is None:
            _add_lora(m, cfg)
        getattr(m, which).data.copy_(t.to(getattr(m, which).dtype))
        used.add(name)
    return cfg


def _add_lora(m: QuantLinear, cfg: LoRAConfig) -> None:
    """A fresh LoRA branch as PEFT initializes one: A Kaiming-uniform, B zero (a no-op until trained)."""
    dev, dt = next(m.buffers()).device, m.compute_dtype
    m.lora_cfg = cfg
    m.lora_A = nn.Parameter(torch.empty(cfg.r, m.in_features, device=dev, dtype=dt))
    nn.init.kaiming_uniform_(m.lora_A, a=math.sqrt(5))
    m.lora_B = nn.Parameter(torch.zeros(m.out_features, cfg.r, device=dev, dtype=dt))
    m.lora_dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()


def attach_lora(model: nn.Module, cfg: LoRAConfig, exclude: tuple[str, ...] = ("lm_head",),
                wrap_linear: bool = True) -> int:
    """Add LoRA to an *already quantized* model (e.g. a calibrated checkpoint): every
    QuantLinear whose leaf name is in ``cfg.targets`` gets a branch; a plain nn.Linear in
    the targets (a layer the recipe kept in high precision) is wrapped as a frozen
    high-precision QuantLinear first, unless ``wrap_linear=False`` (then the branches go
    exactly where ``quantize_model`` with a LoRA recipe puts them: on its planned layers).
    Everything but LoRA is frozen. Returns the layer count."""
    n = 0
    kinds = nn.Linear | QuantLinear if wrap_linear else QuantLinear
    for name, m in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in cfg.targets or leaf in exclude or not isinstance(m, kinds):
            continue
        if isinstance(m, nn.Linear):
            parent_name, _, _ = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            m = QuantLinear.from_linear(m, None)
            setattr(parent, leaf, m)
        if m.mode != "frozen":
            raise QuantError(f"{name}: LoRA needs a frozen base, got a {m.mode} layer")
        if m.lora_cfg is None:
            _add_lora(m, cfg)
        n += 1
    for pname, p in model.named_parameters():
        p.requires_grad_("lora_A" in pname or "lora_B" in pname)
    return n


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every QuantLinear by a plain nn.Linear with the LoRA merged (full precision)."""
    for name, m in list(model.named_modules()):
        if isinstance(m, QuantLinear):
            parent_name, _, leaf = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, leaf, m.to_linear(merge_lora=True))
    return model
