"""Benchmark the weight-only 4-bit GEMMs against cuBLAS BF16 at Qwen2.5-7B shapes.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_wo_gemm.py --out DIR

Method (docs/kernels.md has the reasoning):
  * ceilings measured first: HBM bandwidth from a 4 GiB device-to-device copy
    (bytes read + written), BF16 tensor-core rate from an 8192^3 cuBLAS matmul
    on random data;
  * every timed call reads a different copy of the weight (copies rotate, all
    together >= 4x the L2), so weights come from HBM as in a real model;
  * R calls are captured in one CUDA graph and replayed; the time per call is
    the median over replays / R (graph replay removes Python launch overhead,
    which decode engines also remove);
  * cuBLAS BF16 gets the same treatment (``x @ w.T`` on rotated bf16 weights);
  * every candidate config is timed; the table reports the best and the
    default (first) one, and checks the output against the reference first.

GB/s counts the fewest bytes: packed weight + scales + x + y, each once.
Writes ``bench.json`` and ``bench.md`` (a markdown table) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import torch
import triton
from quarl_kernels import wo_gemm
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]  # N x K: q/o, k/v, gate/up, down
MS = [1, 8, 32, 128, 2048]
SPECS = ["nvfp4", "mxfp4", "int4-g128"]
L2_MULT = 4


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


def measure_ceilings() -> dict:
    n = 1 << 31  # 2 GiB each way
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = statistics.median(_sync_ms(lambda: dst.copy_(src), 20))
    hbm = 2 * n / (t * 1e-3) / 1e9
    src = dst = None  # free 4 GiB before the sweep
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x @ y
    t = statistics.median(_sync_ms(lambda: x @ y, 20))
    mm = 2 * 8192**3 / (t * 1e-3) / 1e12
    return {"hbm_copy_GBps": hbm, "bf16_matmul_TFLOPs": mm}


def capture_graph(fns: list) -> torch.cuda.CUDAGraph:
    """``fns`` (one call per rotating input) warmed up, captured as one CUDA graph, replayed once."""
    for f in fns[:2]:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_time_us(fns: list, replays: int = 10) -> float:
    """Median time per call of ``fns`` (rotating inputs), captured as one CUDA graph."""
    g = capture_graph(fns)
    ts = _sync_ms(g.replay, replays)
    return statistics.median(ts) * 1e3 / len(fns)


def _copies(nbytes: int, l2: int) -> int:
    return max(2, min(256, -(-L2_MULT * l2 // max(nbytes, 1))))


def rotating_packed(spec: str, w: torch.Tensor, l2: int):
    """``w`` [N, K] quantized to ``spec``: (packed weights as ``wo_gemm.PackedWeight``, the
    first followed by copies so that all together cover >= ``L2_MULT`` x the L2 -- each
    timed call then streams its weight from HBM -- and the ``QTensor``)."""
    cfg = make_config(spec)
    n, k = w.shape
    q = get_format(cfg.name).quantize(w, cfg)
    t = q.tensors
    p0 = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                        t.get("weight_global_scale"), cfg.name, cfg.block_size, n, k)
    pws = [p0] + [
        wo_gemm.PackedWeight(p0.fmt, p0.group, n, k, p0.words.clone(), p0.scale.clone(),
                             None if p0.zero is None else p0.zero.clone(),
                             None if p0.gscale is None else p0.gscale.clone(), p0.bytes32)
        for _ in range(_copies(q.nbytes, l2) - 1)
    ]
    return pws, q


def bench_point(spec: str, n: int, k: int, m: int, l2: int, ref_cache: dict) -> dict:
    cfg = make_config(spec)
    fmt = get_format(cfg.name)
    torch.manual_seed(n + k + m)
    w = torch.randn(n, k, device="cuda") * 0.03
    q = fmt.quantize(w, cfg)
    t = q.tensors
    args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
            cfg.name, cfg.block_size, n, k)
    pw0 = _packed_weight(*args)
    wbytes = q.nbytes
    reps = _copies(wbytes, l2)
    pws = [pw0] + [
        wo_gemm.PackedWeight(pw0.fmt, pw0.group, n, k, pw0.words.clone(), pw0.scale.clone(),
                             None if pw0.zero is None else pw0.zero.clone(),
                             None if pw0.gscale is None else pw0.gscale.clone(), pw0.bytes32)
        for _ in range(reps - 1)
    ]
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    ref = (x.double() @ q.dequantize(torch.float64).T)
    flops = 2 * m * n * k
    nbytes = wbytes + 2 * m * k + 2 * m * n

    # cuBLAS BF16 on rotated bf16 weights (cached per shape/M: the same for every format)
    key = (n, k, m)
    if key not in ref_cache:
        wb = w.to(torch.bfloat16)
        rb = _copies(wb.numel() * 2, l2)
        wbs = [wb] + [wb.clone() for _ in range(rb - 1)]
        ref_cache[key] = graph_time_us([lambda wi=wi: x @ wi.T for wi in wbs])
        del wbs, wb
    t_bf16 = ref_cache[key]

    cands = wo_gemm.DECODE_CONFIGS if m <= wo_gemm.DECODE_MAX_M else wo_gemm.PREFILL_CONFIGS
    results = []
    for c in cands:
        y = wo_gemm.launch_fwd(x, pw0, c)
        err = ((y.double() - ref).norm() / ref.norm()).item()
        us = graph_time_us([lambda p=p, c=c: wo_gemm.launch_fwd(x, p, c) for p in pws])
        results.append({"config": str(c), "us": us, "err": err})
    best = min(results, key=lambda r: r["us"])
    dflt = str(wo_gemm.default_config("fwd", m, n, k))
    default = next(r for r in results if r["config"] == dflt)  # what wo_matmul runs untuned
    row = {
        "format": spec, "N": n, "K": k, "M": m, "weight_bytes": wbytes, "bytes": nbytes, "flops": flops,
        "rotating_copies": reps, "bf16_us": t_bf16, "bf16_GBps": (2 * n * k + 2 * m * k + 2 * m * n) / t_bf16 / 1e3,
        "bf16_TFLOPs": flops / t_bf16 / 1e6, "default": default, "best": best, "all": results,
        "us": best["us"], "GBps": nbytes / best["us"] / 1e3, "TFLOPs": flops / best["us"] / 1e6,
        "speedup": t_bf16 / best["us"], "speedup_default": t_bf16 / default["us"],
        "max_err": max(r["err"] for r in results),
    }
    del pws
    return row


def bench_backward(spec: str, n: int, k: int, m: int, l2: int) -> dict:
    cfg = make_config(spec)
    q = get_format(cfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, cfg)
    t = q.tensors
    pw = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                        t.get("weight_global_scale"), cfg.name, cfg.block_size, n, k)
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    ref = dy.double() @ q.dequantize(torch.float64)
    wb = q.dequantize(torch.bfloat16)
    t_bf16 = graph_time_us([lambda: dy @ wb] * 4)
    res = []
    for c in wo_gemm.BWD_CONFIGS:
        dx = wo_gemm.launch_bwd(dy, pw, c)
        err = ((dx.double() - ref).norm() / ref.norm()).item()
        res.append({"config": str(c), "us": graph_time_us([lambda c=c: wo_gemm.launch_bwd(dy, pw, c)] * 4),
                    "err": err})
    best = min(res, key=lambda r: r["us"])
    dflt = str(wo_gemm.default_config("bwd", m, n, k))
    flops = 2 * m * n * k
    return {"format": spec, "N": n, "K": k, "M": m, "bf16_us": t_bf16, "us": best["us"], "best": best, "all": res,
            "TFLOPs": flops / best["us"] / 1e6, "bf16_TFLOPs": flops / t_bf16 / 1e6, "speedup": t_bf16 / best["us"],
            "default": next(r for r in res if r["config"] == dflt),
            "max_err": max(r["err"] for r in res)}


def variants(l2: int) -> list[dict]:
    """Open questions at one shape: PTX vs portable decode (forward), pair vs natural
    tile order (backward). Each with its default config."""
    out = []
    n, k = 3584, 18944
    for spec in ("nvfp4", "int4-g128"):
        cfg = make_config(spec)
        q = get_format(cfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, cfg)
        t = q.tensors
        args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
                cfg.name, cfg.block_size, n, k)
        p0 = _packed_weight(*args)
        pws = [p0] + [wo_gemm.PackedWeight(p0.fmt, p0.group, n, k, p0.words.clone(), p0.scale.clone(),
                                           None if p0.zero is None else p0.zero.clone(),
                                           None if p0.gscale is None else p0.gscale.clone(), p0.bytes32)
                      for _ in range(_copies(q.nbytes, l2) - 1)]
        for m in (1, 2048):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            c = wo_gemm.DECODE_CONFIGS[0] if m <= wo_gemm.DECODE_MAX_M else wo_gemm.PREFILL_CONFIGS[0]
            for asm in (True, False):
                us = graph_time_us([lambda p=p, x=x, c=c, a=asm: wo_gemm.launch_fwd(x, p, c, use_asm=a) for p in pws])
                out.append({"kind": "fwd", "format": spec, "N": n, "K": k, "M": m, "config": str(c), "asm": asm,
                            "pair": c.pair, "us": us, "GBps": (q.nbytes + 2 * m * k + 2 * m * n) / us / 1e3})
        dy = torch.randn(2048, n, device="cuda").to(torch.bfloat16)
        for pair in (True, False):
            c = wo_gemm.BWD_CONFIGS[0]
            us = graph_time_us([lambda p=p, o=pair, dy=dy, c=c: wo_gemm.launch_bwd(dy, p, c, pair_order=o)
                                for p in pws[:4]])
            out.append({"kind": "bwd", "format": spec, "N": n, "K": k, "M": 2048, "config": str(c), "asm": True,
                        "pair": pair, "us": us, "GBps": (q.nbytes + 2 * 2048 * (k + n)) / us / 1e3})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="one shape, M in (1, 2048)")
    args = ap.parse_args()
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    info = {"gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": l2, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat()}
    try:
        info["clocks"] = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                                         "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        pass
    info.update(measure_ceilings())
    print(json.dumps(info), flush=True)
    shapes, ms = (SHAPES[:1], [1, 2048]) if args.quick else (SHAPES, MS)
    rows, ref_cache = [], {}
    for n, k in shapes:
        for m in ms:
            for spec in SPECS:
                r = bench_point(spec, n, k, m, l2, ref_cache)
                rows.append(r)
                print(f"{spec:10s} N={n:5d} K={k:5d} M={m:4d}  {r['us']:9.1f} us  {r['GBps']:7.0f} GB/s  "
                      f"{r['TFLOPs']:6.1f} TF/s  x{r['speedup']:.2f} vs bf16 ({r['bf16_us']:.1f} us)  "
                      f"best {r['best']['config']}  default x{r['speedup_default']:.2f}  err {r['max_err']:.1e}",
                      flush=True)
    bwd = [bench_backward(spec, n, k, 2048, l2) for spec in SPECS for n, k in shapes]
    for r in bwd:
        print(f"bwd {r['format']:10s} N={r['N']:5d} K={r['K']:5d} M=2048 {r['us']:8.1f} us "
              f"{r['TFLOPs']:6.1f} TF/s x{r['speedup']:.2f} best {r['best']['config']} err {r['max_err']:.1e}")
    var = [] if args.quick else variants(l2)
    for v in var:
        print(f"variant {v['kind']} {v['format']:10s} M={v['M']:4d} asm={v['asm']!s:5s} pair={v['pair']!s:5s} "
              f"{v['us']:8.1f} us {v['GBps']:6.0f} GB/s")
    info["wall_s"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"info": info, "forward": rows, "backward": bwd, "variants": var}, f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(to_markdown(info, rows, bwd))
    print(to_markdown(info, rows, bwd))


def to_markdown(info: dict, rows: list[dict], bwd: list[dict]) -> str:
    hbm = info["hbm_copy_GBps"]
    lines = [
        (f"GPU: {info['gpu']} ({info['sms']} SMs), torch {info['torch']}, Triton {info['triton']}, {info['date']}. "
         f"Measured ceilings: HBM copy {hbm:.0f} GB/s, cuBLAS BF16 8192^3 {info['bf16_matmul_TFLOPs']:.0f} TFLOP/s."),
        "",
        "| format | N x K | M | us | GB/s | % HBM | TFLOP/s | cuBLAS bf16 us | speedup | best config | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {r['us']:.1f} | {r['GBps']:.0f} | "
            f"{100 * r['GBps'] / hbm:.0f}% | {r['TFLOPs']:.1f} | {r['bf16_us']:.1f} | {r['speedup']:.2f}x | "
            f"{r['best']['config']} | {r['max_err']:.1e} |")
    lines += ["", "Backward dX = dY @ W (M = 2048):", "",
              "| format | N x K | us | TFLOP/s | cuBLAS bf16 us | speedup | best config | rel err |",
              "|---|---|---|---|---|---|---|---|"]
    for r in bwd:
        lines.append(f"| {r['format']} | {r['N']}x{r['K']} | {r['us']:.1f} | {r['TFLOPs']:.1f} | {r['bf16_us']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['best']['config']} | {r['max_err']:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
