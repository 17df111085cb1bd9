"""RL precision search on SmolLM2-135M-Instruct (CPU): searched recipe vs uniform, greedy and random.

    .venv/bin/python -m benchmarks.precision_search [--menus default,servable] [--episodes 128]
                                                    [--threads 1] [--reuse] [--skip-calibrate]
                                                    [--write-results] [--only-write]

1. For each format menu (``--menus``): ``quarl.search.run_precision_search`` with the stage's
   defaults -- one decision per fused projection (qkv, o, gate_up, down: 120 units), RTN weights,
   budget = uniform NVFP4's average bits on this model, reward KL(ref || quant), shaped per-step
   credit, top-8 selection on a separate batch -- on GSM8K *train* worked answers: search batch
   4 x 128 tokens, selection batch the next 4 x 128, held-out batch 8 x 128 tokens of the last fifth
   of the (shuffled) train answers, never used to choose. ``--episodes`` PPO episodes, random search
   as many; attention entropy not measured (sdpa). Menus: ``default`` (the stage's formats: nf4-dq /
   nvfp4 / int8-g64 / bf16) and ``servable`` (what export can write for vLLM, the pipeline's: mxfp4 /
   nvfp4 / int8-g64 / bf16). Each artifact (recipe, search.json, report.md, reward_curve.png,
   formats.png) goes to ``benchmarks/results/precision_search/<menu>/``.
2. ``quarl.calibrate.run_calibrate`` (RTN) with each searched recipe and with uniform formats
   (``--uniform``), then their held-out KL(ref || quant), NLL and perplexity from calibrate's own
   metrics on 8 x 128 tokens of GSM8K *test* answers: the "calibrate with the searched recipe and
   eval it against uniform NVFP4 at equal bits".

Sizes: about 450 forward passes of 512 tokens per menu plus 6 calibrations (~25 s each). On the shared
2-core box the default menu's search took 47 min (2 threads, oversubscribed), the servable one's 20 min
(1 thread); ``--reuse`` keeps what the JSON already has, so a stopped run continues.
``--pipeline-summary runs/<id>/summary.json`` records a ``quarl run precision_search`` beside them.

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
import sys
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
KEEP = ("metrics.json", "report.md", "manifest.json", "quarl_quantization.json")  # of each calibrated checkpoint


MENUS = {  # the formats a search may pick: the stage's default, and what export (compressed-tensors) can write
    "default": None,
    "servable": ["mxfp4", "nvfp4", "int8-g64", "bf16"],
}


def run_search(menu: str, episodes: int, threads: int) -> dict:
    from quarl.search import PrecisionSearchConfig
    from quarl.search.config import PPOConfig, SearchDataConfig
    from quarl.search.stage import run_precision_search

    out = RESULTS / "precision_search" / menu
    ckpt = RESULTS / "precision_search" / f"{menu}.ckpt"
    kw = {"formats": MENUS[menu]} if MENUS[menu] else {}
    cfg = PrecisionSearchConfig(
        **kw,
        budget_format="nvfp4",
        ppo=PPOConfig(episodes=episodes),
        data=SearchDataConfig(path=str(GSM8K / "train.jsonl"), text_field="answer", num_samples=4, seq_len=128,
                              select_samples=4, heldout_samples=8),
        measure_entropy=False,  # sdpa attention: the shared 2-core box is the bottleneck
        checkpoint_dir=str(ckpt),
        resume=False,
        threads=threads,
    )
    t0 = time.perf_counter()
    res = run_precision_search(cfg, model_uri="default", output_uri=str(out), overwrite=True)
    res["wall_s"] = time.perf_counter() - t0
    res["formats"] = cfg.formats
    res["search_json"] = str((out / "search.json").relative_to(ROOT))
    shutil.rmtree(ckpt, ignore_errors=True)
    return res


def run_calibrations(jobs: list[tuple[str, str | None, str]], done: dict, command: str):
    """RTN calibrate + held-out metrics for each (name, recipe dir or None, format); skips names in done."""
    from quarl.calibrate import CalibrateConfig, run_calibrate
    from quarl.calibrate.config import CalibDataConfig, HeldOutConfig

    rows = dict(done)
    for name, recipe_uri, fmt in jobs:
        if name in rows:
            continue
        cfg = CalibrateConfig(method="rtn", format=fmt, device="cpu",
                              data=CalibDataConfig(path=str(GSM8K / "train.jsonl"), text_field="answer",
                                                   num_samples=8, seq_len=128),
                              eval=HeldOutConfig(path=str(GSM8K / "test.jsonl"), text_field="answer", num_samples=8))
        slug = name.replace(" (", "-").replace(")", "").replace(" ", "-")
        out = RESULTS / "precision_search" / f"calibrated-{slug}"
        shutil.rmtree(out, ignore_errors=True)  # this benchmark's own output
        t0 = time.perf_counter()
        m = run_calibrate(cfg, model_uri="default", recipe_uri=recipe_uri, output_uri=str(out), overwrite=True)
        mem = m["memory"]["by_format"]
        lin = {k: v for k, v in mem.items() if k not in ("float32", "bfloat16", "lora")}
        lin_bits = 8 * sum(v["bytes"] for v in lin.values()) / max(sum(v["params"] for v in lin.values()), 1)
        rows[name] = {"kl": m["quality"]["kl"], "nll": m["quality"]["nll"], "ppl": m["quality"]["ppl"],
                      "ref_ppl": m["quality"]["ref_ppl"], "linear_avg_bits": lin_bits,
                      "formats": {k: v["params"] for k, v in lin.items()},
                      "total_mib": m["memory"]["total_bytes"] / 2**20, "seconds": time.perf_counter() - t0,
                      "command": command, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
        for f in out.iterdir():  # the checkpoint (weights, tokenizer, config) is never committed
            if f.name not in KEEP:
                shutil.rmtree(f) if f.is_dir() else f.unlink()
        yield rows


def _chunks(xs: list[float], k: int) -> list[float]:
    return [sum(xs[i:i + k]) / len(xs[i:i + k]) for i in range(0, len(xs), k)]


def render(data: dict) -> str:
    from quarl.search.report import comparison_markdown

    lines = [SECTION, "",
             (f"{data['date']}, {data['machine']}, no GPU; `benchmarks/precision_search.py`: each part below names the "
              "command that measured it (`--reuse` keeps the parts already in `results/precision_search.json`; "
              "`--write-results` renders this section from that file). SmolLM2-135M-Instruct (fp32 reference). "
              "The stage's defaults: one decision per "
              "fused projection (qkv, o, gate_up, down of each of 30 blocks: 120 units), RTN, budget = uniform "
              "NVFP4's average bits on this model, reward -KL(ref‖q) (w_kl 1, w_perf 0, w_ent 0, w_mem 0.01) paid "
              "with priced per-step shaping, searched recipe = the best of PPO's top 8 episodes on a separate "
              "selection batch. Two format menus: `default` (the stage's: nf4-dq / nvfp4 / int8-g64 / bf16) and "
              "`servable` (what export can write as compressed-tensors for vLLM, the precision_search pipeline's: "
              "mxfp4 / nvfp4 / int8-g64 / bf16; NF4 has no compressed-tensors format). Search batch 4 x 128 tokens "
              "of GSM8K train answers, selection batch the next 4 x 128; held-out batch 8 x 128 tokens of other "
              "GSM8K train answers (never used to choose). Attention entropy not measured (sdpa, for speed). "
              "Every row except the uniform ones respects the budget."), ""]
    for menu, r in data.get("searches", {}).items():
        s = json.loads((ROOT / r["search_json"]).read_text())
        sec = s["seconds"]
        rel = Path(r["search_json"]).parent.relative_to("benchmarks")
        lines += [(f"### Search, `{menu}` formats ({' / '.join(s['formats'])}): average bits <= "
                   f"{s['budget_bits']:.5f} (= uniform nvfp4)"), "",
                  f"Command: {r.get('command', '(not recorded)')}", "",
                  (f"Search wall time {sec['total']:.0f} s ({r.get('threads', data.get('threads', '?'))} threads): "
                   f"quantize every (linear, format) {sec['quantize']:.0f} s, sensitivity table "
                   f"{sec['setup'] - sec['quantize']:.0f} s ({s['evaluations']['sensitivity']} evaluations), random "
                   f"search {sec['random']:.0f} s, PPO {sec['ppo']:.0f} s; {s['evaluations']['unique']} unique "
                   f"recipes measured, {s['evaluations']['forward_equivalents']:.0f} forward-pass equivalents with the "
                   f"prefix cache. PPO {len(s['ppo']['episode_returns'])} episodes ({s['ppo']['updates']} updates), "
                   "random search as many; each selection re-measures its top 8 on the selection batch."), "",
                  comparison_markdown(s["comparison"]),
                  (f"Reward curve: [`reward_curve.png`]({rel}/reward_curve.png); per-unit formats: "
                   f"[`formats.png`]({rel}/formats.png); searched recipe: [`recipe.yaml`]({rel}/recipe.yaml)."), ""]
        lines += _learning(s) + [""] + _observations(s) + [""]
    c = data.get("calibrate")
    if c:
        lines += ["### Calibrate with the searched recipes vs uniform formats", "",
                  ("`run_calibrate` RTN (the calibration windows are unused by RTN); held-out: 8 x 128 tokens of "
                   "GSM8K *test* answers (calibrate's own KL(ref‖q), NLL and perplexity)."), "",
                  "| recipe | quantized-linear avg bits | model MiB | held-out KL(ref‖q) | NLL | ppl | ref ppl | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        cmds: dict[str, list[str]] = {}
        for name, v in c.items():
            cmds.setdefault(v.get("command", "(not recorded)"), []).append(name)
        lines[-2:-2] = ["Commands (the seconds column is wall time on the shared box, not a speed figure):", "",
                        *[f"- {', '.join(names)}: {cmd}" for cmd, names in cmds.items()], ""]
        for name, v in c.items():
            lines.append(f"| {name} | {v['linear_avg_bits']:.5f} | {v['total_mib']:.1f} | {v['kl']:.4f} | "
                         f"{v['nll']:.4f} | {v['ppl']:.3f} | {v['ref_ppl']:.3f} | {v['seconds']:.0f} |")
        for me, a in c.items():
            if not me.startswith("searched"):
                continue
            lines.append("")
            for name, v in c.items():
                if name.startswith("searched"):
                    continue
                bits = "equal or more bits" if v["linear_avg_bits"] >= a["linear_avg_bits"] - 1e-9 else \
                    "FEWER bits (not an equal-bits comparison)"
                kl = "lower" if a["kl"] < v["kl"] else "NOT lower"
                nll = "lower" if a["nll"] < v["nll"] else "NOT lower"
                lines.append(f"- {me} ({a['linear_avg_bits']:.5f} bits) vs {name} ({v['linear_avg_bits']:.5f} bits, "
                             f"{bits}): KL {a['kl']:.4f} vs {v['kl']:.4f} ({kl}, {100 * (a['kl'] / v['kl'] - 1):+.1f}%), "
                             f"NLL {a['nll']:.4f} vs {v['nll']:.4f} ({nll}).")
        lines.append("")
    if data.get("pipeline_runs"):
        lines += _pipeline(data["pipeline_runs"])
    lines += _verdict(data)
    return "\n".join(lines).rstrip("\n") + "\n"


def _learning(s: dict) -> list[str]:
    """PPO's mean return per block of episodes next to random search's (same episodes, same env)."""
    pr, rr = s["ppo"]["episode_returns"], (s.get("random") or {}).get("episode_returns") or []
    if not rr:
        return []
    k = max(1, len(pr) // 8)
    rows = {x["name"]: x for x in s["comparison"]}
    refs = ", ".join(f"{n} {rows[n]['reward']:.4f}" for n in ("uniform nvfp4", "greedy (sensitivity)") if n in rows)
    out = [f"Mean episode reward per {k} episodes (search batch; {refs}):", "",
           "| episodes | " + " | ".join(f"{i + 1}-{min(i + k, len(pr))}" for i in range(0, len(pr), k)) + " |",
           "|---|" + "---:|" * len(range(0, len(pr), k)),
           "| PPO | " + " | ".join(f"{x:.4f}" for x in _chunks(pr, k)) + " |",
           "| random | " + " | ".join(f"{x:.4f}" for x in _chunks(rr, k)) + " |"]
    last = min(k, len(pr))
    out += ["", (f"- learning: PPO's mean reward over its last {last} episodes {sum(pr[-last:]) / last:.4f} vs random "
                 f"search's mean {sum(rr) / len(rr):.4f}; best episode {max(pr):.4f} vs {max(rr):.4f}.")]
    return out


def _observations(s: dict) -> list[str]:
    rows = {r["name"]: r for r in s["comparison"]}
    me = rows.get(s.get("searched", "PPO (selected)"))
    if me is None or "heldout" not in me:
        return []
    out = []
    for name, r in rows.items():
        if r is me or "heldout" not in r:
            continue
        more = r["avg_bits"] > me["avg_bits"] + 1e-6
        fewer = r["avg_bits"] < me["avg_bits"] - 1e-6
        tag = " -- more bits" if more else (" -- FEWER bits" if fewer else "")
        a, b = me["heldout"]["kl_ref_quant"], r["heldout"]["kl_ref_quant"]
        la, lb = me["heldout"]["loss"], r["heldout"]["loss"]
        out.append(f"- {me['name']} vs {name} ({r['avg_bits']:.4f} bits{tag}): held-out KL(ref‖q) {a:.4f} vs {b:.4f} "
                   f"({'lower' if a < b else 'NOT lower'}), held-out loss {la:.4f} vs {lb:.4f} "
                   f"({'lower' if la < lb else 'NOT lower'}); search-batch reward {me['reward']:.4f} vs "
                   f"{r['reward']:.4f}.")
    return out


def _verdict(data: dict) -> list[str]:
    """Issue 16's claims checked against the numbers above (held-out batches only)."""
    out = ["### Issue 16's claims against these numbers", ""]
    c = data.get("calibrate") or {}
    for me, a in c.items():
        if not me.startswith("searched"):
            continue
        peers = [n for n, v in c.items() if n.startswith("uniform") and v["linear_avg_bits"] >= a["linear_avg_bits"] - 1e-9]
        lost = [n for n in peers if not (a["kl"] < c[n]["kl"] and a["nll"] < c[n]["nll"])]
        out.append(f"- after calibrate, {me} beats every uniform recipe with as many or more bits ({', '.join(peers)}) "
                   f"on held-out KL and NLL: {'holds' if not lost else 'does NOT hold against ' + ', '.join(lost)}.")
    for menu, r in data.get("searches", {}).items():
        s = json.loads((ROOT / r["search_json"]).read_text())
        rows = {x["name"]: x for x in s["comparison"]}
        me = rows.get(s.get("searched", ""))
        if me is None or "heldout" not in me:
            continue
        h = me["heldout"]
        for other in ("greedy (sensitivity)", "random search (selected)"):
            o = rows.get(other)
            if o is None or "heldout" not in o:
                continue
            kl = "lower" if h["kl_ref_quant"] < o["heldout"]["kl_ref_quant"] else "higher"
            loss = "lower" if h["loss"] < o["heldout"]["loss"] else "higher"
            out.append(f"- `{menu}` search: {me['name']} vs {other} at the same budget: held-out KL {kl} "
                       f"({h['kl_ref_quant']:.4f} vs {o['heldout']['kl_ref_quant']:.4f}), held-out loss {loss} "
                       f"({h['loss']:.4f} vs {o['heldout']['loss']:.4f}).")
    return out + [""] if len(out) > 2 else []


