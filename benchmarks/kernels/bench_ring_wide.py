"""The TMA-ring wgmma kernel above 64 rows (``wgmma_ring.WIDE_CONFIGS``: token tiles of 128 / 256) against what
``wo_matmul`` runs there today, the dense path and cuBLAS BF16.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/bench_ring_wide.py --budget-s 240 --out $OUT/wide
    ... --shapes 18944x3584,3584x18944 --ms 128,256 --configs 0,4      # a subset
    python3 benchmarks/kernels/bench_ring_wide.py --render $OUT/wide/ring_wide.json

Why. Between the decode kernels (M <= 64) and the dense path (M >= 256: a transient BF16 weight and cuBLAS) the
Triton tensor-core kernel runs M = 65..255 at 0.4-0.7x cuBLAS (RESULTS "v8"), and the dense path M = 256..1024 at
0.5-0.8x: a rollout of 128-256 sequences -- GRPO's 16 prompts x 8 answers -- pays that every decode step. The ring
kernel decodes each weight K step into wgmma A registers once per token tile, so at 128-256 rows it reads the 4-bit
weights once or twice while cuBLAS reads 16 bits.

Each (shape, M) point: ``x [M, K]`` bf16 random, weights ``0.03 * randn`` quantized to NVFP4; every path is checked
against the float64 product with the format's dequantized weight (``||y - ref|| / ||ref|| < 5e-3``) before it is
timed; timing as ``bench_wo_gemm.py`` (rotating weight copies covering >= 4x the L2, one CUDA graph, median per
call). Results go to ``--out/ring_wide.json`` point by point (a run stopped by ``--budget-s`` keeps them) and a
markdown table (``ring_wide.md``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_wo_gemm

SHAPES = [(18944, 3584), (3584, 18944), (3584, 3584), (512, 3584), (27648, 5120), (5120, 13824), (5120, 5120),
          (1024, 5120)]  # N x K: the 7B and 14B projections
MS = [96, 128, 192, 256, 512, 1024, 2048]
TOL = 5e-3


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(y).any():
        return math.inf
    return ((y.double() - ref).norm() / ref.norm()).item()


def best_ring(paths: list[dict]) -> dict | None:
    """The fastest timed ``ring-*`` path (timed means it passed its check); an ``-unpadded`` comparison arm never
    counts."""
    ring = [r for r in paths if r["path"].startswith("ring-") and "us" in r and not r["path"].endswith("-unpadded")]
    return min(ring, key=lambda r: r["us"]) if ring else None


def point(spec: str, n: int, k: int, ms: list[int], configs, l2: int, deadline: float, emit,
          unpadded: bool = False) -> bool:
    from bench_wo_gemm import _copies, graph_time_us, rotating_packed
    from quarl_kernels import dense, wgmma_ring, wo_gemm

    torch.manual_seed(n + 3 * k)
    w = torch.randn(n, k, device="cuda") * 0.03
    pws, q = rotating_packed(spec, w, l2)
    wref = q.dequantize(torch.float64)
    wb = w.to(torch.bfloat16)
    wbs = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
    for m in ms:
        if time.time() > deadline:
            return False
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.double() @ wref.T
        row = {"format": spec, "N": n, "K": k, "M": m, "paths": []}

        def timed(name, fn, row=row, x=x, ref=ref):
            r = {"path": name}
            try:
                r["err"] = rel(fn(x, pws[0]), ref)
                if r["err"] < TOL:
                    r["us"] = graph_time_us([lambda p=p: fn(x, p) for p in pws])
                r["result"] = "PASS" if r["err"] < TOL else "FAIL"
            except Exception as ex:  # noqa: BLE001  (record and go on)
                r.update(result="ERROR", error=f"{type(ex).__name__}: {str(ex)[:300]}")
            row["paths"].append(r)

        row["bf16_us"] = graph_time_us([lambda wi=wi, x=x: x @ wi.T for wi in wbs])
        with torch.no_grad():
            timed("dispatch", lambda x, p: wo_gemm.wo_matmul(x, p))
            timed("dense", lambda x, p: x @ dense.dequantize(p).T)
            for c in configs:
                if time.time() > deadline:
                    break
                timed(str(c), lambda x, p, c=c: wgmma_ring.launch_wgmma_ring(x, p, c))
            if unpadded and m % configs[0].tile(m):  # the first config with x not padded to whole token tiles
                timed(f"{configs[0]}-unpadded", lambda x, p, c=configs[0]: wgmma_ring.launch_wgmma_ring(
                    x, p, c, xp=wgmma_ring.permute_x(x, c.bkw)))
        best = best_ring(row["paths"])
        disp = next((r.get("us") for r in row["paths"] if r["path"] == "dispatch"), None)
        row.update(best=best and best["path"], best_us=best and best["us"],
                   best_vs_bf16=best and row["bf16_us"] / best["us"],
                   dispatch_vs_bf16=disp and row["bf16_us"] / disp)
        emit(row)
    return True


def to_markdown(data: dict) -> str:
    info = data["info"]
    out = [f"wgmma_ring wide token tiles on {info.get('gpu')}, {info.get('date')} (x = cuBLAS BF16 time / path time)",
           "", "| N x K | M | cuBLAS BF16 us | dispatch us (x) | dense us (x) | best ring us (x), config |",
           "|---|---:|---:|---:|---:|---|"]
    for r in data["points"]:
        p = {q["path"]: q for q in r["paths"]}

        def cell(name, r=r, p=p):
            us = p.get(name, {}).get("us")
            return f"{us:.1f} ({r['bf16_us'] / us:.2f}x)" if us else p.get(name, {}).get("result", "-")

        best = f"{r['best_us']:.1f} ({r['best_vs_bf16']:.2f}x), {r['best']}" if r.get("best") else "-"
        out.append(f"| {r['N']}x{r['K']} | {r['M']} | {r['bf16_us']:.1f} | {cell('dispatch')} | {cell('dense')} | {best} |")
    fails = [(r["N"], r["K"], r["M"], q["path"], q["result"]) for r in data["points"] for q in r["paths"]
             if q["result"] != "PASS"]
    out += ["", f"every path checked against the float64 reference first (rel. error < {TOL}); not PASS: {fails or 'none'}"]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "wide"))
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new points after this many seconds")
    ap.add_argument("--shapes", default=None, help="N x K list, e.g. 18944x3584,3584x18944 (default: 7B + 14B set)")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="token counts")
    ap.add_argument("--configs", default=None, help="indices into wgmma_ring.WIDE_CONFIGS (default: all)")
    ap.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp4"])
    ap.add_argument("--unpadded", action="store_true",
                    help="also time the first config with x not padded to whole token tiles (TMA zero fill)")
    ap.add_argument("--render", default=None, help="print the markdown table of an earlier ring_wide.json and exit")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            print(to_markdown(json.load(f)))
        return
    import triton
    from bench_wo_gemm import measure_ceilings
    from quarl_kernels import wgmma_ring

    t0 = time.time()
    deadline = t0 + args.budget_s
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    ms = [int(v) for v in args.ms.split(",")]
    configs = [wgmma_ring.WIDE_CONFIGS[int(i)] for i in args.configs.split(",")] if args.configs else \
        list(wgmma_ring.WIDE_CONFIGS)
    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat(), "shapes": shapes, "ms": ms,
            "configs": [str(c) for c in configs], "format": args.format}
    info.update(measure_ceilings())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "ring_wide.json")
    data = {"info": info, "points": []}

    def emit(row):
        data["points"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "paths"}), flush=True)
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.replace(path + ".tmp", path)

    l2 = getattr(props, "L2_cache_size", 50 << 20)
    done = True
    for n, k in shapes:
        done = done and point(args.format, n, k, ms, configs, l2, deadline, emit, args.unpadded)
        torch.cuda.empty_cache()  # the shape's weight copies, freed on return
    data["info"].update(wall_s=time.time() - t0, complete=done)
    emit_md = to_markdown(data)
    with open(os.path.join(args.out, "ring_wide.md"), "w") as f:
        f.write(emit_md + "\n")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(emit_md, flush=True)


if __name__ == "__main__":
    main()
