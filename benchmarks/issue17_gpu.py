"""Issue 17's device call: the decode-step profile and the peer kernel library, in one command.

    pip install --no-deps .whl/gemlite-0.5.1.post1-py3-none-any.whl
    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/issue17_gpu.py --budget-s 275 --out $OUT
    python3 benchmarks/issue17_gpu.py --device cpu --out /tmp/i17      # the dry run (tiny shapes)

Runs, each as its own process with its own share of ``--budget-s`` (a process that overruns
its share by more than ``--grace-s`` is killed; whatever JSON it wrote stays):

1. ``benchmarks/kernels/bench_peer.py`` -- quarl's NVFP4/MXFP4 decode kernels beside gemlite
   (INT4 g64, shipped H100 configs) and torch's tinygemm INT4 and cuBLAS BF16, on the 7B/14B
   layer shapes at M = 1..64 and 2048. First, because its spawn workers compile the quarl
   kernels for the 7B shapes in parallel, which the profile then finds in the Triton cache.
2. ``benchmarks/rollout_profile.py`` -- where the 7B decode step's time goes, BF16 / NVFP4 /
   NVFP4+LoRA r32 (fp32 adapter as the trainer keeps it, and bf16 as ``rollout.py`` had it), each
   LoRA variant before (``:nopack``) and after the packed adapters of ``quarl.engine.lora``, at
   batch 1 / 8 / 64.

Outputs under ``--out``: ``peer/peer.json``, ``profile/profile.json``, ``peer.log``,
``profile.log``, ``summary.md`` (both tables; also printed last).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_step(name: str, cmd: list[str], budget_s: float, grace_s: float, out: Path) -> dict:
    t = time.perf_counter()
    log = out / f"{name}.log"
    print(f"== {name}: {' '.join(cmd)} (budget {budget_s:.0f}s)", flush=True)
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = p.wait(timeout=budget_s + grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "killed (over budget)"
    wall = time.perf_counter() - t
    tail = log.read_text().splitlines()[-6:]
    print(f"== {name}: rc {rc}, {wall:.0f}s; log tail:\n   " + "\n   ".join(tail), flush=True)
    return {"rc": rc, "wall_s": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=275.0, help="the whole call, both steps")
    ap.add_argument("--peer-share", type=float, default=0.33, help="fraction of the budget for the kernel sweep")
    ap.add_argument("--grace-s", type=float, default=15.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/issue17"))
    ap.add_argument("--device", default="cuda", help="cpu: the dry run (tiny model and shapes)")
    ap.add_argument("--peer-impls", help="bench_peer.py --impls (default: its own list)")
    ap.add_argument("--profile-variants", help="rollout_profile.py --variants (default: its own list)")
    ap.add_argument("--profile-batches", help="rollout_profile.py --batches (default 1,8,64)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    cpu = args.device == "cpu"
    peer_s = args.budget_s * args.peer_share
    steps = {}
    peer_cmd = [py, str(HERE / "kernels" / "bench_peer.py"), "--out", str(out / "peer"), "--budget-s", f"{peer_s:.0f}",
                "--device", args.device]
    if args.peer_impls:
        peer_cmd += ["--impls", args.peer_impls]
    steps["peer"] = run_step("peer", peer_cmd, peer_s, args.grace_s, out)
    prof_s = args.budget_s - (time.perf_counter() - t0) - 5
    prof_cmd = [py, str(HERE / "rollout_profile.py"), "--out", str(out / "profile"), "--budget-s", f"{prof_s:.0f}",
                "--device", args.device]
    if cpu:
        prof_cmd += ["--models", "tiny", "--prompt", "16", "--steps", "4", "--prof-steps", "2", "--check-tokens", "5"]
    for flag, val in (("--variants", args.profile_variants), ("--batches", args.profile_batches)):
        if val:
            prof_cmd += [flag, val]
    steps["profile"] = run_step("profile", prof_cmd, prof_s, args.grace_s, out)

    parts = [f"issue 17 device call: {json.dumps(steps)}; wall {time.perf_counter() - t0:.0f}s", ""]
    for name, script, path in (("kernel sweep", "kernels/bench_peer.py", out / "peer" / "peer.json"),
                               ("decode-step profile", "rollout_profile.py", out / "profile" / "profile.json")):
        if path.exists():
            rep = subprocess.run([py, str(HERE / script), "--report", str(path)], capture_output=True, text=True,
                                 check=False)
            parts += [f"## {name}", "", rep.stdout or rep.stderr[-2000:], ""]
        else:
            parts += [f"## {name}: no JSON written", ""]
    summary = "\n".join(parts)
    (out / "summary.md").write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
