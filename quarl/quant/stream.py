"""Building a model one decoder layer at a time, each layer quantized as it is built.

    model = empty_model(config, dtype)                        # parameters on the meta device: no memory
    report = build_streamed(model, fill, recipe, device=dev)  # fill(module, prefix) materializes one part
    fill = checkpoint_filler(model, reader, dev, dtype)       # ... from a checkpoint's safetensors shards
    model, report = load_streamed(dir, config, recipe, dtype, dev)   # all of it for a HF-layout directory

Why. ``load_model`` + ``quantize_model`` holds the whole model in high precision before the
first layer is packed: 61 GiB of BF16 for a 32B model, which leaves an 80 GB GPU nothing for
the RL step (QeRL's headline is RL of a 32B model on one such GPU). Here the model starts on
the meta device (``accelerate.init_empty_weights``: parameters take no memory, the few
non-persistent buffers such as RoPE's ``inv_freq`` are real), the parts outside the decoder
layers (embeddings, final norm, LM head) are materialized first, then each decoder layer in
turn is materialized and its linears are swapped for ``QuantLinear`` before the next layer
exists. Peak = the final packed model + one layer in ``dtype`` + quantization temporaries
(measured on an H100 at the 32B shape: 23.0 GiB while building, 19.3 GiB after; see
benchmarks/RESULTS.md, "the 32B memory step").

Same model as the dense route, byte for byte (tested): the plan is made on the whole meta
model with ``quarl.quant.model.plan_formats`` -- so recipe patterns see the full qualified
names -- and each layer's part of it goes through ``quantize_planned``, the code
``quantize_model`` runs; fused shards (q/k/v, gate/up) sit in one layer, so their shared
NVFP4 global scale is the same. LoRA is not part of a streamed build: the trainer attaches it
afterwards in the order ``quantize_model`` would have (``quarl.train.policy.build_policy``).

A fill is ``fill(module, prefix)``: make every meta tensor of ``module`` (whose qualified
name is ``prefix``) real, on ``device``, in ``dtype``. :func:`checkpoint_filler` reads each
tensor on its own from the shards (``safetensors.safe_open`` memory-maps a file and copies out
only the tensor asked for), checking names and shapes against the model config.json describes;
with ``packed=`` it builds a calibrated checkpoint's quantized layers straight from their
stored codes and scales (``quarl.quant.checkpoint.load_quantized``). The GRPO benchmark passes
a fill that draws seeded random weights instead (benchmarks/grpo_step_gpu.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import Any, Self

import torch
from torch import nn

from quarl.quant.base import FormatConfig, QuantError
from quarl.quant.checkpoint import CheckpointError, CheckpointInfo, check_checkpoint, from_ct_tensors
from quarl.quant.linear import QuantLinear
from quarl.quant.model import QuantRecipe, QuantReport, checked_plan, finish_quantized, memory_report, quantize_planned
from quarl.quant.spec import spec_string

log = logging.getLogger(__name__)
Fill = Callable[[nn.Module, str], None]
_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def empty_model(config, dtype: torch.dtype) -> nn.Module:
    """The causal LM ``config`` describes with every parameter on the meta device (buffers real)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(qualified name, ModuleList) of the decoder layers (``model.layers`` in llama/qwen2/qwen3)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name.rpartition(".")[2] == "layers":
            return name, mod
    raise QuantError(f"{type(model).__name__} has no '.layers' ModuleList of decoder layers to build one by one")


def _meta_owned(mod: nn.Module) -> bool:
    return any(t is not None and t.is_meta for t in chain(mod._parameters.values(), mod._buffers.values()))


