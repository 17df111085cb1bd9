"""Hammer the TMA-ring decode GEMM for run-to-run differences: the same launches replayed many times from a CUDA graph.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/ring_race.py [--replays 20] [--copies 20]

The 7B batch-64 rollout was not reproducible with the ring on (session 14, phase h: a seeded rollout's tokens
differed from step 7 on, while a 70-launch test of the kernel alone was bit-identical). Per variant (each default
config -- each step's wgmma waited for before the next decode, ``inflight=0`` -- and the same overlapping the
next decode with it, ``inflight=1``) this captures
``--copies`` launches of each 7B shape at 64 rows (gate/up, down, q/o) in one graph, replays it ``--replays``
times and counts the outputs that differ from the first eager call in any bit; then times one launch of each
(``triton.testing.do_bench``, which clears the L2 between calls: use bench_wgmma_decode.py for speed). Phase i:
0 of 400 differed for either variant alone -- the race needs the engine's surroundings to show.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch
import triton
from quarl_kernels import wgmma_ring
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config

SHAPES = [(18944, 3584), (3584, 18944), (3584, 3584)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    qcfg = make_config("nvfp4")
    torch.manual_seed(0)
    cases = []
    for n, k in SHAPES:
        q = get_format(qcfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, qcfg)
        t = q.tensors
        pw = _packed_weight(t["weight_packed"], t["weight_scale"], None, t.get("weight_global_scale"), qcfg.name,
                            qcfg.block_size, n, k)
        cases.append((n, k, pw, torch.randn(64, k, device="cuda").to(torch.bfloat16)))
    res = {}
    for inflight in (0, 1):
        row = {}
        for n, k, pw, x in cases:
            cfg = dataclasses.replace(wgmma_ring.default_config(64, n, k), inflight=inflight)
            ref = wgmma_ring.launch_wgmma_ring(x, pw, cfg).clone()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ys = [wgmma_ring.launch_wgmma_ring(x, pw, cfg) for _ in range(args.copies)]
            bad = 0
            for _ in range(args.replays):
                g.replay()
                torch.cuda.synchronize()
                bad += sum(not torch.equal(y, ref) for y in ys)
            us = triton.testing.do_bench(lambda x=x, pw=pw, cfg=cfg: wgmma_ring.launch_wgmma_ring(x, pw, cfg)) * 1e3
            row[f"{n}x{k} {cfg}"] = {"launches": args.copies * args.replays, "differing": bad, "us": round(us, 2)}
            print(f"inflight={inflight} {n}x{k} {cfg}: {bad} of {args.copies * args.replays} outputs differ, "
                  f"{us:.1f} us a call", flush=True)
        res[f"inflight={inflight}"] = row
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ring_race.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
