"""GPTQ wall time on a GPU for a Qwen2.5-7B-shaped model, NVFP4 and INT4-g128, new column loop vs old.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/gptq_gpu.py --out $OUT --deadline $(( $(date +%s) + 200 ))
    .venv/bin/python benchmarks/gptq_gpu.py --shape tiny --device cpu --samples 4 --seq-len 64   # dry run (~1 min)
    # the same with TRITON_INTERPRET=1 runs the Triton loop on the CPU too (~6 min); without it "triton"
    # falls back to the graph loop off CUDA (column_loop_used in the JSON says which ran)

What is timed is :func:`quarl.calibrate.calibrate_model` with ``method="gptq"``
-- the loop the calibrate stage runs -- with the stage's GPTQ defaults (lazy
blocks of 128 columns, percdamp 0.01, act-order with static groups) on every
linear of every decoder block (q/k/v/o/gate/up/down; embeddings and
``lm_head`` stay BF16, the recipes' default ``exclude``). The model is BF16 (the
``qerl-nvfp4`` calibrate recipe's dtype), built on the device with random
weights (meta init, ``to_empty``, ``normal_(0, 0.02)``; see
``benchmarks/grpo_step_gpu.py``); calibration inputs are random token ids,
``--samples`` sequences of ``--seq-len`` tokens in batches of ``--batch``.
Random weights and tokens change the numbers GPTQ produces, not the work it
does: every shape, Hessian and column loop is the real model's.

Runs (``--runs``, one per entry ``format/column_loop/hessian/check/share``): each builds a
fresh model (calibration quantizes in place) and calibrates it with that column loop
("triton": one kernel per lazy block, "graph": the fixed-buffer loop replayed as CUDA
graphs, "reference": the old eager loop)
and Hessian GEMM ("fp32" or "native"). ``check`` adds work to block 0 only, timed apart:

  * ``ref``: every GPTQ solve of block 0 is re-run with ``column_loop="reference"`` on the
    same (W, H): the old loop's time on the same layers in the same process, and whether
    the new loop's Q is identical (fraction of equal weights, relative output errors);
  * ``hess``: block 0's Hessians are also accumulated the other way (fp32 <-> native) and
    every solve re-run on them: how far the "native" Hessians are from the fp32 ones, and
    what that does to Q (fraction of equal weights; relative output error of both, measured
    on the fp32 H).

Per-block time: a forward pre-hook on each decoder block notes (after a device
synchronize) when the block is first entered; block ``i`` costs the time from
its first entry to block ``i+1``'s -- its Hessian pass, the GPTQ solves of its
linears and the forward of the quantized block that makes the next block's
inputs. ``capture`` is the embedding pass before block 0. The Hessian pass and each
GPTQ solve are also timed alone (synchronized). Block 0 carries the one-time CUDA-graph
captures and the checks, so the means are over blocks >= 1, and ``total_est_s`` is
``capture + block 0 without its checks + (num_layers - 1) x mean(blocks >= 1)``.

Before the runs, ``selftest`` compares every fast loop with the reference loop on small
layers of five formats on the device (seconds).

Budget: a run gets ``share`` of the time left to ``--deadline`` (relative to the shares of
the runs after it); it stops (by raising from the hook) before entering a block that,
judged by the previous block's time, would end past its share. Results are written after
every run (``gptq_gpu.json``); a summary table is printed last.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from grpo_step_gpu import SHAPES, build_model, qwen25_config


class _OutOfTime(Exception):
    pass


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


RUN_FIELDS = ("format", "column_loop", "hessian", "check", "share")
DEFAULT_RUNS = ("nvfp4/triton/native/ref/0.36,nvfp4/graph/fp32/hess/0.17,"
                "int4-g128/triton/native/ref/0.31,int4-g128/graph/fp32/-/0.16")


def parse_runs(text: str) -> list[dict]:
    runs = []
    for item in filter(None, text.split(",")):
        parts = item.split("/")
        if len(parts) != len(RUN_FIELDS):
            raise SystemExit(f"--runs entry {item!r}: expected {'/'.join(RUN_FIELDS)}")
        r = dict(zip(RUN_FIELDS, parts))
        if r["column_loop"] not in ("triton", "graph", "reference", "auto") or r["hessian"] not in ("fp32", "native") \
                or r["check"] not in ("ref", "hess", "-"):
            raise SystemExit(f"--runs entry {item!r}: loop triton|graph|reference|auto, hessian fp32|native, "
                             "check ref|hess|-")
        r["share"] = float(r["share"])
        runs.append(r)
    return runs


def _mean(xs):
    return round(statistics.mean(xs), 3) if xs else None


def _loop_used(loop: str, plan: dict, dev: torch.device) -> str:
    """The loop gptq_quantize picks for this run's format (act-order: static groups), as it decides."""
    from quarl.calibrate.gptq_columns import GRAPH_FORMATS, triton_applies

    cfg = next(c for c in plan.values() if c is not None)
    if loop == "auto":
        loop = ("triton" if triton_applies(cfg, True, dev) else "graph") if dev.type == "cuda" else "reference"
    if loop == "triton" and not triton_applies(cfg, True, dev):
        loop = "graph"
    return "reference" if loop == "graph" and cfg.name not in GRAPH_FORMATS else loop


