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

Held for a whole phase (:func:`holding`). A LoRA trainer's base never changes, yet one GRPO step decodes every
weight afresh for each micro-batch of its log-prob pass and of each of its mu updates (7B, 8 micro-batches, mu 2:
~40 decodes of each projection). With memory to spare, the trainer opens ``holding(budget)`` around the log-prob
pass and the updates: inside, every weight made -- with or without grad -- is kept until the block ends, while the
held bytes stay within ``budget`` (beyond it, the LRU above as usual). The GEMMs then run cuBLAS on the same BF16
weights with no decode after the first (a hit is bit-equal to decoding again); the price is up to the BF16 base in
memory for the phase (13 GiB at Qwen2.5-7B), given back when it ends, before the next rollout plans its KV cache.
How big a budget the memory allows is the trainer's decision (``quarl.train.dequant_cache``).
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
_held: dict[tuple, tuple[tuple, torch.Tensor]] = {}  # the same, for the phase :func:`holding` spans
stats = {"hits": 0, "misses": 0}
_keeping = False
_hold_budget = 0  # bytes :func:`holding` may keep; 0 = not holding
_held_bytes = 0


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
    hit = _held.get(key)
    if hit is not None:
        stats["hits"] += 1
        return hit[1]
    hit = _kept.get(key)
    if hit is not None:
        _kept.move_to_end(key)
        stats["hits"] += 1
        return hit[1]
    stats["misses"] += 1
    w = make()
    global _held_bytes
    if _hold_budget and _held_bytes + w.nbytes <= _hold_budget:
        _held[key] = (packed, w)
        _held_bytes += w.nbytes
        return w
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


@contextlib.contextmanager
def holding(budget_bytes: int) -> Iterator[None]:
    """Inside, every weight :func:`get` makes is kept -- forward or backward, grad or not -- until the block ends,
    while the held bytes stay within ``budget_bytes`` (0 = hold nothing); on exit they are dropped. Not nested."""
    global _hold_budget, _held_bytes
    if budget_bytes < 0:
        raise ValueError(f"holding: budget_bytes={budget_bytes} is negative; 0 holds nothing")
    if _hold_budget:
        raise RuntimeError("holding() is already open: one phase at a time")
    _hold_budget = int(budget_bytes)
    try:
        yield
    finally:
        _hold_budget = 0
        _held.clear()
        _held_bytes = 0


def held_bytes() -> int:
    """Bytes of the weights :func:`holding` keeps now."""
    return _held_bytes


def release() -> None:
    """Drop every weight the LRU keeps (their memory goes back to the caching allocator). Weights :func:`holding`
    holds stay until its block ends: the trainer releases after each update, inside the phase it holds for."""
    _kept.clear()


def kept() -> int:
    """How many weights are held now."""
    return len(_kept)


__all__ = ["DEFAULT_KEEP", "ENV", "capacity", "get", "held_bytes", "holding", "keeping", "kept", "release", "stats"]