def materialized_bytes(model: nn.Module) -> int:
    """Bytes of the model's real (non-meta) parameters and buffers, each tensor once."""
    seen, total = set(), 0
    for t in chain(model.parameters(), model.buffers()):
        if id(t) not in seen and not t.is_meta:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _planned_bytes(model: nn.Module) -> int:
    """Bytes of the whole model in its construction dtype: what a dense build holds at its end."""
    seen, total = set(), 0
    for t in chain(model.parameters(), model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


@torch.no_grad()
def materialize_stem(model: nn.Module, fill: Fill) -> None:
    """Fill every meta tensor outside the decoder layers (embeddings, rotary, final norm, LM head),
    leaving the layers on the meta device. The input embeddings go first so that a tied LM head
    can share them instead of being read (the dense load ties them the same way)."""
    layers_name, _ = decoder_layers(model)
    emb = model.get_input_embeddings()
    owners = [(n, m) for n, m in model.named_modules()
              if not n.startswith(layers_name + ".") and n != layers_name and _meta_owned(m)]
    owners.sort(key=lambda nm: nm[1] is not emb)
    for name, mod in owners:
        if not _meta_owned(mod):
            continue  # the tied head, already sharing the embeddings
        fill(mod, name)
        if mod is emb and getattr(model.config, "tie_word_embeddings", False):
            head = model.get_output_embeddings()
            if head is not None:
                head.weight = model.get_input_embeddings().weight


@torch.no_grad()
def build_streamed(model: nn.Module, fill: Fill, recipe: QuantRecipe | dict | None = None, *,
                   device: str | torch.device = "cpu") -> QuantReport:
    """Materialize a meta-device ``model`` part by part with ``fill``, quantizing each decoder layer
    with ``recipe`` (a frozen quarl.quant recipe without LoRA; ``None`` = keep ``dtype``) before
    the next is built. In place; returns the recipe's report plus ``build`` (bytes and seconds)."""
    t0 = time.perf_counter()
    dev = torch.device(device)
    recipe = None if recipe is None else QuantRecipe.load(recipe)
    if recipe is not None and (recipe.lora is not None or recipe.mode != "frozen"):
        raise QuantError("a streamed build packs frozen weights as it goes: give it a recipe with mode=frozen and "
                         "no lora (LoRA is attached afterwards; QAT keeps dense master weights and cannot stream)")
    plan = checked_plan(model, recipe) if recipe is not None else {}
    layers_name, layers = decoder_layers(model)
    dense_bytes = _planned_bytes(model)

    def inside(name: str, prefix: str) -> bool:
        return name.startswith(prefix + ".")

    # 1. Everything outside the decoder layers: small next to them (embeddings, final norm, LM head).
    materialize_stem(model, fill)
    if recipe is not None:
        quantize_planned(model, {n: c for n, c in plan.items() if not inside(n, layers_name)}, recipe)
    peak = materialized_bytes(model)

    # 2. The decoder layers, one at a time: the high point is layer i in `dtype` beside i packed layers.
    n_layers = len(layers)
    for i in range(n_layers):
        prefix = f"{layers_name}.{i}"
        fill(layers[i], prefix)
        peak = max(peak, materialized_bytes(model))
        if recipe is not None:
            quantize_planned(model, {n: c for n, c in plan.items() if inside(n, prefix)}, recipe)
        if (i + 1) % max(1, n_layers // 8) == 0 or i + 1 == n_layers:
            log.info("built decoder layer %d/%d (%.2f GiB materialized)", i + 1, n_layers,
                     materialized_bytes(model) / 2**30)

    left = [n for n, t in chain(model.named_parameters(), model.named_buffers()) if t.is_meta]
    if left:
        raise QuantError(f"{len(left)} tensor(s) (e.g. {left[:3]}) are still on the meta device after the streamed "
                         f"build; the fill did not materialize them")
    model.to(dev)  # the non-persistent buffers (RoPE) built on the host; every parameter is there already
    if recipe is not None:
        finish_quantized(model, recipe)
    else:
        model.requires_grad_(False)
    build = {"peak_bytes": peak, "final_bytes": materialized_bytes(model), "dense_bytes": dense_bytes,
             "layers": n_layers, "seconds": round(time.perf_counter() - t0, 2)}
    if dev.type == "cuda":
        build["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    log.info("streamed build: peak %.2f GiB of materialized weights (dense: %.2f GiB), %.2f GiB at the end, %.1f s",
             peak / 2**30, dense_bytes / 2**30, build["final_bytes"] / 2**30, build["seconds"])
    return QuantReport(layers={n: spec_string(c) for n, c in plan.items()}, memory=memory_report(model), build=build)


# --------------------------------------------------------------------------- checkpoints
class TensorReader:
    """Per-tensor reads from the shards of a checked checkpoint directory (``CheckpointInfo``:
    shards present, headers intact). Shards are opened on first use and stay open (memory-mapped)
    until ``close``; ``used`` records what was read, so leftovers can be reported."""

    def __init__(self, info: CheckpointInfo):
        self.info, self.used = info, set()
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, Any] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def __contains__(self, name: str) -> bool:
        return name in self.info.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.info.tensors[name][2])

    def children(self, prefix: str) -> list[str]:
        """Names of the tensors directly under module ``prefix`` (``prefix.weight_packed`` ...)."""
        pre = prefix + "."
        return [k for k in self.info.tensors if k.startswith(pre) and "." not in k[len(pre):]]

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.info.tensors:
            raise CheckpointError(f"{self.info.path}: no tensor {name} in any shard; the model config.json "
                                  f"describes needs it (a partial checkpoint, or config.json of another model?)")
        f = self.info.tensors[name][0]
        if f not in self._handles:
            self._handles[f] = self._stack.enter_context(safe_open(str(self.info.path / f), framework="pt",
                                                                   device="cpu"))
        self.used.add(name)
        return self._handles[f].get_tensor(name)

    def unused(self) -> list[str]:
        return sorted(set(self.info.tensors) - self.used)


