"""GPTQ's column loop, three ways: the reference (eager, one format call per column), a
static-shape version that a CUDA graph captures once per layer shape and replays, and one
Triton kernel per lazy block (``quarl_kernels.gptq_block``; static groups only).

Why. Inside a lazy block of 128 columns GPTQ is sequential: column ``i`` is rounded, its error
is pushed onto columns ``i+1..``, then column ``i+1`` is rounded. Each column is ~20 tiny
kernels (NVFP4's two-level rounding is ~16 of them) over ``[N, 1]`` tensors, so on a GPU the
loop is bound by kernel launches and Python dispatch (~0.5 ms per column measured on an H100;
a 7B block has ~30k columns), not by arithmetic.

How. Every column of a lazy block does the same ops on the same shapes; only the values
differ. So the block's columns are written once against fixed buffers (``W1``, ``Hinv1``,
``Q1``, ``E1`` and the scales, all ``[N, B]``-shaped) with no host syncs and no branching on
values, captured into a CUDA graph the first time a ``(N, B, format, ...)`` shape is seen,
and replayed for every later lazy block of that shape (a 7B model has four: q/k/v, o,
gate/up and down; the graphs are reused across all decoder blocks). Before a replay the
block's inputs are copied into the buffers; after it ``Q1`` and ``E1`` are read out, and the
lazy update of the columns to the right stays the one eager GEMM it was.

Numerics. The captured ops are the reference loop's ops, in the same order, on the same
values (the format's own ``qdq_with_scales``; ``err @ Hinv1[i, i:]`` as the same K=1
matmul), so the result is bit-identical to the reference loop -- the CPU tests run the same
code eagerly and compare with ``torch.equal``; the device benchmark re-checks it against the
reference on real 7B-shaped layers.

Scales. With static groups (act-order) every group's scales exist before the loop: their
tensors are stacked once per layer (``[G, ...]``) and each lazy block gathers its columns'
rows into the per-column scale buffer (one gather per block, the column -> group map lives on
the device). Without act-order a group's scales are computed from the current weights when
the loop reaches the group's first column; that ``block_scales`` call (which checks values:
a host sync) runs eagerly between graph segments, so a lazy block is split into segments at
group starts (8 segments of 16 columns for NVFP4, one for INT4-g128) and each segment is its
own graph.

Only formats whose ``qdq_with_scales`` is capture-safe (no host sync, no host-to-device copy)
are graphed: ``GRAPH_FORMATS``. Others, CPUs, and ``column_loop="reference"`` run the
reference loop.

Triton. The graph still pays one kernel per op per column (~22 for NVFP4). The kernel instead
keeps a 16-row x 128-column tile in registers and walks the columns itself: one launch per lazy
block. It re-implements the formats' rounding (``TRITON_FORMATS``) with the per-row divisors or
scales computed by the formats' own code (``_kernel_params``); its module docstring says how it
stays bit-identical. Static groups only: the in-loop ``block_scales`` of the other case is left
to the graph loop.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from typing import Any

import torch

log = logging.getLogger(__name__)

GRAPH_FORMATS = ("nvfp4", "mxfp4", "int")  # qdq_with_scales is a fixed sequence of device ops
TRITON_FORMATS = ("nvfp4", "mxfp4", "int")  # the rounding quarl_kernels.gptq_block implements
COLUMN_LOOPS = ("auto", "triton", "graph", "reference")
_MAX_CACHED = 32  # segment runners (each holds a few [N, B] buffers and its graphs)
_cache: OrderedDict[tuple, _Runner] = OrderedDict()
_graphs_broken = False  # set when a capture failed once: later calls run the same ops eagerly


def clear_graphs() -> None:
    """Drop every cached buffer and CUDA graph (calibrate_model calls this when it is done)."""
    _cache.clear()


# --- scales as flat tensor lists (a format's scales: a tensor, or a tuple of tensors / None) --------
def _flatten(x: Any, leaves: list[torch.Tensor]) -> tuple:
    if isinstance(x, tuple):
        return ("tuple", tuple(_flatten(y, leaves) for y in x))
    if torch.is_tensor(x):
        leaves.append(x)
        return ("tensor", len(leaves) - 1)
    return ("const", x)


def _build(spec: tuple, leaves: list[torch.Tensor]) -> Any:
    kind, v = spec
    if kind == "tuple":
        return tuple(_build(s, leaves) for s in v)
    return leaves[v] if kind == "tensor" else v


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Gathers and copies move bytes: float8 scales travel as uint8 (not every op takes float8)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


# --- the reference loop ----------------------------------------------------------------------------
def reference_loop(fmt, cfg, state: dict, W: torch.Tensor, Hinv: torch.Tensor, *, block_size: int, g: int,
                   groups: list | None, orig_col) -> tuple[torch.Tensor, torch.Tensor, list]:
    """GPTQ's lazy-batch column loop, eager (``W`` [N, K] is updated in place). -> (Q, losses, scales)."""
    n, k = W.shape
    Q = torch.zeros_like(W)
    losses = torch.zeros(n, device=W.device, dtype=torch.float32)
    scales_in_order: list[Any] = []
    scales = None
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        cnt = i2 - i1
        W1 = W[:, i1:i2].clone()  # [N, B]
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]  # [B, B]
        diag1 = Hinv1.diagonal().clone()  # [B]: the per-column divisors, read once per block
        for i in range(cnt):
            col = i1 + i
            if groups is not None:
                scales = groups[orig_col[col] // g]
            elif col % g == 0:
                # scales from the current weights of this group: columns inside the
                # block live (updated) in W1, later ones in W (updated once per block)
                cur = W1[:, i : i + g] if i + g <= cnt else torch.cat([W1[:, i:], W[:, i2 : col + g]], dim=1)
                scales = fmt.block_scales(cur, cfg, state)
                scales_in_order.append(scales)
            wc = W1[:, i : i + 1]  # [N, 1]
            qc = fmt.qdq_with_scales(wc, scales, cfg, state)  # [N, 1] float32 (W is)
            Q1[:, i : i + 1] = qc
            err = (wc - qc) / diag1[i]  # [N, 1]
            W1[:, i:] -= err @ Hinv1[i : i + 1, i:]  # [N, 1] @ [1, B-i]
            Err1[:, i : i + 1] = err
        losses += (Err1**2).sum(1) / 2  # GPTQ's objective (a report; per block rather than per column)
        Q[:, i1:i2] = Q1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]  # lazy batch update of the remaining columns
    return Q, losses, scales_in_order


