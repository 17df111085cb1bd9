"""Benchmark: the engine's decode-step attention, SDPA (today's call) vs the flash-decoding kernel.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/decode_attn.py --out $OUT/decode_attn.json
        [--models 7b 14b] [--batch 1 8 64] [--lengths 1280 2304] [--dtype bf16] [--reps 20] [--iters 30]
        [--sweep]                              # also tile / warps / split variants of the kernel
    python benchmarks/decode_attn.py --dry-run --out /tmp/decode_attn.json   # CPU: Triton interpreter, tiny shapes

One decode step's attention for one layer, as ``DecoderRunner.decode`` runs it: ``q [B, H_kv, G, D]``
(the G query heads of a KV head folded as rows) against the ``[:, :, :L]`` prefix of a static
``[B, H_kv, S, D]`` cache (S = the largest L + 256, so the views are strided as in the engine), with
a bool ``valid [B, L]`` from a ``[B, S]`` mask (left padding of up to L/4 slots per row):

    sdpa    F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=D**-0.5)
    kernel  quarl_kernels.fused_ops.decode_attention(q, k, v, valid, scale)  (torch.ops.quarl; split-KV)

Models: 7b = Qwen2.5-7B (H_kv 4, G 7, D 128, 28 layers), 14b = Qwen2.5-14B (H_kv 8, G 5, D 128,
48 layers). Timing is what the engine's CUDA-graph step sees: ``--reps`` calls captured in one graph,
replayed ``--iters`` times, median microseconds per call (``*_us``). Before timing, the kernel's
output is checked against an fp32 SDPA (max abs error <= 1e-2, the tests' bound); a case that fails
reports its error and is not timed. ``per_step_ms_saved`` = layers x (sdpa - kernel). ``kv_gbps`` is
the K/V bytes read (B x H_kv x L x D x 2 tensors x 2 bytes) over the kernel's time.

``--sweep`` adds, per case, the kernel at BLOCK_N 32 / 64 / 128 x 4 / 8 warps (default split rule)
and at half / double the default split count, and names the fastest (``best``): the data for
retuning ``decode_attn.BLOCK_N`` / ``NUM_WARPS`` / ``WAVES``.

Prints a markdown table, then the JSON (device, versions, rows); ``--out`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "kernels")):
    if p not in sys.path:
        sys.path.insert(0, p)

MODELS = {"7b": (4, 7, 128, 28), "14b": (8, 5, 128, 48)}  # H_kv, G, D, layers
DRY_MODELS = {"7b": (2, 7, 64, 28), "14b": (2, 5, 64, 48)}  # interpreter: fewer heads, D 64


def make_inputs(B: int, HK: int, G: int, D: int, L: int, S: int, dtype, device: str, seed: int = 0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, HK, G, D, device=device, generator=g).to(dtype)
    kc = torch.randn(B, HK, S, D, device=device, generator=g).to(dtype)
    vc = torch.randn(B, HK, S, D, device=device, generator=g).to(dtype)
    pad = torch.randint(0, max(1, L // 4), (B,), device=device, generator=g)
    pos = torch.arange(S, device=device)
    valid = (pos[None, :] >= pad[:, None]) & (pos[None, :] < L)  # [B, S]
    return q, kc[:, :, :L], vc[:, :, :L], valid[:, :L]


def time_graph(fn, reps: int, iters: int) -> float:
    """Median microseconds per call of ``fn`` replayed from a CUDA graph of ``reps`` calls (the fused-glue
    benchmark's timer: ``benchmarks/kernels/bench_fused.py``)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels"))
    from bench_fused import time_graph as graph_timer

    return graph_timer(fn, reps, iters)


def time_wall(fn, reps: int, iters: int) -> float:
    """Dry run (CPU): median wall microseconds per call -- only proves the path runs."""
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t) * 1e6 / reps)
    return statistics.median(times)


