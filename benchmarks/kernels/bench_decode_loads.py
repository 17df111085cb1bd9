"""The decode kernels with other cache policies on their loads (``GemvConfig.wload``), on the 7B / 14B layers.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_decode_loads.py --out DIR [--wloads 0,1,2,3] [--repeats 3]

Issue 17's decode target is >= 80 % of HBM at M = 1..16. Sessions 13-17 measured the one-row GEMV at 59-66 % and
the ``mma.sync`` kernel at 44-56 % (4-16 rows) on the large weights, where a plain read of the same bytes reaches
80-85 %. Session 19 first asked whether DRAM latency separates them, with a rolling L2 prefetch (``l2_ahead``, commit
1f91051 of this file as ``bench_l2_prefetch.py``): slower everywhere. This asks whether the streamed weight evicts
the reused x from L1: each kernel's default config at 1 / 4 / 8 / 16 rows with ``wload`` = each of ``--wloads`` (0
plain loads = today's kernel; 1 the words and scale bytes ``.cg``, cached in L2 only; 2 the same L1 evict-first; 3
as 1 and x L1 evict-last), timed as ``bench_gemv`` times (rotating weight copies that together exceed the L2 several
times, one CUDA graph, median per call), the variants *alternating* ``--repeats`` times so that clock drift hits them
alike; each variant's output must equal ``wload = 0``'s bit for bit (a cache policy changes no value) before it is
timed. The plain read of the same bytes (``--read-ceiling`` of ``bench_gemv``) is timed beside them.

Writes ``decode_loads.json`` and ``decode_loads.md`` (us per call, % of the HBM copy rate, ratio to wload = 0).
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


def _launcher(m: int, n: int, k: int, wload: int):
    """(config name, fn(x, pw) -> y): the kernel ``wo_matmul`` runs at M rows, its default config, ``wload``."""
    from quarl_kernels import gemv, mma_decode

    if m == 1:
        cfg = dataclasses.replace(gemv.default_gemv_config(0, 1, n, k), wload=wload)
        return str(cfg), lambda x, p, c=cfg: gemv.launch_gemv(x, p, c)
    cfg = dataclasses.replace(mma_decode.default_config(m, n), wload=wload)
    return str(cfg), lambda x, p, c=cfg: mma_decode.launch_mma_decode(x, p, c)


def bench_shape(n: int, k: int, ms, wloads, repeats: int, l2: int, hbm: float) -> list[dict]:
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
        variants = [_launcher(m, n, k, a) for a in wloads]
        want = variants[0][1](x, pw0)
        for name, fn in variants:  # bit-equal to plain loads
            got = fn(x, pw0)
            if not torch.equal(got, want):
                raise AssertionError(f"{name} at {n}x{k} M={m}: output differs from wload=0's")
        times = {name: [] for name, _ in variants}
        reads = []
        for _ in range(repeats):
            for name, fn in variants:
                times[name].append(graph_us([lambda p=p, fn=fn, x=x: fn(x, p) for p in pws]))
            reads.append(read_ceiling_us(nbytes, l2))
        base = statistics.median(times[variants[0][0]])
        read = statistics.median(reads)
        for (name, _), a in zip(variants, wloads, strict=True):
            us = statistics.median(times[name])
            rows.append({"N": n, "K": k, "M": m, "wload": a, "config": name, "us": us, "all_us": times[name],
                         "bytes": nbytes, "pct_hbm": 100 * nbytes / us / 1e3 / hbm, "vs_wload0": base / us,
                         "read_us": read, "read_pct_hbm": 100 * nbytes / read / 1e3 / hbm})
            r = rows[-1]
            print(f"{n:5d}x{k:5d} M={m:2d} {name:28s} {us:7.2f} us ({r['pct_hbm']:4.1f} % HBM, x{r['vs_wload0']:.3f} "
                  f"vs wload 0; read {read:.2f} us = {r['read_pct_hbm']:.1f} %)  {[f'{t:.2f}' for t in times[name]]}",
                  flush=True)
    return rows


def table(info: dict, rows: list[dict]) -> str:
    lines = [(f"{info['gpu']}, torch {info['torch']}, {info['date']}; HBM copy {info['hbm_copy_GBps']:.0f} GB/s; "
              f"PDL {info['pdl']}; median of {info['repeats']} alternating repeats"), "",
             "| N x K | M | config | wload | us | % HBM | x wload 0 | plain read us (% HBM) |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['N']} x {r['K']} | {r['M']} | {r['config']} | {r['wload']} | {r['us']:.2f} | "
                     f"{r['pct_hbm']:.1f} | {r['vs_wload0']:.3f} | {r['read_us']:.2f} ({r['read_pct_hbm']:.1f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--wloads", default="0,1,2,3")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    wloads = [int(a) for a in args.wloads.split(",")]
    if wloads[0] != 0:
        raise SystemExit("--wloads must start with 0 (plain loads: the reference)")
    from quarl_kernels import pdl

    dev = torch.device("cuda")
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "hbm_copy_GBps": hbm_copy_GBps(), "pdl": pdl.mode(dev), "repeats": args.repeats}
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rows = []
    for s in args.shapes.split(","):
        n, k = map(int, s.split("x"))
        rows += bench_shape(n, k, [int(m) for m in args.ms.split(",")], wloads, args.repeats, l2,
                            info["hbm_copy_GBps"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_loads.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    md = table(info, rows)
    with open(os.path.join(args.out, "decode_loads.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
