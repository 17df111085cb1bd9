"""Streaming the dense model from its checkpoint: host memory of one dense block, not one dense model.

    src = stream_source(model_uri)                      # (local dir, "") or (None, why it cannot stream)
    with StreamedModel.open(src.path, dtype) as sm:     # skeleton on meta, stem read; blocks still meta
        calibrate_model(sm.model, plan, ..., onload=Onloader(dev), fill=sm.fill_block)

With ``offload: cpu`` (:mod:`quarl.calibrate.onload`) the device holds one decoder block at a
time, but ``load_model`` still puts the whole dense model in host memory first: 140 GB for a
70B model in BF16, more than the calibrate pod's 96Gi. Here the model is built on the meta
device from the checkpoint's config.json (``quarl.quant.stream.empty_model``), the stem
(embeddings, rotary, final norm, ``lm_head``) is read from the safetensors shards, and
:func:`quarl.calibrate.sequential.calibrate_model` calls :meth:`StreamedModel.fill_block` just
before block i's turn: block i is read (``quarl.quant.stream.checkpoint_filler``, one tensor at
a time from memory-mapped shards), calibrated, and its linears become packed ``QuantLinear``
layers, so its dense weights are gone before block i+1 is read. Host memory is then the stem +
one dense block + the packed blocks before it (see docs/calibrate.md, "Offloading").

Same artifact as loading the whole model (tested bit for bit, for rtn/gptq/awq): the fill casts
each tensor to ``dtype`` exactly as ``from_pretrained`` does, the tied head shares the embeddings
as it does there, and the plan is made on the whole (meta) model. After each block the shards are
unmapped (``TensorReader.close``): a memory map keeps every page it touched resident in this
process (counted in its RSS and in the pod's memory) until it is unmapped, so an open map would
grow back to the whole checkpoint; for the same reason every tensor is copied out of the map
(``checkpoint_filler``), or a norm weight would keep its whole shard mapped. Freed heap memory is
handed back to the OS before each block (``malloc_trim``), or glibc keeps the previous blocks' freed
dense weights in the process.

Not streamable (then ``load_model`` on the host, as before, with the reason logged): the built-in
tiny models (no checkpoint on disk), a reference that does not resolve to a directory with
config.json and ``*.safetensors``, an already-quantized checkpoint, an architecture without a
``.layers`` list. ``s3://`` models are downloaded to the local cache first (disk, not memory:
the dense load downloads them the same way).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class StreamSource:
    path: Path | None  # the local checkpoint directory, or None: not streamable
    reason: str  # why not (empty when streamable)


def stream_source(model_uri: str, path: Path | None = None) -> StreamSource:
    """Where the dense blocks of ``model_uri`` can be streamed from, or why they cannot (see the
    module docstring). ``path``: its local directory when already resolved (an ``s3://`` model the
    stage downloaded to size it), so it is not fetched or verified twice."""
    from transformers import AutoConfig

    from quarl.models import TINY_MODELS, ModelError, check_architecture, resolve_model_dir

    ref = str(model_uri)
    if ref.lower() in TINY_MODELS:
        return StreamSource(None, f"{ref} is built in memory (no checkpoint on disk to stream from)")
    if path is None:
        try:
            path = resolve_model_dir(ref)
        except ModelError as e:
            return StreamSource(None, f"not a local checkpoint ({e})")
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        return StreamSource(None, f"{path} has no config.json + *.safetensors")
    try:
        config = AutoConfig.from_pretrained(path)
        check_architecture(config, ref)
    except Exception as e:  # noqa: BLE001 -- the dense load reports it properly
        return StreamSource(None, f"config.json not usable ({type(e).__name__}: {e})")
    if getattr(config, "quantization_config", None) is not None:
        return StreamSource(None, f"{path} is already a quantized checkpoint")
    return StreamSource(path, "")


class StreamedModel:
    """A dense model whose decoder blocks are read from its checkpoint one at a time.

    ``model``: the skeleton, stem materialized on the host, blocks on the meta device until
    :meth:`fill_block`. ``tokenizer``: as ``load_model`` returns it. ``peak_bytes``: the most
    materialized parameter/buffer bytes seen right after a block was read (the host high point)."""

    def __init__(self, model: nn.Module, tokenizer, reader, fill, path: Path):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self._reader, self._fill = reader, fill
        self.peak_bytes = 0
        self.blocks_read = 0

    @classmethod
    def open(cls, path: Path, dtype: torch.dtype) -> Self:
        from transformers import AutoConfig, GenerationConfig

        from quarl.models.loading import load_tokenizer
        from quarl.quant.checkpoint import check_checkpoint
        from quarl.quant.stream import (
            TensorReader,
            checkpoint_filler,
            empty_model,
            materialize_stem,
            materialized_bytes,
        )

        info = check_checkpoint(path, require_quantized=False)
        model = empty_model(AutoConfig.from_pretrained(path), dtype)
        if (path / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(path)
        _check_blocks(model, info)
        reader = TensorReader(info)
        try:
            fill = checkpoint_filler(model, reader, "cpu", dtype)
            materialize_stem(model, fill)
            reader.close()
            model.eval()
            tok = load_tokenizer(path, str(path), model, trust_remote_code=False)
        except BaseException:
            reader.close()
            raise
        sm = cls(model, tok, reader, fill, path)
        sm.peak_bytes = materialized_bytes(model)
        return sm

    def fill_block(self, block: nn.Module, prefix: str) -> None:
        """Read decoder block ``prefix`` (on meta) from the shards, on the host, in the model's dtype."""
        from quarl.quant.stream import materialized_bytes

        _trim_heap()  # the previous block's dense weights and temporaries, freed: back to the OS first
        self._fill(block, prefix)
        self._reader.close()  # unmap the shards: their touched pages leave this process (module docstring)
        self.blocks_read += 1
        self.peak_bytes = max(self.peak_bytes, materialized_bytes(self.model))

    def close(self, check_unused: bool = False) -> None:
        self._reader.close()
        extra = self._reader.unused() if check_unused else []
        if extra:
            log.warning("%s: %d tensor(s) of the checkpoint are not used by the model (e.g. %s)", self.path,
                        len(extra), extra[:3])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(check_unused=exc_type is None)  # after a failure, the unread blocks are no news


def _check_blocks(model: nn.Module, info) -> None:
    """Every decoder-block tensor the model needs is in the shards with its shape (headers only), so a
    checkpoint whose names or shapes differ fails here, before the loop, not at block 37."""
    from quarl.quant.checkpoint import CheckpointError
    from quarl.quant.stream import decoder_layers

    name, layers = decoder_layers(model)
    bad = []
    for i, layer in enumerate(layers):
        for k, t in layer.state_dict().items():
            full = f"{name}.{i}.{k}"
            got = info.tensors.get(full)
            if got is None or tuple(got[2]) != tuple(t.shape):
                bad.append(f"{full} {'missing' if got is None else f'{list(got[2])} != {list(t.shape)}'}")
    if bad:
        raise CheckpointError(f"{info.path}: {len(bad)} decoder-block tensor(s) do not match the model config.json "
                              f"describes (e.g. {bad[:3]})")


def _trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: hand freed heap pages back to the OS. A layer's weights (tens of MB)
    fall under glibc's dynamic mmap threshold once a few large blocks were freed, so they are served
    from the heap and, once freed, stay in this process's RSS; measured on a 4-layer CPU run, the RSS
    before each block then grew by 0.1-0.3 GiB per block instead of by the packed block. No-op
    elsewhere (musl, macOS)."""
    import ctypes
    import ctypes.util

    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    if _LIBC and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


_LIBC = None
