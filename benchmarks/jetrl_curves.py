"""Reward curves of Jet-RL's three precision flows, same seed: the RESULTS.md table from a run's JSON.

    python benchmarks/jetrl_curves.py OUT/jetrl_curves.json                    # print the table
    python benchmarks/jetrl_curves.py OUT/jetrl_curves.json --results benchmarks/RESULTS.md

The run itself is ``benchmarks/rl_learning.py --policies bf16,fp8-rollout,jetrl`` (the learning
benchmark's settings; ``benchmarks/jetrl_curves_gpu.sh`` runs it on one GPU in ~200 s and calls
this). The JSON holds every per-step curve and, where the evals finished, the held-out accuracy of
each adapter against its own base (``compare_runs``: paired on the same problems).

The table: steps done and seconds per step (rollout / log-prob / update); train reward over the
first and last 10 steps and at equal steps (the modes run at different speeds under one time
budget, so only equal-step windows compare learning); the rollout/trainer mismatch (mean
|log p_train - log p_rollout|, KL(rollout || train) k3) over the run; held-out accuracy. With
``--results`` the block between ``<!-- jetrl-curves:begin -->`` and ``<!-- jetrl-curves:end -->`` in
that file is replaced (nothing else is touched).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

BEGIN, END = "<!-- jetrl-curves:begin -->", "<!-- jetrl-curves:end -->"


def _vals(curves: dict, key: str) -> list[float]:
    return [float(x) for x in curves.get(key) or [] if x is not None and not math.isnan(float(x))]


def _mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else float("nan")


def render(res: dict, window: int = 10) -> str:
    s = res.get("settings", {})
    pols = [e for e in res.get("policies", []) if e.get("curves")]
    L = [(f"- **Date / GPU**: {res.get('date', '?')}, {res.get('gpu', '?')}, torch {res.get('torch', '?')}; "
         f"wall {res.get('wall_s', float('nan')):.0f} s for the three runs side by side."),
         (f"- **Settings** (all modes): model `{s.get('model', 'default')}`, data `{s.get('data', '?')}`, GRPO, "
         f"{s.get('prompts_per_step')} prompts x {s.get('group_size')} answers, {s.get('max_new_tokens')} new tokens, "
         f"LoRA r {s.get('lora_r')}, lr {s.get('lr')}, seed {s.get('seed')}, train.max_time_s {s.get('train_seconds')}, "
         f"held-out eval {s.get('eval_problems')} problems greedy. Only `precision.mode` differs."),
         f"- **Command**: `{res.get('command', '?')}`", ""]
    n = min((len(_vals(e["curves"], "reward/mean")) for e in pols), default=0)
    head = ("| mode | steps | step s (rollout / logprob / update) | reward, first 10 -> last 10 steps | "
            f"reward, steps 0-{n - 1} (all modes) | mean abs dlogp | KL(rollout ‖ train) | base acc % | "
            "trained acc % | delta (pts) +- s.e. |")
    L += [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in pols:
        c = e["curves"]
        r = _vals(c, "reward/mean")
        ts = [_mean(_vals(c, k)) for k in ("time/step_s", "time/rollout_s", "time/logprob_s", "time/update_s")]
        eq = _mean(r[:n]) if n else float("nan")
        acc = ("| - | - | - |" if "trained_accuracy" not in e else
               f"| {100 * e['base_accuracy']:.1f} | {100 * e['trained_accuracy']:.1f} | "
               f"{100 * e['delta']:+.1f} +- {100 * (e.get('paired_se') or 0):.1f} |")
        L.append(f"| {e['policy']} | {len(r)} | {ts[0]:.2f} ({ts[1]:.2f} / {ts[2]:.2f} / {ts[3]:.2f}) | "
                 f"{_mean(r[:window]):.3f} -> {_mean(r[-window:]):.3f} | {eq:.3f} | "
                 f"{_mean(_vals(c, 'mismatch/abs_logprob_diff')):.2e} | {_mean(_vals(c, 'mismatch/kl')):.2e} " + acc)
    if n:
        edges = sorted({min(n, k) for k in (window, n // 2, n)} - {0})
        L += ["", f"Train reward at equal steps (mean over {window}-step windows ending at the step shown):", "",
              "| mode | " + " | ".join(f"steps {max(0, k - window)}-{k - 1}" for k in edges) + " |",
              "|---|" + "---:|" * len(edges)]
        for e in pols:
            r = _vals(e["curves"], "reward/mean")
            L.append(f"| {e['policy']} | " + " | ".join(f"{_mean(r[max(0, k - window):k]):.3f}" for k in edges) + " |")
    missing = [e["policy"] for e in res.get("policies", []) if not e.get("curves")]
    if missing:
        L += ["", f"No curve for: {', '.join(missing)} (the run ended before their first step was logged)."]
    return "\n".join(L)


def write_block(path: Path, md: str) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to replace; add the two markers where the table goes")
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    path.write_text(pat.sub(lambda _: f"{BEGIN}\n{md}\n{END}", text, count=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="the run's jetrl_curves.json (benchmarks/rl_learning.py --name jetrl_curves)")
    ap.add_argument("--results", default="", help="replace the marked block in this file (benchmarks/RESULTS.md)")
    ap.add_argument("--out", default="", help="also write the table here (.md)")
    args = ap.parse_args(argv)
    md = render(json.loads(Path(args.json).read_text()))
    if args.out:
        Path(args.out).write_text(md + "\n")
    if args.results:
        write_block(Path(args.results), md)
    print(md)


if __name__ == "__main__":
    main()