def run_one(run: dict, args, stop_at: float) -> dict:
    import quarl.calibrate.sequential as seq
    from quarl.calibrate import gptq as gptq_mod
    from quarl.calibrate import gptq_columns
    from quarl.calibrate.gptq import relative_error
    from quarl.calibrate.sequential import calibrate_model, decoder_blocks
    from quarl.quant.model import QuantRecipe, plan_formats

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    cfg = qwen25_config(args.shape)
    model = build_model(cfg, str(dev), dtype)
    plan = plan_formats(model, QuantRecipe.load({"default": run["format"]}))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(16, cfg.vocab_size, (args.samples, args.seq_len), generator=g)  # [S, T]
    batches = [ids[i : i + args.batch] for i in range(0, args.samples, args.batch)]
    n_batches = len(batches)
    _, blocks = decoder_blocks(model)
    entered: dict[int, float] = {}
    calls: dict[int, int] = defaultdict(int)

    def block_now() -> int:
        return max(entered) if entered else 0

    def pre_hook(i):
        def hook(_mod, _args, _kwargs):
            calls[i] += 1
            # block 0 is also entered once per batch by capture_block_inputs (whose own hook stops the
            # forward there): the calibration loop's first entry is call len(batches) + 1
            if i in entered or (i == 0 and calls[i] <= n_batches):
                return
            _sync(dev)
            now = time.time()
            entered[i] = time.perf_counter()  # also when stopping: it is the end of block i - 1
            last = entered[i] - entered[i - 1] if i >= 2 else 0.0  # block 0 carries captures and checks
            if i > 0 and now + last > stop_at:
                raise _OutOfTime
            return

        return hook

    hooks = [b.register_forward_pre_hook(pre_hook(i), with_kwargs=True) for i, b in enumerate(blocks)]
    solves: list[tuple[int, str, float]] = []  # (block, "NxK", seconds) per GPTQ solve
    hess_s: dict[int, float] = defaultdict(float)
    check_s: dict[int, float] = defaultdict(float)  # time of the block-0 checks (not part of the product path)
    checks: list[dict] = []
    hmap: dict[int, torch.Tensor] = {}  # id(this run's H) -> the other mode's H of the same layer (check "hess")
    other_mode = "fp32" if run["hessian"] == "native" else "native"
    orig_gptq, orig_hess = seq.gptq_quantize, seq._hessians

    def timed_hessians(block, cache, names, matmul="fp32"):
        _sync(dev)
        t = time.perf_counter()
        acc, outs = orig_hess(block, cache, names, matmul)
        _sync(dev)
        bi = block_now()
        hess_s[bi] += time.perf_counter() - t
        if bi > 0:
            hmap.clear()  # block 0's fp32 Hessians are needed no longer
        if run["check"] == "hess" and bi == 0:
            t = time.perf_counter()
            acc2, _ = orig_hess(block, cache, names, other_mode)
            for n in names:
                hmap[id(acc[n].H)] = acc2[n].H
                h32 = acc[n].H if run["hessian"] == "fp32" else acc2[n].H
                d = (acc[n].H - acc2[n].H).abs()
                checks.append({"what": "hessian", "layer": n, "max_abs_diff_rel": float(d.max() / h32.abs().max()),
                               "fro_rel": float(d.norm() / h32.norm())})
            _sync(dev)
            check_s[bi] += time.perf_counter() - t
        return acc, outs

    def timed_gptq(w, H, fcfg, **kw):  # the loop calls seq.gptq_quantize by name: time each solve
        _sync(dev)
        t = time.perf_counter()
        out = orig_gptq(w, H, fcfg, **kw)
        _sync(dev)
        bi = block_now()
        shape = f"{w.shape[0]}x{w.shape[1]}"
        solves.append((bi, shape, time.perf_counter() - t))
        if bi == 0 and run["check"] in ("ref", "hess"):
            t = time.perf_counter()
            if run["check"] == "ref":  # the old loop on the same (W, H)
                other = orig_gptq(w, H, fcfg, **{**kw, "column_loop": "reference", "pack": False})
                Hm = H
            else:  # the same loop on the other mode's Hessian; errors measured on the fp32 one
                H2 = hmap[id(H)]
                Hm = H if run["hessian"] == "fp32" else H2
                other = orig_gptq(w, H2, fcfg, **{**kw, "pack": False})
            _sync(dev)
            other_s = time.perf_counter() - t
            checks.append({"what": run["check"], "shape": shape, "other_s": round(other_s, 3),
                           "equal_frac": float((out.q == other.q).float().mean()),
                           "rel_err": relative_error(w, out.q, Hm), "rel_err_other": relative_error(w, other.q, Hm),
                           "loss": out.loss, "loss_other": other.loss})
            _sync(dev)
            check_s[bi] += time.perf_counter() - t
        return out

    seq.gptq_quantize, seq._hessians = timed_gptq, timed_hessians
    _sync(dev)
    t0 = time.perf_counter()
    complete, result = True, None
    gptq = {"block_size": 128, "percdamp": 0.01, "act_order": True, "hessian": run["hessian"],
            "column_loop": run["column_loop"]}
    try:
        result = calibrate_model(model, plan, batches, method="gptq", gptq=gptq, progress=False)
    except _OutOfTime:
        complete = False
    finally:
        seq.gptq_quantize, seq._hessians = orig_gptq, orig_hess
        for h in hooks:
            h.remove()
        graphs = sum(len(r.graphs) for r in gptq_columns._cache.values())
        broken = gptq_columns._graphs_broken
        gptq_columns.clear_graphs()
    _sync(dev)
    t_end = time.perf_counter()
    starts = [entered[i] for i in sorted(entered)]
    block_s = [b - a for a, b in itertools.pairwise(starts)] + ([t_end - starts[-1]] if complete and starts else [])
    nb = len(block_s)
    capture_s = (starts[0] - t0) if starts else 0.0
    solve_blk = [sum(x for b, _, x in solves if b == i) for i in range(nb)]
    later = block_s[1:]
    per_shape = defaultdict(list)
    for b, shape, sec in solves:
        if b >= 1 or nb == 1:
            per_shape[shape].append(sec)
    n = cfg.num_hidden_layers
    b0 = block_s[0] - check_s[0] if block_s else None
    mean_later = statistics.mean(later) if later else b0
    res = {
        **{k: run[k] for k in RUN_FIELDS},
        "complete": complete,
        "blocks_done": nb,
        "num_layers": n,
        "capture_s": round(capture_s, 2),
        "block_s": [round(x, 2) for x in block_s],
        "block0_checks_s": round(check_s[0], 2),
        "block0_without_checks_s": round(b0, 2) if b0 is not None else None,
        "block_mean_s": _mean(later),  # blocks >= 1
        "block_median_s": round(statistics.median(later), 3) if later else None,
        "hessian_s_per_block": [round(hess_s[i], 2) for i in range(nb)],
        "solve_s_per_block": [round(x, 2) for x in solve_blk],
        "hessian_mean_s": _mean([hess_s[i] for i in range(1, nb)]),
        "solve_mean_s": _mean(solve_blk[1:]),
        "gptq_solve_s_by_shape": {k: _mean(v) for k, v in sorted(per_shape.items())},
        "total_s": round(t_end - t0, 1) if complete else None,
        "total_without_checks_s": round(t_end - t0 - sum(check_s.values()), 1) if complete else None,
        "elapsed_s": round(t_end - t0, 1),
        "total_est_s": round(capture_s + b0 + (n - 1) * mean_later, 1) if block_s else None,
        "checks": checks,
        "column_loop_used": _loop_used(run["column_loop"], plan, dev),
        "cuda_graphs": graphs,
        "graphs_broken": broken,
        "hessian_native_ok": gptq_mod._NATIVE_OK,  # None: never tried (fp32 run), False: fell back to fp32
        "rel_error_mean": (round(statistics.mean(r.rel_error for r in result.layers), 5) if result else None),
        "peak_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None,
    }
    if run["check"] == "ref" and later:  # the old path's block, composed from this run's parts
        ref_solve0 = sum(c["other_s"] for c in checks if c["what"] == "ref")
        res["ref_solve_block0_s"] = round(ref_solve0, 2)
        res["old_block_est_s"] = round(mean_later - res["solve_mean_s"] + ref_solve0, 2)
    del model, batches, result
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def selftest(dev: torch.device) -> list[dict]:
    """Small layers, every fast loop against the reference loop on this device: NVFP4, MXFP4,
    INT4-g128, INT3-g128 (asymmetric), INT4-g128-sym; act-order on and off (the Triton loop
    serves act-order only: off, it falls back to the graph loop)."""
    from quarl.calibrate.gptq import gptq_quantize
    from quarl.quant import make_config

    g = torch.Generator().manual_seed(5)
    k = 1024
    x = torch.randn(4096, 64, generator=g) @ torch.randn(64, k, generator=g) + 0.1 * torch.randn(4096, k, generator=g)
    H = (2 * x.t() @ x / x.shape[0]).to(dev)  # correlated inputs, like LLM activations
    w = torch.randn(200, k, generator=g).to(dev)  # 200 rows: a partial row tile
    out = []
    for spec in ("nvfp4", "mxfp4", "int4-g128", "int3-g128", "int4-g128-sym"):
        cfg = make_config(spec)
        for act_order in (True, False):
            ref = gptq_quantize(w, H, cfg, act_order=act_order, column_loop="reference", pack=False)
            for loop in ("triton", "graph"):
                if loop == "triton" and not act_order:
                    continue
                try:
                    r = gptq_quantize(w, H, cfg, act_order=act_order, column_loop=loop, pack=False)
                    out.append({"spec": spec, "act_order": act_order, "loop": loop,
                                "equal_frac": float((r.q == ref.q).float().mean()),
                                "signbits_equal": bool(torch.equal(torch.signbit(r.q), torch.signbit(ref.q))),
                                "loss_equal": r.loss == ref.loss})
                except Exception as e:  # noqa: BLE001 -- report, keep going
                    out.append({"spec": spec, "act_order": act_order, "loop": loop, "error": f"{type(e).__name__}: {e}"})
    from quarl.calibrate.gptq_columns import clear_graphs

    clear_graphs()
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="format/column_loop/hessian/check/share,...")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds by which every run must stop")
    ap.add_argument("--out", default="runs/bench/gptq_gpu")
    args = ap.parse_args(argv)
    runs = parse_runs(args.runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    results = []
    t0 = time.perf_counter()
    try:
        checks = selftest(torch.device(args.device))
    except Exception as e:  # noqa: BLE001
        checks = [{"error": f"{type(e).__name__}: {e}"}]
    print(f"selftest ({time.perf_counter() - t0:.1f} s): " + "; ".join(
        f"{c.get('spec')} ao={c.get('act_order')} {c.get('loop')}: "
        + (c["error"][:100] if "error" in c else f"{c['equal_frac']:.6f} sign={c['signbits_equal']} loss={c['loss_equal']}")
        for c in checks), flush=True)
    (out / "gptq_gpu.json").write_text(json.dumps({"env": env, "args": vars(args), "selftest": checks,
                                                   "results": results}, indent=2) + "\n")
    for k, run in enumerate(runs):
        left = (args.deadline - time.time()) if args.deadline else float("inf")
        stop_at = time.time() + left * run["share"] / sum(r["share"] for r in runs[k:])
        t0 = time.perf_counter()
        try:
            res = run_one(run, args, stop_at)
        except Exception as e:  # noqa: BLE001 -- one run failing must not lose the others' numbers
            import traceback

            traceback.print_exc()
            res = {**{f: run[f] for f in RUN_FIELDS}, "error": f"{type(e).__name__}: {e}"}
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(json.dumps({k2: v for k2, v in res.items() if k2 != "checks"}), flush=True)
        (out / "gptq_gpu.json").write_text(
            json.dumps({"env": env, "args": vars(args), "selftest": checks, "results": results}, indent=2) + "\n"
        )
    print(
        f"\nGPTQ (calibrate_model, act-order, block 128), Qwen2.5-{args.shape} shape, calibration "
        f"{args.samples} x {args.seq_len} tokens, batch {args.batch}, {env['gpu'] or args.device}"
    )
    print("| format | loop (used) | hessian | blocks | block s mean (>=1) | hessian s | solve s | block 0 s (w/o checks) "
          "| total s | est. total s | old block est. s | peak GB |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['format']} | {r['column_loop']} | {r['hessian']} | error: {r['error'][:80]} |")
            continue
        print(f"| {r['format']} | {r['column_loop']} ({r['column_loop_used']}) | {r['hessian']} "
              f"| {r['blocks_done']}/{r['num_layers']} "
              f"| {r['block_mean_s']} | {r['hessian_mean_s']} | {r['solve_mean_s']} | {r['block0_without_checks_s']} "
              f"| {r['total_without_checks_s'] if r['complete'] else '-'} | {r['total_est_s']} "
              f"| {r.get('old_block_est_s', '-')} | {r['peak_gb']} |")
    print("\nchecks (block 0): what | shape | equal fraction | rel err new / other | other loop s")
    for r in results:
        for c in r.get("checks", []):
            if c["what"] == "hessian":
                print(f"  {r['format']} hessian {c['layer']}: max|dH|/max|H| {c['max_abs_diff_rel']:.2e}, "
                      f"fro {c['fro_rel']:.2e}")
            else:
                print(f"  {r['format']} {c['what']} {c['shape']}: {c['equal_frac']:.6f} | {c['rel_err']:.6f} / "
                      f"{c['rel_err_other']:.6f} | {c['other_s']}")
    return results


if __name__ == "__main__":
    main()
