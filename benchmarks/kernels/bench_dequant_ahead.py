"""The dense path with the next weight decoded on a side stream (``dequant_ahead.py``), timed against cuBLAS BF16.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_dequant_ahead.py --out DIR [--shapes 7b,14b]
        [--ms 2048,4096,8192] [--layers 4] [--carveouts 0,8,16]

Issue 17's large-M target is ">= 0.95x cuBLAS BF16 at M >= 2048 with weight-only numerics". One dense call decodes
its weight, then runs cuBLAS: ~0.85x at 2048 rows. What a model runs is a *chain* of such calls -- a decoder layer's
seven projections, layer after layer -- so this times chains: ``--layers`` decoder layers of Qwen2.5-7B (hidden
3584, MLP 18944, k/v 512) or 14B (5120, 13824, 1024) width, each projection its own NVFP4 weight (random,
``0.03 randn``; 4 layers are 2-4 GB of BF16 weights, far past the L2), in forward order (``x @ W^T``) and in the
backward's reverse order (``dy @ W``). Arms, each timed back to back (eager, as training runs; median of
``--iters`` chains, CUDA events):

* ``bf16``: cuBLAS on BF16 copies of the same weights (the reference).
* ``dense``: ``dense.dense_matmul`` / ``dense_matmul_t`` with ``QUARL_KERNELS_DENSE_AHEAD=0`` (decode, then GEMM).
* ``ahead``: the same calls with the side-stream decode on (the library's default).
* for each of ``--carveouts`` c: ``ahead`` with the GEMM on a high-priority stream and cuBLAS leaving c SMs free while
  a decode is in flight (``QUARL_KERNELS_DENSE_AHEAD_PRIO=1``, ``..._SMS=c``), beside ``bf16`` with c SMs left free
  for the whole chain (what the carveout costs cuBLAS). torch applies a carveout on its cuBLASLt route only, so both
  switch to it (``torch.backends.cuda.preferred_blas_library("cublaslt")``) while SMs are left free; ``bf16`` on
  cuBLASLt with no carveout is timed as well.

Every arm's outputs are checked first: ``ahead`` bit-equal to ``dense``; both against ``bf16`` (the same BF16
weights, so equal up to cuBLAS's own choices). Writes ``dequant_ahead.json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

import torch
from bench_wo_gemm import _packed_weight, get_format, make_config
from quarl_kernels import dense, dequant_ahead

WIDTHS = {"7b": (3584, 18944, 512), "14b": (5120, 13824, 1024)}  # hidden, MLP, k/v rows


def layer_shapes(name: str) -> list[tuple[int, int]]:
    """A decoder layer's projections, N x K, in the order a forward runs them: q, k, v, o, gate, up, down."""
    h, i, kv = WIDTHS[name]
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]


def packed(n: int, k: int):
    """(a random NVFP4 weight as ``wo_gemm.PackedWeight``, its BF16 dequantization)."""
    cfg = make_config("nvfp4")
    q = get_format(cfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, cfg)
    t = q.tensors
    pw = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                        t.get("weight_global_scale"), cfg.name, cfg.block_size, n, k)
    return pw, dense.dequantize(pw)


def chain(direction: str, arm: str, weights: list, xs: dict) -> list[torch.Tensor]:
    """One pass over the weights; forward in model order, backward in reverse."""
    order = weights if direction == "fwd" else weights[::-1]
    out = []
    for pw, wb in order:
        if direction == "fwd":
            x = xs[pw.k]
            out.append(x @ wb.T if arm == "bf16" else dense.dense_matmul(x, pw))
        else:
            dy = xs[pw.n]
            out.append(dy @ wb if arm == "bf16" else dense.dense_matmul_t(dy, pw))
    return out