def variants(default_splits: int) -> list[dict]:
    """The ``--sweep`` kernel settings (keyword arguments of ``decode_attn.decode_attention``)."""
    out = [{"block_n": bn, "num_warps": w} for bn in (32, 64, 128) for w in (4, 8)]
    for s in sorted({max(1, default_splits // 2), default_splits * 2}):
        if s != default_splits:
            out.append({"splits": s})
    return out


def run_case(model: str, B: int, L: int, S: int, dtype, device: str, args) -> dict:
    import torch.nn.functional as F
    from quarl_kernels import decode_attn as da
    from quarl_kernels import fused_ops

    HK, G, D, layers = (DRY_MODELS if args.dry_run else MODELS)[model]
    q, k, v, valid = make_inputs(B, HK, G, D, L, S, dtype, device, seed=B * 7 + L)
    scale = D ** -0.5
    sms = da.num_sms(q.device)
    splits = da.num_splits(B * HK, L, sms, da.block_n_for(B * HK, sms))
    row = {"model": model, "batch": B, "kv_len": L, "cache_len": S, "h_kv": HK, "group": G, "head_dim": D,
           "dtype": str(dtype).replace("torch.", ""), "splits": splits, "programs": B * HK * splits,
           "launches": 1 if splits == 1 else 2}
    if not fused_ops.decode_attn_kernel_applies(q, k, v, valid):
        row["error"] = "the kernel does not apply here (needs CUDA, capability >= 8.0, Triton)"
        return row

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)

    def kernel():
        return fused_ops.decode_attention(q, k, v, valid, scale)

    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=valid[:, None, None, :],
                                         scale=scale)
    err = (kernel().float() - ref).abs().max().item()
    row["max_abs_err"] = err
    if not err <= 1e-2:
        row["error"] = f"kernel output off by {err:.3g} (> 1e-2): not timed"
        return row
    timer = time_wall if args.dry_run else time_graph
    row["sdpa_us"] = timer(sdpa, args.reps, args.iters)
    row["kernel_us"] = timer(kernel, args.reps, args.iters)
    row["speedup"] = row["sdpa_us"] / row["kernel_us"]
    row["layers"] = layers
    row["per_step_ms_saved"] = layers * (row["sdpa_us"] - row["kernel_us"]) / 1e3
    kv_bytes = 2 * B * HK * L * D * q.element_size()
    row["kv_mb"] = kv_bytes / 1e6
    row["kv_gbps"] = kv_bytes / (row["kernel_us"] * 1e3)
    if args.sweep:
        sweep = []
        for kw in variants(splits):
            try:
                o = da.decode_attention(q, k, v, valid, scale, **kw)
                e = (o.float() - ref).abs().max().item()
                us = timer(lambda kw=kw: da.decode_attention(q, k, v, valid, scale, **kw), args.reps, args.iters) \
                    if e <= 1e-2 else None
                sweep.append({**kw, "us": us, "max_abs_err": e})
            except Exception as ex:  # noqa: BLE001 - a setting that cannot compile/run is no candidate
                sweep.append({**kw, "us": None, "error": f"{type(ex).__name__}: {ex}"[:200]})
        row["sweep"] = sweep
        timed = [s for s in sweep if s.get("us") is not None]
        if timed:
            best = min(timed, key=lambda s: s["us"])
            row["best"] = {k: best[k] for k in best if k not in ("max_abs_err",)}
    return row


def table(rows: list[dict]) -> str:
    head = ("| model | B | L | splits | programs | SDPA us | kernel us | speedup | ms/step saved | K/V MB | "
            "kernel GB/s | max err | best sweep |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['kv_len']} | {r['splits']} | {r['programs']} | "
                         f"{r['error']} |||||||| ")
            continue
        best = r.get("best")
        best_s = ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in best.items()) \
            if best else ""
        lines.append(f"| {r['model']} | {r['batch']} | {r['kv_len']} | {r['splits']} | {r['programs']} | "
                     f"{r['sdpa_us']:.1f} | {r['kernel_us']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['per_step_ms_saved']:.2f} | {r['kv_mb']:.1f} | {r['kv_gbps']:.0f} | "
                     f"{r['max_abs_err']:.1e} | {best_s} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["7b", "14b"])
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="default 1 8 64 (dry run: 1 2)")
    ap.add_argument("--lengths", type=int, nargs="+", default=None, help="default 1280 2304 (dry run: 100 200)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--iters", type=int, default=30, help="timed replays (median)")
    ap.add_argument("--sweep", action="store_true", help="also time tile / warps / split variants")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU smoke run: Triton interpreter, tiny shapes, wall-clock timing (numbers meaningless)")
    ap.add_argument("--out", default=None, help="write the JSON here (a file; its folder is created)")
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
        args.reps, args.iters = min(args.reps, 2), min(args.iters, 2)
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("decode_attn.py needs a CUDA device (or --dry-run for the CPU interpreter smoke run)")
    import triton
    from quarl_kernels import fused_ops

    if args.dry_run:
        fused_ops._ATTN_ON_CPU = True  # the CPU test seam: the op launches the (interpreted) kernel
    batches = args.batch or ([1, 2] if args.dry_run else [1, 8, 64])
    lengths = args.lengths or ([100, 200] if args.dry_run else [1280, 2304])
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    S = max(lengths) + 256
    rows = []
    for model in args.models:
        for L in lengths:
            for B in batches:
                t = time.perf_counter()
                row = run_case(model, B, L, S, dtype, device, args)
                row["wall_s"] = time.perf_counter() - t
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
                if not args.dry_run:
                    torch.cuda.empty_cache()
    result = {
        "device": torch.cuda.get_device_name() if not args.dry_run else "cpu (Triton interpreter; times meaningless)",
        "sms": torch.cuda.get_device_properties(0).multi_processor_count if not args.dry_run else None,
        "torch": torch.__version__, "triton": triton.__version__, "dry_run": args.dry_run,
        "reps": args.reps, "iters": args.iters, "rows": rows,
    }
    print()
    print(table(rows))
    print()
    print(json.dumps(result, indent=1))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
