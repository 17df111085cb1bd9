"""FP8 training linear vs BF16 on a Hopper GPU: correctness first, then the quantizers, fwd+bwd and decode.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/fp8_linear.py --out $OUT --budget-s 40
    python benchmarks/fp8_linear.py --device cpu --out /tmp/fp8dry        # CPU dry run, tiny shapes

(``benchmarks/fp8_linear_gpu.sh`` runs this and the GPU tests in one ~60 s device call.)

FP8 arms, by quantizer implementation (``QUARL_FP8_QUANT``, :mod:`quarl.quant.fp8_linear`):
``fp8`` = the fused Triton quantizers (``quarl_kernels.fp8_quant``, the CUDA default),
``fp8-compile`` = the PyTorch quantizers through ``torch.compile`` (the previous default).

1. Correctness: ``fp8_linear`` through cuBLAS (``F.scaled_mm`` blockwise) against the
   emulated FP32 path (same FP8 operands) for forward, DGrad and WGrad at a SmolLM2 shape
   (K = 576, padded), a 7B shape and an odd one; the fused and the compiled quantizers
   against the eager ones, counting the code bytes that differ (fused: 0 expected).
2. Quantizers alone at Qwen2.5-7B gate-projection sizes (8192 tokens): X and dY in both
   groupings (one pass), W's tiles and their transpose; ms and the HBM bandwidth they
   reach (bytes read + written / time; the prediction in docs/kernels.md assumes ~3 TB/s).
3. Training GEMMs: one decoder layer's seven projections (q, k, v, o, gate, up, down) at
   Qwen2.5-7B / Qwen3-8B shapes, forward + backward (DGrad and WGrad) with a BF16 master
   weight that changes every iteration (so the FP8 weight is re-quantized every time, as
   after each optimizer step), vs ``F.linear`` in BF16. Each arm is timed as ``--iters``
   steps launched back to back between two CUDA events (the host runs ahead, as in a
   training step of a large model; per-step mean), after 2 warm-up steps.
4. A kernel profile of one gate-projection FP8 fwd+bwd with the fused quantizers (where
   the time goes now).
5. Decode: the projections of all layers of an 8B-shaped model (random weights, FP8 tiles
   cached as in rollout) for one token per row, batch 1 / 8 / 64, captured in one CUDA
   graph, FP8 (fused activation quantizer) vs BF16. Attention, norms and the LM head are
   not included: this is the GEMM part of a decode step.

A hard wall-clock budget (``--budget-s``) is checked before every measurement; whatever
finished is in ``fp8_linear.json`` (rewritten after every row), and the tables are printed
last. ``--device cpu`` runs every part on tiny shapes (emulated GEMMs; the fused quantizers
only under ``TRITON_INTERPRET=1`` with Triton installed) so the GPU call cannot fail on a typo.
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
from quarl.quant.fp8_linear import fp8_linear, quant_backend, quantize_weight_128x128, quantize_weight_padded

# (name, hidden, intermediate, q_out, kv_out, layers)
MODELS = {"Qwen2.5-7B": (3584, 18944, 3584, 512, 28), "Qwen3-8B": (4096, 12288, 4096, 1024, 36),
          "tiny": (256, 640, 256, 128, 2)}  # tiny: the CPU dry run
ARMS = {"bf16": None, "fp8": "triton", "fp8-compile": "compile", "fp8-eager": "eager"}


def projections(h: int, inter: int, q: int, kv: int) -> list[tuple[str, int, int]]:
    """(name, N out, K in) of one decoder layer."""
    return [("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q), ("gate", inter, h), ("up", inter, h),
            ("down", h, inter)]


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def set_quant(backend: str | None) -> None:
    if backend is None:
        os.environ.pop("QUARL_FP8_QUANT", None)
    else:
        os.environ["QUARL_FP8_QUANT"] = backend


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.time(), seconds

    def left(self) -> float:
        return self.seconds - (time.time() - self.t0)

    def ok(self, need: float = 0.0) -> bool:
        return self.left() > need


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def cuda_time(fn, iters: int, warmup: int = 3) -> float:
    """Median ms of ``iters`` calls, each between two CUDA events and synchronized (decode replays)."""
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


def stream_time(fn, iters: int, device: str, warmup: int = 2, meter=None) -> float:
    """Mean ms per call of ``iters`` calls launched back to back (host runs ahead of the GPU); ``meter``
    (``gpu_energy.EnergyMeter``, CUDA) started and stopped around the same span."""
    for _ in range(warmup):
        fn()
    sync(device)
    if device != "cuda":
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) * 1e3 / iters
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if meter is not None:
        meter.start()
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    if meter is not None:
        meter.stop()
    return a.elapsed_time(b) / iters


def _bytes_differ(a, b) -> int:
    return int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())


# --------------------------------------------------------------------------- 1. correctness
def check_correctness(device: str) -> dict:
    out = {}
    cuda = device == "cuda"
    shapes = ((4096, 1536, 576), (2048, 18944, 3584), (300, 512, 640)) if cuda else ((64, 256, 576), (30, 128, 256))
    for (m, n, k) in shapes:
        torch.manual_seed(0)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.05
        g = torch.randn(m, n, device=device, dtype=torch.bfloat16)
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
            "quant_backend": quant_backend(x),
            "cublas_vs_emulated_rel": [rel(a, e) for a, e in zip(res["auto"], res["emulate"])],
            "fp8_vs_fp32_rel": [rel(a, r) for a, r in zip(res["auto"], (y32, xx.grad, ww.grad))],
        }
    # quantizer implementations vs eager, at a 7B activation and weight (bytes of codes that differ)
    m, k, n = (3000, 3584, 18944) if cuda else (130, 576, 200)
    torch.manual_seed(1)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
    qe, se = fp8.quantize_act_1x128(x)
    qte, ste = fp8.quantize_act_1x128(x.t())
    set_quant("eager")
    qwe, swe = quantize_weight_padded(w)
    q128, s128 = quantize_weight_128x128(w)
    cmp = {"numel_act": x.numel(), "numel_weight": w.numel(),
           "eager_padded_equals_format": _bytes_differ(qwe[:n, :k], q128) == 0 and torch.equal(swe, s128)}
    from quarl.quant import fp8_linear as fl

    kp, mt = -(-k // 128) * 128, -(-m // 128) * 128
    for backend in ("triton", "compile"):
        set_quant(backend)
        if quant_backend(x) != backend:
            cmp[backend] = f"not available on {device} (backend {quant_backend(x)})"
            continue
        q, s, qt, st = fl.quantize_act_gemm(x, m, kp, mt)  # [m, kp], [m, kp/128], [kp, mt], [kp, mt/128]
        qw, sw = quantize_weight_padded(w)
        cmp[backend] = {"act_bytes_differ": _bytes_differ(q[:, :k], qe), "act_scales_equal": bool(torch.equal(s, se)),
                        "act_t_bytes_differ": _bytes_differ(qt[:k, :m], qte),
                        "act_t_scales_equal": bool(torch.equal(st[:k], ste)),
                        "weight_bytes_differ": _bytes_differ(qw, qwe), "weight_scales_equal": bool(torch.equal(sw, swe))}
    set_quant(None)
    out["quantizers_vs_eager"] = cmp
    return out


# --------------------------------------------------------------------------- 2. quantizers alone
def bench_quantizers(device: str, budget: Budget, iters: int) -> list[dict]:
    set_quant("triton")
    avail = quant_backend(torch.empty(0, device=device)) == "triton"
    set_quant(None)
    if not avail:
        return [{"skipped": f"fused quantizers not available on {device} (Triton; on CPU TRITON_INTERPRET=1)"}]
    from quarl_kernels import fp8_quant as fq

    from quarl.quant import fp8_linear as fl

    m, n, k = (8192, 18944, 3584) if device == "cuda" else (256, 384, 256)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    rows = []
    # (operand, bytes moved: 2-byte read + two 1-byte code writes (+ scales), the call per implementation)
    cases = [("X dual [8192, 3584]" if device == "cuda" else "X dual", 4 * m * k + 8 * m * k // 128,
              lambda **kw: fq.quantize_act(x, m, k, m, **kw),
              lambda: fl.quantize_act_gemm(x, m, k, m)),
             ("dY dual [8192, 18944]" if device == "cuda" else "dY dual", 4 * m * n + 8 * m * n // 128,
              lambda **kw: fq.quantize_act(dy, m, n, m, **kw),
              lambda: fl.quantize_act_gemm(dy, m, n, m)),
             ("W tiles + W^T [18944, 3584]" if device == "cuda" else "W tiles + W^T", 4 * n * k,
              lambda **kw: fq.quantize_tiles(w, True, **kw),
              lambda: fl._weight_tiles(w, True))]
    # (rows per chunk, warps): the default first for every operand; the others (one Triton compile each) and
    # the compiled PyTorch quantizers only while the budget leaves room for the training table
    configs = ((32, 8), (16, 8), (32, 4), (64, 8)) if device == "cuda" else ((32, 8),)
    rows = [{"operand": name, "bytes": nbytes} for name, nbytes, _, _ in cases]
    for ci, (sub, warps) in enumerate(configs):
        for row, (_, nbytes, fused, _) in zip(rows, cases):
            if not budget.ok(5 if ci == 0 else 30):
                break
            ms = stream_time(lambda f=fused, s=sub, wa=warps: f(sub=s, warps=wa), iters if device == "cuda" else 1,
                             device, warmup=2 if device == "cuda" else 1)
            row[f"fused_sub{sub}_w{warps}_ms"] = ms
            row[f"fused_sub{sub}_w{warps}_GBps"] = nbytes / ms / 1e6
    for row, (_, _, _, generic) in zip(rows, cases):
        if device == "cuda" and budget.ok(28):
            set_quant("compile")  # the previous default: torch.compile'd PyTorch quantizers (pad, quantize, .t())
            row["compile_ms"] = stream_time(generic, iters, device)
            set_quant(None)
        print("quant", json.dumps(row), flush=True)
    return rows


# --------------------------------------------------------------------------- 3. training GEMMs
def bench_training(models: list[str], tokens: list[int], arms: list[str], old_tokens: set[int], iters: int,
                   device: str, budget: Budget, rows: list, on_row) -> list[dict]:
    """Appends one row per (tokens, model) to ``rows`` and calls ``on_row`` (the incremental save)."""
    for m in tokens:
        for name in models:
            if not budget.ok(4):
                print(f"budget: skipping {name} M={m} and later", flush=True)
                return rows
            h, inter, q, kv, _ = MODELS[name]
            use = [a for a in arms if a != "fp8-compile" or m in old_tokens]
            tot = dict.fromkeys(use, 0.0)
            per = {}
            for pname, n, k in projections(h, inter, q, kv):
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
                w = torch.nn.Parameter(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
                g = torch.randn(m, n, device=device, dtype=torch.bfloat16)

                def step(f, x=x, w=w, g=g):
                    with torch.no_grad():
                        w.mul_(1.0)  # an optimizer step: the weight's version moves, FP8 re-quantizes
                    x.grad = w.grad = None
                    f(x, w).backward(g)

                per[pname] = {"N": n, "K": k}
                for arm in use:
                    set_quant(ARMS[arm])
                    try:
                        t = stream_time(lambda arm=arm: step(F.linear if arm == "bf16" else fp8_linear), iters, device)
                    except Exception as e:  # noqa: BLE001 - one arm failing must not lose the others
                        per[pname][f"{arm}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        print(f"train {name} M={m} {pname} {arm} failed: {per[pname][f'{arm}_error']}", flush=True)
                        t = float("nan")
                    per[pname][f"{arm}_ms"] = t
                    tot[arm] += t
                set_quant(None)
                del x, w, g
            row = {"model": name, "tokens": m, **{f"layer_{a}_ms": tot[a] for a in use}, "projections": per}
            for a in use:
                if a != "bf16":
                    row[f"speedup_{a}"] = tot["bf16"] / tot[a]
            rows.append(row)
            on_row()
            print(f"train {name} M={m}: " + "  ".join(f"{a} {tot[a]:.2f} ms" for a in use) + "  " +
                  "  ".join(f"{a} x{row[f'speedup_{a}']:.2f}" for a in use if a != "bf16"), flush=True)
    return rows


# --------------------------------------------------------------------------- 4. kernel profile
def profile_gate(device: str, m: int) -> str:
    h, inter, *_ = MODELS["Qwen2.5-7B"] if device == "cuda" else MODELS["tiny"]
    x = torch.randn(m, h, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(inter, h, device=device, dtype=torch.bfloat16) * 0.02)
    g = torch.randn(m, inter, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        fp8_linear(x, w).backward(g)
    sync(device)
    acts = [torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        with torch.no_grad():
            w.mul_(1.0)
        x.grad = w.grad = None
        fp8_linear(x, w).backward(g)
        sync(device)
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=70)


# --------------------------------------------------------------------------- 5. decode
def bench_decode(name: str, batches: list[int], iters: int, device: str, budget: Budget) -> list[dict]:
    h, inter, q, kv, layers = MODELS[name]
    shapes = projections(h, inter, q, kv)
    torch.manual_seed(0)
    w16 = [[torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _, n, k in shapes]
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
        if not budget.ok(3):
            break
        res = {}
        for kind in ("bf16", "fp8"):
            xs = {k: torch.randn(b, k, device=device, dtype=torch.bfloat16) for k in {k for _, _, k in shapes}}

            def step(kind=kind, xs=xs):
                acc = 0
                for li in range(layers):
                    for (_, _, k), w, qw in zip(shapes, w16[li], w8[li]):
                        y = F.linear(xs[k], w) if kind == "bf16" else fp8_linear(xs[k], qw)
                        acc = y[:, :1].sum() if isinstance(acc, int) else acc + y[:, :1].sum()
                return acc

            with torch.no_grad():
                if device != "cuda":
                    res[kind] = stream_time(step, iters, device)
                    continue
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    step()
                res[kind] = cuda_time(gr.replay, iters)
        rows.append({"model": name, "batch": b, "bf16_ms": res["bf16"], "fp8_ms": res["fp8"],
                     "speedup": res["bf16"] / res["fp8"], "quant_backend": quant_backend(w16[0][0])})
        print(f"decode {name} B={b}: bf16 {res['bf16']:.3f} ms  fp8 {res['fp8']:.3f} ms  "
              f"x{res['bf16'] / res['fp8']:.2f}", flush=True)
    return rows


# --------------------------------------------------------------------------- report
def tables(res: dict) -> str:
    L = [f"# FP8 vs BF16 linear, {res.get('gpu')}, torch {res.get('torch')}, wall {res.get('wall_s', 0):.0f} s"]
    if res.get("quantizers"):
        L += ["", "| quantizer (fused, one pass) | bytes | best fused ms | GB/s | setting | compiled ms |", "|---|---:|---:|---:|---|---:|"]
        for r in res["quantizers"]:
            if "operand" not in r:
                L.append(f"| {r} |")
                continue
            fused = {k: v for k, v in r.items() if k.startswith("fused_") and k.endswith("_ms")}
            if not fused:
                continue
            best = min(fused, key=fused.get)
            comp = f"{r['compile_ms']:.3f}" if "compile_ms" in r else "-"
            L.append(f"| {r['operand']} | {r['bytes'] / 1e6:.0f} MB | {fused[best]:.3f} | "
                     f"{r['bytes'] / fused[best] / 1e6:.0f} | {best[6:-3]} | {comp} |")
    if res.get("training"):
        L += ["", "| model | tokens | BF16 ms | FP8 fused ms | speed-up | FP8 compiled ms | speed-up |",
              "|---|---:|---:|---:|---:|---:|---:|"]
        for r in res["training"]:
            c = (f"{r['layer_fp8-compile_ms']:.2f} | {r['speedup_fp8-compile']:.2f}x" if "layer_fp8-compile_ms" in r
                 else "- | -")
            f8 = f"{r['layer_fp8_ms']:.2f} | {r['speedup_fp8']:.2f}x" if "layer_fp8_ms" in r else "- | -"
            L.append(f"| {r['model']} | {r['tokens']} | {r['layer_bf16_ms']:.2f} | {f8} | {c} |")
    if res.get("decode"):
        L += ["", "| decode (all projections, 8B shape) batch | BF16 ms | FP8 ms | speed-up |", "|---:|---:|---:|---:|"]
        for r in res["decode"]:
            L.append(f"| {r['batch']} | {r['bf16_ms']:.3f} | {r['fp8_ms']:.3f} | {r['speedup']:.2f}x |")
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", default=None, help="default Qwen2.5-7B,Qwen3-8B (cuda) / tiny (cpu)")
    ap.add_argument("--tokens", default=None, help="default 8192,16384,4096 (cuda) / 64,128 (cpu), in this order")
    ap.add_argument("--arms", default="bf16,fp8,fp8-compile", help=f"of {', '.join(ARMS)}")
    ap.add_argument("--compile-tokens", default="8192", help="token counts that also time fp8-compile (cpu: all)")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=45.0, help="stop starting new measurements after this")
    ap.add_argument("--skip", default="", help="parts to skip: correctness,quantizers,training,profile,decode")
    ap.add_argument("--render", default="", help="print the tables of an earlier run's fp8_linear.json and exit")
    args = ap.parse_args()
    if args.render:
        print(tables(json.loads(Path(args.render).read_text())))
        return
    cuda = args.device == "cuda"
    models = (args.models or ("Qwen2.5-7B,Qwen3-8B" if cuda else "tiny")).split(",")
    tokens = [int(t) for t in (args.tokens or ("8192,16384,4096" if cuda else "64,128")).split(",")]
    arms = args.arms.split(",")
    bad = [a for a in arms if a not in ARMS] + [m for m in models if m not in MODELS]
    if bad or "bf16" not in arms:
        raise SystemExit(f"unknown arm/model {bad} (arms {list(ARMS)}, models {list(MODELS)}); bf16 is required")
    old = set(tokens) if not cuda else {int(t) for t in args.compile_tokens.split(",") if t}
    skip = set(args.skip.split(",")) - {""}
    budget = Budget(args.budget_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "default_quant_backend": quant_backend(torch.empty(0, device=args.device)), "budget_s": args.budget_s}

    def save():
        res["wall_s"] = time.time() - budget.t0
        (out / "fp8_linear.json").write_text(json.dumps(res, indent=1))

    def part(name, fn, need):
        if name in skip:
            return
        if not budget.ok(need):
            res.setdefault("skipped", []).append(name)
            print(f"budget: skipping {name}", flush=True)
            return
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - record and go on: a killed part must not lose the others
            res[name + "_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(f"{name} failed: {res[name + '_error']}", flush=True)
        save()

    part("correctness", lambda: check_correctness(args.device), 0)
    from quarl.quant.fp8_linear import CUBLAS_FALLBACKS

    res["cublas_fallbacks"] = dict(CUBLAS_FALLBACKS)  # empty: every GEMM ran on cuBLAS
    print(json.dumps(res.get("correctness"), indent=1), flush=True)
    part("quantizers", lambda: bench_quantizers(args.device, budget, args.iters), 5)
    rows: list = []
    res["training"] = rows  # filled row by row, saved after each
    part("training", lambda: bench_training(models, tokens, arms, old, args.iters, args.device, budget, rows, save), 4)
    part("profile_gate", lambda: profile_gate(args.device, 8192 if cuda else 64), 4)
    if "profile_gate" in res:
        print(res["profile_gate"], flush=True)
    part("decode", lambda: bench_decode("Qwen3-8B" if cuda else "tiny", [int(b) for b in args.batches.split(",")],
                                        args.iters, args.device, budget), 6)
    save()
    print()
    print(tables(res))


if __name__ == "__main__":
    main()
