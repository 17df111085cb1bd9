"""Sequential onloading: calibrate a model that does not fit the GPU, one decoder block at a time.

    mode = choose_offload(cfg.offload, device, dense_bytes, free_bytes, copies)   # "cpu" | "none"
    onload = Onloader(device)          # model on the host; parts move to `device` to compute
    calibrate_model(model_on_host, plan, batches, onload=onload, held_out=windows)

What llm-compressor calls *sequential onloading*: the dense model lives in host memory and
:func:`quarl.calibrate.sequential.calibrate_model` moves to the compute device only what one
step needs:

* the stem (embeddings, rotary module: every child of the base model except the decoder
  blocks) while the inputs of block 0 are captured, then back;
* decoder block i, for its Hessian pass, AWQ search, quantization and the quantized block's
  forward; then the *quantized* block goes back to the host. Keeping the packed blocks on the
  device would be possible (a 32B model packs to ~17 GiB at NVFP4) but leaves a model split
  across devices for ``save_quantized``, and for 70B (~37 GiB packed) eats the room the next
  blocks need; a packed block moves in milliseconds, so nothing is gained by keeping it;
* the final norm and ``lm_head`` for the held-out metrics (``quarl.calibrate.metrics``).

Device memory is then one block in the compute dtype + the calibration activations
(``2 x num_samples x seq_len x hidden``) + that block's Hessians, instead of the whole model:
see docs/calibrate.md, "Offloading", for the arithmetic at 7B-70B. Host memory is one dense
block + the packed blocks when the model is a checkpoint on disk (its blocks are read one at a
time, :mod:`quarl.calibrate.streaming`), else one dense model; the held-out check needs no second copy, because each block is
compared while its dense weights are still there (:class:`quarl.calibrate.metrics.BlockwiseComparison`).

``auto`` decides before any weight is read, from the checkpoint's safetensors headers
(:func:`estimate_dense_bytes`; an ``s3://`` model is downloaded to the local cache first): ``cpu`` on CUDA when ``copies x dense size`` exceeds
:data:`AUTO_FRACTION` of the free device memory (``copies`` = 2 with the held-out check, which
in ``none`` mode loads a second full reference model), else ``none`` (the model loaded straight
onto the device, exactly as before this option existed).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

OFFLOAD_MODES = ("auto", "none", "cpu")
# auto: offload when the dense model(s) would take more than this share of the free device memory.
# The rest is for the calibration activations (inputs and outputs of a block: 2 x 256 x 2048 x 5120 x
# 2 B = 10.7 GB at 14B/32B in BF16), the block's fp32 Hessians (down_proj's alone is 27648^2 x 4 B =
# 3.1 GB at 32B) and GPTQ's workspace: ~15 GB of an 80 GB card.
AUTO_FRACTION = 0.7


def check_offload(mode: str) -> None:
    if mode not in OFFLOAD_MODES:
        raise ValueError(f"offload={mode!r} is not an offload mode; use one of {', '.join(OFFLOAD_MODES)} "
                         f"(cpu: model on the host, one decoder block at a time on the device)")


def choose_offload(mode: str, device: torch.device, dense_bytes: int | None, free_bytes: int | None,
                   copies: int = 1) -> tuple[str, str]:
    """``(mode, reason)``: ``"cpu"`` or ``"none"``; ``auto`` resolves by the rule in the module docstring.

    ``dense_bytes``/``free_bytes`` ``None`` (unknown) under ``auto`` on CUDA: ``cpu``, the choice
    that cannot run out of device memory."""
    check_offload(mode)
    if mode != "auto":
        return mode, "set in the config"
    if device.type != "cuda":
        return "none", f"compute device is {device.type}: nothing to offload to"
    if dense_bytes is None or free_bytes is None:
        return "cpu", "model size or free device memory unknown"
    need = copies * dense_bytes
    verdict = "cpu" if need > AUTO_FRACTION * free_bytes else "none"
    op = ">" if verdict == "cpu" else "<="
    return verdict, (f"{copies} x {dense_bytes / 2**30:.1f} GiB dense {op} {AUTO_FRACTION:g} x "
                     f"{free_bytes / 2**30:.1f} GiB free on {device}")


def estimate_dense_bytes(model_uri: str, dtype: torch.dtype) -> int | None:
    """Parameters x ``dtype``'s size from the checkpoint's safetensors headers, without reading weights.

    Local directories (a model artifact too: its files are read, not verified -- ``load_model``
    verifies them next), ``default``, tiny models and hub ids are counted; an ``s3://`` model is not
    (``None``: the stage then loads it on the host and sizes it there, rather than download and
    verify gigabytes twice)."""
    from quarl.models import DEFAULT_MODEL_ALIASES, TINY_MODELS
    from quarl.models.info import _safetensors_stats, model_info

    ref = os.fspath(model_uri)
    low = ref.lower()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    try:
        if low in TINY_MODELS:
            return model_info(low)["params"] * itemsize
        if low in DEFAULT_MODEL_ALIASES:
            from quarl.models import default_model_dir

            path = default_model_dir()
        elif low.startswith("s3://"):
            return None
        elif Path(ref).expanduser().is_dir():
            path = Path(ref).expanduser()
        else:  # a hub id: the snapshot load_model reads next (downloaded now, a cache hit then)
            from quarl.models import resolve_model_dir

            path = resolve_model_dir(ref)
        params, _ = _safetensors_stats(path)
    except Exception as e:  # noqa: BLE001 -- unknown is an answer (auto then offloads); loading reports real errors
        log.info("calibrate: cannot size %s before loading (%s: %s)", ref, type(e).__name__, e)
        return None
    return params * itemsize if params else None


def dense_bytes_of(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor once (tied weights once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


class Onloader:
    """Moves parts of a host-resident model to ``device`` to compute and back to ``host`` after.

    ``device == host`` (CPU tests) runs the same calls with no-op moves. ``peak()`` is the device's
    peak allocated memory since the last ``peak(reset=True)`` (None off CUDA)."""

    def __init__(self, device: torch.device | str, host: torch.device | str = "cpu"):
        self.device, self.host = torch.device(device), torch.device(host)

    def onload(self, *mods: nn.Module) -> None:
        for m in mods:
            m.to(self.device)

    def offload(self, *mods: nn.Module) -> None:
        for m in mods:
            m.to(self.host)

    def peak(self, reset: bool = False) -> int | None:
        if self.device.type != "cuda":
            return None
        p = torch.cuda.max_memory_allocated(self.device)
        if reset:
            torch.cuda.reset_peak_memory_stats(self.device)
        return p


def stem_modules(model: nn.Module, blocks: nn.ModuleList) -> list[nn.Module]:
    """Children of the base model other than the decoder blocks (embeddings, rotary, final norm)."""
    base = _base(model, blocks)
    return [m for m in base.children() if m is not blocks]


def head_modules(model: nn.Module, blocks: nn.ModuleList) -> tuple[nn.Module, nn.Module]:
    """(final norm, lm_head): what turns the last block's hidden states into logits (Llama/Qwen)."""
    base = _base(model, blocks)
    norm, head = getattr(base, "norm", None), model.get_output_embeddings()
    if not isinstance(norm, nn.Module) or head is None:
        from quarl.quant.base import QuantError

        raise QuantError(f"{type(model).__name__}: no final .norm / lm_head found for the block-by-block "
                         f"held-out check; quarl calibrates Llama/Qwen2/Qwen3-style causal LMs")
    return norm, head


def _base(model: nn.Module, blocks: nn.ModuleList) -> nn.Module:
    for m in model.modules():
        if any(c is blocks for c in m.children()):
            return m
    raise ValueError("the decoder blocks are not a child of any module of the model")