def timed(fn, iters: int) -> float:
    fn()
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def run_arm(direction: str, arm: str, weights, xs, iters: int, carveout: int = 0, sms: int = 0, prio: int = 0,
            lt: bool = False) -> tuple[float, list]:
    """``arm`` "bf16" (cuBLAS, ``carveout`` SMs left free for the whole chain), "dense" (no side stream) or "ahead"
    (the side-stream decode; ``sms`` / ``prio``: dequant_ahead's SMS / PRIO knobs)."""
    os.environ[dequant_ahead.ENV] = "1" if arm == "ahead" else "0"
    os.environ[dequant_ahead.SMS_ENV] = str(sms)
    os.environ[dequant_ahead.PRIO_ENV] = str(prio)
    dequant_ahead.reset()
    torch._C._set_sm_carveout_experimental(carveout or None)
    if carveout or lt:  # torch applies the carveout on its cuBLASLt route only
        torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        ms = timed(lambda: chain(direction, arm, weights, xs), iters)
        ys = chain(direction, arm, weights, xs)
    finally:
        torch._C._set_sm_carveout_experimental(None)
        torch.backends.cuda.preferred_blas_library("cublas")
    return ms, ys


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def bench(shape: str, m: int, layers: int, iters: int, carveouts: list[int]) -> list[dict]:
    torch.manual_seed(m + layers)
    weights = [packed(n, k) for _ in range(layers) for n, k in layer_shapes(shape)]
    dims = {d for n, k in layer_shapes(shape) for d in (n, k)}
    xs = {d: (torch.randn(m, d, device="cuda") * 0.5).to(torch.bfloat16) for d in dims}
    flops = sum(2 * m * pw.n * pw.k for pw, _ in weights)
    rows = []
    for direction in ("fwd", "bwd"):
        ms_bf16, y_bf16 = run_arm(direction, "bf16", weights, xs, iters, 0)
        ms_dense, y_dense = run_arm(direction, "dense", weights, xs, iters, 0)
        ms_ahead, y_ahead = run_arm(direction, "ahead", weights, xs, iters, 0)
        st = dict(dequant_ahead.stats)
        exact = all(torch.equal(a, b) for a, b in zip(y_ahead, y_dense))
        err = max(rel_err(a, b) for a, b in zip(y_dense, y_bf16))
        ms_lt = run_arm(direction, "bf16", weights, xs, iters, lt=True)[0]
        row = {"shape": shape, "bf16_lt_ms": ms_lt, "M": m, "layers": layers, "direction": direction, "bf16_ms": ms_bf16,
               "dense_ms": ms_dense, "ahead_ms": ms_ahead, "x_dense": ms_bf16 / ms_dense,
               "x_ahead": ms_bf16 / ms_ahead, "bf16_TFLOPs": flops / ms_bf16 / 1e9, "ahead_equal_dense": exact,
               "dense_vs_bf16_err": err, "ahead_stats": st, "carveouts": {}}
        for c in carveouts:  # cuBLAS leaving c SMs free: what it costs the BF16 chain, what it gives the decode
            cb = run_arm(direction, "bf16", weights, xs, iters, carveout=c)[0] if c else ms_bf16
            ca, yc = run_arm(direction, "ahead", weights, xs, iters, sms=c, prio=1)
            row["carveouts"][c] = {"bf16_ms": cb, "ahead_ms": ca, "x_ahead": ms_bf16 / ca,
                                   "equal": all(torch.equal(a, b) for a, b in zip(yc, y_dense)),
                                   "err": max(rel_err(a, b) for a, b in zip(yc, y_dense))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    del weights, xs
    torch.cuda.empty_cache()
    return rows


def render(rows: list[dict], meta: dict) -> str:
    cs = sorted({int(c) for r in rows for c in r["carveouts"]})
    head = ["width", "M", "direction", "cuBLAS BF16 ms", "cuBLASLt BF16 ms", "dense ms (x)", "ahead ms (x)"]
    head += [f"{c} SMs left: BF16 ms / ahead+prio ms (x)" for c in cs]
    lines = [f"# dense path with the next weight decoded ahead ({meta['gpu']}, {meta['date']})", "",
             (f"{meta['layers']} decoder layers, 7 NVFP4 projections each, eager, median of {meta['iters']} chains; "
              "x = cuBLAS BF16 time / arm time (no carveout)"), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["shape"], str(r["M"]), r["direction"], f"{r['bf16_ms']:.2f}", f"{r.get('bf16_lt_ms', 0):.2f}",
                 f"{r['dense_ms']:.2f} ({r['x_dense']:.3f}x)", f"{r['ahead_ms']:.2f} (**{r['x_ahead']:.3f}x**)"]
        for c in cs:
            v = r["carveouts"].get(c) or r["carveouts"].get(str(c))
            cells.append(f"{v['bf16_ms']:.2f} / {v['ahead_ms']:.2f} ({v['x_ahead']:.3f}x)" if v else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "ahead bit-equal to dense: " + str(all(r["ahead_equal_dense"] for r in rows)),
              "ahead+prio bit-equal to dense: " + str(all(v.get("equal", False) for r in rows
                                                          for v in r["carveouts"].values())),
              f"dense vs BF16 rel. err (max): {max(r['dense_vs_bf16_err'] for r in rows):.2e}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="7b,14b")
    ap.add_argument("--ms", default="2048,4096,8192")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--carveouts", default="0,8,16")
    ap.add_argument("--render", help="re-render a dequant_ahead.json")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.render:
        with open(a.render) as f:
            d = json.load(f)
        print(render(d["rows"], d["meta"]))
        return
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.UTC).isoformat(),
            "layers": a.layers, "iters": a.iters, "torch": torch.__version__}
    carveouts = [int(c) for c in a.carveouts.split(",")]
    rows = []
    for shape in a.shapes.split(","):
        for m in [int(v) for v in a.ms.split(",")]:
            rows += bench(shape, m, a.layers, a.iters, carveouts)
    with open(os.path.join(a.out, "dequant_ahead.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    md = render(rows, meta)
    with open(os.path.join(a.out, "dequant_ahead.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