def dense_dtype(info: CheckpointInfo) -> torch.dtype | None:
    """The checkpoint's high-precision dtype, read from a norm weight's header (None if it has none)."""
    return next((_ST_DTYPES.get(dt) for k, (_, dt, _) in info.tensors.items() if k.endswith("norm.weight")), None)


def checkpoint_filler(root: nn.Module, reader: TensorReader, device, dtype: torch.dtype, *,
                      packed: dict[str, FormatConfig] | None = None) -> Fill:
    """A fill reading each meta tensor of a part of ``root`` from ``reader`` (floating tensors of
    16 bits or more cast to ``dtype``). Layers named in ``packed`` become QuantLinear holding
    their stored (compressed-tensors) tensors as they are: no dense weight is made for them."""
    packed = packed or {}
    dev = torch.device(device)

    def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name in reader and reader.shape(name) != tuple(shape):
            raise CheckpointError(
                f"{reader.info.path}: {name} has shape {list(reader.shape(name))} in "
                f"{reader.info.tensors[name][0]} but the model built from config.json expects {list(shape)}; "
                f"config.json does not describe these weights (copy the checkpoint's own config.json)")
        t = reader.get(name)  # a view into the shard's memory map
        cast = dtype if t.is_floating_point() and t.element_size() >= 2 else t.dtype
        # Always a copy: a view would keep its whole shard mapped, and every page of it that was read
        # resident, for as long as any tensor of the shard lives (a norm weight pins a whole layer).
        return t.to(device=dev, dtype=cast, copy=True)

    def swap_packed(name: str, lin: nn.Module, cfg: FormatConfig) -> None:
        tensors = {k.rpartition(".")[2]: reader.get(k).to(dev) for k in reader.children(name)}
        bias = tensors.pop("bias", None)
        if not tensors:
            raise CheckpointError(f"{reader.info.path}: no tensors for quantized layer {name}; the checkpoint is "
                                  f"partial")
        q = QuantLinear(lin.in_features, lin.out_features, cfg, bias=bias is not None, dtype=dtype, device=dev)
        try:
            q.set_qtensor(from_ct_tensors(cfg, (lin.out_features, lin.in_features), tensors))
        except (QuantError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"{reader.info.path}: layer {name} does not hold a valid {spec_string(cfg)} "
                                  f"weight ({e})") from None
        if bias is not None:
            q.bias.data.copy_(bias)
        parent, _, leaf = name.rpartition(".")
        setattr(root.get_submodule(parent) if parent else root, leaf, q)

    def fill(module: nn.Module, prefix: str) -> None:
        pre = prefix + "." if prefix else ""
        for local, m in list(module.named_modules()):
            full = pre + local if local else prefix
            if full in packed:
                swap_packed(full, m, packed[full])
        if prefix in packed:  # the part itself was a packed layer (a quantized lm_head): nothing left in it
            return
        sd = {local: read(pre + local, t.shape)
              for local, t in chain(module.named_parameters(), module.named_buffers()) if t.is_meta}
        module.load_state_dict(sd, strict=False, assign=True)  # assign: the read tensors become the parameters

    return fill


def load_streamed(path: str | Path, config, recipe: QuantRecipe | dict | None, dtype, device) -> tuple[nn.Module, QuantReport]:
    """A HF-layout directory (config.json + safetensors shards) built layer by layer on ``device``,
    each decoder layer quantized with ``recipe`` as it is read. ``config``: its (checked) config.
    ``dtype``: a torch dtype or ``"auto"`` (the checkpoint's own). Tensors the model does not use
    are reported and skipped, as ``from_pretrained`` does."""
    d = Path(path)
    info = check_checkpoint(d, require_quantized=False)
    if dtype == "auto":
        dtype = dense_dtype(info) or torch.float32
    model = empty_model(config, dtype)
    if (d / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(d)
    with TensorReader(info) as reader:
        report = build_streamed(model, checkpoint_filler(model, reader, device, dtype), recipe, device=device)
        extra = reader.unused()
    if extra:
        log.warning("%s: %d tensor(s) of the checkpoint are not used by the model (e.g. %s)", d, len(extra), extra[:3])
    return model.eval(), report