def pipeline_times(summary: dict) -> dict:
    """What RESULTS.md shows of a local pipeline run: status, wall time, each step's seconds and key metrics."""
    keep = ("searched.avg_bits", "searched.kl", "quality.kl", "quality.ppl", "benchmarks.heldout.accuracy")
    steps = [{"step": s["step"], "status": s["status"], "seconds": s["seconds"],
              "metrics": {k: v for k, v in (s.get("metrics") or {}).items() if k in keep}} for s in summary["steps"]]
    return {"status": summary["status"], "wall_seconds": summary["wall_seconds"], "profile": summary["profile"],
            "model": summary["model"], "steps": steps}


def _pipeline(runs: list[dict]) -> list[str]:
    """Each recorded ``quarl run precision_search``: its command, the box's load, every step's seconds."""
    out = ["### `quarl run precision_search` (local profile)", "",
           ("Profile `local`, model `default` (SmolLM2-135M-Instruct): a block-granularity search of 32 episodes on "
            "2 x 32 tokens with the servable formats, GPTQ on 4 x 64 tokens, greedy eval of the 16 eval problems, "
            "export to compressed-tensors. A smoke-sized run: its search is not the measured comparison above, and "
            "its eval accuracy (0 of 16 greedy answers) is not a quality figure."), ""]
    for i, p in enumerate(runs, 1):
        out += [(f"Run {i}: {p.get('command', '`.venv/bin/quarl run precision_search`')} -- {p['status']} in "
                 f"{p['wall_seconds']:.0f} s ({p['wall_seconds'] / 60:.1f} min) {p.get('note', '')}").rstrip() + ".", "",
                "| step | status | seconds | metrics |", "|---|---|---:|---|"]
        for s in p["steps"]:
            m = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in s["metrics"].items())
            out.append(f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {m} |")
        out.append("")
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
    ap.add_argument("--menus", default="default,servable", help=f"format menus to search: {', '.join(MENUS)}")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core box 2 threads oversubscribe and run ~2x slower)")
    ap.add_argument("--uniform", default="nvfp4,nf4,mxfp4,int4-g64-sym",
                    help="uniform formats to calibrate beside the searched recipes")
    ap.add_argument("--reuse", action="store_true", help="keep searches and calibrations already in the JSON")
    ap.add_argument("--skip-calibrate", action="store_true")
    ap.add_argument("--write-results", action="store_true", help="rewrite the RESULTS.md section")
    ap.add_argument("--only-write", action="store_true", help="do not run; just rewrite RESULTS.md")
    ap.add_argument("--pipeline-summary", type=Path,
                    help="add the step times of a `quarl run precision_search` (its runs/<id>/summary.json)")
    ap.add_argument("--pipeline-note", help="how the box was loaded during that run (RESULTS.md says it)")
    ap.add_argument("--pipeline-command", help="the exact `quarl run` command line of that run")
    a = ap.parse_args()
    if a.pipeline_summary:
        data = json.loads(OUT_JSON.read_text())
        run = pipeline_times(json.loads(a.pipeline_summary.read_text()))
        run |= {k: v for k, v in (("note", a.pipeline_note), ("command", a.pipeline_command)) if v}
        data["pipeline_runs"] = [*data.get("pipeline_runs", []), run]
        OUT_JSON.write_text(json.dumps(data, indent=1, default=str))
    if a.only_write:
        write_results(json.loads(OUT_JSON.read_text()))
        return
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(a.threads)
    data = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() and a.reuse else {}
    data["machine"] = f"{platform.processor() or platform.machine()} (2 shared cores)"
    data["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    searches, calib = data.setdefault("searches", {}), data.setdefault("calibrate", {})
    command = " ".join([".venv/bin/python -m benchmarks.precision_search", *sys.argv[1:]])
    for menu in a.menus.split(","):
        if menu not in MENUS:
            raise SystemExit(f"unknown menu {menu!r}; choose from {', '.join(MENUS)}")
        if menu in searches and a.reuse:
            continue
        searches[menu] = run_search(menu, a.episodes, a.threads) | {"threads": a.threads, "command": command}
        calib.pop(f"searched ({menu})", None)  # a new search: its calibration is stale
        OUT_JSON.write_text(json.dumps(data, indent=1, default=str))
    if not a.skip_calibrate:
        jobs = [(f"searched ({m})", str(ROOT / Path(searches[m]["search_json"]).parent), "nvfp4") for m in searches]
        jobs += [(f"uniform {f}", None, f) for f in a.uniform.split(",")]
        for rows in run_calibrations(jobs, calib if a.reuse else {}, command):
            data["calibrate"] = {n: rows[n] for n, _, _ in jobs if n in rows}
            OUT_JSON.write_text(json.dumps(data, indent=1, default=str))
    if a.write_results:
        write_results(data)
    print(json.dumps({k: v for k, v in data.items() if k != "searches"}, indent=1, default=str))


if __name__ == "__main__":
    main()
