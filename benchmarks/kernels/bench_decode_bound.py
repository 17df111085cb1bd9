"""Where the decode kernels' time goes: each default config beside diagnostic variants that skip work (7B / 14B layers).

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_decode_bound.py --out DIR [--diags 0,1,2] [--repeats 3]

Issue 17's decode target is >= 80 % of HBM at M = 1..16. The one-row GEMV runs at 59-66 % and the ``mma.sync``
kernel at 42-56 % (4-16 rows) on the large weights, where a plain read of the same bytes reaches 80-82 %. Session 19
tested two memory-side causes first and both failed (``gpu_session19.sh`` phases a, b): a rolling L2 prefetch
(commit 1f91051, ``bench_l2_prefetch.py``) was slower everywhere, and cache policies on the loads (commit 0e437fa,
``bench_decode_loads.py``) moved nothing. This asks whether the work between the loads binds: ``diag`` (``GemvConfig``
/ ``MmaDecodeConfig``) 1 replaces the FP4 decode by one bitcast / conversion a word (the GEMV's FFMAs, the mma.sync
MMAs, every load kept), 2 (the GEMV only) also drops the FFMAs and x (the words and scale bytes loaded, one add a
word): the kernel's loop as a plain read. **The diagnostic outputs are wrong by design**; only ``diag = 0``'s output
is checked (against the float64 product of x and the dequantized weight). Timed as ``bench_gemv`` times (rotating
weight copies that together exceed the L2 several times, one CUDA graph, median per call), the variants alternating
``--repeats`` times, with a plain read of the same bytes beside them.

``--gemv-sweep``: the one-row GEMV's work split instead -- ``SWEEP`` configs (rows x K words a step, the same 16 words
a thread: contiguous runs of 128 B to 2 KB a row) as the real kernel and as ``diag = 2`` (its loop as a plain read):
does a program that reads longer runs of a row stream closer to the plain read?

``--blocked``: ``wo_gemm.wo_matmul`` on the words as compressed-tensors lays them out and in the blocked layout the
engine holds them in (``quarl.quant.packed_layout``: [64, 8]-word blocks, session 21), at any M (``--ms 1,4,8,16,64,
2048``: the GEMV, ``mma.sync``, the TMA ring, the dense path); the blocked outputs bit-equal to the row-major ones.
(Session 19's ``--tiled`` / ``--blocks`` measured tiled words through diagnostic builds, since replaced by it.)

Writes ``decode_bound.json`` and ``decode_bound.md`` (us per call, % of the HBM copy rate, ratio to diag = 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics

import torch
from bench_gemv import _quantized, graph_us, hbm_copy_GBps, read_ceiling_us
from bench_wo_gemm import _copies
from outputs import write_outputs

SHAPES = ((18944, 3584), (3584, 18944), (3584, 3584), (13824, 5120), (5120, 13824))  # 7B gate/up, down, q/o; 14B
MS = (1, 4, 8, 16)


def _launcher(m: int, n: int, k: int, diag: int):
    """(config name, fn(x, pw) -> y): the kernel ``wo_matmul`` runs at M rows, its default config, ``diag``."""
    from quarl_kernels import gemv, mma_decode

    if m == 1:
        cfg = dataclasses.replace(gemv.default_gemv_config(0, 1, n, k), diag=diag)
        return str(cfg), lambda x, p, c=cfg: gemv.launch_gemv(x, p, c)
    cfg = dataclasses.replace(mma_decode.default_config(m, n), diag=diag)
    return str(cfg), lambda x, p, c=cfg: mma_decode.launch_mma_decode(x, p, c)


def _rotating(n: int, k: int, l2: int):
    """(the QTensor, its packed weight, that weight followed by copies that together exceed the L2 several times)."""
    from quarl_kernels import wo_gemm

    _, q, pw0 = _quantized("nvfp4", n, k, n + k)
    copies = [pw0] + [wo_gemm.PackedWeight(pw0.fmt, pw0.group, n, k, pw0.words.clone(), pw0.scale.clone(), None,
                                           pw0.gscale.clone(), pw0.bytes32) for _ in range(_copies(q.nbytes, l2) - 1)]
    return q, pw0, copies


def _activations(m: int, n: int, k: int, q) -> tuple[torch.Tensor, int]:
    """Seeded bf16 x [m, k] and the fewest bytes a call moves: packed weight + scales, x and y once each."""
    torch.manual_seed(m)
    return torch.randn(m, k, device="cuda").to(torch.bfloat16), q.nbytes + 2 * m * k + 2 * m * n


def _sweep_configs():
    from quarl_kernels.gemv import GemvConfig as C

    # (rows, K words a step, VEC, warps): a row's contiguous run a step is 4 * words bytes
    return [C(64, 32, 4, 4, prefetch=False), C(32, 64, 4, 4, prefetch=False), C(16, 128, 4, 4, prefetch=False),
            C(8, 256, 4, 4, prefetch=False), C(4, 512, 4, 4, prefetch=False), C(16, 256, 4, 8, prefetch=False),
            C(8, 512, 4, 8, prefetch=False), C(8, 256, 4, 4)]


def sweep_shape(n: int, k: int, repeats: int, l2: int, hbm: float) -> list[dict]:
    """``--gemv-sweep``: each of ``_sweep_configs`` at one row, real (checked) and ``diag = 2``, alternating."""
    from quarl_kernels import gemv

    q, pw0, pws = _rotating(n, k, l2)
    torch.manual_seed(1)
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    want = x.double() @ q.dequantize(torch.float64).T
    nbytes = q.nbytes + 2 * k + 2 * n
    variants = []
    for c in _sweep_configs():
        got = gemv.launch_gemv(x, pw0, c).double()
        err = ((got - want).norm() / want.norm()).item()
        if not err < 5e-3:
            raise AssertionError(f"{c} at {n}x{k}: relative error {err:.2e}")
        variants += [(c, 0), (dataclasses.replace(c, diag=2), 2)]
    times = {str(c): [] for c, _ in variants}
    reads = []
    for _ in range(repeats):
        for c, _ in variants:
            times[str(c)].append(graph_us([lambda p=p, c=c: gemv.launch_gemv(x, p, c) for p in pws]))
        reads.append(read_ceiling_us(nbytes, l2))
    read = statistics.median(reads)
    rows = []
    for c, d in variants:
        us = statistics.median(times[str(c)])
        base = statistics.median(times[str(dataclasses.replace(c, diag=0))])
        rows.append({"N": n, "K": k, "M": 1, "diag": d, "config": str(c), "us": us, "all_us": times[str(c)],
                     "bytes": nbytes, "pct_hbm": 100 * nbytes / us / 1e3 / hbm, "vs_diag0": base / us,
                     "read_us": read, "read_pct_hbm": 100 * nbytes / read / 1e3 / hbm, "run_bytes": 4 * c.bkw})
        r = rows[-1]
        print(f"{n:5d}x{k:5d} M= 1 {c!s:28} {us:7.2f} us ({r['pct_hbm']:4.1f} % HBM; read {read:.2f} us = "
              f"{r['read_pct_hbm']:.1f} %)", flush=True)
    return rows


def blocked_shape(n: int, k: int, ms, repeats: int, l2: int, hbm: float) -> list[dict]:
    """``--blocked``: per M, ``wo_gemm.wo_matmul`` (whatever kernel it routes to) on row-major words and on the same
    words blocked (``quarl.quant.packed_layout``), alternating; the blocked outputs bit-equal to the row-major ones."""
    from quarl_kernels import wo_gemm

    from quarl.quant import packed_layout

    q, _, copies = _rotating(n, k, l2)
    blocked = [dataclasses.replace(p, words=packed_layout.block(p.words).view(n, k // 8), blocked=True)
               for p in copies]
    out = []
    for m in ms:
        x, nbytes = _activations(m, n, k, q)
        want = wo_gemm.wo_matmul(x, copies[0])
        if not torch.equal(wo_gemm.wo_matmul(x, blocked[0]), want):
            raise AssertionError(f"blocked words at {n}x{k} M={m}: output differs from the row-major kernel's")
        variants = (("row-major", copies), ("blocked", blocked))
        times = {name: [] for name, _ in variants}
        reads = []
        for _ in range(repeats):
            for name, pws in variants:
                times[name].append(graph_us([lambda p=p, x=x: wo_gemm.wo_matmul(x, p) for p in pws]))
            reads.append(read_ceiling_us(nbytes, l2))
        read = statistics.median(reads)
        base = statistics.median(times["row-major"])
        for name, _ in variants:
            us = statistics.median(times[name])
            out.append({"N": n, "K": k, "M": m, "diag": name, "config": "wo_matmul", "us": us,
                        "all_us": times[name], "bytes": nbytes, "pct_hbm": 100 * nbytes / us / 1e3 / hbm,
                        "vs_diag0": base / us, "read_us": read, "read_pct_hbm": 100 * nbytes / read / 1e3 / hbm})
            r = out[-1]
            print(f"{n:5d}x{k:5d} M={m:4d} {name:10s} {us:8.2f} us ({r['pct_hbm']:4.1f} % HBM, x{r['vs_diag0']:.3f} vs "
                  f"row-major; read {read:.2f} us = {r['read_pct_hbm']:.1f} %)", flush=True)
    return out


def bench_shape(n: int, k: int, ms, diags, repeats: int, l2: int, hbm: float) -> list[dict]:
    q, pw0, pws = _rotating(n, k, l2)
    rows = []
    for m in ms:
        x, nbytes = _activations(m, n, k, q)
        variants = [_launcher(m, n, k, a) for a in diags if m == 1 or a < 2]  # diag 2: the GEMV only
        got = variants[0][1](x, pw0).double()
        want = x.double() @ q.dequantize(torch.float64).T
        err = ((got - want).norm() / want.norm()).item()
        if not err < 5e-3:  # the real kernel (diag 0) must be right; the diagnostics are wrong by design
            raise AssertionError(f"{variants[0][0]} at {n}x{k} M={m}: relative error {err:.2e}")
        times = {name: [] for name, _ in variants}
        reads = []
        for _ in range(repeats):
            for name, fn in variants:
                times[name].append(graph_us([lambda p=p, fn=fn, x=x: fn(x, p) for p in pws]))
            reads.append(read_ceiling_us(nbytes, l2))
        base = statistics.median(times[variants[0][0]])
        read = statistics.median(reads)
        for (name, _), a in zip(variants, diags, strict=False):
            us = statistics.median(times[name])
            rows.append({"N": n, "K": k, "M": m, "diag": a, "config": name, "us": us, "all_us": times[name],
                         "bytes": nbytes, "pct_hbm": 100 * nbytes / us / 1e3 / hbm, "vs_diag0": base / us,
                         "read_us": read, "read_pct_hbm": 100 * nbytes / read / 1e3 / hbm})
            r = rows[-1]
            print(f"{n:5d}x{k:5d} M={m:2d} {name:28s} {us:7.2f} us ({r['pct_hbm']:4.1f} % HBM, x{r['vs_diag0']:.3f} "
                  f"vs diag 0; read {read:.2f} us = {r['read_pct_hbm']:.1f} %)  {[f'{t:.2f}' for t in times[name]]}",
                  flush=True)
    return rows


def table(info: dict, rows: list[dict]) -> str:
    lines = [(f"{info['gpu']}, torch {info['torch']}, {info['date']}; HBM copy {info['hbm_copy_GBps']:.0f} GB/s; "
              f"PDL {info['pdl']}; median of {info['repeats']} alternating repeats"), "",
             "| N x K | M | config | diag | us | % HBM | x diag 0 | plain read us (% HBM) |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['N']} x {r['K']} | {r['M']} | {r['config']} | {r['diag']} | {r['us']:.2f} | "
                     f"{r['pct_hbm']:.1f} | {r['vs_diag0']:.3f} | {r['read_us']:.2f} ({r['read_pct_hbm']:.1f}) |")
    return "\n".join(lines) + "\n"


def device_info(repeats: int, **extra) -> tuple[dict, int]:
    """(the run's header -- GPU, torch, date, the measured HBM copy rate, repeats, ``extra`` -- and the L2 size)."""
    dev = torch.device("cuda")
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "hbm_copy_GBps": hbm_copy_GBps(), "repeats": repeats, **extra}
    return info, torch.cuda.get_device_properties(dev).L2_cache_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--diags", default="0,1,2")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gemv-sweep", action="store_true", help="the one-row GEMV's work split (_sweep_configs) instead")
    ap.add_argument("--blocked", action="store_true", help="row-major against blocked words (wo_matmul) instead")
    args = ap.parse_args()
    diags = [int(a) for a in args.diags.split(",")]
    if diags[0] != 0:
        raise SystemExit("--diags must start with 0 (the real kernel: the reference)")
    from quarl_kernels import pdl

    info, l2 = device_info(args.repeats, pdl=pdl.mode(torch.device("cuda")))
    rows = []
    for s in args.shapes.split(","):
        n, k = map(int, s.split("x"))
        if args.gemv_sweep:
            rows += sweep_shape(n, k, args.repeats, l2, info["hbm_copy_GBps"])
        elif args.blocked:
            rows += blocked_shape(n, k, [int(m) for m in args.ms.split(",")], args.repeats, l2, info["hbm_copy_GBps"])
        else:
            rows += bench_shape(n, k, [int(m) for m in args.ms.split(",")], diags, args.repeats, l2,
                                info["hbm_copy_GBps"])
    write_outputs(args.out, "decode_bound", info, rows, table(info, rows))


if __name__ == "__main__":
    main()
