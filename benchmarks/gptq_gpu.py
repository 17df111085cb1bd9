"""GPTQ wall time on a GPU for a Qwen2.5-7B-shaped model: NVFP4 and INT4-g128 through ``calibrate_model``.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/gptq_gpu.py --out $OUT [--deadline EPOCH_S]
    .venv/bin/python benchmarks/gptq_gpu.py --shape tiny --device cpu --samples 4 --seq-len 64   # smoke test

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

Per-block time: a forward pre-hook on each decoder block notes (after a device
synchronize) when the block is first entered; block ``i`` costs the time from
its first entry to block ``i+1``'s -- its Hessian pass, the GPTQ solves of its
7 linears and the forward of the quantized block that makes the next block's
inputs. ``capture`` is the embedding pass before block 0. Each GPTQ solve
(``gptq_quantize``, wrapped with synchronizes) is timed too, so a block's time
splits into solves vs. the rest (Hessian pass and forwards); these two fields
were added after the 2026-11-21 H100 run, whose JSON lacks them.

Budget: the same hook stops a format's run (by raising) when entering another
block would pass that format's share of ``--deadline``; the result then says
how many blocks were done, and ``total_28_est_s`` extrapolates
``capture + num_layers x mean(block)`` -- labelled as an estimate. Each format
gets a fresh model (calibration quantizes in place).
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


def names_in_block(block, plan: dict, seq) -> list[str]:
    """The linears of one decoder block that the plan quantizes (GPTQ solves per block)."""
    prefix = next(n for n in plan if ".layers.0." in n).split(".layers.0.")[0] + ".layers.0"
    return [n for n, c in seq._linear_names(block, prefix, plan).items() if plan[c] is not None]


def run_format(fmt: str, args, stop_at: float) -> dict:
    import quarl.calibrate.sequential as seq
    from quarl.calibrate.sequential import calibrate_model, decoder_blocks
    from quarl.quant.model import QuantRecipe, plan_formats

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    cfg = qwen25_config(args.shape)
    model = build_model(cfg, str(dev), dtype)
    plan = plan_formats(model, QuantRecipe.load({"default": fmt}))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(16, cfg.vocab_size, (args.samples, args.seq_len), generator=g)  # [S, T]
    batches = [ids[i : i + args.batch] for i in range(0, args.samples, args.batch)]
    n_batches = len(batches)
    _, blocks = decoder_blocks(model)
    per_block = len(names_in_block(blocks[0], plan, seq))  # before calibration replaces the linears
    entered: dict[int, float] = {}
    calls: dict[int, int] = defaultdict(int)

    def pre_hook(i):
        def hook(_mod, _args, _kwargs):
            calls[i] += 1
            # block 0 is also entered once per batch by capture_block_inputs (whose own hook stops the
            # forward there): the calibration loop's first entry is call len(batches) + 1
            if i in entered or (i == 0 and calls[i] <= n_batches):
                return
            _sync(dev)
            now = time.perf_counter()
            entered[i] = now  # also when stopping: it is the end of block i - 1
            if i > 0 and time.time() > stop_at:
                raise _OutOfTime
            return

        return hook

    hooks = [b.register_forward_pre_hook(pre_hook(i), with_kwargs=True) for i, b in enumerate(blocks)]
    solves: list[tuple[str, float]] = []  # ("NxK", seconds) per GPTQ solve, in order (kept if the run stops)
    original = seq.gptq_quantize

    def timed_gptq(w, H, cfg, **kw):  # the loop calls seq.gptq_quantize by name: time each solve
        _sync(dev)
        t = time.perf_counter()
        out = original(w, H, cfg, **kw)
        _sync(dev)
        solves.append((f"{w.shape[0]}x{w.shape[1]}", time.perf_counter() - t))
        return out

    seq.gptq_quantize = timed_gptq
    _sync(dev)
    t0 = time.perf_counter()
    complete, result = True, None
    try:
        result = calibrate_model(
            model,
            plan,
            batches,
            method="gptq",
            gptq={"block_size": 128, "percdamp": 0.01, "act_order": True},
            progress=False,
        )
    except _OutOfTime:
        complete = False
    finally:
        seq.gptq_quantize = original
        for h in hooks:
            h.remove()
    _sync(dev)
    t_end = time.perf_counter()
    starts = [entered[i] for i in sorted(entered)]
    block_s = [b - a for a, b in itertools.pairwise(starts)] + ([t_end - starts[-1]] if complete and starts else [])
    capture_s = (starts[0] - t0) if starts else None
    per_shape = defaultdict(list)
    for shape, sec in solves:
        per_shape[shape].append(sec)
    solve_per_block = [sum(x for _, x in solves[i * per_block : (i + 1) * per_block]) for i in range(len(block_s))]
    n = cfg.num_hidden_layers
    res = {
        "format": fmt,
        "complete": complete,
        "blocks_done": len(block_s),
        "num_layers": n,
        "capture_s": round(capture_s, 2) if capture_s is not None else None,
        "block_s": [round(x, 2) for x in block_s],
        "block_mean_s": round(statistics.mean(block_s), 2) if block_s else None,
        "block_median_s": round(statistics.median(block_s), 2) if block_s else None,
        "total_s": round(t_end - t0, 1) if complete else None,
        "elapsed_s": round(t_end - t0, 1),
        "total_est_s": round((capture_s or 0) + n * statistics.mean(block_s), 1) if block_s else None,
        # GPTQ solves alone (gptq_quantize, synchronized), per weight shape [N x K] and per block;
        # the rest of a block's time is its Hessian pass and forwards
        "gptq_solve_s_by_shape": {k: round(statistics.mean(v), 3) for k, v in sorted(per_shape.items())},
        "gptq_solve_s_per_block": [round(x, 2) for x in solve_per_block],
        "rel_error_mean": (round(statistics.mean(r.rel_error for r in result.layers), 5) if result else None),
        "peak_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None,
    }
    del model, batches, result
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    ap.add_argument("--formats", default="nvfp4,int4-g128")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds by which every format must stop")
    ap.add_argument("--out", default="runs/bench/gptq_gpu")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    fmts = [f for f in args.formats.split(",") if f]
    results = []
    for k, fmt in enumerate(fmts):
        left = (args.deadline - time.time()) if args.deadline else float("inf")
        stop_at = time.time() + left / (len(fmts) - k)  # an equal share of what is left
        t0 = time.perf_counter()
        try:
            res = run_format(fmt, args, stop_at)
        except Exception as e:  # noqa: BLE001 -- one format failing must not lose the other's numbers
            import traceback

            traceback.print_exc()
            res = {"format": fmt, "error": f"{type(e).__name__}: {e}"}
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
        (out / "gptq_gpu.json").write_text(
            json.dumps({"env": env, "args": vars(args), "results": results}, indent=2) + "\n"
        )
    print(
        f"GPTQ (calibrate_model, act-order, block 128), Qwen2.5-{args.shape} shape, BF16, calibration "
        f"{args.samples} x {args.seq_len} tokens, batch {args.batch}"
    )
    print(
        "| format | blocks done | capture s | block s mean / median | total s | est. total s (all layers) | peak GB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['format']} | error: {r['error'][:80]} |")
            continue
        print(
            f"| {r['format']} | {r['blocks_done']}/{r['num_layers']} | {r['capture_s']} | {r['block_mean_s']} / "
            f"{r['block_median_s']} | {r['total_s'] if r['complete'] else '-'} | {r['total_est_s']} | {r['peak_gb']} |"
        )
    return results


if __name__ == "__main__":
    main()
