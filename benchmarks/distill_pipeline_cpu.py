"""Where the time of `quarl run qad` / `quarl run reasoning_qat` (local profile) goes, stage by stage.

    python -m benchmarks.distill_pipeline_cpu qad             # wall and CPU seconds of each stage
    python -m benchmarks.distill_pipeline_cpu reasoning_qat --set kd_coldstart.train.steps=1

Runs the recipe's steps in DAG order by calling the stage functions directly on local paths
(no kfp.local, no S3), each with the config `quarl run` builds for that step from the recipe and
its profile, so the numbers are the stages' own work: the DAG's process start-up, S3 uploads and
downloads come on top (compare with `quarl run`'s own "step ... done in" lines). CPU seconds are
this process's (user + system, all threads): on a shared machine they say what a stage costs
while the wall clock says how busy the machine was. Writes one JSON line per stage to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# step -> (stage function, {its keyword: the artifact it reads}) for the two distillation DAGs
WIRING = {
    "qad": [
        ("data_prep", "quarl.data:run_data_prep", {}),
        ("calibrate", "quarl.calibrate:run_calibrate", {"model_uri": "@model", "data_uri": "data_prep"}),
        ("distill", "quarl.distill:run_distill", {"model_uri": "calibrate", "data_uri": "data_prep"}),
        ("eval", "quarl.eval:run_eval", {"model_uri": "distill", "data_uris": "data_prep"}),
        ("export", "quarl.export:run_export", {"model_uri": "distill"}),
    ],
    "reasoning_qat": [
        ("data_prep", "quarl.data:run_data_prep", {}),
        ("calibrate", "quarl.calibrate:run_calibrate", {"model_uri": "@model", "data_uri": "data_prep"}),
        ("kd_coldstart", "quarl.distill:run_kd_coldstart", {"model_uri": "calibrate", "data_uri": "data_prep"}),
        ("rl", "quarl.rl.stage:run_rl", {"model_uri": "kd_coldstart", "data_uri": "data_prep"}),
        ("eval", "quarl.eval:run_eval", {"model_uri": "kd_coldstart", "adapter_uri": "rl", "data_uris": "data_prep"}),
        ("export", "quarl.export:run_export", {"model_uri": "kd_coldstart", "adapter_uri": "rl"}),
    ],
}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> list[dict]:
    import importlib

    from quarl.pipeline.recipes import load_recipe

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe", choices=sorted(WIRING))
    ap.add_argument("--profile", default="local")
    ap.add_argument("--set", action="append", default=[], help="recipe override, as quarl run --set")
    ap.add_argument("--work", default="", help="output root (default: a fresh temporary directory)")
    ap.add_argument("--until", default="", help="stop after this step")
    ap.add_argument("--out", default="", help="append one JSON line per stage here")
    a = ap.parse_args(argv)
    recipe = load_recipe(a.recipe, a.profile, a.set)
    root = Path(a.work or tempfile.mkdtemp(prefix=f"{a.recipe}-stages-"))
    uris: dict[str, str] = {"@model": recipe.model}
    rows = []
    t_all, c_all = time.perf_counter(), cpu_seconds()
    for step, fn, wiring in WIRING[a.recipe]:
        mod, name = fn.split(":")
        run = getattr(importlib.import_module(mod), name)
        cfg = recipe.stage_config(step, step)  # in these DAGs a step is named after its stage
        out = str(root / step / ("dataset" if step == "data_prep" else "out"))
        kw = {k: uris[v] for k, v in wiring.items()}
        t0, c0 = time.perf_counter(), cpu_seconds()
        run(cfg, output_uri=out, **kw)
        row = {"recipe": a.recipe, "step": step, "wall_s": round(time.perf_counter() - t0, 1),
               "cpu_s": round(cpu_seconds() - c0, 1), "load_avg": round(os.getloadavg()[0], 2)}
        uris[step] = out
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        if step == a.until:
            break
    total = {"recipe": a.recipe, "step": "total", "wall_s": round(time.perf_counter() - t_all, 1),
             "cpu_s": round(cpu_seconds() - c_all, 1), "threads": os.cpu_count()}
    print(json.dumps(total), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(total) + "\n")
    return [*rows, total]


if __name__ == "__main__":
    main()
