"""What compaction (finished rows leave the batch) saves a rollout whose rows end at scattered lengths.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/rollout_compaction.py [--models 7b] [--variants
        nvfp4+lora,bf16+lora] [--batch 64] [--prompt 256] [--settings 2048:400,512:150] [--calls 2] [--out DIR]
    python benchmarks/rollout_compaction.py --models tiny --device cpu --settings 64:16    # CPU smoke test

``benchmarks/rollout.py`` times fixed-length rollouts (no stop token: every row runs ``new_tokens``), where
compaction never acts. An RL rollout's answers end at very different lengths, and without compaction the batch
decodes at full width until its longest answer ends. Here the random-weight model (``rollout.build_model``: its
next-token distribution is close to uniform) stops on a set of ``V / mean`` token ids, so each row's length is
roughly geometric with that mean, capped at ``T`` (``--settings T:mean``); the longest of 64 rows is ~4.7x the mean.

Per (model, variant, setting), ``FastGenerator(..., keep_cache=False)`` -- the RL trainer's default: the cache and
graphs are freed after every call, so each call re-captures the graphs it needs, a compacted call more of them --
runs ``--calls`` calls with compaction off, then on, the same sampling seed; reported is the last call of each
(its shapes captured before: no eager warm-ups): seconds, decode steps, generated tokens, tokens/s, compactions,
graph captures and their seconds, and the rows' lengths. Writes ``compaction.json`` and ``compaction.md``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import time
from pathlib import Path

import rollout
import torch

from quarl.engine import FastGenerator
from quarl.engine.rollout import SamplingParams


def one_setting(model, batch: int, prompt: int, T: int, mean: int, calls: int, seed: int) -> list[dict]:
    vocab = model.config.vocab_size
    stop = list(range(1, 1 + max(1, vocab // mean)))  # PAD is 0
    rows = rollout._prompts(batch, prompt, vocab)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=T, stop_token_ids=stop)
    out = []
    for compact in (False, True):
        eng = FastGenerator(model, rollout.PAD, kv_block=256, sync_every=16, keep_cache=False, compact=compact)
        for _ in range(calls):
            gen = torch.Generator(rollout.DEVICE).manual_seed(seed)
            roll, secs = rollout._sync_time(lambda e=eng, g=gen: e.generate(rows, params, 1, g))
        st = eng.last_stats
        lengths = roll.lengths.tolist()
        out.append({
            "T": T, "mean_target": mean, "seed": seed, "compact": compact, "seconds": secs, "steps": st["steps"],
            "generated_tokens": st["generated_tokens"], "tok_s": st["generated_tokens"] / secs,
            "compactions": st.get("compactions", 0), "graph_captures": st.get("graph_captures", 0),
            "capture_s": st.get("capture_s", 0.0), "warmup_s": st.get("warmup_s", 0.0),
            "len_mean": statistics.mean(lengths), "len_p50": statistics.median(lengths), "len_max": max(lengths),
            "truncated": int(roll.truncated.sum()),
        })
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out[-1].items()}), flush=True)
        del roll, eng
        gc.collect()
    return out


def _totals(runs: list[dict]) -> dict:
    keys = ("seconds", "generated_tokens", "steps", "graph_captures", "compactions", "capture_s")
    return {k: sum(r[k] for r in runs) for k in keys}


def _cell(t: dict) -> str:
    return f"{t['seconds']:.2f}, {t['generated_tokens']}, {t['generated_tokens'] / t['seconds']:.0f}"


def render(res: dict) -> str:
    lines = [f"# compaction: rollouts with scattered lengths ({res['env'].get('gpu')}, {res['date']})", "",
             (f"batch {res['args']['batch']}, {res['args']['prompt']}-token prompts, keep_cache=False (graphs "
              "re-captured every call), the last of each arm's calls, summed over the sampling seeds (the two arms "
              "sample the same tokens only up to the kernels' rounding at other batch sizes, so their lengths "
              "differ: tok/s is the fair figure)"), "",
             ("| model | variant | T | seeds | off: s, tokens, tok/s (steps, captures) | on: s, tokens, tok/s (steps, "
              "compactions, captures, capture s) | x tok/s |"), "|---|---|---:|---:|---|---|---:|"]
    for c in res["cells"]:
        off, on = c["off"], c["on"]
        t_off, t_on = _totals(off), _totals(on)
        x = (t_on["generated_tokens"] / t_on["seconds"]) / (t_off["generated_tokens"] / t_off["seconds"])
        lines.append(
            f"| {c['model']} | {c['variant']} | {off[0]['T']} | {len(off)} | {_cell(t_off)} ({t_off['steps']}, "
            f"{t_off['graph_captures']}) | {_cell(t_on)} ({t_on['steps']}, {t_on['compactions']}, "
            f"{t_on['graph_captures']}, {t_on['capture_s']:.2f}) | **{x:.2f}x** |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="7b")
    ap.add_argument("--variants", default="nvfp4+lora,bf16+lora")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--settings", default="2048:400,512:150", help="T:mean,... (max new tokens : target mean length)")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--seeds", default="0", help="sampling seeds, each run off and on")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="benchmarks/runs/compaction")
    a = ap.parse_args(argv)
    rollout.DEVICE = a.device
    from quarl.quant import quantize_model

    res = {"env": rollout.environment(), "args": vars(a), "date": datetime.datetime.now(datetime.UTC).isoformat(),
           "cells": []}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = [tuple(int(v) for v in s.split(":")) for s in a.settings.split(",")]
    for mname in a.models.split(","):
        for variant in a.variants.split(","):
            t = time.perf_counter()
            model = rollout.build_model(rollout.qwen25_config(mname))
            if rollout.RECIPES[variant] is not None:
                quantize_model(model, rollout.RECIPES[variant])
            print(f"== {mname} {variant} built in {time.perf_counter() - t:.1f} s", flush=True)
            for T, mean in settings:
                runs = [one_setting(model, a.batch, a.prompt, T, mean, a.calls, int(sd)) for sd in a.seeds.split(",")]
                res["cells"].append({"model": mname, "variant": variant, "off": [r[0] for r in runs],
                                     "on": [r[1] for r in runs]})
                (out / "compaction.json").write_text(json.dumps(res, indent=1, default=str))
            del model
            gc.collect()
            if a.device == "cuda":
                torch.cuda.empty_cache()
    md = render(res)
    (out / "compaction.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
