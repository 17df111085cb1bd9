"""Which tiles read blocked words best: the one-row GEMV's configs and the dense path's decode tiles, row-major vs
blocked (``quarl.quant.packed_layout``), on the 7B / 14B weights.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_blocked_configs.py --out DIR [--repeats 3]

Session 21's first GPU run (``bench_decode_bound.py --blocked``) put ``wo_matmul`` on blocked words 1.06-1.12x
faster at 4..16 rows but 0.90-0.96x at one row (the GEMV's default tiles read each row's 32-64 words as 32-byte
pieces 2 KB apart) and 0.96-0.99x at 2048 rows (the dense path's decode pass). This times, per shape: every GEMV
candidate (``gemv.GEMV_CONFIGS`` plus tiles shaped like whole [64, 8] blocks) at one row, and the dense decode
(``dense.dequantize``) at several tile shapes, each on both layouts, alternating ``--repeats`` times (rotating
weight copies beyond the L2, one CUDA graph, median per call). Each blocked output is checked bit-equal to the
row-major output of the same config. Writes ``blocked_configs.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

import torch
from bench_decode_bound import _activations, _rotating, device_info
from bench_gemv import graph_us
from outputs import write_outputs

SHAPES = ((18944, 3584), (3584, 18944), (13824, 5120), (5120, 13824), (3584, 3584))
DENSE_TILES = ((32, 16), (64, 8), (64, 16), (32, 32), (64, 32))  # (rows, words) a program


def _gemv_candidates():
    from quarl_kernels.gemv import GEMV_CONFIGS
    from quarl_kernels.gemv import GemvConfig as C

    block_shaped = (C(64, 8, 4, 4, prefetch=False), C(64, 16, 4, 4, prefetch=False), C(128, 8, 4, 4, prefetch=False),
                    C(128, 16, 4, 4, prefetch=False), C(64, 8, 4, 4), C(64, 16, 4, 4),
                    C(64, 16, 4, 4, waves=8, prefetch=False))
    return list(GEMV_CONFIGS) + list(block_shaped)


def _time(variants: dict, repeats: int) -> dict:
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fns in variants.items():
            times[name].append(graph_us(fns))
    return {name: statistics.median(t) for name, t in times.items()}


def shape_rows(n: int, k: int, repeats: int, l2: int, hbm: float) -> list[dict]:
    from quarl_kernels import dense, gemv

    from quarl.quant import packed_layout

    q, _, copies = _rotating(n, k, l2)
    blocked = [dataclasses.replace(p, words=packed_layout.block(p.words).view(n, k // 8), blocked=True)
               for p in copies]
    x, nbytes = _activations(1, n, k, q)
    default = str(gemv.default_gemv_config(0, 1, n, k))
    rows = []
    for cfg in _gemv_candidates():
        want = gemv.launch_gemv(x, copies[0], cfg)
        if not torch.equal(gemv.launch_gemv(x, blocked[0], cfg), want):
            raise AssertionError(f"{cfg} at {n}x{k}: blocked output differs from row-major")
        us = _time({lay: [lambda p=p, c=cfg: gemv.launch_gemv(x, p, c) for p in pws]
                    for lay, pws in (("row-major", copies), ("blocked", blocked))}, repeats)
        for lay, t in us.items():
            rows.append({"N": n, "K": k, "kernel": "gemv M=1", "config": str(cfg), "default": str(cfg) == default,
                         "layout": lay, "us": t, "pct_hbm": 100 * nbytes / t / 1e3 / hbm})
            print(f"{n:5d}x{k:5d} gemv {cfg!s:30} {lay:9s} {t:7.2f} us ({rows[-1]['pct_hbm']:.1f} % HBM)"
                  f"{'  (default)' if rows[-1]['default'] else ''}", flush=True)
    outs = [torch.empty(n, k, device="cuda", dtype=torch.bfloat16) for _ in copies]
    dbytes = q.nbytes + 2 * n * k
    for bn, bkw in DENSE_TILES:
        if not torch.equal(dense.dequantize(blocked[0], bn=bn, bkw=bkw), dense.dequantize(copies[0], bn=bn, bkw=bkw)):
            raise AssertionError(f"dense [{bn}, {bkw}] at {n}x{k}: blocked output differs from row-major")
        us = _time({lay: [lambda p=p, o=o, bn=bn, bkw=bkw: dense.dequantize(p, bn=bn, bkw=bkw, out=o) for p, o in zip(pws, outs)]
                    for lay, pws in (("row-major", copies), ("blocked", blocked))}, repeats)
        for lay, t in us.items():
            rows.append({"N": n, "K": k, "kernel": "dense decode", "config": f"[{bn}, {bkw}]",
                         "default": (bn, bkw) == (32, 16), "layout": lay, "us": t,
                         "pct_hbm": 100 * dbytes / t / 1e3 / hbm})
            print(f"{n:5d}x{k:5d} dense [{bn:3d}, {bkw:2d}] {lay:9s} {t:7.2f} us ({rows[-1]['pct_hbm']:.1f} % HBM)",
                  flush=True)
    return rows


def mma_rows(n: int, k: int, repeats: int, l2: int, hbm: float) -> list[dict]:
    """``--mma``: the 2..16-row ``mma.sync`` kernel's candidates (``MMA_DECODE_CONFIGS[:6]``) at 4 / 8 / 16 rows on
    both layouts (blocked outputs bit-equal to row-major ones of the same config)."""
    from quarl_kernels import mma_decode

    from quarl.quant import packed_layout

    q, _, copies = _rotating(n, k, l2)
    blocked = [dataclasses.replace(p, words=packed_layout.block(p.words).view(n, k // 8), blocked=True)
               for p in copies]
    rows = []
    for m in (4, 8, 16):
        x, nbytes = _activations(m, n, k, q)
        default = str(mma_decode.default_config(m, n))
        for cfg in mma_decode.MMA_DECODE_CONFIGS[:6]:
            want = mma_decode.launch_mma_decode(x, copies[0], cfg)
            if not torch.equal(mma_decode.launch_mma_decode(x, blocked[0], cfg), want):
                raise AssertionError(f"{cfg} at {n}x{k} M={m}: blocked output differs from row-major")
            us = _time({lay: [lambda p=p, c=cfg, x=x: mma_decode.launch_mma_decode(x, p, c) for p in pws]
                        for lay, pws in (("row-major", copies), ("blocked", blocked))}, repeats)
            for lay, t in us.items():
                rows.append({"N": n, "K": k, "kernel": f"mma M={m}", "config": str(cfg), "default": str(cfg) == default,
                             "layout": lay, "us": t, "pct_hbm": 100 * nbytes / t / 1e3 / hbm})
                print(f"{n:5d}x{k:5d} M={m:2d} {cfg!s:30} {lay:9s} {t:7.2f} us ({rows[-1]['pct_hbm']:.1f} % HBM)"
                      f"{'  (default)' if rows[-1]['default'] else ''}", flush=True)
    return rows


def check_shape(n: int, k: int, l2: int) -> list[dict]:
    """``--check``: no timing -- every GEMV candidate at one row on both layouts, each output's relative error
    against the float64 product, and whether the two are bit-equal (a mismatch says which layout is off)."""
    from quarl_kernels import gemv

    from quarl.quant import packed_layout

    q, _, copies = _rotating(n, k, l2)
    blk = dataclasses.replace(copies[0], words=packed_layout.block(copies[0].words).view(n, k // 8), blocked=True)
    x, _ = _activations(1, n, k, q)
    ref = x.double() @ q.dequantize(torch.float64).T
    rows = []
    for cfg in _gemv_candidates():
        a, b = gemv.launch_gemv(x, copies[0], cfg), gemv.launch_gemv(x, blk, cfg)
        err = [((y.double() - ref).norm() / ref.norm()).item() for y in (a, b)]
        bad = (a != b).nonzero()[:, 1]
        rows.append({"N": n, "K": k, "config": str(cfg), "equal": bool(torch.equal(a, b)), "rel_err_row_major": err[0],
                     "rel_err_blocked": err[1], "differing_columns": bad.numel(),
                     "first_differing": bad[:8].tolist(), "split": gemv._gemv_split(cfg, n, k // 8, 132)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(info: dict, rows: list[dict]) -> str:
    lines = [(f"{info['gpu']}, torch {info['torch']}, {info['date']}; HBM copy {info['hbm_copy_GBps']:.0f} GB/s; "
              f"median of {info['repeats']} alternating repeats; * = today's default"), "",
             "| N x K | kernel | config | row-major us | blocked us | blocked % HBM | row-major / blocked |",
             "|---|---|---|---:|---:|---:|---:|"]
    by = {}
    for r in rows:
        by.setdefault((r["N"], r["K"], r["kernel"], r["config"], r["default"]), {})[r["layout"]] = r
    for (n, k, kern, cfg, dflt), lay in by.items():
        a, b = lay["row-major"], lay["blocked"]
        lines.append(f"| {n} x {k} | {kern} | {cfg}{' *' if dflt else ''} | {a['us']:.2f} | {b['us']:.2f} | "
                     f"{b['pct_hbm']:.1f} | {a['us'] / b['us']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="no timing: each GEMV candidate's error on both layouts")
    ap.add_argument("--mma", action="store_true", help="the mma.sync kernel's candidates at 4 / 8 / 16 rows instead")
    args = ap.parse_args()
    info, l2 = device_info(args.repeats)
    rows = []
    for s in args.shapes.split(","):
        n, k = map(int, s.split("x"))
        if args.check:
            rows += check_shape(n, k, l2)
        elif args.mma:
            rows += mma_rows(n, k, args.repeats, l2, info["hbm_copy_GBps"])
        else:
            rows += shape_rows(n, k, args.repeats, l2, info["hbm_copy_GBps"])
    if args.check:
        write_outputs(args.out, "blocked_check", info, rows, None)
    else:
        write_outputs(args.out, "blocked_configs", info, rows, table(info, rows))


if __name__ == "__main__":
    main()
