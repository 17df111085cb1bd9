"""Programmatic dependent launch (PDL): a decode step's next kernel is launched before this one has ended.

Why. A 7B decode step at batch 1 is ~370 kernels replayed from one CUDA graph (RESULTS "Issue 17, session 13"),
most of them a few microseconds long, so the time between one kernel's last program and the next one's first
matters. Hopper's PDL (sm_90, CUDA >= 12.3; ``griddepcontrol`` in PTX) lets a kernel launched with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (Triton: ``launch_pdl=True``) place its programs on the
SMs once every program of the kernel before has *signalled* (``launch_dependents``) or exited; it must then
``wait`` -- for the kernel before to complete and its writes to be visible -- before it touches that kernel's
results. Stream capture records the launch as a programmatic edge of the CUDA graph.

The contract of every kernel here that takes a ``PDL`` constexpr:

* Wait (in :func:`enter`, first thing) before the first load of anything a kernel of the step writes
  (activations, partials, the K/V cache) and before the first store. Only weights, which no kernel of a decode step
  writes, could be read before it; the GEMV's L2 prefetch there was measured and dropped (below).
* Signal (``griddepcontrol.launch_dependents``) where the rest of the program is short, :func:`leave`: after the
  GEMV's K loop, before a pass's stores (``PDL == LATE``, the default); or first thing, in :func:`enter`
  (``EARLY``). Without it a program signals when it exits.
* Transitively safe: a kernel cannot end before its own ``wait`` returned, so waiting for it waits for every
  kernel before it. A kernel launched *without* the attribute (torch's, cuBLAS) starts after the one before has
  ended, as always; ``wait`` in a kernel launched without it returns at once.

Measured (H100, session 16, RESULTS "Issue 17, session 16"): signalling first thing made the 7B NVFP4+LoRA step
*slower* (3.22 -> 3.81 ms at batch 1): a chain of small kernels, each signalling at its start, had the next three
or four kernels' programs placed on the few SMs free in a long kernel's tail, where they then ran crowded. Asking L2
for a GEMV's whole weight slice before its wait was slower still (the 7B gate / up GEMV alone 19.2 -> 23.3 us: the
requests of every resident program queued ahead of their own loads); not kept. What is kept (wait first, signal
after the K loop) takes the step's GPU idle from 0.15 to 0.04 ms: 2 % off the 7B NVFP4+LoRA step at batch 1, 8 and 64.

:func:`mode` is the one switch and :func:`kwargs` hands out the launch attribute and the ``PDL`` constexpr together
(a kernel launched with the attribute but without its ``wait`` would race). ``QUARL_KERNELS_PDL``: ``late`` (or 1,
the default), ``early``, or 0 (off; ``:nopdl`` in ``benchmarks/rollout_profile.py``); off under
``TRITON_INTERPRET=1``, below sm_90 and with a CUDA driver older than 12.3.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from quarl_kernels.env import interpreting

__all__ = ["EARLY", "ENV", "LATE", "MIN_DRIVER", "OFF", "driver_version", "enter", "kwargs", "leave", "mode", "on"]

ENV = "QUARL_KERNELS_PDL"
OFF, LATE, EARLY = 0, 1, 2
_MODES = {"": LATE, "1": LATE, "on": LATE, "true": LATE, "yes": LATE, "late": LATE, "early": EARLY,
          "0": OFF, "off": OFF, "false": OFF, "no": OFF}


MIN_DRIVER = 12030  # CUDA 12.3: programmatic launches inside captured CUDA graphs


@functools.cache
def driver_version() -> int:
    """The CUDA driver's version (``cuDriverGetVersion``: 12030 for 12.3), 0 when libcuda cannot be asked."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else 0
    except (OSError, AttributeError):
        return 0


@functools.cache
def _device_supports_pdl(index: int) -> bool:
    """sm_90+ and a driver that captures programmatic launches into graphs (else the engine's first capture would
    fail and it would decode eagerly, much slower)."""
    return torch.cuda.get_device_capability(index)[0] >= 9 and driver_version() >= MIN_DRIVER


def mode(device: torch.device) -> int:
    """``OFF``, ``LATE`` or ``EARLY`` for kernels launched on ``device``: CUDA sm_90+, not the interpreter, as
    ``QUARL_KERNELS_PDL`` says (unset: ``LATE``)."""
    raw = os.environ.get(ENV)
    m = LATE if raw is None else _MODES.get(raw.strip().lower())
    if m is None:
        raise ValueError(f"{ENV}={raw!r}: set it to late (or 1, the default), early, or 0 (off)")
    if m == OFF or device.type != "cuda" or interpreting():
        return OFF
    index = device.index if device.index is not None else torch.cuda.current_device()
    return m if _device_supports_pdl(index) else OFF


def on(device: torch.device) -> bool:
    """True when kernels launched on ``device`` use PDL (:func:`mode` is not ``OFF``)."""
    return mode(device) != OFF


def kwargs(device: torch.device) -> dict:
    """The launch keywords of a ``PDL`` kernel: ``{"PDL": mode, "launch_pdl": mode != OFF}`` -- the constexpr and the
    launch attribute together, never one without the other."""
    m = mode(device)
    return {"PDL": m, "launch_pdl": m != OFF}


@triton.jit
def enter(PDL: tl.constexpr):
    """A kernel's first statement: signal if ``EARLY``, then wait for the kernel before to complete, its writes
    visible (``griddepcontrol.wait``)."""
    if PDL == 2:
        gdc_launch_dependents()
    if PDL != 0:
        gdc_wait()


@triton.jit
def leave(PDL: tl.constexpr):
    """Where the rest of a program is short (after the K loop, before the last stores): signal if ``LATE``."""
    if PDL == 1:
        gdc_launch_dependents()
