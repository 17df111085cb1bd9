"""What compaction (finished rows leave the batch) saves a rollout whose rows end at scattered lengths.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/rollout_compaction.py [--models 7b] [--variants
        nvfp4+lora,bf16+lora] [--batch 64] [--prompt 256] [--settings 2048:400,512:150] [--calls 2] [--out DIR]
    python benchmarks/rollout_compaction.py --models tiny --device cpu --settings 64:16    # CPU smoke test

``benchmarks/rollout.py`` times fixed-length rollouts (no stop token: every row runs ``new_tokens``), where
compaction never acts. An RL rollout's answers end at very different lengths, and without compaction the batch
decodes at full width until its longest answer ends. Here each row's answer length is drawn in advance --
``ceil(mean * Exp(1))`` capped at ``T`` (``--settings T:mean``; the longest of 64 rows ~4.7x the mean) -- and the
sampler is wrapped to emit the stop token at that step (``FixedLengths``): both arms then decode the same rows for
the same steps, which free-running answers would not (compaction changes the batch the kernels see, so the logits
round differently and the answers diverge: phases d and e of ``gpu_session20.sh``).

Per (model, variant, setting), ``FastGenerator(..., keep_cache=False)`` -- the RL trainer's default: the cache and
graphs are freed after every call, so each call re-captures the graphs it needs, a compacted call more of them --
runs ``--calls`` calls with compaction off, then on, per seed (``--seeds``: the lengths' and the sampler's); reported
is the last call of each (its shapes captured before: no eager warm-ups): seconds, decode steps, generated tokens,
compactions, graph captures and their seconds, and the rows' lengths. Writes ``compaction.json`` and ``compaction.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics

import rollout
import torch

from quarl.engine import FastGenerator, sampling
from quarl.engine import generator as engine_generator
from quarl.engine.rollout import SamplingParams


class FixedLengths:
    """The engine's sampler with each row's answer length fixed in advance: the sampled token is replaced by
    ``stop`` at the row's length (and a sampled ``stop`` before it by ``stop + 1``). Compaction changes the batch
    the kernels see, so the two arms' logits round differently and free-running answers would end at different
    steps (phases d, e of gpu_session20.sh); with the lengths fixed both arms decode the same rows for the same
    number of steps, and their seconds compare directly. Everything else -- the kernels, the sampling, the stop
    test, the compaction -- is the engine's own."""

    def __init__(self, lengths: torch.Tensor, stop: int):
        self.lengths, self.stop, self.t = lengths, stop, 0  # [N] on the device; t: the step about to be sampled

    def __call__(self, logits, temperature, top_p, generator=None, *, rows_of=None, all_rows=None):
        tok, lp = sampling.sample(logits, temperature, top_p, generator, rows_of=rows_of, all_rows=all_rows)
        ends = self.lengths if rows_of is None else self.lengths[rows_of]  # [n]
        tok = torch.where(tok == self.stop, tok + 1, tok)
        tok = torch.where(ends == self.t + 1, torch.full_like(tok, self.stop), tok)
        self.t += 1
        return tok, lp


def lengths_for(batch: int, T: int, mean: int, seed: int) -> torch.Tensor:
    """Geometric-like answer lengths: ceil(mean * Exp(1)), clamped to [1, T] (the longest of 64 ~4.7x the mean)."""
    g = torch.Generator().manual_seed(1000 + seed)
    e = -torch.log(torch.rand(batch, generator=g).clamp_min(1e-12))
    return (e * mean).ceil().clamp(1, T).long().to(rollout.DEVICE)


def one_setting(model, batch: int, prompt: int, T: int, mean: int, calls: int, seed: int) -> list[dict]:
    vocab = model.config.vocab_size
    stop = vocab - 2
    rows = rollout._prompts(batch, prompt, vocab)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=T, stop_token_ids=[stop])
    fixed = FixedLengths(lengths_for(batch, T, mean, seed), stop)
    engine_generator.sample = fixed  # the engine samples through the wrapper (restored below)
    try:
        return [_arm(model, rows, params, fixed, compact, calls, seed, mean) for compact in (False, True)]
    finally:
        engine_generator.sample = sampling.sample


