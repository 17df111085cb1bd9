"""Benchmark the decode GEMV against the tensor-core decode path and cuBLAS BF16.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_gemv.py --out DIR [--quick]

Qwen2.5-7B linear shapes (N x K = 3584x3584, 512x3584, 18944x3584, 3584x18944),
M = 1, 2, 3, 4, 8, 16 tokens, NVFP4 / MXFP4 / INT4-g128 (asymmetric).

Method (docs/kernels.md):
  * ceilings first: HBM bandwidth from a 2 GiB device-to-device copy (bytes read +
    written, median of 20);
  * kernels are compiled ahead in worker processes (one per format and shape, into
    the shared Triton cache) so that compile time stays out of the device budget's
    critical path;
  * every timed call reads a different copy of the weight (copies rotate; together
    >= 4x the L2), R calls are captured in one CUDA graph, and the time per call is
    ``triton.testing.do_bench(graph.replay, return_mode="median") / R`` -- no Python
    launch overhead, weights streamed from HBM;
  * cuBLAS BF16 (``x @ w.T`` on rotated bf16 weights) and the tensor-core decode path
    (``wo_gemm.launch_fwd`` with its default config) are timed the same way;
  * every timed output is first checked against a float64 product of the same
    activations and the reference dequantized weight (rel. Frobenius error).

GB/s counts the fewest bytes: packed weight + scales + x + y, each once. ``--read-ceiling`` also times a pure
streaming read of that many bytes the same way (rotating copies, one graph): the % of the copy rate that a kernel
of this size can reach at all -- launch, ramp-up and tail included.
Writes ``gemv.json`` to ``--out`` and prints a compact table last.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import time

import torch
from bench_wo_gemm import _copies, _sync_ms, capture_graph  # same L2-defeating copies, timer, capture

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]  # N x K: q/o, k/v, gate/up, down
MS = [1, 2, 3, 4, 8, 16]
SPECS = ["nvfp4", "mxfp4", "int4-g128"]


def explore_configs() -> list:
    """``--explore``: M = 1 configs beyond ``GEMV_CONFIGS`` (the H200 sweep's winners), to see whether another GPU
    (the H100: less bandwidth, the same SMs) wants more bytes in flight -- more programs (waves), longer K steps,
    more warps, a deeper cp.async pipeline."""
    from quarl_kernels.gemv import GemvConfig as C

    return [C(64, 32, 4, 4, prefetch=False, waves=8), C(64, 32, 4, 4, prefetch=False, waves=2),
            C(64, 64, 4, 4, prefetch=False), C(32, 64, 4, 4, prefetch=False), C(128, 32, 4, 8, prefetch=False),
            C(64, 32, 4, 4, stages=4), C(64, 64, 4, 4, stages=3), C(64, 32, 4, 4, waves=8)]


EXPLORE = os.environ.get("QUARL_BENCH_GEMV_EXPLORE") == "1"  # --explore (the spawned compile workers inherit it)
READ_CEILING = False  # --read-ceiling


def _candidates(m: int) -> list:
    """GEMV configs timed at this M: all at M = 1 (and ``explore_configs`` with ``--explore``), those that fit
    their registers above (docs/kernels.md v6)."""
    from quarl_kernels import gemv

    idx = list(range(len(gemv.GEMV_CONFIGS))) if m == 1 else [1, 2, 3, 4, 5, 6] if m <= 4 else [2, 6]
    return [gemv.GEMV_CONFIGS[i] for i in idx] + (explore_configs() if EXPLORE and m == 1 else [])


def _quantized(spec: str, n: int, k: int, seed: int):
    from quarl_kernels.ops import _packed_weight

    from quarl.quant import get_format, make_config

    cfg = make_config(spec)
    torch.manual_seed(seed)
    w = torch.randn(n, k, device="cuda") * 0.03
    q = get_format(cfg.name).quantize(w, cfg)
    t = q.tensors
    args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
            cfg.name, cfg.block_size, n, k)
    return w, q, _packed_weight(*args)


def _warm(task) -> str:
    """Worker: compile every kernel one (format, shape) point will run."""
    spec, n, k, ms = task
    from quarl_kernels import gemv, wo_gemm

    _, _, pw = _quantized(spec, n, k, 0)
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        for c in _candidates(m):
            gemv.launch_gemv(x, pw, c)
        wo_gemm.launch_fwd(x, pw, wo_gemm.default_config("fwd", m, n, k))
    torch.cuda.synchronize()
    return f"{spec} {n}x{k}"


def hbm_copy_GBps() -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint16, device="cuda").random_(0, 1 << 15)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = statistics.median(_sync_ms(lambda: dst.copy_(src), 20))
    return 2 * src.numel() * 2 / (t * 1e-3) / 1e9


@functools.cache
def _read_kernel():
    """A pure streaming read: each program loads ``BLOCK`` int32 words (16-byte loads) and stores their xor, so
    the loads stay. The same bytes, timed the same way as a GEMV, are the ceiling the GEMV's "% HBM" can reach at
    this size (launch, ramp-up and tail included), which a 2 GiB copy does not show."""
    import triton
    import triton.language as tl
    from quarl_kernels import pdl

    @triton.jit
    def read_words(src, out, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl.enter(PDL)  # with PDL as the GEMV: wait first, signal once the loads are done
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(src + offs, mask=offs < n, other=0)
        pdl.leave(PDL)
        tl.store(out + tl.program_id(0), tl.xor_sum(v, 0))

    return read_words


def read_ceiling_us(nbytes: int, l2: int, block: int = 4096) -> float:
    """Time per read of ``nbytes`` (rounded up to whole words) from HBM, rotating copies as the GEMV timing does."""
    import triton

    kern = _read_kernel()
    n = -(-nbytes // 4)
    bufs = [torch.randint(-(1 << 31), 1 << 31, (n,), dtype=torch.int32, device="cuda")
            for _ in range(_copies(nbytes, l2))]
    grid = (triton.cdiv(n, block),)
    out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    from quarl_kernels import pdl

    chain = pdl.kwargs(out.device)  # QUARL_KERNELS_PDL, as the GEMV's launches
    fns = [lambda b=b: kern[grid](b, out, n, BLOCK=block, num_warps=8, **chain) for b in bufs]
    fns[0]()
    return graph_us(fns)


def graph_us(fns: list) -> float:
    """Median time per call of ``fns`` (one call per rotating input), as one CUDA graph."""
    import triton

    g = capture_graph(fns)
    ms = triton.testing.do_bench(g.replay, warmup=10, rep=40, return_mode="median")
    return ms * 1e3 / len(fns)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float("nan") if torch.isnan(y).any() else ((y.double() - ref).norm() / ref.norm()).item()


def bench_shape(spec: str, n: int, k: int, ms: list[int], l2: int, bf16_cache: dict) -> list[dict]:
    from quarl_kernels import gemv, wo_gemm

    w, q, pw0 = _quantized(spec, n, k, n + k)
    wbytes = q.nbytes
    reps = _copies(wbytes, l2)
    pws = [pw0] + [
        wo_gemm.PackedWeight(pw0.fmt, pw0.group, n, k, pw0.words.clone(), pw0.scale.clone(),
                             None if pw0.zero is None else pw0.zero.clone(),
                             None if pw0.gscale is None else pw0.gscale.clone(), pw0.bytes32)
        for _ in range(reps - 1)
    ]
    w64 = q.dequantize(torch.float64)
    rows = []
    for m in ms:
        torch.manual_seed(m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.double() @ w64.T
        nbytes = wbytes + 2 * m * k + 2 * m * n
        key = (n, k, m)
        if key not in bf16_cache:  # the same for every format
            wb = w.to(torch.bfloat16)
            wbs = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
            bf16_cache[key] = graph_us([lambda wi=wi, x=x: x @ wi.T for wi in wbs])
            del wbs, wb
        t_bf16 = bf16_cache[key]
        res = []
        for c in _candidates(m):
            err = _rel(gemv.launch_gemv(x, pw0, c), ref)
            us = graph_us([lambda p=p, c=c, x=x: gemv.launch_gemv(x, p, c) for p in pws])
            res.append({"config": str(c), "us": us, "err": err})
        tc_cfg = wo_gemm.default_config("fwd", m, n, k)
        tc_err = _rel(wo_gemm.launch_fwd(x, pw0, tc_cfg), ref)
        tc_us = graph_us([lambda p=p, x=x, c=tc_cfg: wo_gemm.launch_fwd(x, p, c) for p in pws])
        best = min(res, key=lambda r: r["us"])
        read_us = read_ceiling_us(nbytes, l2) if READ_CEILING else None
        dflt = str(gemv.default_gemv_config(pw0.fmt, m, n, k))
        default = next((r for r in res if r["config"] == dflt), None)
        rows.append({
            "format": spec, "N": n, "K": k, "M": m, "weight_bytes": wbytes, "bytes": nbytes, "copies": reps,
            "gemv": res, "best": best, "default": default, "us": best["us"], "GBps": nbytes / best["us"] / 1e3,
            "tc_config": str(tc_cfg), "tc_us": tc_us, "tc_err": tc_err, "tc_GBps": nbytes / tc_us / 1e3,
            "bf16_us": t_bf16, "speedup_bf16": t_bf16 / best["us"], "speedup_tc": tc_us / best["us"],
            "max_err": max(r["err"] for r in res),
            "read_us": read_us, "read_GBps": None if read_us is None else nbytes / read_us / 1e3,
        })
        r = rows[-1]
        print(f"{spec:10s} {n:5d}x{k:5d} M={m:2d}  gemv {r['us']:7.2f} us {r['GBps']:6.0f} GB/s  "
              f"tc {tc_us:7.2f}  bf16 {t_bf16:7.2f}  x{r['speedup_bf16']:.2f} bf16  x{r['speedup_tc']:.2f} tc  "
              f"best {best['config']}  err {r['max_err']:.1e}/{tc_err:.1e}"
              + (f"  read {read_us:.2f} us (the GEMV at {read_us / r['us']:.2f} of the read's rate)" if read_us else ""),
              flush=True)
    del pws
    torch.cuda.empty_cache()
    return rows


def table(info: dict, rows: list[dict]) -> str:
    hbm = info["hbm_copy_GBps"]
    lines = [
        (f"GPU {info['gpu']} ({info['sms']} SMs, L2 {info['l2_bytes'] >> 20} MiB), torch {info['torch']}, "
         f"Triton {info['triton']}, {info['date']}; HBM copy {hbm:.0f} GB/s"),
        "",
        ("| format | N x K | M | GEMV us | GB/s | % HBM | vs cuBLAS BF16 | vs TC path | cuBLAS us | TC us | best config "
        "| read-only us (% HBM) |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        read = f"{r['read_us']:.2f} ({100 * r['read_GBps'] / hbm:.0f}%)" if r.get("read_us") else "-"
        lines.append(
            f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {r['us']:.2f} | {r['GBps']:.0f} | "
            f"{100 * r['GBps'] / hbm:.0f}% | {r['speedup_bf16']:.2f}x | {r['speedup_tc']:.2f}x | "
            f"{r['bf16_us']:.2f} | {r['tc_us']:.2f} | {r['best']['config']} | {read} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import triton

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="18944x3584 only, M = 1, 4")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--formats", default=",".join(SPECS), help=f"comma-separated, default {','.join(SPECS)}")
    ap.add_argument("--ms", default=None, help=f"comma-separated token counts, default {','.join(map(str, MS))}")
    ap.add_argument("--explore", action="store_true", help="also time explore_configs() at M = 1")
    ap.add_argument("--read-ceiling", action="store_true",
                    help="also time a pure streaming read of each row's bytes, the same way (the reachable % HBM)")
    args = ap.parse_args()
    global EXPLORE, READ_CEILING
    EXPLORE, READ_CEILING = args.explore, args.read_ceiling
    os.environ["QUARL_BENCH_GEMV_EXPLORE"] = "1" if args.explore else ""  # the compile workers (spawned) read it
    t0 = time.time()
    shapes, ms = ([(18944, 3584)], [1, 4]) if args.quick else (SHAPES, MS)
    if args.ms:
        ms = [int(v) for v in args.ms.split(",")]
    specs = args.formats.split(",")
    bad = [s for s in specs if s not in SPECS]
    if bad:
        raise SystemExit(f"--formats: unknown {bad}; known: {', '.join(SPECS)}")
    tasks = [(spec, n, k, ms) for spec in specs for n, k in shapes]
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for done in pool.imap_unordered(_warm, tasks):
            print("compiled", done, f"{time.time() - t0:.0f}s", flush=True)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    info = {"gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": l2, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat(), "compile_s": time.time() - t0}
    try:
        info["clocks"] = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                                         "--format=csv,noheader"], capture_output=True, text=True,
                                        check=False).stdout.strip()
    except OSError:
        pass
    info["hbm_copy_GBps"] = hbm_copy_GBps()
    from quarl_kernels import pdl

    info["pdl"] = pdl.mode(torch.device("cuda"))  # QUARL_KERNELS_PDL: 0 off, 1 late, 2 early (pdl.py)
    print(json.dumps(info), flush=True)
    rows, cache = [], {}
    for n, k in shapes:
        for spec in specs:
            rows += bench_shape(spec, n, k, ms, l2, cache)
    info["wall_s"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemv.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    print(table(info, rows))
    ok = all(r["max_err"] < 5e-3 and r["tc_err"] < 5e-3 for r in rows if not math.isnan(r["max_err"]))
    print("all outputs within 5e-3 of the float64 reference:", ok and not any(math.isnan(r["max_err"]) for r in rows))


if __name__ == "__main__":
    main()
