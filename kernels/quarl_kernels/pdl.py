"""Programmatic dependent launch (PDL): a decode step's next kernel starts while this one ends.

Why. A 7B decode step at batch 1 is ~370 kernels replayed from one CUDA graph (RESULTS "Issue 17, session 13"). A
large GEMV streams its packed weight for ~20 us, but it starts only once the kernel before it has ended -- often an
RMSNorm on one SM or a latency-bound pass of a few microseconds, with the rest of the GPU idle -- and it ends in a
tail where a handful of its programs are left. The weights do not depend on the kernel before: no kernel of a
decode step writes them. Hopper's PDL (sm_90, CUDA >= 12.3; ``griddepcontrol`` in PTX) lets a kernel launched with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (Triton: ``launch_pdl=True``) place its programs on the
SMs once every program of the kernel before has *signalled* (``launch_dependents``) or ended; it must then
``wait`` -- for the kernel before to complete and its writes to be visible -- before it touches that kernel's
results. Stream capture records the launch as a programmatic edge of the CUDA graph.

The contract of every kernel here that takes a ``PDL`` constexpr (:func:`enter`, or :func:`signal` +
:func:`wait`):

* ``signal`` first thing: the next kernel may place its programs as this one's last wave runs;
* ``wait`` before the first load of anything a kernel of the step writes (activations, partials, the K/V cache)
  and before the first store. Before it only constant data may be read: the GEMV asks L2 for its slice of the
  packed weight there (:func:`prefetch_l2`), overlapping the kernel before.
* Transitively safe: a kernel cannot end before its own ``wait`` returned, so waiting for it waits for every
  kernel before it. A kernel launched *without* the attribute (torch's, cuBLAS, the Gluon decode kernels) starts
  after the one before has ended, as always; ``wait`` in a kernel launched without it returns at once.

:func:`on` is the one switch: the launch attribute and the ``PDL`` constexpr always go together (a kernel launched
with the attribute but without its ``wait`` would race). ``QUARL_KERNELS_PDL=0`` turns it off (measured with
``:nopdl`` in ``benchmarks/rollout_profile.py``); it is off under ``TRITON_INTERPRET=1`` and below sm_90.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from quarl_kernels.env import env_flag, interpreting

__all__ = ["ENV", "PREFETCH_ENV", "enter", "kwargs", "on", "prefetch_l2", "prefetch_on", "rows_aligned", "signal", "wait"]

ENV = "QUARL_KERNELS_PDL"
PREFETCH_ENV = "QUARL_KERNELS_PDL_PREFETCH"


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def on(device: torch.device) -> bool:
    """True when kernels launched on ``device`` use PDL: CUDA sm_90+, not the interpreter, ``QUARL_KERNELS_PDL``
    not 0."""
    if device.type != "cuda" or interpreting() or not env_flag(ENV, True):
        return False
    return _hopper_or_later(device.index if device.index is not None else torch.cuda.current_device())


def prefetch_on() -> bool:
    """The one-row GEMV's L2 prefetch before its wait (``QUARL_KERNELS_PDL_PREFETCH``, default on; only with PDL)."""
    return env_flag(PREFETCH_ENV, True)


def rows_aligned(ts: list, itemsize: int, per: int, total: int) -> bool:
    """True when every row slice a program prefetches (``pdl.prefetch_l2``: ``per`` elements from a multiple of
    ``per``, the last one up to ``total``) of every tensor starts and ends on 16 bytes."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * itemsize) % 16 == 0 for t in ts) and \
        (per * itemsize) % 16 == 0 and (total * itemsize) % 16 == 0


def kwargs(device: torch.device) -> dict:
    """The launch keywords of a ``PDL`` kernel: ``{"PDL": flag, "launch_pdl": flag}`` -- the constexpr and the
    launch attribute together, never one without the other."""
    flag = on(device)
    return {"PDL": flag, "launch_pdl": flag}


@triton.jit
def signal(PDL: tl.constexpr):
    """Let the next kernel place its programs (``griddepcontrol.launch_dependents``)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Wait for the kernel before to complete, its writes visible (``griddepcontrol.wait``)."""
    if PDL:
        gdc_wait()


@triton.jit
def enter(PDL: tl.constexpr):
    """:func:`signal` then :func:`wait`: the first statement of a kernel that reads its inputs at once."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def prefetch_l2(ptrs, nbytes, lead):
    """Ask L2 for ``nbytes`` (a multiple of 16) from each pointer of ``ptrs`` (16-byte aligned) whose ``lead`` is
    nonzero, one bulk request each (``cp.async.bulk.prefetch.L2``, sm_90): nothing to wait for, no registers held.
    A hint: the loads that follow read the same bytes. ``lead`` picks one element per request: a ``[BN]`` vector
    sliced from a 2-D tile is held by every thread along the other axis, and 16 copies of each request (the first
    version, session 16 phase a) made the 7B gate / up GEMV 1.24x slower."""
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $3, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t}"
        "\n\tmov.b32 $0, 0;", "=r,l,r,r", [ptrs, nbytes, lead], dtype=tl.int32, is_pure=False, pack=1)
