"""Shared scaffolding of the GPU kernel tests: a quantized random weight, NaN-poisoned
output memory, and the relative error against a float64 reference."""

from __future__ import annotations

import torch

from quarl.quant import get_format, make_config


def qweight(spec: str, n: int, k: int, device="cuda"):
    """(op arguments after ``x`` for ``torch.ops.quarl.wo_linear``, float64 dequantized weight [N, K])."""
    cfg = make_config(spec)
    w = torch.randn(n, k, device=device) * 0.03
    q = get_format(cfg.name).quantize(w, cfg)
    t = q.tensors
    args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
            cfg.name, cfg.block_size, n, k)
    return args, q.dequantize(torch.float64)


def poison(shape, dtype):
    """Fill the block the next same-size allocation will reuse with NaN (an unwritten output fails)."""
    junk = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    del junk


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, after checking that every element was written."""
    assert not torch.isnan(out).any(), "NaN in output: an element was not written (or decoded to NaN)"
    return ((out.double() - ref).norm() / ref.norm()).item()


def replayed(launch, x: torch.Tensor) -> torch.Tensor:
    """``launch(x)`` captured in a CUDA graph (compiled outside the capture), x refilled with new values, the graph
    replayed: its output -- what a rollout's decode step sees on every replay after the first."""
    launch(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = launch(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    return y
