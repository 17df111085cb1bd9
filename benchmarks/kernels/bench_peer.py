"""quarl's weight-only decode kernels beside two peers, on the Qwen2.5-7B/14B layer shapes (issue 17).

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/kernels/bench_peer.py --out DIR [--budget-s 120]
        [--models 7b,14b] [--ms 1,2,4,8,16,32,64,2048] [--impls ...] [--no-fused-shapes]
    python benchmarks/kernels/bench_peer.py --device cpu        # dry run: tiny shapes, no timing that means anything
    python benchmarks/kernels/bench_peer.py --report DIR/peer.json

Implementations (``--impls``), each ``y [M, N] = x [M, K] @ W^T`` with BF16 activations:

* ``quarl-nvfp4`` / ``quarl-mxfp4``: ``quarl_kernels.wo_gemm.wo_matmul`` -- the dispatched path a
  frozen ``QuantLinear`` runs (GEMV at M = 1, Gluon ``mma.sync`` at 2..64 on large layers, the
  fused tensor-core kernel, dense dequantize + cuBLAS at large M). NVFP4: block 16, E4M3
  scales + FP32 global; MXFP4: block 32, E8M0 scales.
* ``gemlite-int4-g64``: gemlite 0.5.1 (mobiusml, pure Triton) ``A16W4_HQQ_INT``: asymmetric INT4,
  group 64 along K, BF16 scale and zero per group, weights packed 8 per int32. Group 64 is the
  smallest group gemlite ships tuned H100 configs for (``configs/h100.json``); 4.5 bits a
  weight, the same as NVFP4 (4 + 8/16), vs MXFP4's 4.25. It runs only where gemlite ships a
  tuned config for the (M bucket, N, K, group) key: every 7B shape and the fused ones here, and
  the 14B q/o, down and fused shapes; not the 14B k/v 1024x5120 and gate/up 13824x5120, where
  gemlite's "fast" run-time autotune would compile and time ~20 configs per M -- more device
  time than this call has (those rows say so).
* ``gemlite-mxfp4`` (not in the default list): gemlite ``A16W4_MXFP`` (MXFP4, group 32, E8M0 --
  quarl's mxfp4 format); gemlite ships no H100 configs for it, so it autotunes at run time.
* ``tinygemm-int4-g64``: torch's own ``torch._weight_int4pack_mm`` (tinygemm, in torch core),
  asymmetric INT4, group 64, BF16 scales and zeros, ``_convert_weight_to_int4pack`` layout
  (inner k tiles 8).
* ``cublas-bf16``: ``x @ W.T`` on a BF16 weight, the baseline.

Method (as ``bench_dispatch.py``/``bench_gemv.py``): every timed call reads a different copy of
its weight (copies rotate, together >= 4x L2, so weights stream from HBM), R calls are captured
in one CUDA graph and the median replay / R is the time per call. GB/s counts what the call must
read and write at least: that implementation's packed weight + scales (+ zeros) + x + y, once.
% HBM is against 3.35 TB/s (H100 SXM spec) and against the measured device copy rate. Every
output is first checked against a float64 product with that implementation's own dequantized
weight (rel. Frobenius error; a peer whose packing we got wrong shows up there, not as speed).
Kernels are compiled ahead in spawn workers (one per shape) so compile time runs in parallel.
``--budget-s`` bounds the sweep (7B shapes first; what did not fit is listed), ``DIR/peer.json``
is rewritten after every shape, and the summary table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import torch

SHAPES = {  # (N, K, layer) -- N x K as nn.Linear's weight
    "7b": [(3584, 3584, "q/o"), (512, 3584, "k/v"), (18944, 3584, "gate/up"), (3584, 18944, "down")],
    "14b": [(5120, 5120, "q/o"), (1024, 5120, "k/v"), (13824, 5120, "gate/up"), (5120, 13824, "down")],
}
FUSED_SHAPES = {  # q|k|v and gate|up as one weight: what vLLM-style engines run
    "7b": [(4608, 3584, "qkv fused"), (37888, 3584, "gate|up fused")],
    "14b": [(7168, 5120, "qkv fused"), (27648, 5120, "gate|up fused")],
}
TINY = {"tiny": [(256, 256, "tiny"), (64, 256, "tiny k/v")]}
MS = [1, 2, 4, 8, 16, 32, 64, 2048]
IMPLS = ["quarl-nvfp4", "quarl-mxfp4", "gemlite-int4-g64", "tinygemm-int4-g64", "cublas-bf16"]  # + gemlite-mxfp4
H100_SPEC_GBPS = 3350.0
L2_MULT = 4
GROUP = 64
DEVICE = "cuda"


# --- quantizers shared by the INT4 peers -------------------------------------------------------
def int4_asym(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> (q uint8 [N, K] in 0..15, scale [N, K/g], min [N, K/g]) with w ~ q * scale + min."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8)
    return q.reshape(n, k), scale, lo


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.repeat_interleave(group, dim=1)


# --- implementations: each returns (list of callables over rotating copies, dequantized W float64, bytes)
def _copies(nbytes: int, l2: int) -> int:
    return max(2, min(256, -(-L2_MULT * l2 // max(nbytes, 1))))


def make_quarl(spec: str, w: torch.Tensor, l2: int):
    from quarl.quant import get_format, make_config

    cfg = make_config(spec)
    q = get_format(cfg.name).quantize(w, cfg)
    w64 = q.dequantize(torch.float64)
    if DEVICE != "cuda":  # dry run: the reference path a CPU QuantLinear takes
        wd = q.dequantize(torch.bfloat16)
        return [lambda x: x @ wd.T], w64, q.nbytes, {}
    from quarl_kernels import wo_gemm
    from quarl_kernels.ops import _packed_weight

    n, k = w.shape
    t = q.tensors
    p0 = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                        t.get("weight_global_scale"), cfg.name, cfg.block_size, n, k)
    pws = [p0] + [
        wo_gemm.PackedWeight(p0.fmt, p0.group, n, k, p0.words.clone(), p0.scale.clone(),
                             None if p0.zero is None else p0.zero.clone(),
                             None if p0.gscale is None else p0.gscale.clone(), p0.bytes32)
        for _ in range(_copies(q.nbytes, l2) - 1)
    ]
    return [lambda x, p=p: wo_gemm.wo_matmul(x, p) for p in pws], w64, q.nbytes, {}


def make_gemlite_int4(w: torch.Tensor, l2: int):
    from gemlite.helper import A16W4_HQQ_INT

    qv, scale, lo = int4_asym(w, GROUP)
    s16 = scale.to(torch.bfloat16)
    z16 = (-lo / scale).to(torch.bfloat16)  # HQQ convention: w ~ (q - z) * s
    # gemlite's fma mode stores -z*s rounded to bf16: w ~ q * s + zz
    zz = (-z16.float() * s16.float()).to(torch.bfloat16)
    w64 = qv.double() * _expand(s16.double(), GROUP) + _expand(zz.double(), GROUP)
    layers = []
    for _ in range(_copies(qv.numel() // 2, l2)):
        layers.append(A16W4_HQQ_INT(device=w.device, dtype=torch.bfloat16).from_weights(qv, s16, z16))
    lay = layers[0]
    nbytes = sum(t.numel() * t.element_size() for t in (lay.W_q, lay.scales, lay.zeros))
    return [lambda x, m=m: m(x) for m in layers], w64, nbytes, {}


def make_gemlite_mxfp4(w: torch.Tensor, l2: int):
    from gemlite.helper import A16W4_MXFP

    n, k = w.shape
    layers = []
    for _ in range(_copies(n * k // 2, l2)):
        lin = torch.nn.Linear(k, n, bias=False, device=w.device, dtype=torch.bfloat16)
        lin.weight.data.copy_(w)
        layers.append(A16W4_MXFP(device=w.device, dtype=torch.bfloat16).from_linear(lin))
    lay = layers[0]
    # its own dequantized weight, read back through the kernel on the identity (K x K is too big:
    # columns in chunks), so the error check compares against what it stores
    eye_chunks = []
    for c0 in range(0, k, 2048):
        e = torch.zeros(min(2048, k - c0), k, device=w.device, dtype=torch.bfloat16)
        e[torch.arange(e.shape[0]), torch.arange(c0, c0 + e.shape[0])] = 1
        eye_chunks.append(lay(e).double())  # [chunk, N] = rows of W^T
    w64 = torch.cat(eye_chunks).T.contiguous()
    nbytes = sum(t.numel() * t.element_size() for t in (lay.W_q, lay.scales))
    return [lambda x, m=m: m(x) for m in layers], w64, nbytes, {"ref": "own kernel on the identity"}


def make_tinygemm(w: torch.Tensor, l2: int):
    qv, scale, lo = int4_asym(w, GROUP)
    s16 = scale.to(torch.bfloat16)
    zero = (lo + 8 * scale).to(torch.bfloat16)  # tinygemm: w ~ (q - 8) * scale + zero
    sz = torch.stack([s16, zero], dim=2).transpose(0, 1).contiguous()  # [K/g, N, 2]
    q32 = qv.to(torch.int32)
    packed_u8 = (q32[:, ::2] << 4 | q32[:, 1::2]).to(torch.uint8)  # [N, K/2], as torchao packs it
    wp = torch._convert_weight_to_int4pack(packed_u8, 8)
    w64 = (qv.double() - 8) * _expand(s16.double(), GROUP) + _expand(zero.double(), GROUP)
    copies = [(wp, sz)] + [(wp.clone(), sz.clone()) for _ in range(_copies(wp.numel() * wp.element_size(), l2) - 1)]
    nbytes = wp.numel() * wp.element_size() + sz.numel() * sz.element_size()
    return [lambda x, p=p, s=s: torch._weight_int4pack_mm(x, p, GROUP, s) for p, s in copies], w64, nbytes, {}


def make_bf16(w: torch.Tensor, l2: int):
    wb = w.to(torch.bfloat16)
    ws = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
    return [lambda x, wi=wi: x @ wi.T for wi in ws], wb.double(), wb.numel() * 2, {}


def build(impl: str, w: torch.Tensor, l2: int):
    if impl.startswith("quarl-"):
        return make_quarl(impl.split("-", 1)[1], w, l2)
    return {"gemlite-int4-g64": make_gemlite_int4, "gemlite-mxfp4": make_gemlite_mxfp4,
            "tinygemm-int4-g64": make_tinygemm, "cublas-bf16": make_bf16}[impl](w, l2)


def gemlite_tuned(n: int, k: int, m: int) -> bool:
    """Whether gemlite ships a tuned config for this INT4 g64 BF16 call (its kernel choice by M)."""
    from gemlite import core
    from gemlite.triton_kernels.utils import get_closest_m

    kind = core.get_matmul_type(m, 4, False)
    key = str((get_closest_m(m), n, k, GROUP, 8, 104))  # 8 nibbles per int32, type_id fp16/bf16 * 100 + 4 bits
    return key in core.GEMLITE_TRITON_CONFIG_CACHE.get(kind, {})


def runs_here(impl: str) -> str | None:
    """None when ``impl`` can run on this device, else why not."""
    if DEVICE != "cuda" and impl.split("-")[0] in ("gemlite", "tinygemm"):
        return "needs CUDA (gemlite: Triton; tinygemm: CUDA int4 packing)"
    if impl.startswith("gemlite") and importlib.util.find_spec("gemlite") is None:
        return "gemlite is not installed (pip install --no-deps the wheel)"
    return None


# --- timing ------------------------------------------------------------------------------------------
def _sync_ms(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return out


def time_us(fns: list, x: torch.Tensor) -> float:
    """Median time per call of ``fns`` (one per rotating weight copy) replayed as one CUDA graph."""
    if DEVICE != "cuda":
        t = time.perf_counter()
        for f in fns:
            f(x)
        return (time.perf_counter() - t) / len(fns) * 1e6
    for f in fns[:2]:
        f(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        for f in fns:
            f(x)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    return statistics.median(_sync_ms(g.replay, 10)) * 1e3 / len(fns)


def hbm_copy_GBps() -> float:
    if DEVICE != "cuda":
        return float("nan")
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * n / (statistics.median(_sync_ms(lambda: dst.copy_(src), 20)) * 1e-3) / 1e9


# --- the sweep ------------------------------------------------------------------------------------------
def _setup_gemlite() -> str | None:
    """Import gemlite (it loads its shipped H100 configs at import); its version."""
    if DEVICE != "cuda" or importlib.util.find_spec("gemlite") is None:
        return None
    import gemlite
    from gemlite import core

    # gemlite picks its shipped configs by GPU name (configs/h100.json, ...); an H200 matches none and
    # would run untuned. It is the same SM90 chip with faster HBM: use the H100 configs, and say so.
    if not core.GEMLITE_TRITON_CONFIG_CACHE.get("GEMM_SPLITK") and torch.cuda.get_device_capability(0) == (9, 0):
        path = Path(core.__file__).parent / "configs" / "h100.json"
        gemlite.load_config(str(path))
        return f"{gemlite.__version__} (shipped H100 configs loaded explicitly on this SM90 GPU)"
    return gemlite.__version__  # autotune mode left at gemlite's default ("fast"): shipped configs apply


def _weight(n: int, k: int) -> torch.Tensor:
    g = torch.Generator(DEVICE).manual_seed(n * 7 + k)
    return (torch.randn(n, k, device=DEVICE, generator=g) * 0.03).to(torch.bfloat16).float()


def warm_shape(task) -> str:
    """Spawn worker: compile every kernel one shape will run, for every M (the Triton cache is shared)."""
    n, k, impls, ms = task
    _setup_gemlite()
    torch.cuda.set_device(0)
    w = _weight(n, k)
    done = []
    for impl in impls:
        try:
            fns, _, _, _ = build(impl, w, 0)
            for m in ms:
                if impl == "gemlite-int4-g64" and not gemlite_tuned(n, k, m):
                    continue
                fns[0](torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
            done.append(impl)
        except Exception as e:  # noqa: BLE001 - the timed pass records the error
            done.append(f"{impl}: {type(e).__name__}")
    torch.cuda.synchronize()
    return f"{n}x{k}: {', '.join(done)}"


def bench_shape(n: int, k: int, layer: str, model: str, impls: list[str], ms: list[int], l2: int, hbm: float,
                deadline: float) -> list[dict]:
    w = _weight(n, k)
    rows = []
    for impl in impls:
        why = runs_here(impl)
        if why:
            rows.append({"model": model, "layer": layer, "N": n, "K": k, "impl": impl, "skipped": why})
            continue
        if time.perf_counter() > deadline:
            rows.append({"model": model, "layer": layer, "N": n, "K": k, "impl": impl, "skipped": "time budget"})
            continue
        try:
            fns, w64, wbytes, extra = build(impl, w, l2)
        except Exception as e:  # noqa: BLE001
            rows.append({"model": model, "layer": layer, "N": n, "K": k, "impl": impl,
                         "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(rows[-1], flush=True)
            continue
        for m in ms:
            row = {"model": model, "layer": layer, "N": n, "K": k, "M": m, "impl": impl, **extra}
            if time.perf_counter() > deadline:
                row["skipped"] = "time budget"
                rows.append(row)
                continue
            if impl == "gemlite-int4-g64" and not gemlite_tuned(n, k, m):
                row["skipped"] = "no shipped H100 config (run-time autotune not affordable)"
                rows.append(row)
                continue
            try:
                x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=torch.Generator(DEVICE).manual_seed(m))
                y = fns[0](x)
                ref = x.double() @ w64.T
                row["err"] = float((y.double() - ref).norm() / ref.norm())
                ref_w = x.double() @ w.double().T  # the unquantized weight: quantization error, a packing check
                row["err_vs_w"] = float((y.double() - ref_w).norm() / ref_w.norm())
                us = time_us(fns, x)
                nbytes = wbytes + 2 * m * k + 2 * m * n
                row.update({"us": us, "weight_bytes": wbytes, "bytes": nbytes, "GBps": nbytes / us / 1e3,
                            "pct_spec": 100 * nbytes / us / 1e3 / H100_SPEC_GBPS,
                            "pct_copy": None if math.isnan(hbm) else 100 * nbytes / us / 1e3 / hbm,
                            "TFLOPs": 2 * m * n * k / us / 1e6, "copies": len(fns)})
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
        del fns, w64
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    # speed-ups over cuBLAS BF16 at the same (shape, M)
    bf16 = {r["M"]: r["us"] for r in rows if r["impl"] == "cublas-bf16" and "us" in r}
    for r in rows:
        if "us" in r and r.get("M") in bf16:
            r["vs_bf16"] = bf16[r["M"]] / r["us"]
    for r in rows:
        if "us" in r:
            print(f"{model} {layer:14s} {n:5d}x{k:5d} M={r['M']:4d} {r['impl']:18s} {r['us']:8.2f} us "
                  f"{r['GBps']:6.0f} GB/s {r['pct_spec']:4.0f}% spec  x{r.get('vs_bf16', float('nan')):.2f} bf16  "
                  f"err {r['err']:.1e}", flush=True)
    return rows


def table(res: dict) -> str:
    """Per (shape, M): us and % of 3.35 TB/s for each implementation, the best one marked."""
    info = res["info"]
    impls = [i for i in res["impls"] if any(r["impl"] == i and "us" in r for r in res["rows"])]
    lines = [(f"GPU {info.get('gpu')}, torch {info.get('torch')}, Triton {info.get('triton')}, gemlite "
              f"{info.get('gemlite')}, {info.get('date')}; HBM copy {info.get('hbm_copy_GBps', float('nan')):.0f} GB/s; "
              "cell = us (% of 3.35 TB/s on an H100, else % of the measured copy rate; x vs cuBLAS BF16); "
              "* = fastest 4-bit"), "",
             "| model | layer | N x K | M | " + " | ".join(impls) + " |", "|---|---|---|---:|" + "---|" * len(impls)]
    keys, skips = [], []  # skips: distinct reasons a cell was not timed, printed once under the table
    for r in res["rows"]:
        if "M" in r and (r["model"], r["layer"], r["N"], r["K"], r["M"]) not in keys:
            keys.append((r["model"], r["layer"], r["N"], r["K"], r["M"]))
    for key in keys:
        cell = {r["impl"]: r for r in res["rows"] if (r["model"], r["layer"], r["N"], r["K"], r.get("M")) == key}
        four = [i for i in impls if i != "cublas-bf16" and "us" in cell.get(i, {})]
        best = min(four, key=lambda i: cell[i]["us"]) if four else None
        vals = []
        for i in impls:
            r = cell.get(i, {})
            if "us" in r:
                bad = " BAD-ERR" if r["err"] > 2e-2 else ""
                pct = r["pct_spec"] if "H100" in str(info.get("gpu")) or r.get("pct_copy") is None else r["pct_copy"]
                vals.append(f"{'*' if i == best else ''}{r['us']:.1f} ({pct:.0f}%, "
                            f"{r.get('vs_bf16', float('nan')):.2f}x){bad}")
            elif r.get("error") or r.get("skipped"):
                why = f"{'error' if r.get('error') else 'skipped'}: {r.get('error') or r.get('skipped')}"
                skips += [why] if why not in skips else []
                vals.append(f"{why.split(':')[0]} ({skips.index(why) + 1})")
            else:
                vals.append("-")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]}x{key[3]} | {key[4]} | " + " | ".join(vals) + " |")
    notes = "".join(f"({n}) {why}\n" for n, why in enumerate(skips, 1))
    return "\n".join(lines) + "\n\n" + (notes + "\n" if notes else "") + peer_wins(res)


def peer_wins(res: dict) -> str:
    """Where a peer beats both quarl formats (per shape and M), in one line each."""
    out = []
    by = {}
    for r in res["rows"]:
        if "us" in r:
            by.setdefault((r["model"], r["layer"], r["M"]), {})[r["impl"]] = r["us"]
    for key, d in by.items():
        q = min((d[i] for i in d if i.startswith("quarl-")), default=None)
        for i, us in d.items():
            if q is not None and not i.startswith(("quarl-", "cublas")) and us < q:
                out.append(f"{i} beats quarl at {key[0]} {key[1]} M={key[2]}: {us:.1f} vs {q:.1f} us ({q / us:.2f}x)")
    return "Peer wins:\n" + ("\n".join(out) if out else "(none)") + "\n"


def gemlite_import_check() -> dict:
    """On any machine: is the wheel installed, do its sources compile, are its imports importable here."""
    spec = importlib.util.find_spec("gemlite")
    out = {"installed": spec is not None}
    if spec is None:
        return out
    root = Path(spec.origin).parent
    bad = []
    for f in root.rglob("*.py"):
        try:
            compile(f.read_text(), str(f), "exec")
        except SyntaxError as e:
            bad.append(f"{f.name}: {e}")
    out["sources_compile"] = not bad
    out["compile_errors"] = bad
    out["deps"] = {m: importlib.util.find_spec(m) is not None for m in ("torch", "triton", "numpy", "tqdm")}
    return out


def main(argv=None) -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", default="7b,14b")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--no-fused-shapes", action="store_true", help="skip the fused qkv / gate|up shapes")
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--no-warm", action="store_true", help="compile in the timed process (no spawn workers)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--report", help="print the table of a finished run's peer.json and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(table(json.loads(Path(args.report).read_text())))
        return 0
    DEVICE = args.device
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    ms = [int(m) for m in args.ms.split(",")]
    impls = args.impls.split(",")
    models = args.models.split(",")
    if DEVICE != "cuda":
        models, ms = ["tiny"], [m for m in ms if m <= 16]
    table_shapes = {**SHAPES, **TINY}
    shapes = [(m, n, k, lay) for m in models for n, k, lay in table_shapes[m]]
    if not args.no_fused_shapes:
        shapes += [(m, n, k, lay) for m in models for n, k, lay in FUSED_SHAPES.get(m, [])]
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "device": DEVICE,
            "gemlite_import_check": gemlite_import_check()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"info": info, "impls": impls, "rows": [], "notes": []}

    def save():
        (out / "peer.json").write_text(json.dumps(res, indent=1, default=str))

    l2 = 0
    if DEVICE == "cuda":
        props = torch.cuda.get_device_properties(0)
        l2 = getattr(props, "L2_cache_size", 50 << 20)
        info.update({"gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": l2,
                     "gemlite": _setup_gemlite()})
        if not args.no_warm:
            warm_impls = [i for i in impls if runs_here(i) is None and i != "cublas-bf16"]
            tasks = [(n, k, warm_impls, ms) for _, n, k, _ in shapes]
            try:
                with mp.get_context("spawn").Pool(min(args.workers, len(tasks))) as pool:
                    it = pool.imap_unordered(warm_shape, tasks)
                    for _ in tasks:
                        left = deadline - time.perf_counter() - 0.5 * args.budget_s  # keep half for timing
                        print("compiled", it.next(timeout=max(left, 1.0)), f"{time.perf_counter() - t0:.0f}s",
                              flush=True)
            except Exception as e:  # noqa: BLE001 - a timeout or a dead worker: compile in the timed pass
                res["notes"].append(f"warm-up incomplete: {type(e).__name__}: {e}")
                print(res["notes"][-1], flush=True)
        info["compile_s"] = time.perf_counter() - t0
    info["hbm_copy_GBps"] = hbm_copy_GBps()
    print(json.dumps(info), flush=True)
    save()
    for model, n, k, lay in shapes:
        if time.perf_counter() > deadline:
            res["notes"].append(f"{model} {lay} {n}x{k}: not run (time budget)")
            continue
        res["rows"] += bench_shape(n, k, lay, model, impls, ms, l2, info["hbm_copy_GBps"], deadline)
        save()
    info["wall_s"] = time.perf_counter() - t0
    save()
    print("notes:", res["notes"])
    print(table(res))
    return 0


if __name__ == "__main__":
    mp.freeze_support()
    sys.exit(main())