# --- the static-shape loop -------------------------------------------------------------------------
class _Runner:
    """Fixed buffers for lazy blocks of one shape, and the graphs of their column segments."""

    def __init__(self, fmt, cfg, n: int, cnt: int, dev: torch.device, state: dict, spec: tuple,
                 leaves: list[torch.Tensor], per_column: bool):
        self.fmt, self.cfg, self.spec, self.per_column = fmt, cfg, spec, per_column
        self.W1 = torch.zeros(n, cnt, device=dev)  # [N, B] the block's weights, updated column by column
        self.Q1 = torch.zeros(n, cnt, device=dev)  # [N, B] rounded columns
        self.E1 = torch.zeros(n, cnt, device=dev)  # [N, B] scaled errors
        self.Hinv1 = torch.zeros(cnt, cnt, device=dev)  # [B, B]
        self.diag1 = torch.zeros(cnt, device=dev)  # [B]
        self.state = {k: v.detach().to(dev).clone() if torch.is_tensor(v) else v for k, v in state.items()}
        # per column: leaf j is [B, *shape_j] (row i: column i's scales); else one set for the segment
        self.leaves = [torch.zeros((cnt, *t.shape) if per_column else t.shape, dtype=t.dtype, device=dev)
                       for t in leaves]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def load(self, W1: torch.Tensor, Hinv1: torch.Tensor, state: dict) -> None:
        self.W1.copy_(W1)
        self.Hinv1.copy_(Hinv1)
        self.diag1.copy_(self.Hinv1.diagonal())
        for k, v in self.state.items():
            if torch.is_tensor(v):
                v.copy_(state[k])

    def set_scales(self, leaves: list[torch.Tensor]) -> None:
        for buf, t in zip(self.leaves, leaves):
            _raw(buf).copy_(_raw(t))

    def _scales(self, i: int) -> Any:
        return _build(self.spec, [t[i] for t in self.leaves] if self.per_column else self.leaves)

    def _body(self, a: int, b: int) -> None:
        """Columns a..b-1: the reference loop's ops, in its order, on the fixed buffers."""
        fmt, cfg, state = self.fmt, self.cfg, self.state
        W1, Q1, E1, Hinv1 = self.W1, self.Q1, self.E1, self.Hinv1
        for i in range(a, b):
            wc = W1[:, i : i + 1]  # [N, 1]
            qc = fmt.qdq_with_scales(wc, self._scales(i), cfg, state)  # [N, 1]
            Q1[:, i : i + 1] = qc
            err = (wc - qc) / self.diag1[i]  # [N, 1]
            W1[:, i:] -= err @ Hinv1[i : i + 1, i:]  # [N, 1] @ [1, B-i]
            E1[:, i : i + 1] = err

    def run(self, a: int, b: int, graph: bool) -> None:
        global _graphs_broken
        if not graph or _graphs_broken:
            self._body(a, b)
            return
        gr = self.graphs.get((a, b))
        if gr is not None:
            gr.replay()
            return
        # first time: run eagerly on a side stream (the real result, and the warm-up capture needs),
        # then capture the same ops; capturing does not execute them, so the buffers keep the result
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(a, b)
        torch.cuda.current_stream().wait_stream(side)
        try:
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                self._body(a, b)
            self.graphs[(a, b)] = gr
        except Exception as e:  # noqa: BLE001 -- a format op that cannot be captured: stay eager, stay correct
            _graphs_broken = True
            torch.cuda.synchronize()
            log.warning("gptq: CUDA graph capture of the column loop failed (%s: %s); running it eagerly",
                        type(e).__name__, e)


