"""The dense path's next weight dequantized on a side stream while the current GEMM runs.

Why. At training and prefill sizes ``dense.py`` decodes each packed weight into a transient BF16 copy and hands it
to cuBLAS. The decode is a memory-bound pass (0.56 B read + 2 B written a weight: ~50 us for a Qwen2.5-7B MLP
projection on an H100) in front of a compute-bound GEMM (~365 us for the same weight at 2048 tokens) that leaves
most of HBM's bandwidth idle -- run one after the other they cost 0.80-0.89x cuBLAS at 2048 rows (RESULTS.md,
issue 17). A model's projections run in the same order pass after pass (q, k, v, o, gate, up, down, next layer),
so the weight the *next* dense call will need is known one call ahead: decoding it on a second stream lets the two
overlap.

How.

* Each dense call names its weight; the call before it learns "this weight came next" (``_after``: last seen
  successor per weight and direction, forward ``x @ W^T`` and backward ``dy @ W`` kept apart). The next time the
  first weight runs, its successor is decoded on the side stream into a fresh buffer, and the call that then
  asks for it waits on that decode's event instead of decoding again.
* A wrong guess (the order changed: an activation-checkpointing recompute, a different model, a layer skipped)
  costs one wasted decode: an entry the next call does not take is dropped. The buffer was written on the side
  stream, so it is ``record_stream``-ed there and the caching allocator never hands it out before that decode
  ends.
* The side stream starts each decode after everything the main stream had queued *before* the current GEMM (an
  event recorded before the GEMM is launched): the buffer's memory is free by then, and the decode runs beside the
  GEMM, not after it.
* Off under CUDA-graph capture (the graphed decode steps never take the dense path; a capture must not learn or
  fork streams it did not ask for), for inference-mode tensors in-place writes cannot be detected, so an entry is
  checked against the packed tensors' version counters where they have them.

Memory: one more transient BF16 weight alive at a time (the next one; 136 MB at Qwen2.5-7B's gate/up, 283 MB at
32B's). ``QUARL_KERNELS_DENSE_AHEAD=0`` turns it off (one decode, then the GEMM, as before).
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable

import torch

ENV = "QUARL_KERNELS_DENSE_AHEAD"
SMS_ENV = "QUARL_KERNELS_DENSE_AHEAD_SMS"  # SMs cuBLAS leaves to the decode while one is in flight (0: none)
PRIO_ENV = "QUARL_KERNELS_DENSE_AHEAD_PRIO"  # 1: the GEMM on a high-priority stream, the decode on a low one

_after: dict[tuple, tuple] = {}  # (direction, key) -> (direction, the weight) of the call right after it (held weakly)
_pending: dict[tuple, tuple] = {}  # (direction, key) -> (versions at decode time, the BF16 buffer, its event, the weight)
_last: tuple | None = None  # (direction, key) of the previous dense call
_streams: dict[tuple, torch.cuda.Stream] = {}
stats = {"taken": 0, "wasted": 0, "launched": 0}


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _packed(pw) -> tuple:
    return (pw.words, pw.scale, pw.zero, pw.gscale)


def _key(pw) -> tuple:
    """Where the packed tensors live and what they are (no version: inference tensors have none)."""
    return tuple(None if t is None else (t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) for t in _packed(pw))


def _versions(pw) -> tuple:
    return tuple(None if t is None or t.is_inference() else t._version for t in _packed(pw))


def _remember(pw) -> tuple:
    """``pw`` with its tensors held weakly: a learned order must not keep a deleted model's weights alive."""
    bare = dataclasses.replace(pw, words=None, scale=None, zero=None, gscale=None)
    return bare, tuple(None if t is None else weakref.ref(t) for t in _packed(pw))


def _recall(entry: tuple):
    """The weight ``_remember`` stored, or None once any of its tensors is gone."""
    pw, refs = entry
    ts = [None if r is None else r() for r in refs]
    if any(r is not None and t is None for r, t in zip(refs, ts)):
        return None
    return dataclasses.replace(pw, words=ts[0], scale=ts[1], zero=ts[2], gscale=ts[3])


