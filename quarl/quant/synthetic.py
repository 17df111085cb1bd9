"""Random-weight models and quantized checkpoints of any shape, built one decoder layer at a time.

    fill = seeded_fill(seed=0)                                   # a stream.Fill: weights seeded by their names
    model, report = build_random(config, {"default": "nvfp4"}, device="cuda")
    info = write_random_checkpoint("runs/q32/model", config, tokenizer, {"default": "nvfp4"}, device="cuda")

Why. Showing that a 32B policy trains on one 80 GB GPU through the product (``quarl rl`` reading a
calibrated checkpoint) needs a 32B checkpoint on the GPU machine, and that machine may have no network
and too little disk for the ~65 GB BF16 snapshot. What ``quarl rl`` reads from a calibrated checkpoint is
its packed form (~19 GiB at NVFP4), so this module writes that form directly: the model is built on the
meta device and each decoder layer is filled with seeded random weights and packed before the next
exists (:func:`quarl.quant.stream.build_streamed`), then the packed model is written by the code the
calibrate stage uses (:func:`quarl.quant.checkpoint.save_quantized`) inside a ``model`` artifact
(manifest, checksums). No dense copy of the model exists on the host or the device at any point; the
shapes are real, the weights are not (and the tokenizer is whatever is passed in).

Same bytes as the dense route (tested): a weight's values depend only on the seed and its qualified
name, so ``build_random(config, None)`` + ``quantize_model`` + ``save_quantized`` writes the same
tensors, and the artifact loads through ``quarl.models.load_model`` like any calibrated checkpoint
(``quarl.quant.checkpoint.load_quantized``: packed layers straight from the stored codes and scales).

RMSNorm weights are 1; every other weight and bias is ``normal(0, std)`` from a generator seeded by
``sha256(f"{seed}:{name}")``, drawn on the device the tensor lives on (so a CUDA and a CPU build give
different values, each reproducible).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch
from torch import nn

from quarl.quant.model import QuantRecipe, QuantReport
from quarl.quant.stream import Fill, build_streamed, empty_model

__all__ = ["build_random", "init_params", "param_seed", "planned_quantization_config", "seeded_fill",
           "write_random_checkpoint"]


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed from the run seed and a parameter's qualified name (stable across processes)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def init_params(module: nn.Module, prefix: str, seed: int, std: float = 0.02) -> None:
    """Fill ``module``'s parameters in place: RMSNorm weights 1, everything else ``normal_(0, std)``
    from a generator seeded by the parameter's full name (``prefix`` + local name), so a parameter
    gets the same values whether the model is built whole or layer by layer."""
    for name, p in module.named_parameters(prefix=prefix):
        if p.dim() == 1 and not name.endswith("bias"):
            p.fill_(1.0)  # RMSNorm weights
        else:
            p.normal_(0.0, std, generator=torch.Generator(p.device).manual_seed(param_seed(seed, name)))


def seeded_fill(seed: int = 0, device: str | torch.device = "cpu", std: float = 0.02) -> Fill:
    """A :data:`quarl.quant.stream.Fill` that materializes a part on ``device`` with seeded random weights."""
    dev = torch.device(device)

    def fill(module: nn.Module, prefix: str) -> None:
        module.to_empty(device=dev, recurse=True)
        init_params(module, prefix, seed, std)

    return fill


@torch.no_grad()
def build_random(config, recipe: QuantRecipe | dict | None, *, seed: int = 0, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.bfloat16) -> tuple[nn.Module, QuantReport]:
    """The causal LM ``config`` describes, random, built layer by layer on ``device``; each decoder layer is
    packed with ``recipe`` (frozen, no LoRA; ``None`` keeps ``dtype``) before the next one is made."""
    model = empty_model(config, dtype)
    report = build_streamed(model, seeded_fill(seed, device), recipe, device=device)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_floating_point() and t.dtype.itemsize > 1 and not torch.isfinite(t).all():
            raise RuntimeError(f"{name} holds non-finite values after the random build (a tensor the fill "
                               f"did not initialise)")
    return model.eval().requires_grad_(False), report


def planned_quantization_config(config, recipe: QuantRecipe | dict, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The ``quantization_config`` a checkpoint of ``config``'s model quantized with ``recipe`` carries,
    computed on the meta device (no weights): for :func:`write_random_checkpoint` on a machine that lacks
    compressed-tensors (compute it where the package is, carry the JSON)."""
    from quarl.quant.checkpoint import checkpoint_quantization_config
    from quarl.quant.model import checked_plan
    from quarl.quant.spec import spec_string

    model = empty_model(config, dtype)
    plan = checked_plan(model, QuantRecipe.load(recipe))
    layers = {n: spec_string(c) for n, c in plan.items() if c is not None}
    dense = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in layers)
    return checkpoint_quantization_config(layers, dense)


def write_random_checkpoint(out_uri: str | Path, config, tokenizer, recipe: QuantRecipe | dict, *, seed: int = 0,
                            device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                            max_shard_size: str | int = "5GB", qconfig: dict | None = None,
                            overwrite: bool = False) -> dict:
    """A ``model`` artifact at ``out_uri`` holding a random model of ``config``'s shape, quantized with
    ``recipe`` as the calibrate stage writes it (compressed-tensors layout, tokenizer beside it).

    ``qconfig``: the ``quantization_config`` to write, when it was computed elsewhere (a machine without
    compressed-tensors; :func:`quarl.quant.checkpoint.checkpoint_quantization_config`); it is checked
    against the built layers. Returns timings (s) and sizes (bytes)."""
    from quarl.artifacts import write_artifact
    from quarl.quant.checkpoint import save_quantized

    recipe = QuantRecipe.load(recipe)
    t0 = time.perf_counter()
    model, report = build_random(config, recipe, seed=seed, device=device, dtype=dtype)
    t_build = time.perf_counter() - t0
    source = f"random: normal(0, 0.02) seeded by name, seed {seed} (quarl.quant.synthetic)"
    with write_artifact(out_uri, "model", "synthetic", config={"recipe": recipe.to_dict(), "seed": seed},
                        inputs=[source], overwrite=overwrite) as art:
        t1 = time.perf_counter()
        save_quantized(model, tokenizer, art.path, max_shard_size=max_shard_size, qconfig=qconfig,
                       extra={"method": "rtn", "recipe": recipe.to_dict(), "source_model": source})
        t_save = time.perf_counter() - t1
        sizes = [p.stat().st_size for p in art.path.iterdir() if p.is_file()]
        art.metadata.update({"method": "rtn", "synthetic": True, "seed": seed})
    t_total = time.perf_counter() - t0
    build = dict(report.build or {})
    return {"build_s": round(t_build, 2), "save_s": round(t_save, 2),
            "checksum_publish_s": round(t_total - t_build - t_save, 2), "total_s": round(t_total, 2),
            "build": build, "bytes": sum(sizes), "files": len(sizes),
            "memory": report.memory, "layers": len(report.layers)}
