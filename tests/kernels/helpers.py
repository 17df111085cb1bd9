"""Shared scaffolding of the GPU kernel tests: a quantized random weight, NaN-poisoned
output memory, the relative error against a float64 reference, and FP8 operands compared code by code."""

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


def _pdl_chain(step, x: torch.Tensor, pws: list, norm_w: torch.Tensor) -> torch.Tensor:
    """RMSNorm -> ``step(x, pw, epi)`` (a decode GEMM and its last pass, with a bias) per weight, each reading the one
    before's output: what a decode step chains, so a kernel that read its x before the kernel before had written it
    would show."""
    from quarl_kernels import norm
    from quarl_kernels.launch import Epilogue

    for i, pw in enumerate(pws):
        x, _, _, _ = norm.rms_norm(x, norm_w, 1e-6)
        bias = torch.full((pw.n,), 0.01 * (i + 1), device=x.device, dtype=torch.bfloat16)
        x = step(x, pw, Epilogue(bias, None, None, 1.0))
    return x


def pdl_chain_runs(monkeypatch, step, pws: list, rows: int) -> None:
    """The chain of square weights ``pws`` with ``QUARL_KERNELS_PDL`` late, early and off, eager and replayed from a
    CUDA graph three times with new inputs: bit-equal outputs every way, and the replays saw their inputs."""
    from quarl_kernels import pdl

    k = pws[0].k
    gen = torch.Generator().manual_seed(k)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to("cuda", torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to("cuda", torch.bfloat16)
    runs = {}
    for flag in ("late", "early", "0"):
        monkeypatch.setenv(pdl.ENV, flag)
        eager = _pdl_chain(step, x, pws, norm_w)
        static = x.clone()
        _pdl_chain(step, static, pws, norm_w)  # compile before the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = _pdl_chain(step, static, pws, norm_w)
        got = []
        for s in range(3):
            static.copy_(torch.randn(rows, k, generator=torch.Generator().manual_seed(s)).to(torch.bfloat16))
            g.replay()
            got.append(out.clone())
        torch.cuda.synchronize()
        runs[flag] = (eager, got)
        del g
    for flag in ("late", "early"):
        assert torch.equal(runs[flag][0], runs["0"][0]), flag
        for a, b in zip(runs[flag][1], runs["0"][1], strict=True):
            assert torch.equal(a, b), flag
    assert not torch.equal(runs["0"][1][0], runs["0"][1][1])  # the replays saw their new inputs


def bench_kernel_module(name: str):
    """A module of ``benchmarks/kernels/`` (``compile_report``, the kept kernel experiments), imported without leaving
    that folder on ``sys.path``."""
    import importlib
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def fp8_operands_near(got, want, what: str, frac: float) -> int:
    """FP8 GEMM operands ``(q, s, qt, st)`` (None where absent) against a reference's: scales equal, codes equal but
    for at most ``frac`` of them, each of those one E4M3 step away (same sign, neighbouring magnitudes). Prints and
    returns how many codes differ."""
    n = total = 0
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None), what
        if a is None:
            continue
        if a.dtype != torch.float8_e4m3fn:
            assert torch.equal(a, b), f"{what}: {int((a != b).sum())} scales differ"
            continue
        a, b = a.contiguous().view(torch.uint8).int(), b.contiguous().view(torch.uint8).int()
        d = a != b
        if d.any():
            assert bool(((a[d] & 0x80) == (b[d] & 0x80)).all()), f"{what}: a code changed sign"
            assert int(((a[d] & 0x7F) - (b[d] & 0x7F)).abs().max()) <= 1, f"{what}: a code more than one step off"
        n, total = n + int(d.sum()), total + a.numel()
    print(f"{what}: {n} of {total} codes differ")
    assert n <= total * frac, f"{what}: {n} of {total} codes differ from the reference"
    return n


def ndiff(a, b) -> int:
    """How many elements of ``a`` differ from ``b`` (FP8 codes compared as bytes; None against None is 0, a shape
    mismatch or None against a tensor counts as 1)."""
    if a is None or b is None:
        return 0 if a is None and b is None else 1
    if a.shape != b.shape:
        return 1
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return int((a != b).sum())


def operands_same(got, want) -> bool:
    """Two tuples of FP8 GEMM operands ``(q, s, qt, st)`` (None where absent), bit for bit."""
    return all(ndiff(a, b) == 0 for a, b in zip(got, want, strict=True))


def mlp_inputs(h: int = 3584, inter: int = 18944, m: int = 4096, seed: int = 2):
    """A 7B-width MLP's BF16 master weights (gate, up [I, H], down [H, I]), input x [M, H] and output gradient, on
    CUDA: ``(ws, x, dy)``."""
    torch.manual_seed(seed)
    ws = [(torch.randn(*s, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_()
          for s in ((inter, h), (inter, h), (h, inter))]
    x = torch.randn(m, h, device="cuda").to(torch.bfloat16).requires_grad_()
    return ws, x, torch.randn(m, h, device="cuda").to(torch.bfloat16)


def mlp_grads(fn, x, ws, dy) -> list:
    """``[y, dx, dWg, dWu, dWd]`` of ``y = fn()`` backward from ``dy`` (the gradients cleared first)."""
    for t in (x, *ws):
        t.grad = None
    y = fn()
    y.backward(dy)
    return [y.detach(), x.grad, *(w.grad for w in ws)]
