"""A rolling L2 prefetch for the decode kernels: ask for a weight's bytes a few K steps before they are loaded.

Why. A decode kernel at M = 1..16 streams its packed weight once, so its speed is HBM bytes in flight per SM
(Little's law: ~3 TB/s over 132 SMs at ~700-1000 cycles of DRAM latency is ~10 KB an SM). The GEMV and the
``mma.sync`` kernel keep at most two K steps of words in registers (the register double buffer), and a deeper
ring through shared memory cost more than it won (RESULTS "Issue 17, session 17": the per-step chain binds).
``prefetch.global.L2`` moves the DRAM latency off the loads without holding a register or a scoreboard slot:
each program asks L2 for the line(s) of its step ``i + AHEAD`` while it loads step ``i``, which by then is an
L2 hit (~250 cycles). One instruction per 128-byte line of a row, issued by the threads that hold the row.

What it is not: session 16 asked L2 for a program's *whole* weight slice before its PDL wait and was slower (every
resident program's requests queued ahead of their own loads, ``pdl.py``). Here at most ``AHEAD`` steps are
outstanding per program.

Prefetches are hints: the pointers are clamped in bounds by the callers (the split's last step again), so a
prefetch never names an address outside the tensor. ``AHEAD = 0`` compiles to nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LINE: tl.constexpr = tl.constexpr(128)  # bytes an L2 prefetch brings (one cache line)

_ASM = tl.constexpr("mov.u32 $0, 0;\n prefetch.global.L2 [$1];")


@triton.jit
def prefetch_l2(ptrs):
    """Triton: one ``prefetch.global.L2`` per element of ``ptrs`` (a tensor of pointers; the result is unused)."""
    tl.inline_asm_elementwise(_ASM, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_rows(row_ptrs, BYTES: tl.constexpr):
    """Triton: the lines of ``BYTES`` contiguous bytes from each of ``row_ptrs`` (int32 word pointers, e.g. a [R]
    tensor of a weight's row starts at one K step)."""
    for j in tl.static_range(0, BYTES, LINE):
        prefetch_l2(row_ptrs + j // 4)


@gluon.jit
def prefetch_l2_gluon(ptrs):
    """Gluon: one ``prefetch.global.L2`` per element of ``ptrs``."""
    gl.inline_asm_elementwise(_ASM, "=r,l", [ptrs], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def prefetch_rows_gluon(row_ptrs, BYTES: gl.constexpr):
    """Gluon: :func:`prefetch_rows`."""
    for j in gl.static_range(0, BYTES, LINE):
        prefetch_l2_gluon(row_ptrs + j // 4)


__all__ = ["LINE", "prefetch_l2", "prefetch_l2_gluon", "prefetch_rows", "prefetch_rows_gluon"]
