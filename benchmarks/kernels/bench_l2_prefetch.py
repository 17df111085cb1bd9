"""The decode kernels with and without the rolling L2 prefetch (``quarl_kernels.l2_prefetch``), on the 7B / 14B layers.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_l2_prefetch.py --out DIR [--aheads 0,2,4,8] [--repeats 3]

Issue 17's decode target is >= 80 % of HBM at M = 1..16. Sessions 13-17 measured the one-row GEMV at 59-66 % and
the ``mma.sync`` kernel at 44-56 % (4-16 rows) on the large weights, where a plain read of the same bytes reaches
80-85 %. This asks whether DRAM latency is what separates them: each kernel's default config at 1 / 4 / 8 / 16 rows,
run with ``l2_ahead`` = each of ``--aheads`` (0 = today's kernel), timed as ``bench_gemv`` times (rotating weight
copies that together exceed the L2 several times, one CUDA graph, median per call), the variants *alternating*
``--repeats`` times so that clock drift hits them alike; each variant's output must equal ``l2_ahead = 0``'s bit for
bit (a prefetch is a hint: the arithmetic is the same) before it is timed. The plain read of the same bytes
(``--read-ceiling`` of ``bench_gemv``) is timed beside them.

Writes ``l2_prefetch.json`` and ``l2_prefetch.md`` (us per call, % of the HBM copy rate, ratio to l2_ahead = 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics

import torch
from bench_gemv import _quantized, graph_us, hbm_copy_GBps, read_ceiling_us
from bench_wo_gemm import _copies

SHAPES = ((18944, 3584), (3584, 18944), (3584, 3584), (13824, 5120), (5120, 13824))  # 7B gate/up, down, q/o; 14B
MS = (1, 4, 8, 16)


def _launcher(m: int, n: int, k: int, ahead: int):
    """(config name, fn(x, pw) -> y): the kernel ``wo_matmul`` runs at M rows, its default config, ``l2_ahead``."""
    from quarl_kernels import gemv, mma_decode

    if m == 1:
        cfg = dataclasses.replace(gemv.default_gemv_config(0, 1, n, k), l2_ahead=ahead)
        return str(cfg), lambda x, p, c=cfg: gemv.launch_gemv(x, p, c)
    cfg = dataclasses.replace(mma_decode.default_config(m, n), l2_ahead=ahead)
    return str(cfg), lambda x, p, c=cfg: mma_decode.launch_mma_decode(x, p, c)


def bench_shape(n: int, k: int, ms, aheads, repeats: int, l2: int, hbm: float) -> list[dict]:
    from quarl_kernels import wo_gemm

    _, q, pw0 = _quantized("nvfp4", n, k, n + k)
    reps = _copies(q.nbytes, l2)
    pws = [pw0] + [wo_gemm.PackedWeight(pw0.fmt, pw0.group, n, k, pw0.words.clone(), pw0.scale.clone(), None,
                                        pw0.gscale.clone(), pw0.bytes32) for _ in range(reps - 1)]
    rows = []
    for m in ms:
        torch.manual_seed(m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        nbytes = q.nbytes + 2 * m * k + 2 * m * n
        variants = [_launcher(m, n, k, a) for a in aheads]
        want = variants[0][1](x, pw0)
        for name, fn in variants:  # bit-equal to the kernel without the prefetch
            got = fn(x, pw0)
            if not torch.equal(got, want):
                raise AssertionError(f"{name} at {n}x{k} M={m}: output differs from l2_ahead=0's")
        times = {name: [] for name, _ in variants}
        reads = []
        for _ in range(repeats):
            for name, fn in variants:
                times[name].append(graph_us([lambda p=p, fn=fn, x=x: fn(x, p) for p in pws]))
            reads.append(read_ceiling_us(nbytes, l2))
        base = statistics.median(times[variants[0][0]])
        read = statistics.median(reads)
        for (name, _), a in zip(variants, aheads, strict=True):
            us = statistics.median(times[name])
            rows.append({"N": n, "K": k, "M": m, "l2_ahead": a, "config": name, "us": us, "all_us": times[name],
                         "bytes": nbytes, "pct_hbm": 100 * nbytes / us / 1e3 / hbm, "vs_ahead0": base / us,
                         "read_us": read, "read_pct_hbm": 100 * nbytes / read / 1e3 / hbm})
            r = rows[-1]
            print(f"{n:5d}x{k:5d} M={m:2d} {name:28s} {us:7.2f} us ({r['pct_hbm']:4.1f} % HBM, x{r['vs_ahead0']:.3f} "
                  f"vs ahead 0; read {read:.2f} us = {r['read_pct_hbm']:.1f} %)  {[f'{t:.2f}' for t in times[name]]}",
                  flush=True)
    return rows


def table(info: dict, rows: list[dict]) -> str:
    lines = [(f"{info['gpu']}, torch {info['torch']}, {info['date']}; HBM copy {info['hbm_copy_GBps']:.0f} GB/s; "
              f"PDL {info['pdl']}; median of {info['repeats']} alternating repeats"), "",
             "| N x K | M | config | l2_ahead | us | % HBM | x ahead 0 | plain read us (% HBM) |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['N']} x {r['K']} | {r['M']} | {r['config']} | {r['l2_ahead']} | {r['us']:.2f} | "
                     f"{r['pct_hbm']:.1f} | {r['vs_ahead0']:.3f} | {r['read_us']:.2f} ({r['read_pct_hbm']:.1f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--aheads", default="0,2,4,8")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    aheads = [int(a) for a in args.aheads.split(",")]
    if aheads[0] != 0:
        raise SystemExit("--aheads must start with 0 (the kernel without the prefetch: the reference)")
    from quarl_kernels import pdl

    dev = torch.device("cuda")
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "hbm_copy_GBps": hbm_copy_GBps(), "pdl": pdl.mode(dev), "repeats": args.repeats}
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rows = []
    for s in args.shapes.split(","):
        n, k = map(int, s.split("x"))
        rows += bench_shape(n, k, [int(m) for m in args.ms.split(",")], aheads, args.repeats, l2,
                            info["hbm_copy_GBps"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "l2_prefetch.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    md = table(info, rows)
    with open(os.path.join(args.out, "l2_prefetch.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