def _runner(fmt, cfg, n, cnt, dev, state, spec, leaves, per_column) -> _Runner:
    key = (str(dev), n, cnt, cfg, spec, per_column, tuple((tuple(t.shape), t.dtype) for t in leaves),
           tuple(sorted((k, (tuple(v.shape), v.dtype) if torch.is_tensor(v) else repr(v)) for k, v in state.items())))
    r = _cache.get(key)
    if r is None:
        r = _cache[key] = _Runner(fmt, cfg, n, cnt, dev, state, spec, leaves, per_column)
        while len(_cache) > _MAX_CACHED:
            _cache.popitem(last=False)
    _cache.move_to_end(key)
    return r


def static_loop(fmt, cfg, state: dict, W: torch.Tensor, Hinv: torch.Tensor, *, block_size: int, g: int,
                groups: list | None, orig_col, graph: bool) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The reference loop's arithmetic on fixed buffers; ``graph``: capture/replay it (CUDA only)."""
    n, k = W.shape
    dev = W.device
    Q = torch.zeros_like(W)
    losses = torch.zeros(n, device=dev, dtype=torch.float32)
    scales_in_order: list[Any] = []
    if groups is not None:  # static groups: column c's scales are row group(c) of the stacked leaves
        specs, per_group = [], []
        for s in groups:
            leaves: list[torch.Tensor] = []
            specs.append(_flatten(s, leaves))
            per_group.append(leaves)
        spec = specs[0]
        stacked = [torch.stack([_raw(lv[j]) for lv in per_group]) for j in range(len(per_group[0]))]  # [G, ...]
        colgroup = torch.tensor([c // g for c in orig_col], device=dev)  # [K] host -> device once
    else:  # scales computed in the loop: every group's have one structure; learn it from group 0
        probe: list[torch.Tensor] = []
        spec = _flatten(fmt.block_scales(W[:, :g], cfg, state), probe)
    leaves: list[torch.Tensor] = []  # the current group's scales (a group may span lazy blocks)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        cnt = i2 - i1
        r = _runner(fmt, cfg, n, cnt, dev, state, spec, per_group[0] if groups is not None else probe,
                    groups is not None)
        r.load(W[:, i1:i2], Hinv[i1:i2, i1:i2], state)
        if groups is not None:
            idx = colgroup[i1:i2]
            for buf, st in zip(r.leaves, stacked):
                _raw(buf).copy_(st[idx])  # [B, ...]: each column's group row
            r.run(0, cnt, graph)
        else:  # segments between group starts; a group's scales from the current weights (eager)
            bounds = sorted({0, cnt, *(i for i in range(cnt) if (i1 + i) % g == 0)})
            for a, b in itertools.pairwise(bounds):
                if (i1 + a) % g == 0:
                    cur = r.W1[:, a : a + g] if a + g <= cnt else torch.cat([r.W1[:, a:], W[:, i2 : i1 + a + g]], 1)
                    scales = fmt.block_scales(cur, cfg, state)
                    scales_in_order.append(scales)
                    leaves = []
                    _flatten(scales, leaves)
                r.set_scales(leaves)
                r.run(a, b, graph)
        losses += (r.E1**2).sum(1) / 2
        Q[:, i1:i2] = r.Q1
        W[:, i2:] -= r.E1 @ Hinv[i1:i2, i2:]  # lazy batch update of the remaining columns
    return Q, losses, scales_in_order


# --- the whole block in one Triton kernel (static groups) -----------------------------------------
def _kernel_params(cfg, state: dict, scales) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A group's frozen scales -> the kernel's per-row (divisor or scale [N], zero point [N] or None),
    computed with the format's own code, as its ``qdq_with_scales`` computes them."""
    if cfg.name == "nvfp4":
        from quarl.quant.formats.nvfp4 import _divisor, _global_scale

        return _divisor(scales.reshape(-1, 1), _global_scale(state, scales.device, check=False)).reshape(-1), None
    if cfg.name == "mxfp4":
        from quarl.quant.formats.mxfp4 import e8m0_to_float

        return e8m0_to_float(scales.reshape(-1, 1)).reshape(-1), None
    scale, zp = scales  # int: [N, 1] fp32 each (zp None when symmetric)
    return scale.reshape(-1), None if zp is None else zp.reshape(-1)


def triton_applies(cfg, static: bool, dev: torch.device) -> bool:
    """The Triton block kernel serves this call: static groups, a format it implements, and Triton
    on a CUDA device (or its CPU interpreter, ``TRITON_INTERPRET=1``)."""
    import importlib.util
    import os

    if not static or cfg.name not in TRITON_FORMATS:
        return False
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("quarl_kernels") is None:
        return False
    return dev.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_loop(fmt, cfg, state: dict, W: torch.Tensor, Hinv: torch.Tensor, *, block_size: int, g: int,
                groups: list, orig_col) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The reference loop's arithmetic, one kernel launch per lazy block (see quarl_kernels.gptq_block)."""
    from quarl_kernels.gptq_block import gptq_block

    n, k = W.shape
    dev = W.device
    if block_size > 128:
        raise ValueError(f"gptq: the Triton column loop takes lazy blocks of <= 128 columns, got {block_size}")
    params = [_kernel_params(cfg, state, s) for s in groups]
    P = torch.stack([p for p, _ in params])  # [G, N]
    Z = torch.stack([z for _, z in params]) if params[0][1] is not None else None  # [G, N]
    kind = 0 if cfg.name in ("nvfp4", "mxfp4") else (2 if Z is None else 1)
    qmin, qmax = (float(cfg.qmin), float(cfg.qmax)) if cfg.name == "int" else (0.0, 0.0)
    colgroup = torch.tensor([c // g for c in orig_col], device=dev)  # [K] host -> device once
    Q = torch.zeros_like(W)
    losses = torch.zeros(n, device=dev, dtype=torch.float32)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        cnt = i2 - i1
        idx = colgroup[i1:i2]
        E1 = torch.empty(n, cnt, device=dev)  # [N, B] contiguous, as the reference's Err1 (same GEMM below)
        # the kernel reads a row-major copy of the block's Hinv (the Cholesky factor is column-major);
        # the GEMM below keeps the reference's operands, so its summation order is the reference's
        gptq_block(W[:, i1:i2], Hinv[i1:i2, i1:i2].contiguous(), P[idx], None if Z is None else Z[idx], Q[:, i1:i2], E1,
                   kind, qmin, qmax)
        losses += (E1**2).sum(1) / 2
        W[:, i2:] -= E1 @ Hinv[i1:i2, i2:]  # lazy batch update of the remaining columns
    return Q, losses, []
