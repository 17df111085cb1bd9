"""FP8 training linear vs BF16 on a Hopper GPU: correctness first, then fwd+bwd and decode timings.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/fp8_linear.py --out $OUT

1. Correctness: ``fp8_linear`` through cuBLAS (``F.scaled_mm`` blockwise) against the
   emulated FP32 path (same FP8 operands) for the forward, DGrad and WGrad, at a
   SmolLM2 shape (K = 576, padded) and a 7B shape; the compiled quantizers against the
   eager ones, bit for bit.
2. Training GEMMs: one decoder layer's seven projections (q, k, v, o, gate, up, down) at
   Qwen2.5-7B and Qwen3-8B shapes, M = 4096 / 8192 / 16384 tokens, forward + backward
   (DGrad and WGrad) with a BF16 master weight that changes every iteration (so the FP8
   weight is re-quantized every time, as after each optimizer step), vs ``F.linear`` in
   BF16. Times are CUDA-event medians over ``--iters``.
3. Decode: the projections of all layers of an 8B-shaped model (random weights, FP8 tiles
   cached as in rollout) for one token per row, batch 1 / 8 / 64, captured in one CUDA
   graph, FP8 vs BF16. Attention, norms and the LM head are not included: this is the GEMM
   part of a decode step.

Writes ``fp8_linear.json`` to ``--out`` and prints the tables last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quarl.quant.formats import fp8
from quarl.quant.fp8_linear import fp8_linear, quantize_weight_128x128, quantize_weight_padded

# (name, hidden, intermediate, q_out, kv_out, layers)
MODELS = {"Qwen2.5-7B": (3584, 18944, 3584, 512, 28), "Qwen3-8B": (4096, 12288, 4096, 1024, 36)}


def projections(h: int, inter: int, q: int, kv: int) -> list[tuple[str, int, int]]:
    """(name, N out, K in) of one decoder layer."""
    return [("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q), ("gate", inter, h), ("up", inter, h),
            ("down", h, inter)]


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def check_correctness() -> dict:
    out = {}
    for (m, n, k) in ((4096, 1536, 576), (2048, 18944, 3584), (300, 512, 640)):
        torch.manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
        g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        res = {}
        for mode in ("auto", "emulate"):
            os.environ["QUARL_FP8_GEMM"] = mode
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = fp8_linear(xx, ww)
            y.backward(g)
            res[mode] = (y, xx.grad, ww.grad)
        os.environ.pop("QUARL_FP8_GEMM")
        xx, ww = x.float().requires_grad_(), w.float().requires_grad_()
        y32 = F.linear(xx, ww)
        y32.backward(g.float())
        out[f"{m}x{n}x{k}"] = {
            "cublas_vs_emulated_rel": [rel(a, e) for a, e in zip(res["auto"], res["emulate"])],
            "fp8_vs_fp32_rel": [rel(a, r) for a, r in zip(res["auto"], (y32, xx.grad, ww.grad))],
        }
    x = torch.randn(3000, 3584, device="cuda", dtype=torch.bfloat16)
    qc, sc = torch.compile(fp8.quantize_act_1x128, dynamic=True)(x.t())
    qe, se = fp8.quantize_act_1x128(x.t())
    w = torch.randn(1000, 576, device="cuda")
    qw, sw = quantize_weight_padded(w)
    qr, sr = quantize_weight_128x128(w)
    out["compiled_quantizers_bit_identical"] = bool(
        torch.equal(qc.contiguous().view(torch.uint8), qe.contiguous().view(torch.uint8)) and torch.equal(sc, se)
        and torch.equal(qw[:1000, :576].view(torch.uint8), qr.view(torch.uint8)) and torch.equal(sw, sr))
    return out


def cuda_time(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def bench_training(models: list[str], tokens: list[int], iters: int) -> list[dict]:
    rows = []
    for name in models:
        h, inter, q, kv, _ = MODELS[name]
        for m in tokens:
            tot = {"bf16": 0.0, "fp8": 0.0}
            per = {}
            for pname, n, k in projections(h, inter, q, kv):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                w = torch.nn.Parameter(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
                g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

                def step(f, x=x, w=w, g=g):
                    with torch.no_grad():
                        w.mul_(1.0)  # an optimizer step: the weight's version moves, FP8 re-quantizes
                    x.grad = w.grad = None
                    f(x, w).backward(g)

                t16 = cuda_time(lambda: step(F.linear), iters)
                t8 = cuda_time(lambda: step(fp8_linear), iters)
                per[pname] = {"N": n, "K": k, "bf16_ms": t16, "fp8_ms": t8, "speedup": t16 / t8}
                tot["bf16"] += t16
                tot["fp8"] += t8
                del x, w, g
            rows.append({"model": name, "tokens": m, "layer_bf16_ms": tot["bf16"], "layer_fp8_ms": tot["fp8"],
                         "speedup": tot["bf16"] / tot["fp8"], "projections": per})
            print(f"train {name} M={m}: bf16 {tot['bf16']:.2f} ms  fp8 {tot['fp8']:.2f} ms  "
                  f"x{tot['bf16'] / tot['fp8']:.2f}", flush=True)
    return rows


def bench_decode(name: str, batches: list[int], iters: int) -> list[dict]:
    h, inter, q, kv, layers = MODELS[name]
    shapes = projections(h, inter, q, kv)
    torch.manual_seed(0)
    w16 = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _, n, k in shapes]
           for _ in range(layers)]
    from quarl.quant.base import QTensor
    from quarl.quant.formats.fp8 import FP8Config

    w8 = []
    for lw in w16:
        row = []
        for w in lw:
            qp, s = quantize_weight_padded(w)
            row.append(QTensor(FP8Config("block"), tuple(w.shape), {"weight": qp, "weight_scale": s}))
        w8.append(row)
    rows = []
    for b in batches:
        res = {}
        for kind in ("bf16", "fp8"):
            xs = {k: torch.randn(b, k, device="cuda", dtype=torch.bfloat16) for k in {k for _, _, k in shapes}}

            def step(kind=kind, xs=xs):
                acc = 0
                for li in range(layers):
                    for (_, _, k), w, qw in zip(shapes, w16[li], w8[li]):
                        y = F.linear(xs[k], w) if kind == "bf16" else fp8_linear(xs[k], qw)
                        acc = y[:, :1].sum() if isinstance(acc, int) else acc + y[:, :1].sum()
                return acc

            with torch.no_grad():
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    step()
                res[kind] = cuda_time(gr.replay, iters)
        rows.append({"model": name, "batch": b, "bf16_ms": res["bf16"], "fp8_ms": res["fp8"],
                     "speedup": res["bf16"] / res["fp8"]})
        print(f"decode {name} B={b}: bf16 {res['bf16']:.3f} ms  fp8 {res['fp8']:.3f} ms  "
              f"x{res['bf16'] / res['fp8']:.2f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--models", default="Qwen2.5-7B,Qwen3-8B")
    ap.add_argument("--tokens", default="4096,8192,16384")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["correctness"] = check_correctness()
    from quarl.quant.fp8_linear import CUBLAS_FALLBACKS

    res["cublas_fallbacks"] = dict(CUBLAS_FALLBACKS)  # empty: every GEMM ran on cuBLAS
    print(json.dumps(res["correctness"], indent=1), flush=True)
    res["training"] = bench_training(args.models.split(","), [int(t) for t in args.tokens.split(",")], args.iters)
    if not args.skip_decode:
        res["decode"] = bench_decode("Qwen3-8B", [int(b) for b in args.batches.split(",")], args.iters)
    res["wall_s"] = time.time() - t0
    (out / "fp8_linear.json").write_text(json.dumps(res, indent=1))
    print(f"\n# FP8 vs BF16 linear, {res['gpu']}, torch {res['torch']}")
    print("| model | tokens | BF16 layer fwd+bwd ms | FP8 ms | speed-up |")
    for r in res["training"]:
        print(f"| {r['model']} | {r['tokens']} | {r['layer_bf16_ms']:.2f} | {r['layer_fp8_ms']:.2f} | "
              f"{r['speedup']:.2f}x |")
    if "decode" in res:
        print("| decode (all projections, 8B shape) batch | BF16 ms | FP8 ms | speed-up |")
        for r in res["decode"]:
            print(f"| {r['batch']} | {r['bf16_ms']:.3f} | {r['fp8_ms']:.3f} | {r['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
