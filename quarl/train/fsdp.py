"""Full-parameter training on several GPUs: FSDP2 (``fully_shard``) and sharded checkpoints (DCP).

Jet-RL's full mode and QAD's ``student.mode=qat`` train every weight; at 32B+ the fp32
master weights, gradients and AdamW states (16 bytes a weight) exceed one GPU. Here
each decoder layer is one FSDP2 unit and the root (embeddings, final norm, LM head) is
another (:func:`shard_model`); parameters, gradients and optimizer states are sharded
along dim 0 over the ranks, and a layer's full weights exist only while it computes.

quarl's modules under FSDP2. A QAT ``QuantLinear`` keeps its master ``weight`` as a
Parameter and fake-quantizes it in its forward: FSDP2 all-gathers the full weight
before the layer runs, so the NVFP4 / INT block scales and the global amax are those of
the whole weight -- exactly the one-process numbers. The FP8 linear
(:mod:`quarl.quant.fp8_linear`) quantizes the gathered master weight the same way.
Frozen packed buffers (a calibrated base) are buffers, which FSDP2 does not shard: they
stay replicated.

Three things the trainers need that plain ``model(...)`` training does not:

* **Decoder-then-head calls** (:func:`decoder_hidden`). The trainers run
  ``model.get_decoder()`` and then the LM head in checkpointed chunks, so the full
  ``[tokens, vocab]`` logits never exist. Under FSDP2 the root unit's parameters
  (embeddings, final norm, head) are gathered by the *root's* forward hook, so a
  sharded model runs its root forward with ``logits_to_keep`` empty (no logits) and
  the final hidden states are taken from the final norm's output; the root stays
  gathered after its forward (FSDP2's default for the root), which the chunked head
  then uses.
* **Rollouts** (:func:`gathered`): generation runs a different number of decode steps
  on every rank (answers end at different times), and an FSDP forward all-gathers, so
  ranks would wait on each other forever. Every unit is gathered once before the
  rollout and kept gathered through it (memory: the full model, as a rollout engine
  holds it anyway), then resharded.
* **Equal forward counts** in training: every FSDP forward is a collective, so all
  ranks run the same number of micro-batches (the trainers pad a short rank with a
  zero-weighted micro-batch).

Gradients are *summed* over ranks (``set_gradient_divide_factor(1)``): the losses are
already divided by global counts, as in the data-parallel LoRA path.

Checkpoints (:func:`save_sharded`, :func:`load_sharded`): ``torch.distributed.checkpoint``
writes one file per rank plus a ``.metadata`` index of every tensor's global shape and
shard offsets; loading reads whatever slices the *loading* layout needs, so a run saved
on 2 ranks resumes on 1 (plain model, no process group) or on 4 (tested: 2 -> 1).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from quarl.train.distributed import Dist

__all__ = ["clip_grad_norm", "decoder_hidden", "full_state_dict", "gathered", "is_sharded", "load_sharded",
           "save_sharded", "shard_model"]


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module) -> bool:
    """True when ``fully_shard`` was applied to ``model`` (its root)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model: nn.Module, d: Dist, device: torch.device) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root, on a 1-D mesh of every rank over ``device``; in place.

    The model must have its final trainable flags (the optimizer is built after). It may sit
    on the CPU: FSDP2 moves each rank's shard (and the buffers) to ``device`` (``cuda:LOCAL_RANK``),
    so the whole model is never on one GPU -- it is in each rank's host memory once, while
    it is built (docs/distributed.md, "Limits")."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (d.world_size,))
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in _fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)  # sum, not mean: the losses carry the global normaliser
        if hasattr(m, "set_force_sum_reduction_for_comms"):  # a plain SUM: gloo has no PREMUL_SUM (torch >= 2.9)
            m.set_force_sum_reduction_for_comms(True)
    return model


def decoder_hidden(model: nn.Module, **inputs) -> torch.Tensor:
    """``model.get_decoder()(**inputs).last_hidden_state`` ([B, L, H]); through the root forward when sharded."""
    if not is_sharded(model):
        return model.get_decoder()(**inputs).last_hidden_state
    box = {}
    hook = model.get_decoder().norm.register_forward_hook(lambda m, args, out: box.__setitem__("h", out))
    try:
        ids = inputs["input_ids"]
        model(**inputs, logits_to_keep=torch.empty(0, dtype=torch.long, device=ids.device))
    finally:
        hook.remove()
    return box["h"]


@contextlib.contextmanager
def gathered(model: nn.Module):
    """Every FSDP unit all-gathered once and kept so until the block ends (rollouts; see the module doc)."""
    mods = _fsdp_modules(model)
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    for m in mods:
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)  # FSDP2's defaults: the root stays gathered


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm; returns it. Sharded (DTensor) gradients: the norm over all shards."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (empty elsewhere). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    msd, osd = get_state_dict(model, optimizer)
    return {"model": {k: v for k, v in msd.items() if k in trainable}, "optim": osd}


def save_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """DCP checkpoint of the trainable weights and the optimizer at ``path``; every rank calls it."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(model, optimizer), checkpoint_id=str(path))


def load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a :func:`save_sharded` checkpoint into this layout (any world size, sharded or not)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    sd = _state(model, optimizer)
    dcp.load(sd, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                   options=StateDictOptions(strict=False))
