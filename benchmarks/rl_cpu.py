"""QeRL on a CPU, side by side: NVFP4+LoRA+AQN vs NVFP4+LoRA vs BF16-LoRA on SmolLM2-135M-Instruct.

    .venv/bin/python -m benchmarks.rl_cpu --work runs/bench/rl_cpu --steps 12 --eval-problems 50

What it does, in order (each step skips work whose artifact is already complete,
so an interrupted run continues where it stopped):

1. data-prep: the built-in generator, 2000 problems of difficulty 1 only (a
   135M model solves some of them, so GRPO groups have reward spread), rendered
   with the model's chat template and QeRL's instruction; 5% held out.
2. three RL runs of ``quarl/recipes/rl/smollm2-cpu.yaml`` with the *same* seed,
   data order and settings, differing only in the policy:
       nvfp4-aqn   policy.format=nvfp4, AQN on (QeRL)
       nvfp4       policy.format=nvfp4, aqn.enabled=false
       bf16        policy.format=bf16 (frozen high-precision base + LoRA), AQN off
   AQN's ``num_stages`` is scaled to the run (4 stages for 12 steps: 3 clean
   steps, then sigma 1e-2 -> 5e-4 over the remaining 9).
3. evaluation on the first ``--eval-problems`` problems of the dataset's
   held-out split, greedy, the training budget of new tokens, the prompt the
   dataset stored: the two untrained bases (RTN NVFP4, full precision) and the
   three trained adapters on their own base; paired comparisons after-vs-before.
4. ``benchmarks/results/rl_cpu.{json,md}`` and ``rl_cpu_curves.svg``: per-step
   reward/accuracy of each run, eval accuracy before/after, wall times.

Runs one after another in one process (2 shared cores: parallel runs would only
slow each other). Everything is seeded; the CPU numbers are deterministic up to
floating-point reduction order.

What this is: a smoke-scale measurement of the real algorithm -- 12 steps x 8
answers on a 135M model are far too few to separate the three policies; read the
curves as "the machinery runs and what the noise level is", not as a result
about QeRL.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "quarl/recipes/rl/smollm2-cpu.yaml"
RESULTS = ROOT / "benchmarks/results"

VARIANTS = {  # name -> RL overrides on top of the recipe
    "nvfp4-aqn": ["policy.format=nvfp4", "aqn.enabled=true"],
    "nvfp4": ["policy.format=nvfp4", "aqn.enabled=false"],
    "bf16": ["policy.format=bf16", "aqn.enabled=false"],
}
BASE_QUANT = {"nvfp4-aqn": "nvfp4", "nvfp4": "nvfp4", "bf16": None}  # eval base for each adapter
COLORS = {"nvfp4-aqn": "#d62728", "nvfp4": "#1f77b4", "bf16": "#2ca02c"}

log = logging.getLogger("rl_cpu")


def _complete(uri: Path) -> bool:
    m = uri / "manifest.json"
    return m.is_file() and json.loads(m.read_text()).get("complete") is True


def prepare_data(work: Path, max_difficulty: int) -> Path:
    from quarl.config import load_config
    from quarl.data.config import DataPrepConfig
    from quarl.data.stage import run_data_prep

    out = work / "data"
    if _complete(out):
        return out
    cfg = load_config(DataPrepConfig, ROOT / "quarl/recipes/data/default.yaml", [
        f"sources=[{{name: synthetic, num_samples: 2000, max_difficulty: {max_difficulty}}}]",
        "template=chat", "tokenizer=default"])  # fmt: skip
    run_data_prep(cfg, output_uri=str(out))
    return out


def rl_overrides(name: str, steps: int, aqn_stages: int, threads: int, rollout_tokens: int) -> list[str]:
    return [
        *VARIANTS[name],
        f"train.steps={steps}",
        f"aqn.num_stages={aqn_stages}",
        f"train.threads={threads}",
        f"rollout.max_new_tokens={rollout_tokens}",
        "train.sample_every=1",
    ]


def train(work: Path, data: Path, name: str, args) -> tuple[Path, float | None]:
    from quarl.config import load_config
    from quarl.rl import RLConfig, run_rl

    out = work / "rl" / name
    if _complete(out):
        return out, None
    cfg = load_config(
        RLConfig, RECIPE, rl_overrides(name, args.steps, args.aqn_stages, args.threads, args.max_new_tokens)
    )
    t0 = time.time()
    run_rl(cfg, model_uri="default", data_uri=str(data), output_uri=str(out))
    return out, time.time() - t0


def eval_overrides(n_problems: int, max_new_tokens: int, quant: str | None) -> list[str]:
    return [
        f"benchmarks=[{{name: heldout, source: dataset, template: dataset, max_problems: {n_problems}}}]",
        "sampling.greedy=true",
        f"sampling.max_new_tokens={max_new_tokens}",
        "sampling.batch_size=25",
        "sampling.cache=dynamic",
        "dtype=float32",
        "cpu_threads=1",
        f"quant={quant or 'null'}",
    ]


def evaluate(
    work: Path, data: Path, label: str, quant: str | None, adapter: Path | None, n_problems: int, max_new_tokens: int
) -> tuple[Path, float | None]:
    from quarl.config import load_config
    from quarl.eval import EvalConfig, run_eval

    out = work / "eval" / label
    if _complete(out):
        return out, None
    cfg = load_config(EvalConfig, None, eval_overrides(n_problems, max_new_tokens, quant))
    # heldout binds to the dataset artifact's eval split (data_uris name=URI)
    t0 = time.time()
    run_eval(
        cfg,
        model_uri="default",
        data_uris={"heldout": str(data)},
        adapter_uri=str(adapter) if adapter else None,
        output_uri=str(out),
        progress=False,
    )
    return out, time.time() - t0


# --------------------------------------------------------------------------- report
def _metric_rows(run: Path) -> list[dict]:
    from quarl.train.metrics import read_metrics

    return read_metrics(run / "metrics.jsonl")


def svg_curves(series: dict[str, list[tuple[int, float]]], title: str, ylabel: str, width=520, height=260) -> str:
    """Several named (step, value) lines on one axis, with a legend. Plain SVG, no dependencies."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40"><text y="20">{title}: no data</text></svg>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(1.0, max(p[1] for p in pts))
    L, R, T, B = 48, 130, 26, 34

    def px(x):
        return L + (x - x0) / max(x1 - x0, 1) * (width - L - R)

    def py(y):
        return height - B - (y - y0) / max(y1 - y0, 1e-9) * (height - T - B)

    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11">'
        ),
        f'<text x="{L}" y="16" font-size="13">{title}</text>',
        f'<line x1="{L}" y1="{py(y0)}" x2="{width - R}" y2="{py(y0)}" stroke="#888"/>',
        f'<line x1="{L}" y1="{py(y0)}" x2="{L}" y2="{py(y1)}" stroke="#888"/>',
    ]
    for v in (y0, (y0 + y1) / 2, y1):
        out.append(f'<text x="{L - 6}" y="{py(v) + 4}" text-anchor="end">{v:.2f}</text>')
    for x in sorted({x0, (x0 + x1) // 2, x1}):
        out.append(f'<text x="{px(x)}" y="{height - B + 14}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{(L + width - R) / 2}" y="{height - 4}" text-anchor="middle">step</text>')
    out.append(
        f'<text x="12" y="{(T + height - B) / 2}" transform="rotate(-90 12 {(T + height - B) / 2})" '
        f'text-anchor="middle">{ylabel}</text>'
    )
    for i, (name, s) in enumerate(series.items()):
        c = COLORS.get(name, "#555")
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{path}"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{c}"/>' for x, y in s]
        ly = T + 14 + 16 * i
        out.append(
            f'<line x1="{width - R + 10}" y1="{ly - 4}" x2="{width - R + 28}" y2="{ly - 4}" stroke="{c}" '
            f'stroke-width="2"/><text x="{width - R + 32}" y="{ly}">{name}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def ascii_curve(vals: list[float], lo=0.0, hi=1.0) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    return "".join(bars[min(8, max(0, round((v - lo) / (hi - lo) * 8)))] for v in vals)


def build_report(work: Path, runs: dict[str, Path], evals: dict[str, Path], timings: dict, args) -> dict:
    from quarl.eval import compare_runs

    curves = {n: _metric_rows(p) for n, p in runs.items()}
    ev = {}
    for label, p in evals.items():
        m = json.loads((p / "metrics.json").read_text())["benchmarks"]["heldout"]
        ev[label] = {
            "accuracy": m["accuracy"],
            "accuracy_stderr": m["accuracy_stderr"],
            "problems": m["problems"],
            "format_rate": m["format_rate"],
            "truncation_rate": m.get("truncation_rate"),
            "mean_tokens": m["response_tokens"]["mean"],
        }
    paired = {}
    for n in runs:
        before = "base-nvfp4" if BASE_QUANT[n] else "base-bf16"
        rows = compare_runs([str(evals[before]), str(evals[n])])
        r = rows[-1]
        paired[n] = {
            "vs": before,
            "delta": r.get("delta"),
            "delta_stderr": r.get("delta_stderr"),
            "gained": r.get("gained"),
            "lost": r.get("lost"),
            "same_answer": r.get("same_answer"),
        }
    keys = [
        "reward/mean",
        "reward/accuracy",
        "reward/format",
        "aqn/sigma",
        "policy/entropy",
        "grad_norm",
        "response/length_mean",
        "response/truncated_fraction",
        "mismatch/abs_logprob_diff",
        "time/step_s",
    ]
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs, torch threads {args.threads}",
        "torch": torch.__version__,
        "command": "python -m benchmarks.rl_cpu "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("report_only", "results")
        ),
        "settings": {
            "recipe": str(RECIPE.relative_to(ROOT)),
            "steps": args.steps,
            "aqn_num_stages": args.aqn_stages,
            "max_difficulty": args.max_difficulty,
            "eval_problems": args.eval_problems,
            "eval": f"greedy, float32, dataset prompt, max_new_tokens={args.max_new_tokens}",
            "rl_overrides": {
                n: rl_overrides(n, args.steps, args.aqn_stages, args.threads, args.max_new_tokens) for n in runs
            },
        },
        "timings_s": timings,
        "curves": {n: [{k: r.get(k) for k in ["step", *keys]} for r in rows] for n, rows in curves.items()},
        "eval": ev,
        "paired": paired,
    }
    res_dir = Path(args.results)
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "rl_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    svg = "".join(
        [
            svg_curves(
                {n: [(r["step"], r["reward/mean"]) for r in rows] for n, rows in curves.items()},
                "train reward (accuracy + 0.2 format), mean of 8 answers",
                "reward",
            ),
            svg_curves(
                {n: [(r["step"], r["reward/accuracy"]) for r in rows] for n, rows in curves.items()},
                "train accuracy, mean of 8 answers",
                "accuracy",
            ),
        ]
    )
    (res_dir / "rl_cpu_curves.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="1040" height="260">'
        + svg.replace('<svg xmlns="http://www.w3.org/2000/svg" width="520"', '<svg x="0" width="520"', 1).replace(
            '<svg xmlns="http://www.w3.org/2000/svg" width="520"', '<svg x="520" width="520"', 1
        )
        + "</svg>\n"
    )
    (res_dir / "rl_cpu.md").write_text(markdown(result) + "\n")
    return result