def _stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """The side stream (``role`` "side", lowest priority) or the GEMM's high-priority stream ("gemm")."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    s = _streams.get((idx, role))
    if s is None:
        lo, hi = torch.cuda.Stream.priority_range()  # (lowest, highest): numerically larger is lower
        s = _streams[(idx, role)] = torch.cuda.Stream(device=idx, priority=hi if role == "gemm" else lo)
    return s


def _side(device: torch.device) -> torch.cuda.Stream:
    return _stream(device, "side")


def _knob(name: str) -> int:
    raw = os.environ.get(name, "0")
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer (default 0)") from None
    if v < 0:
        raise ValueError(f"{name}={v} is negative (default 0)")
    return v


def gemm(fn: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
    """``fn()`` -- the dense call's cuBLAS GEMM -- run where the decode in flight on the side stream can progress
    beside it: with ``QUARL_KERNELS_DENSE_AHEAD_PRIO=1`` on a high-priority stream (the block scheduler then places
    the GEMM's tiles before the decode's), and with cuBLAS told to leave ``QUARL_KERNELS_DENSE_AHEAD_SMS`` SMs free
    (``torch._C._set_sm_carveout_experimental``) for the decode. Plain ``fn()`` when no decode is in flight."""
    if not _pending or not _active_device(device):
        return fn()
    sms, prio = _knob(SMS_ENV), _knob(PRIO_ENV)
    if not sms and not prio:
        return fn()
    prev = torch._C._get_sm_carveout_experimental()
    prev_lib = torch.backends.cuda.preferred_blas_library()
    if sms:  # torch applies the carveout on its cuBLASLt route only
        torch._C._set_sm_carveout_experimental(sms)
        torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        if not prio:
            return fn()
        main, hp = _main(device), _stream(device, "gemm")
        hp.wait_stream(main)
        with torch.cuda.stream(hp):
            y = fn()
        main.wait_stream(hp)
        y.record_stream(main)
        return y
    finally:
        torch._C._set_sm_carveout_experimental(prev)
        torch.backends.cuda.preferred_blas_library(prev_lib)


def _active_device(device: torch.device) -> bool:
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def _active(pw) -> bool:
    return enabled() and pw.words.is_cuda and not torch.cuda.is_current_stream_capturing()


def _main(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.current_stream(device)


def weight(pw, direction: str, make: Callable[[], torch.Tensor], decode_into: Callable, ahead_of=None
           ) -> torch.Tensor:
    """The BF16 weight for this dense call: the side stream's decode when one was started for it (the main stream
    waits on it), else ``make()``. Then the weight that followed this one last time is started on the side stream
    (``decode_into(pw_next, buffer)``), unless ``ahead_of(pw_next)`` says it will not need decoding (kept by
    ``recent_weights``)."""
    global _last
    if not _active(pw):
        return make()
    me = (direction, _key(pw))
    if _last is not None and _last != me:
        _after[_last] = direction, _remember(pw)
    _last = me
    main = _main(pw.words.device)
    ent = _pending.pop(me, None)
    for stale in list(_pending):  # a guess the order did not follow
        _pending.pop(stale)
        stats["wasted"] += 1
    if ent is not None and ent[0] == _versions(pw):
        main.wait_event(ent[2])
        w = ent[1]
        stats["taken"] += 1
    else:
        w = make()
    nxt_dir, nxt = (_after[me][0], _recall(_after[me][1])) if me in _after else (None, None)
    if nxt is not None and (ahead_of is None or ahead_of(nxt)):
        _start(nxt, nxt_dir, main, decode_into)
    return w


def _start(pw, direction: str, main: torch.cuda.Stream, decode_into: Callable) -> None:
    try:
        buf = torch.empty((pw.n, pw.k), device=pw.words.device, dtype=torch.bfloat16)
    except torch.cuda.OutOfMemoryError:
        return  # no room for a second transient: the call decodes when it comes
    ready = main.record_event()  # everything before the current GEMM: the buffer's memory is free by then
    side = _side(pw.words.device)
    side.wait_event(ready)
    with torch.cuda.stream(side):
        decode_into(pw, buf)
        done = side.record_event()
    buf.record_stream(side)
    # the weight is held until taken or dropped (one call): its address cannot be reused by another meanwhile
    _pending[(direction, _key(pw))] = (_versions(pw), buf, done, pw)
    stats["launched"] += 1


def reset() -> None:
    """Forget the learned order and drop any decode in flight (a new model, or the end of a pass)."""
    global _last
    _after.clear()
    _pending.clear()
    _last = None


__all__ = ["ENV", "enabled", "reset", "stats", "weight"]
