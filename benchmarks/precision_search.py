"""RL precision search on SmolLM2-135M-Instruct (CPU): searched recipe vs uniform, greedy and random.

    .venv/bin/python -m benchmarks.precision_search [--budgets nvfp4,int8-g64] [--episodes 128]
                                                    [--threads 2] [--skip-calibrate]

For each budget (named by the uniform format whose average bits it equals):

1. ``quarl.search.run_precision_search`` with the default formats (nf4, nvfp4,
   int8-g64, bf16), one decision per decoder block (30), RTN weights, reward
   weights at their defaults (loss gap 1, KL 1, entropy 0, memory 0.01); the
   search batch is 2 x 32 tokens of GSM8K *train* worked answers, the held-out
   batch 2 x 32 tokens of later (unused) train answers; 32 PPO episodes (2 updates),
   attention entropy not measured (sdpa). The artifact (recipe,
   search.json, report.md, reward_curve.png, formats.png) is written to
   ``benchmarks/results/precision_search/<budget>/``.
2. (first budget only) ``quarl.calibrate.run_calibrate`` (RTN, 8 x 128-token
   GSM8K train windows) with the searched recipe and with uniform NVFP4, then
   their held-out KL / perplexity from calibrate's own metrics (8 x 128 tokens
   of GSM8K *test*): the "eval against uniform NVFP4 at equal bits".

Results: ``benchmarks/results/precision_search.json`` (after every part), and
``--write-results`` rewrites the "## Precision search (CPU)" section of
``benchmarks/RESULTS.md`` from it (``--only-write``: no run). The observations
in that section are computed from the numbers, not typed.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks/results"
GSM8K = Path("/work/shared/data/gsm8k")
OUT_JSON = RESULTS / "precision_search.json"
RESULTS_MD = ROOT / "benchmarks/RESULTS.md"
SECTION = "## Precision search (CPU)"


def _bits(fmt: str) -> float:
    """Average storage bits of ``fmt`` on SmolLM2's linears (what the uniform recipe measures)."""
    return {"nvfp4": 4.5001, "nf4": 4.5, "int8-g64": 8.625}[fmt]


def run_search(budget: str, episodes: int, threads: int) -> dict:
    from quarl.search import PrecisionSearchConfig
    from quarl.search.config import PPOConfig, SearchDataConfig
    from quarl.search.stage import run_precision_search

    out = RESULTS / "precision_search" / budget
    cfg = PrecisionSearchConfig(
        budget_bits=_bits(budget),
        ppo=PPOConfig(episodes=episodes, episodes_per_update=16),
        data=SearchDataConfig(path=str(GSM8K / "train.jsonl"), text_field="answer", num_samples=2, seq_len=32,
                              heldout_samples=2),
        measure_entropy=False,  # sdpa attention: the shared 2-core box is the bottleneck
        checkpoint_dir=str(RESULTS / "precision_search" / f"{budget}.ckpt"),
        threads=threads,
    )
    t0 = time.perf_counter()
    res = run_precision_search(cfg, model_uri="default", output_uri=str(out), overwrite=True)
    res["wall_s"] = time.perf_counter() - t0
    res["search_json"] = str((out / "search.json").relative_to(ROOT))
    return res


def run_calibrations(recipe_dir: Path) -> dict:
    from quarl.calibrate import CalibrateConfig, run_calibrate
    from quarl.calibrate.config import CalibDataConfig, HeldOutConfig

    rows = {}
    for name, recipe_uri, fmt in (("searched", str(recipe_dir), "nvfp4"),
                                  ("uniform nvfp4", None, "nvfp4")):
        cfg = CalibrateConfig(method="rtn", format=fmt, device="cpu",
                              data=CalibDataConfig(path=str(GSM8K / "train.jsonl"), text_field="answer",
                                                   num_samples=8, seq_len=128),
                              eval=HeldOutConfig(path=str(GSM8K / "test.jsonl"), text_field="answer", num_samples=8))
        out = RESULTS / "precision_search" / f"calibrated-{name.replace(' ', '-')}"
        t0 = time.perf_counter()
        m = run_calibrate(cfg, model_uri="default", recipe_uri=recipe_uri, output_uri=str(out), overwrite=True)
        mem = m["memory"]["by_format"]
        lin = {k: v for k, v in mem.items() if k not in ("float32", "bfloat16", "lora")}
        lin_bits = 8 * sum(v["bytes"] for v in lin.values()) / max(sum(v["params"] for v in lin.values()), 1)
        rows[name] = {"kl": m["quality"]["kl"], "ppl": m["quality"]["ppl"], "ref_ppl": m["quality"]["ref_ppl"],
                      "linear_avg_bits": lin_bits, "total_mib": m["memory"]["total_bytes"] / 2**20,
                      "seconds": time.perf_counter() - t0}
        shutil.rmtree(out / "model", ignore_errors=True)
    return rows


