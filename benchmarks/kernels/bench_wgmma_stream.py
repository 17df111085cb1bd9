"""The stream-K wgmma decode kernel (``wgmma_stream.py``, an experiment) beside what ``wo_matmul`` runs at 1..16 rows.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_wgmma_stream.py --out DIR [--ms 1,2,4,8,16] [--repeats 3]

Per (7B / 14B layer shape, M): ``routed`` -- ``wo_gemm.wo_matmul`` on the layout the engine holds at that M
(row-major words at one row, blocked from two: ``packed_layout.wanted``), i.e. the one-row GEMV or the ``mma.sync``
kernel; ``stream`` -- the new kernel on blocked words (default ring of 4 stages), ``stream-rm`` on row-major words,
``stream-s3`` / ``stream-s6`` other ring depths, ``stream-pad`` with x copied into a whole zero-padded TMA box first
(the copy in the timed call), ``stream-wide`` a band's four K steps as one 8 KB TMA box; diagnostics (``--variants``,
wrong results by design): ``stream-hs`` / ``stream-wide-hs`` the ring's handshakes alone; ``cublas`` -- ``F.linear`` on the bf16 weight; and a plain read of the packed weight's
bytes (``bench_gemv.read_ceiling_us``: the ceiling at this size). Timed as ``bench_decode_bound`` times (rotating
weight copies past the L2, one CUDA graph, median per call; the variants alternate ``--repeats`` times). Every
variant's output is checked first against the float64 product (< 5e-3 relative) and the routed kernel's.

% HBM: the bytes a call must move (packed weight + scales, x, y) over the time, against the measured copy rate
(``hbm_copy_GBps``) and against the H100's 3.35 TB/s spec. Writes ``wgmma_stream.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

import torch
from bench_decode_bound import _activations, _rotating, device_info
from bench_gemv import graph_us, read_ceiling_us
from outputs import write_outputs

SHAPES = ((18944, 3584), (3584, 18944), (3584, 3584), (4608, 3584), (13824, 5120), (5120, 13824))
MS = (1, 2, 4, 8, 16)
SPEC_GBPS = 3350.0  # H100 SXM HBM3


VARIANTS = "stream,stream-rm,stream-s3,stream-s6,stream-pad"


def _variants(m: int, names: str):
    """(name, reads blocked words, fn(x, pw)) for ``routed`` and each of ``names``; the ``-hs`` ones are diagnostics
    (``diag=1``: the ring's handshakes alone, output garbage, not checked)."""
    import wgmma_stream as ws
    from quarl_kernels import wo_gemm

    from quarl.quant import packed_layout

    nt = ws.token_tile(m)
    every = {
        "stream": (True, lambda x, p: ws.launch_wgmma_stream(x, p)),
        "stream-rm": (False, lambda x, p: ws.launch_wgmma_stream(x, p)),
        "stream-s3": (True, lambda x, p: ws.launch_wgmma_stream(x, p, stages=3)),
        "stream-s6": (True, lambda x, p: ws.launch_wgmma_stream(x, p, stages=6)),
        "stream-pad": (True, lambda x, p, nt=nt: ws.launch_wgmma_stream(x, p, x_rows=nt)),
        "stream-wide": (True, lambda x, p: ws.launch_wgmma_stream(x, p, wide=True)),
        "stream-hs": (False, lambda x, p: ws.launch_wgmma_stream(x, p, diag=1)),
        "stream-wide-hs": (True, lambda x, p: ws.launch_wgmma_stream(x, p, wide=True, diag=1)),
    }
    return [("routed", packed_layout.wanted(m), lambda x, p: wo_gemm.wo_matmul(x, p))] + \
        [(v, *every[v]) for v in names.split(",")]


def bench_shape(n: int, k: int, ms, repeats: int, l2: int, hbm: float, names: str = VARIANTS) -> list[dict]:
    from quarl.quant import packed_layout

    q, _, copies = _rotating(n, k, l2)
    blocked = [dataclasses.replace(p, words=packed_layout.block(p.words).view(n, k // 8), blocked=True)
               for p in copies]
    w16 = q.dequantize(torch.bfloat16)
    w16s = [w16] + [w16.clone() for _ in range(max(1, -(-2 * l2 // w16.nbytes)))]
    want64 = q.dequantize(torch.float64)
    rows = []
    for m in ms:
        x, nbytes = _activations(m, n, k, q)
        ref = x.double() @ want64.T
        routed = None
        variants = _variants(m, names)
        for name, blk, fn in variants:
            y = fn(x, (blocked if blk else copies)[0]).double()
            if name.endswith("-hs"):
                continue
            err = ((y - ref).norm() / ref.norm()).item()
            routed = y if routed is None else routed
            agree = ((y - routed).norm() / routed.norm()).item()
            if not (err < 5e-3 and agree < 5e-3):
                raise AssertionError(f"{name} at {n}x{k} M={m}: error {err:.2e}, vs routed {agree:.2e}")
        times = {name: [] for name, _, _ in variants} | {"cublas": []}
        reads = []
        for _ in range(repeats):
            for name, blk, fn in variants:
                pws = blocked if blk else copies
                times[name].append(graph_us([lambda p=p, fn=fn, x=x: fn(x, p) for p in pws]))
            times["cublas"].append(graph_us([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in w16s]))
            reads.append(read_ceiling_us(nbytes, l2))
        read = statistics.median(reads)
        base = statistics.median(times["routed"])
        for name, ts in times.items():
            us = statistics.median(ts)
            rows.append({"N": n, "K": k, "M": m, "variant": name, "us": us, "all_us": ts, "bytes": nbytes,
                         "pct_copy": 100 * nbytes / us / 1e3 / hbm, "pct_spec": 100 * nbytes / us / 1e3 / SPEC_GBPS,
                         "vs_routed": base / us, "read_us": read, "read_pct_copy": 100 * nbytes / read / 1e3 / hbm})
            r = rows[-1]
            print(f"{n:5d}x{k:5d} M={m:2d} {name:10s} {us:7.2f} us ({r['pct_copy']:4.1f} % copy, {r['pct_spec']:4.1f} "
                  f"% spec, x{r['vs_routed']:.3f} vs routed; read {read:.2f} us = {r['read_pct_copy']:.1f} %)  "
                  f"{[f'{t:.2f}' for t in ts]}", flush=True)
    return rows


def table(info: dict, rows: list[dict]) -> str:
    lines = [(f"{info['gpu']}, torch {info['torch']}, {info['date']}; HBM copy {info['hbm_copy_GBps']:.0f} GB/s; "
              f"median of {info['repeats']} alternating repeats; us (% of the copy rate), x = routed / variant"), ""]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    lines += ["| N x K | M | " + " | ".join(names) + " | plain read |", "|---|---:|" + "---:|" * (len(names) + 1)]
    by = {}
    for r in rows:
        by.setdefault((r["N"], r["K"], r["M"]), {})[r["variant"]] = r
    for (n, k, m), d in by.items():
        cells = [f"{d[v]['us']:.2f} ({d[v]['pct_copy']:.0f} %) x{d[v]['vs_routed']:.2f}" for v in names]
        r0 = d[names[0]]
        lines.append(f"| {n} x {k} | {m} | " + " | ".join(cells) + f" | {r0['read_us']:.2f} ({r0['read_pct_copy']:.0f} %) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default=VARIANTS, help="besides routed; also stream-wide, stream-hs, stream-wide-hs")
    args = ap.parse_args()
    info, l2 = device_info(args.repeats)
    rows = []
    for s in args.shapes.split(","):
        n, k = map(int, s.split("x"))
        rows += bench_shape(n, k, [int(m) for m in args.ms.split(",")], args.repeats, l2, info["hbm_copy_GBps"],
                            args.variants)
    write_outputs(args.out, "wgmma_stream", info, rows, table(info, rows))


if __name__ == "__main__":
    main()
