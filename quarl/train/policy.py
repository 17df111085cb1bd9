"""Building the trained policy: device and dtype, quantized base + LoRA (or every weight), placement.

Shared by every stage that trains a policy (rl today; distill, kd_coldstart and
precision_search next): what a second trainer would otherwise copy from the RL
trainer. Moved here unchanged from ``quarl.rl.trainer``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from quarl import devices
from quarl.quant import (
    LoRAConfig,
    QuantLinear,
    QuantRecipe,
    QuantReport,
    attach_lora,
    make_config,
    memory_report,
    quantize_model,
    spec_string,
)

if TYPE_CHECKING:  # the policy section of a trainer's config (today quarl.rl.config.PolicyConfig)
    from quarl.rl.config import PolicyConfig

__all__ = ["base_recipe", "build_policy", "enable_gradient_checkpointing", "load_policy_model", "lora_disabled",
           "place_policy", "resolve_device", "resolve_dtype", "resolve_load"]


def resolve_device(name: str) -> torch.device:
    return devices.resolve_device(name, key="train.device")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    return devices.resolve_dtype(name, device, key="policy.dtype")


def place_policy(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Move the policy to ``device`` and cast it to ``dtype``, packed 4-bit weights excepted.

    A model can arrive already quantized (a calibrated checkpoint, or one quantized layer by
    layer to fit the GPU). ``QuantLinear._apply`` keeps its packed tensors (codes, E4M3
    block scales, FP32 global scale) in their storage dtypes under ``Module.to`` -- casting
    them would move every weight and take the GPU kernels out of play -- and makes ``dtype``
    the layers' compute dtype, so a plain ``to`` is right here; this name says why it is
    safe."""
    return model.to(device=device, dtype=dtype)


def base_recipe(cfg: PolicyConfig) -> dict:
    """The quantization :func:`build_policy` gives an unquantized base in mode=lora, LoRA left out:
    ``policy.quant_recipe`` when set, else ``{"default": policy.format}`` (normalized)."""
    recipe = dict(cfg.quant_recipe) if cfg.quant_recipe else {"default": cfg.format}
    return QuantRecipe.load({**recipe, "lora": None}).to_dict()


def resolve_load(cfg: PolicyConfig, device: torch.device) -> str:
    """``policy.load`` -> "dense" | "stream". auto: stream a quantized (frozen, some layer below 16
    bits) LoRA base on CUDA, where the dense model may not fit beside the step; dense elsewhere
    (same policy, and on CPU the host holds the dense model anyway)."""
    if cfg.load != "auto":
        return cfg.load
    if cfg.mode != "lora":
        return "dense"
    r = QuantRecipe.load(base_recipe(cfg))
    quantized = any(make_config(f) is not None for f in [r.default, *(o["format"] for o in r.overrides)])
    return "stream" if r.mode == "frozen" and quantized and torch.device(device).type == "cuda" else "dense"


def load_policy_model(ref, cfg: PolicyConfig, device: torch.device, dtype: torch.dtype):
    """The policy's base from a model reference -> ``(model, tokenizer, how)``; ``how`` is
    :func:`resolve_load`'s answer. Streamed, the base arrives quantized with :func:`base_recipe`
    and :func:`build_policy` only adds LoRA; dense, build_policy quantizes it. Same policy."""
    from quarl.models import load_model

    how = resolve_load(cfg, device)
    model, tok = load_model(ref, dtype=dtype, device=str(device), quantize=base_recipe(cfg) if how == "stream" else None)
    return model, tok, how


def build_policy(model: nn.Module, cfg: PolicyConfig) -> dict:
    """Quantize + LoRA (mode=lora) or unfreeze everything (mode=full), in place. Returns a small report.

    mode=lora meets three kinds of base: unquantized (quantized here with the policy's recipe + LoRA),
    quantized while loading with that same recipe (``load_policy_model`` streamed; LoRA added where
    ``quantize_model`` would have put it, in the same order, so the same seed gives the same adapter
    init), or a calibrated checkpoint in its own formats (kept; LoRA attached)."""
    if cfg.mode == "full":
        fmt = "bf16"
        if cfg.quant_recipe and cfg.quant_recipe.get("mode") == "qat":  # Jet-RL: master weights, FP8 GEMMs
            quantize_model(model, dict(cfg.quant_recipe, lora=None))
            fmt = f"{cfg.format} (qat)"
        for p in model.parameters():
            p.requires_grad_(True)
        return {"mode": "full", "format": fmt, "trainable_params": sum(p.numel() for p in model.parameters())}
    lora = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "dropout": cfg.lora_dropout, "targets": list(cfg.lora_targets)}
    base = base_recipe(cfg)
    if any(isinstance(m, QuantLinear) for m in model.modules()) and getattr(model, "quarl_recipe", None) == base:
        # Quantized while loading (policy.load=stream) with exactly this recipe: only LoRA is missing.
        attach_lora(model, LoRAConfig(**lora), exclude=(), wrap_linear=False)
        model.quarl_recipe = QuantRecipe.load({**base, "lora": lora}).to_dict()  # as quantize_model records it
        layers = {n: spec_string(m.config) for n, m in model.named_modules() if isinstance(m, QuantLinear)}
        report = QuantReport(layers=layers, memory=memory_report(model))
        fmt = cfg.format
    elif any(isinstance(m, QuantLinear) for m in model.modules()):
        # A calibrated checkpoint (quarl calibrate -> rl, the QeRL DAG): keep its weights, add LoRA.
        n = attach_lora(model, LoRAConfig(**lora))
        report = QuantReport(layers={f"{i}": "calibrated" for i in range(n)}, memory=memory_report(model))
        fmt = "calibrated checkpoint"
        if not getattr(model, "quarl_recipe", None):
            model.quarl_recipe = {"base": fmt, "layers": getattr(model, "quarl_layers", {})}
    else:
        fmt = cfg.format
        recipe = dict(cfg.quant_recipe) if cfg.quant_recipe else {"default": cfg.format}
        recipe["lora"] = lora
        report = quantize_model(model, recipe)
    for p in model.parameters():  # fp32 adapter weights (PEFT's default): a 1e-5 step vanishes in bf16
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise ValueError(f"no LoRA parameters were created: policy.lora_targets={cfg.lora_targets} match no "
                         f"quantized linear layer of this model")
    return {"mode": "lora", "format": fmt, "trainable_params": trainable, "layers": len(report.layers),
            "memory_bytes": report.memory["total_bytes"]}



def enable_gradient_checkpointing(model: nn.Module) -> None:
    """transformers' activation checkpointing, non-reentrant: it works although the inputs need no grad (LoRA on a
    frozen base)."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


@contextlib.contextmanager
def lora_disabled(model: nn.Module):
    """The frozen base policy (reference for the KL term): LoRA branches switched off."""
    stash = {}
    for name, m in model.named_modules():
        if isinstance(m, QuantLinear) and m.lora_cfg is not None:
            stash[name], m.lora_cfg = m.lora_cfg, None
    try:
        yield
    finally:
        mods = dict(model.named_modules())
        for name, c in stash.items():
            mods[name].lora_cfg = c
