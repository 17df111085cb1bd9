"""The CPU benchmarks by name: ``make bench`` runs the quick one; ``make bench BENCH="calibration rl-cpu"`` (or
``python -m benchmarks.run_cpu NAME ...``) runs others; ``--list`` prints them all.

Each benchmark is its own script with its own documented command (its module docstring); this runs that command in a
fresh process from the repository root, one after another, printing each one's wall time and exit status, and fails
if any failed. The long ones write the JSON / markdown that benchmarks/RESULTS.md quotes (under
``benchmarks/results/``) -- running them re-measures those figures on this machine. GPU benchmarks run through the
device sessions (``benchmarks/gpu_session*.sh``; benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Bench(NamedTuple):
    args: tuple[str, ...]  # after the Python interpreter
    what: str
    takes: str  # on an idle 2-core box
    writes: str


BENCHES = {
    "op-overhead": Bench(("benchmarks/op_overhead_cpu.py",),
                         "host time per call of the 4-bit linear's entry points against F.linear", "~15 s",
                         "stdout only"),
    "calibration": Bench(("-m", "benchmarks.calibration"),
                         "RTN / GPTQ / AWQ / AWQ+GPTQ x weight formats on SmolLM2-135M: held-out perplexity, KL",
                         "~2.5 h for every format and method (RESULTS.md \"Calibration wall time\"; --formats / --methods narrow it)", "benchmarks/results/calibration_cpu.json"),
    "precision-search": Bench(("-m", "benchmarks.precision_search"),
                              "the PPO precision search against uniform, greedy and random recipes on SmolLM2",
                              "20-47 min a menu, two menus (its docstring)", "benchmarks/results/precision_search.json"),
    "rl-cpu": Bench(("-m", "benchmarks.rl_cpu", "--work", "runs/bench/rl_cpu"),
                    "QeRL on CPU: NVFP4+LoRA+AQN vs NVFP4+LoRA vs BF16-LoRA, 12 GRPO steps, held-out accuracy",
                    "~30 min (RESULTS.md: 384-447 s of training a variant, evals 68-89 s each)",
                    "benchmarks/results/rl_cpu.{json,md}"),
    "rl-entropy": Bench(("-m", "benchmarks.rl_entropy"),
                        "sampling entropy of quantized policies against BF16 at step 0 (QeRL Fig. 5)", "not recorded",
                        "benchmarks/results/rl_entropy.json"),
    "distill-pipeline": Bench(("-m", "benchmarks.distill_pipeline_cpu", "qad"),
                              "where `quarl run qad`'s time goes, stage by stage",
                              "~3 min (`quarl run qad`: 2 min 54 s, README)", "stdout only"),
}
QUICK = ("op-overhead",)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: {', '.join(QUICK)}); --list shows all")
    ap.add_argument("--list", action="store_true", help="print the benchmarks and exit")
    a = ap.parse_args(argv)
    if a.list:
        for name, b in BENCHES.items():
            print(f"{name:18s} {b.what}\n{'':18s} takes {b.takes}; writes {b.writes}")
        return 0
    names = a.names or list(QUICK)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(BENCHES)} "
                         "(python -m benchmarks.run_cpu --list)")
    failed = []
    for i, name in enumerate(names, 1):
        b = BENCHES[name]
        print(f"[{i}/{len(names)}] {name}: {b.what} (takes {b.takes})", flush=True)
        t0 = time.time()
        rc = subprocess.run([sys.executable, *b.args], cwd=ROOT, check=False).returncode
        print(f"[{i}/{len(names)}] {name}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