def _arm(model, rows, params, fixed: FixedLengths, compact: bool, calls: int, seed: int, mean: int) -> dict:
    """``calls`` calls of one arm (compaction off or on); the last one's figures."""
    eng = FastGenerator(model, rollout.PAD, kv_block=256, sync_every=16, keep_cache=False, compact=compact)
    for _ in range(calls):
        gen = torch.Generator(rollout.DEVICE).manual_seed(seed)
        fixed.t = 0
        roll, secs = rollout._sync_time(lambda g=gen, e=eng: e.generate(rows, params, 1, g))
    st = eng.last_stats
    lengths = roll.lengths.tolist()
    if lengths != fixed.lengths.tolist():
        raise RuntimeError("the rows did not end at their fixed lengths: the bench's sampler wrapper was bypassed")
    out = {
        "T": params.max_new_tokens, "mean_target": mean, "seed": seed, "compact": compact, "seconds": secs,
        "steps": st["steps"], "generated_tokens": st["generated_tokens"], "tok_s": st["generated_tokens"] / secs,
        "compactions": st.get("compactions", 0), "graph_captures": st.get("graph_captures", 0),
        "capture_s": st.get("capture_s", 0.0), "warmup_s": st.get("warmup_s", 0.0),
        "len_mean": statistics.mean(lengths), "len_p50": statistics.median(lengths), "len_max": max(lengths),
    }
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}), flush=True)
    del roll, eng
    gc.collect()
    return out


def _totals(runs: list[dict]) -> dict:
    keys = ("seconds", "generated_tokens", "steps", "graph_captures", "compactions", "capture_s")
    return {k: sum(r[k] for r in runs) for k in keys}


def _mean(runs: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in runs)


def render(res: dict) -> str:
    lines = [f"# compaction: rollouts with scattered lengths ({res['env'].get('gpu')}, {res['date']})", "",
             (f"batch {res['args']['batch']}, {res['args']['prompt']}-token prompts, keep_cache=False (graphs "
              "re-captured every call), the last of each arm's calls, summed over the seeds; each row's answer "
              "length fixed per seed (FixedLengths: the same in both arms); x = seconds off / seconds on"), "",
             ("| model | variant | T | seeds | lengths mean / p50 / max | off: s (captures) | on: s (compactions, "
              "captures, capture s) | x |"), "|---|---|---:|---:|---|---|---|---:|"]
    for c in res["cells"]:
        off, on = c["off"], c["on"]
        t_off, t_on = _totals(off), _totals(on)
        lens = f"{_mean(off, 'len_mean'):.0f} / {_mean(off, 'len_p50'):.0f} / {max(r['len_max'] for r in off)}"
        lines.append(
            f"| {c['model']} | {c['variant']} | {off[0]['T']} | {len(off)} | {lens} | {t_off['seconds']:.2f} "
            f"({t_off['graph_captures']}) | {t_on['seconds']:.2f} ({t_on['compactions']}, {t_on['graph_captures']}, "
            f"{t_on['capture_s']:.2f}) | **{t_off['seconds'] / t_on['seconds']:.2f}x** |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rollout.add_variant_args(ap, "benchmarks/runs/compaction")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--settings", default="2048:400,512:150", help="T:mean,... (max new tokens : target mean length)")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--seeds", default="0", help="sampling seeds, each run off and on")
    a = ap.parse_args(argv)
    settings = [tuple(int(v) for v in s.split(":")) for s in a.settings.split(",")]

    def cells(model):
        for T, mean in settings:
            runs = [one_setting(model, a.batch, a.prompt, T, mean, a.calls, int(sd)) for sd in a.seeds.split(",")]
            yield {"off": [r[0] for r in runs], "on": [r[1] for r in runs]}

    rollout.run_variants(a, "compaction", cells, render)


if __name__ == "__main__":
    main()
