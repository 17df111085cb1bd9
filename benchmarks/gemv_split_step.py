"""Does a one-row GEMV launch split to whole waves pay in the engine's decode step? (issue 17, session 40)

Why. At batch 1 the decode step is mostly the one-row GEMV (``quarl_kernels.gemv``: 69 % of the 14B NVFP4+LoRA step's
kernel time on an H200, RESULTS "Session 40"), and its K split comes from one rule (``gemv_config._gemv_split``:
about 4 x SMs programs). Built for sm_90 on a CPU, the 14B gate/up group launch takes 108 registers -- 4 programs
an SM, 528 on an H200 -- and the rule gives it 896 programs (864 weight tiles + 32 LoRA-A programs, no split):
1.7 waves, the last 0.7 with the SMs part idle. The 7B launches all sit at 0.84-0.92 of a wave. If the partial wave
is what makes 14B's batch-1 ratio (2.38x) trail 7B's (2.51x), a split that fills whole waves would show it here.

What it does: builds one model (``benchmarks/rollout.py``'s Qwen2.5-shaped random weights, NVFP4 + LoRA r32 by
default), then for each named setting -- environment switches read at launch, chiefly ``QUARL_KERNELS_GEMV_SPLIT``
(``NxK:s``: a launch of N rows in all split s ways) and ``QUARL_KERNELS_GEMV_M1`` (``NxK:i``: the config) -- builds
the engine (graphs captured under the setting), prefills a ``prompt``-token context and times ``steps`` decode steps
of ``benchmarks/rollout_profile.py``'s loop (the engine's graphed step, sampling, bookkeeping). Settings alternate
within each of ``rounds`` rounds, so a drift of the card's clock spreads over all of them; the table gives each
round's step ms, the median and x = the first setting's median / this one's. The process's first engine ran 2-4 %
faster than every later one in session 40's first run, whatever the setting, so ``--warm-engines`` (1) engines are
built and timed first and left out.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/gemv_split_step.py --model 14b --out $OUT \\
        --settings "rule=;gu3=QUARL_KERNELS_GEMV_SPLIT=27648x5120:3"

A setting is ``label=NAME=VALUE|NAME=VALUE`` (``label=`` alone: the defaults); settings are separated by ``;``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import unittest.mock
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rollout as R
import rollout_profile as RP
from gpu_energy import EnergyMeter  # the SM clock and watts of each timing (the first-engine question)


def parse_settings(spec: str) -> dict[str, dict[str, str]]:
    """``"a=;b=X=1|Y=2"`` -> ``{"a": {}, "b": {"X": "1", "Y": "2"}}``; a malformed entry is an error naming the form."""
    out: dict[str, dict[str, str]] = {}
    for item in filter(None, (t.strip() for t in spec.split(";"))):
        label, sep, rest = item.partition("=")
        if not sep or not label:
            raise SystemExit(f"--settings: {item!r} is not label=NAME=VALUE|NAME=VALUE (or label= for the defaults)")
        env = {}
        for pair in filter(None, (t.strip() for t in rest.split("|"))):
            name, sep, value = pair.partition("=")
            if not sep or not name:
                raise SystemExit(f"--settings: {pair!r} in {label!r} is not NAME=VALUE")
            env[name] = value
        if label in out:
            raise SystemExit(f"--settings: label {label!r} given twice")
        out[label] = env
    if not out:
        raise SystemExit("--settings: no setting given")
    return out


@torch.no_grad()
def step_ms(model, batch: int, prompt: int, steps: int, env: dict[str, str], meter=None) -> dict:
    """``{"ms": per decode step, "sm_mhz", "watts"}`` of a fresh engine built and run under ``env`` (its graphs
    captured under it); the clock and power from ``meter`` (an ``EnergyMeter``; None on CPU)."""
    from quarl.engine import FastGenerator
    from quarl.engine import generator as G

    with unittest.mock.patch.dict(os.environ, env):
        eng = FastGenerator(model, R.PAD, kv_block=256, sync_every=64)
        rows = R._prompts(batch, prompt, model.config.vocab_size)
        gen = torch.Generator(R.DEVICE).manual_seed(0)
        graphs = R.DEVICE == "cuda"
        st, carry = RP.start_loop(eng, rows, 2 + steps + 4, gen)
        b = G._pow2(batch) if graphs else batch
        RP.decode_loop(eng, st, batch, b, 2, gen, graphs, carry)  # warm: the replayed graph's first runs
        RP._sync()
        if meter is not None:
            meter.start()
        t = time.perf_counter()
        RP.decode_loop(eng, st, batch, b, steps, gen, graphs, carry)
        RP._sync()
        ms = (time.perf_counter() - t) / steps * 1e3
        if meter is not None:
            meter.stop()
        eng.release()
    watts = meter.joules / meter.seconds if meter is not None and meter.joules is not None else None
    return {"ms": ms, "sm_mhz": meter.sm_mhz if meter is not None else None, "watts": watts}


def table(res: dict) -> str:
    labels = list(res["settings"])
    med = {k: statistics.median(res["ms"][k]) for k in labels if res["ms"].get(k)}
    base = med.get(labels[0])
    head = (f"# {res['model']} {res['recipe']}, batch {res['batch']}, context {res['prompt']}.., {res['steps']} steps "
            f"a timing, {res['gpu']}, {res['date']}")
    lines = [head, "",
             "| setting | env | step ms (rounds) | median | x first | SM MHz (rounds) |", "|---|---|---|---:|---:|---|"]
    for k in labels:
        env = " ".join(f"{n}={v}" for n, v in res["settings"][k].items()) or "(defaults)"
        ms = res["ms"].get(k, [])
        if not ms:
            lines.append(f"| {k} | {env} | (not run) | | |")
            continue
        x = f"{base / med[k]:.3f}" if base else "-"
        mhz = " / ".join(f"{c[0]:.0f}" if c[0] else "-" for c in res.get("clock", {}).get(k, [])) or "-"
        lines.append(f"| {k} | `{env}` | {' / '.join(f'{v:.3f}' for v in ms)} | {med[k]:.3f} | {x} | {mhz} |")
    warm = [f"{ms:.3f} ms" + (f" at {c[0]:.0f} MHz" if c[0] else "")
            for ms, c in zip(res.get("warm_ms", []), res.get("warm_clock", []))]
    if warm:
        lines.append(f"\nthrowaway first engine(s), defaults: {', '.join(warm)}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="14b", help="7b, 14b (benchmarks/rollout.py's shapes), or tiny (--device cpu)")
    ap.add_argument("--recipe", default="nvfp4+lora", help="a recipe of benchmarks/rollout.py")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", required=True, help="label=NAME=VALUE|NAME=VALUE;... (label= : the defaults)")
    ap.add_argument("--warm-engines", type=int, default=1,
                    help="engines built and timed under the defaults first, not reported: in session 40's first run "
                         "the process's first engine ran 2-4 %% faster than every later one (14B 4.97 against 5.15 ms "
                         "a step, 7B 2.69 against 2.79), whatever the setting")
    ap.add_argument("--budget-s", type=float, default=240.0, help="no new round starts past this")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    settings = parse_settings(args.settings)
    if args.recipe not in R.RECIPES:
        raise SystemExit(f"--recipe {args.recipe!r}: not one of {', '.join(R.RECIPES)}")
    R.DEVICE = args.device
    if R.DEVICE == "cuda" and not torch.cuda.is_available():
        print("gemv_split_step.py needs CUDA (or --device cpu --model tiny for a dry run)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = RP.build_model(args.model, args.recipe)
    env = R.environment()
    res = {"model": args.model, "recipe": args.recipe, "batch": args.batch, "prompt": args.prompt, "steps": args.steps,
           "gpu": env.get("gpu"), "date": env.get("date"), "env": env, "settings": settings,
           "ms": {k: [] for k in settings}, "command": " ".join(sys.argv)}
    meter = EnergyMeter(torch.cuda.current_device()) if R.DEVICE == "cuda" else None
    warm = [step_ms(model, args.batch, args.prompt, args.steps, {}, meter) for _ in range(args.warm_engines)]
    res["warm_ms"], res["warm_clock"] = [w["ms"] for w in warm], [(w["sm_mhz"], w["watts"]) for w in warm]
    res["clock"] = {k: [] for k in settings}  # (mean SM MHz, mean W) of each timing
    for r in range(args.rounds):
        if r and time.perf_counter() - t0 > args.budget_s:
            res["note"] = f"stopped after {r} rounds (--budget-s {args.budget_s:.0f})"
            break
        for label, e in settings.items():
            got = step_ms(model, args.batch, args.prompt, args.steps, e, meter)
            res["ms"][label].append(got["ms"])
            res["clock"][label].append((got["sm_mhz"], got["watts"]))
            print(json.dumps({"round": r, "setting": label, **got}), flush=True)
            (out / "gemv_split_step.json").write_text(json.dumps(res, indent=1, default=str))
    md = table(res)
    (out / "gemv_split_step.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
