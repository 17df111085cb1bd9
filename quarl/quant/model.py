"""quantize_model: swap a model's nn.Linear layers for QuantLinear according to a recipe.

A recipe is plain data (YAML/JSON/dict) so that a search stage can write one:

    default: nvfp4                 # format spec for every eligible linear layer
    overrides:                     # first matching pattern wins
      - {pattern: "*.mlp.down_proj", format: int8}
      - {pattern: "re:model\\.layers\\.0\\..*", format: bf16}
    exclude: ["lm_head", "*embed_tokens*"]   # never touched (high precision)
    mode: frozen                   # or qat (trainable master weight, fake-quant)
    act_quant: null                # or fp8-1x128 (Jet-RL activations)
    fp8_wgrad: 1x128               # FP8 flow, master weights: X^T's grouping in WGrad (1x128 | tiles)
    lora: {r: 32, alpha: 64, dropout: 0.0, targets: [q_proj, ...]}   # or null
    share_fused_scales: true       # q/k/v and gate/up share NVFP4's global scale

Patterns are fnmatch globs on the module's qualified name (a bare name such as
``lm_head`` also matches as a suffix), or regexes prefixed with ``re:``.

Shards that vLLM fuses (q/k/v, gate/up) must share one NVFP4 global scale or the
fused checkpoint cannot be represented; ``share_fused_scales`` computes the
per-tensor state over the shards together (any format whose ``tensor_state`` is
non-empty takes part).

After quantize_model, with LoRA on, only LoRA parameters require grad: the base,
embeddings, norms and lm_head are frozen.
"""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quarl.quant.base import QuantError, get_format
from quarl.quant.linear import WGRAD_MODES, LoRAConfig, QuantLinear
from quarl.quant.spec import make_config, spec_string

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass
class QuantRecipe:
    default: Any = "nvfp4"
    overrides: list[dict] = field(default_factory=list)
    exclude: list[str] = field(default_factory=lambda: ["lm_head", "*embed_tokens*"])
    mode: str = "frozen"
    act_quant: str | None = None
    fp8_wgrad: str = "1x128"  # quarl.quant.fp8_linear.WGRAD_MODES
    lora: dict | None = None
    share_fused_scales: bool = True

    @classmethod
    def load(cls, src: QuantRecipe | dict | str | Path | None) -> QuantRecipe:
        if src is None:
            return cls()
        if isinstance(src, QuantRecipe):
            return src
        if isinstance(src, (str, Path)):
            p = Path(src)
            if not p.exists():
                raise QuantError(f"quantization recipe file {p} not found")
            import yaml

            src = yaml.safe_load(p.read_text()) or {}
        if not isinstance(src, dict):
            raise QuantError(f"a quantization recipe must be a mapping, got {type(src).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = set(src) - known
        if unknown:
            raise QuantError(f"unknown quantization recipe keys {sorted(unknown)}; valid keys: {sorted(known)}")
        r = cls(**src)
        for o in r.overrides:
            if not isinstance(o, dict) or "pattern" not in o or "format" not in o:
                raise QuantError(f"each override needs 'pattern' and 'format', got {o!r}")
            make_config(o["format"])  # validate early: a typo should fail before any work
        make_config(r.default)
        if r.fp8_wgrad not in WGRAD_MODES:
            raise QuantError(f"recipe fp8_wgrad must be one of {WGRAD_MODES}, got {r.fp8_wgrad!r}")
        return r

    def to_dict(self) -> dict:
        return asdict(self)

    def lora_config(self) -> LoRAConfig | None:
        return None if self.lora is None else LoRAConfig(**self.lora)


def _match(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*." + pattern)


def plan_formats(model: nn.Module, recipe: QuantRecipe) -> dict[str, Any]:
    """name -> FormatConfig (None = keep high precision) for every nn.Linear not excluded."""
    plan = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or isinstance(mod, QuantLinear):
            continue
        if any(_match(name, p) for p in recipe.exclude):
            continue
        spec = next((o["format"] for o in recipe.overrides if _match(name, o["pattern"])), recipe.default)
        plan[name] = make_config(spec)
    return plan


def _shared_states(model: nn.Module, plan: dict[str, Any]) -> dict[str, dict]:
    """Per-tensor state shared across fused shards (same parent, same format)."""
    states: dict[str, dict] = {}
    mods = dict(model.named_modules())
    for name, cfg in plan.items():
        if cfg is None or name in states:
            continue
        parent, _, leaf = name.rpartition(".")
        group = next((g for g in FUSED_GROUPS if leaf in g), None)
        if group is None:
            continue
        members = [f"{parent}.{g}" if parent else g for g in group]
        members = [m for m in members if m in plan and plan[m] == cfg]
        if len(members) < 2:
            continue
        fmt = get_format(cfg.name)
        w = torch.cat([mods[m].weight.detach() for m in members], dim=0)
        st = fmt.tensor_state(w, cfg)
        if st:
            for m in members:
                states[m] = st
    return states


@dataclass
class QuantReport:
    layers: dict[str, str]  # name -> format spec
    memory: dict
    build: dict | None = None  # quarl.quant.stream.build_streamed: peak / dense / final bytes, layers, seconds

    def summary(self) -> str:
        m = self.memory
        lines = [f"{'format':<14}{'params':>14}{'MiB':>10}{'bits/param':>12}"]
        for fmt, row in sorted(m["by_format"].items()):
            lines.append(f"{fmt:<14}{row['params']:>14,}{row['bytes'] / 2**20:>10.2f}{row['bits_per_param']:>12.3f}")
        lines.append(f"{'total':<14}{m['total_params']:>14,}{m['total_bytes'] / 2**20:>10.2f}"
                     f"{8 * m['total_bytes'] / max(m['total_params'], 1):>12.3f}")
        return "\n".join(lines)


def quantize_model(model: nn.Module, recipe: QuantRecipe | dict | str | Path | None = None) -> QuantReport:
    """Replace eligible nn.Linear layers in place; returns what was done and the memory."""
    recipe = QuantRecipe.load(recipe)
    plan = checked_plan(model, recipe)
    quantize_planned(model, plan, recipe)
    finish_quantized(model, recipe)
    return QuantReport(layers={n: spec_string(c) for n, c in plan.items()}, memory=memory_report(model))


def checked_plan(model: nn.Module, recipe: QuantRecipe) -> dict[str, Any]:
    """:func:`plan_formats`, refusing an empty plan with the reason (works on a meta-device model too)."""
    plan = plan_formats(model, recipe)
    if not plan:
        if any(isinstance(m, QuantLinear) for m in model.modules()):
            raise QuantError("the model is already quantized (a calibrated checkpoint?); add LoRA to it with "
                             "quarl.quant.lora.attach_lora instead of quantizing it again")
        raise QuantError("the recipe selects no linear layers: check 'exclude' and the model")
    return plan


def quantize_planned(model: nn.Module, plan: dict[str, Any], recipe: QuantRecipe) -> None:
    """Swap the planned layers (qualified names in ``model``) for QuantLinear, fused shards sharing
    their per-tensor state. A part of a whole model's plan gives the same layers as the whole plan
    as long as it holds whole parents (q/k/v and gate/up decide their shared scale together):
    :func:`quarl.quant.stream.build_streamed` passes one decoder layer's part at a time."""
    lora = recipe.lora_config()
    states = _shared_states(model, plan) if recipe.share_fused_scales else {}
    for name, cfg in plan.items():
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        lin = getattr(parent, leaf)
        layer_lora = lora if lora is not None and leaf in lora.targets else None
        try:
            q = QuantLinear.from_linear(lin, cfg, mode=recipe.mode, lora=layer_lora,
                                        act_quant=recipe.act_quant, state=states.get(name), fp8_wgrad=recipe.fp8_wgrad)
        except QuantError as e:
            raise QuantError(f"layer {name}: {e}") from None
        setattr(parent, leaf, q)


def finish_quantized(model: nn.Module, recipe: QuantRecipe) -> None:
    """After every planned layer is swapped: freeze what the recipe does not train, record the recipe."""
    lora = recipe.lora_config()
    if lora is not None or recipe.mode == "frozen":
        for n, p in model.named_parameters():
            trainable = (lora is not None and ("lora_A" in n or "lora_B" in n)) or (
                recipe.mode == "qat" and n.endswith(".weight") and isinstance(model.get_submodule(n.rsplit(".", 1)[0]), QuantLinear))
            p.requires_grad_(trainable)
    model.quarl_recipe = recipe.to_dict()  # travels with the model to export


def memory_report(model: nn.Module) -> dict:
    """Bytes and parameters by storage format; LoRA and other tensors by dtype."""
    by: dict[str, dict] = defaultdict(lambda: {"params": 0, "bytes": 0})
    seen: set[int] = set()

    def add(key: str, params: int, nbytes: int):
        by[key]["params"] += params
        by[key]["bytes"] += nbytes

    for mod_name, mod in model.named_modules():
        if isinstance(mod, QuantLinear) and mod.mode == "frozen" and mod.config is not None:
            q = mod.qtensor()
            for t in q.tensors.values():
                seen.add(id(t))
            add(spec_string(mod.config), mod.in_features * mod.out_features, q.nbytes)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) in seen or not torch.is_tensor(t):
            continue
        seen.add(id(t))
        kind = "lora" if ("lora_A" in name or "lora_B" in name) else str(t.dtype).replace("torch.", "")
        add(kind, t.numel(), t.numel() * t.element_size())
    for row in by.values():
        row["bits_per_param"] = 8 * row["bytes"] / max(row["params"], 1)
    total_b = sum(r["bytes"] for r in by.values())
    total_p = sum(r["params"] for k, r in by.items() if k != "lora")
    return {"by_format": dict(by), "total_bytes": total_b, "total_params": total_p}


def quantized_formats(model: nn.Module) -> list[str]:
    """The format specs (``spec_string``) of the model's quantized linear layers, sorted; [] if none."""
    return sorted({spec_string(m.config) for m in model.modules() if isinstance(m, QuantLinear) and m.config})