def _pct(v, se=None):
    return "-" if v is None else (f"{100 * v:.1f}" + (f" ± {100 * se:.1f}" if se is not None else ""))


def markdown(res: dict) -> str:
    cur, ev, pr = res["curves"], res["eval"], res["paired"]
    lines = [
        "| step | " + " | ".join(f"{n} reward | {n} acc" for n in cur) + " | sigma (aqn) |",
        "|---:|" + "---:|---:|" * len(cur) + "---:|",
    ]
    steps = max(len(v) for v in cur.values())
    for i in range(steps):
        cells = []
        for rows in cur.values():
            r = rows[i] if i < len(rows) else {}
            cells += [f"{r.get('reward/mean', float('nan')):.3f}", f"{r.get('reward/accuracy', float('nan')):.3f}"]
        sig = (cur.get("nvfp4-aqn") or [{}] * steps)[i].get("aqn/sigma")
        lines.append(f"| {i} | " + " | ".join(cells) + f" | {sig if sig is None else f'{sig:.1e}'} |")
    lines += [
        "",
        (
            "| run | mean reward (all steps) | mean acc (first half) | mean acc (second half) | "
            "mean entropy | mean step s | curve (acc) |"
        ),
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for n, rows in cur.items():
        acc = [r["reward/accuracy"] for r in rows]
        h = len(acc) // 2
        ent = [r["policy/entropy"] for r in rows if isinstance(r.get("policy/entropy"), float)]
        lines.append(
            f"| {n} | {sum(r['reward/mean'] for r in rows) / len(rows):.3f} | {sum(acc[:h]) / max(h, 1):.3f}"
            f" | {sum(acc[h:]) / max(len(acc) - h, 1):.3f} | {sum(ent) / max(len(ent), 1):.3f} | "
            f"{sum(r['time/step_s'] for r in rows) / len(rows):.1f} | `{ascii_curve(acc)}` |"
        )
    lines += [
        "",
        (
            "| model | held-out accuracy % (± s.e.) | Δ vs its base (± paired s.e.) | gained / lost | "
            "format % | truncated % | mean tokens |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, e in ev.items():
        p = pr.get(label)
        d = f"{100 * p['delta']:+.1f} ± {100 * p['delta_stderr']:.1f}" if p and p["delta"] is not None else "-"
        g = f"{p['gained']} / {p['lost']}" if p and p.get("gained") is not None else "-"
        lines.append(
            f"| {label} | {_pct(e['accuracy'], e['accuracy_stderr'])} | {d} | {g} | "
            f"{_pct(e['format_rate'])} | {_pct(e['truncation_rate'])} | {e['mean_tokens']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="runs/bench/rl_cpu", help="artifacts go here (reruns resume)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--aqn-stages", type=int, default=4)
    ap.add_argument("--max-difficulty", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per answer, in training and eval")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--results", default=str(RESULTS), help="where rl_cpu.{json,md} and the SVG go")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work = Path(args.work)
    names = [v for v in args.variants.split(",") if v]
    timings_file = work / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}

    def note(key, dt):
        if dt is not None:
            timings[key] = round(dt, 1)
            timings_file.parent.mkdir(parents=True, exist_ok=True)
            timings_file.write_text(json.dumps(timings, indent=2))
            log.info("%s took %.0f s", key, dt)

    t0 = time.time()
    data = prepare_data(work, args.max_difficulty)
    runs, evals = {}, {}
    for n in names:
        if args.report_only:
            runs[n] = work / "rl" / n
            continue
        runs[n], dt = train(work, data, n, args)
        note(f"train/{n}", dt)
    todo = [("base-nvfp4", "nvfp4", None), ("base-bf16", None, None)] + [(n, BASE_QUANT[n], runs[n]) for n in names]
    for label, quant, adapter in todo:
        if args.report_only:
            evals[label] = work / "eval" / label
            continue
        evals[label], dt = evaluate(work, data, label, quant, adapter, args.eval_problems, args.max_new_tokens)
        note(f"eval/{label}", dt)
    if not args.report_only:
        note("total_this_invocation", time.time() - t0)
    res = build_report(work, runs, evals, timings, args)
    print(markdown(res))


if __name__ == "__main__":
    main()