def render(data: dict) -> str:
    from quarl.search.report import comparison_markdown

    lines = [SECTION, "",
             (f"`.venv/bin/python -m benchmarks.precision_search --write-results` -- {data['date']}, "
             f"{data['machine']}; SmolLM2-135M-Instruct (fp32 reference), 30 decisions (one per decoder block), "
             "formats nf4 / nvfp4 / int8-g64 / bf16, RTN, reward weights w_perf 1, w_kl 1, w_ent 0, w_mem 0.01; attention entropy not measured (sdpa, for speed). "
             "Search batch 2 x 32 tokens of GSM8K train answers; held-out batch 2 x 32 tokens of other GSM8K train "
             "answers (never used to choose). Every row except the uniform ones respects the budget."), ""]
    for budget, r in data.get("searches", {}).items():
        s = json.loads((ROOT / r["search_json"]).read_text())
        sec = s["seconds"]
        lines += [f"### Budget: average bits <= {s['budget_bits']} (= uniform {budget})", "",
                  (f"Search wall time {sec['total']:.0f} s (weights + sensitivity table {sec['setup']:.0f} s + "
                  f"{s['evaluations']['sensitivity']} evaluations, random {sec['random']:.0f} s, PPO {sec['ppo']:.0f} s; "
                  f"{s['evaluations']['unique']} unique recipes measured, "
                  f"{s['evaluations']['forward_equivalents']:.0f} forward-pass equivalents with the prefix cache); "
                  f"PPO {len(s['ppo']['episode_returns'])} episodes, random search as many."), "",
                  comparison_markdown(s["comparison"]),
                  (f"Reward curve: [`{Path(r['search_json']).parent}/reward_curve.png`]"
                  f"({Path(r['search_json']).parent.relative_to('benchmarks')}/reward_curve.png); "
                  f"per-block formats: [`formats.png`]({Path(r['search_json']).parent.relative_to('benchmarks')}"
                  "/formats.png)."), ""]
        lines += _observations(s, budget) + [""]
    c = data.get("calibrate")
    if c:
        lines += ["### Calibrate with the searched recipe vs uniform NVFP4", "",
                  ("`run_calibrate` RTN (calibration windows unused by RTN); held-out: 8 x 128 tokens of "
                  "GSM8K test answers (calibrate's own KL(ref || quant) and perplexity)."), "",
                  "| recipe | quantized-linear avg bits | model MiB | held-out KL(ref‖q) | ppl | ref ppl | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, v in c.items():
            lines.append(f"| {name} | {v['linear_avg_bits']:.4f} | {v['total_mib']:.1f} | {v['kl']:.4f} | "
                         f"{v['ppl']:.3f} | {v['ref_ppl']:.3f} | {v['seconds']:.0f} |")
        a, b = c.get("searched"), c.get("uniform nvfp4")
        if a and b:
            verdict = "lower" if a["kl"] < b["kl"] else "higher"
            lines += ["", (f"The searched recipe's held-out KL after calibrate (RTN) is {verdict} than uniform NVFP4's "
                          f"({a['kl']:.4f} vs {b['kl']:.4f}, {100 * (a['kl'] / b['kl'] - 1):+.1f}%).")]
    return "\n".join(lines) + "\n"


def _observations(s: dict, budget: str) -> list[str]:
    rows = {r["name"]: r for r in s["comparison"]}
    ppo = rows["PPO (best episode)"]
    out = []
    for name, r in rows.items():
        if name == "PPO (best episode)" or "heldout" not in r:
            continue
        same_bits = abs(r["avg_bits"] - ppo["avg_bits"]) < 0.02 or r["avg_bits"] >= ppo["avg_bits"]
        if not same_bits:
            continue
        better_s = ppo["kl"] < r["kl"]
        better_h = ppo["heldout"]["kl"] < r["heldout"]["kl"]
        more = " -- more bits, not an equal-bits comparison (no search ran at its budget)" if (
            r["avg_bits"] > ppo["avg_bits"] + 0.02) else ""
        out.append(f"- vs {name} ({r['avg_bits']:.3f} bits{more}): KL on the search batch {ppo['kl']:.4f} vs {r['kl']:.4f} "
                   f"({'lower' if better_s else 'not lower'}), held-out {ppo['heldout']['kl']:.4f} vs "
                   f"{r['heldout']['kl']:.4f} ({'lower' if better_h else 'NOT lower'}).")
    pr, rr = s["ppo"]["episode_returns"], (s.get("random") or {}).get("episode_returns") or []
    if rr:
        k = min(16, len(pr))
        out.append(f"- learning: PPO's mean return over its last {k} episodes {sum(pr[-k:]) / k:.4f} vs random "
                   f"search's mean {sum(rr) / len(rr):.4f} (best {max(pr):.4f} vs {max(rr):.4f}).")
    return out


def write_results(data: dict) -> None:
    text = RESULTS_MD.read_text()
    body = render(data)
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        nxt = text.find("\n## ", start + len(SECTION))
        rest = "" if nxt < 0 else text[nxt + 1:]
        text = text[:start] + body + ("\n" + rest if rest else "")
    RESULTS_MD.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="nvfp4")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-calibrate", action="store_true")
    ap.add_argument("--write-results", action="store_true", help="rewrite the RESULTS.md section")
    ap.add_argument("--only-write", action="store_true", help="do not run; just rewrite RESULTS.md")
    a = ap.parse_args()
    if a.only_write:
        write_results(json.loads(OUT_JSON.read_text()))
        return
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(a.threads)
    data = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {}
    data["machine"] = f"{platform.processor() or platform.machine()}, {a.threads} threads (2 shared cores)"
    data["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    for i, b in enumerate(a.budgets.split(",")):
        data.setdefault("searches", {})[b] = run_search(b, a.episodes, a.threads)
        OUT_JSON.write_text(json.dumps(data, indent=1, default=str))
        if i == 0 and not a.skip_calibrate:
            data["calibrate"] = run_calibrations(RESULTS / "precision_search" / b)
            OUT_JSON.write_text(json.dumps(data, indent=1, default=str))
    if a.write_results:
        write_results(data)
    print(json.dumps({k: v for k, v in data.items() if k != "searches"}, indent=1, default=str))


if __name__ == "__main__":
    main()
