"""The last few BF16 weights the dense path dequantized under autograd, kept for the backward that follows.

Why. A frozen 4-bit base trained with LoRA runs every projection three times per micro-batch at training sizes,
each through ``dense.py``'s transient BF16 weight: the forward, the forward again when activation checkpointing
recomputes the layer, and the backward's ``dy @ W``. The recompute of a decoder layer is followed at once by that
layer's backward, so the backward can reuse the weights the recompute just made instead of decoding them again:
one decode in three saved (the BF16 base pays none of this). Keeping one decoder layer's projections (7 for a
Qwen/Llama layer) is enough, and is all this holds: the memory of one layer's BF16 weights (466 MB at
Qwen2.5-7B, 975 MB at 32B), not the BF16 model.

What is kept and when.

* Inserted only inside :func:`keeping` -- a forward whose input requires grad under grad mode, i.e. one whose
  backward will ask for ``dy @ W`` (``registration.forward`` says so; the op itself cannot tell: autograd runs it
  under no-grad). A rollout prefill or the trainer's no-grad log-prob pass never adds a weight (it would hold
  memory the KV cache plans on).
* Looked up by every dense call, forward or backward: an entry is the packed weight's exact dequantization, so a
  hit is bit-equal to decoding again.
* Keyed by the address, dtype, shape and version counter of each packed tensor (codes, scales, zero points,
  global scale): an in-place write to any of them (a checkpoint load, calibration) changes its version and so
  misses. An entry holds those tensors, so their memory cannot be reused by another weight while it is kept: a
  new weight at an old address is never mistaken for the old one.
* At most ``QUARL_KERNELS_DENSE_KEEP`` weights (default 7, 0 = off), least recently used out first;
  :func:`release` empties it (the RL trainer does after each update, before the next rollout).
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator

import torch

DEFAULT_KEEP = 7  # one decoder layer's q, k, v, o, gate, up, down
ENV = "QUARL_KERNELS_DENSE_KEEP"

_kept: OrderedDict[tuple, tuple[tuple, torch.Tensor]] = OrderedDict()  # key -> (the packed tensors, the BF16 weight)
stats = {"hits": 0, "misses": 0}
_keeping = False


def capacity() -> int:
    """How many weights are kept (``QUARL_KERNELS_DENSE_KEEP``; 0 = none)."""
    raw = os.environ.get(ENV, "")
    if raw == "":
        return DEFAULT_KEEP
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not an integer; set how many dequantized weights to keep for the "
                         f"backward (default {DEFAULT_KEEP}: one decoder layer), or 0 to keep none") from None
    if v < 0:
        raise ValueError(f"{ENV}={v} is negative; use 0 to keep none")
    return v


def _key(packed: tuple) -> tuple:
    return tuple(None if t is None else (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t._version)
                 for t in packed)


def get(packed: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` -- the BF16 dequantization of the weight whose packed tensors are ``packed`` (codes, scales,
    zero points or None, global scale or None) -- or the one kept for these exact tensors. Weights made under
    ``torch.inference_mode`` have no version counter: never kept, always made."""
    if any(t is not None and t.is_inference() for t in packed):
        return make()
    key = _key(packed)
    hit = _kept.get(key)
    if hit is not None:
        _kept.move_to_end(key)
        stats["hits"] += 1
        return hit[1]
    stats["misses"] += 1
    w = make()
    cap = capacity()
    if cap > 0 and _keeping:
        _kept[key] = (packed, w)
        while len(_kept) > cap:
            _kept.popitem(last=False)
    return w


@contextlib.contextmanager
def keeping(on: bool) -> Iterator[None]:
    """Inside, :func:`get` keeps what it makes (when ``on``): a forward whose backward will need the weight."""
    global _keeping
    prev, _keeping = _keeping, on
    try:
        yield
    finally:
        _keeping = prev


def release() -> None:
    """Drop every kept weight (their memory goes back to the caching allocator)."""
    _kept.clear()


def kept() -> int:
    """How many weights are held now."""
    return len(_kept)


__all__ = ["DEFAULT_KEEP", "ENV", "capacity", "get", "keeping", "kept", "release", "stats"]
