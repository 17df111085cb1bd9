"""Where a LoRA micro-batch update spends its *host* time, and where it waits for the GPU.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/update_host_profile.py --out $OUT      # 7B width, 4 layers, GPU

Why. ``benchmarks/lora_update_step.py`` found the update's wall time 10-48 % above the sum of its GPU kernels
(session 18: BF16+LoRA 113 ms on 103 of kernels, NVFP4+LoRA 127 on 104, NVFP4+LoRA with the FP8 dense path 135 on
92): the host sets the pace, so a faster kernel does not shorten the step. Per arm (the same step as
``lora_update_step.py``: checkpointed forward, the rl stage's chunked log-probs, backward, AdamW on the adapter), this
reports

* host ms to issue one step (``perf_counter`` around the call, no synchronization) against its wall ms (to the end
  of its GPU work): host >= wall means the GPU waited for Python;
* the synchronizing calls inside one step (``torch.cuda.set_sync_debug_mode("warn")``: each one drains the GPU's
  queue, so the host's lead is lost there), by the source line that made them;
* the operators with the most host time in one step (``torch.profiler``, CPU activity, self time).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import unittest.mock
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks")]

import fp8_model_step as fms  # the step function
import lora_update_step as lus  # the arms


def host_and_wall(fn, steps: int = 3) -> tuple[float, float]:
    """Mean host ms to issue ``fn`` and mean wall ms to its end on the GPU, over ``steps`` synchronized steps."""
    host = wall = 0.0
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host += t1 - t0
        wall += t2 - t0
    return host * 1e3 / steps, wall * 1e3 / steps


def sync_sites(fn) -> list[tuple[str, int]]:
    """(source line, count) of the synchronizing CUDA calls in one ``fn()``, most frequent first."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                if "synchroniz" in str(w.message).lower())
    return sites.most_common(15)


def host_ops(fn, top: int = 20) -> list[tuple[str, float, int]]:
    """(operator, self host ms, calls) of one ``fn()``, by self CPU time."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [(e.key[:90], e.self_cpu_time_total / 1e3, e.count) for e in rows]


def profile_arm(args, arm: str) -> str:
    fmt, env = lus.parse_arm(arm)
    with unittest.mock.patch.dict(os.environ, env):
        model = lus.build_arm(args.shape, args.layers, fmt, args.lora_r, "cuda")
        ids = torch.randint(0, fms.SHAPES[args.shape][4], (max(args.tokens // args.seq, 1), args.seq), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(0))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
        fn = fms.step_fn(model, opt, ids, "rl")
        for _ in range(2):
            fn()
        host, wall = host_and_wall(fn)
        sites = sync_sites(fn)
        ops = host_ops(fn)
    lines = [f"## {arm}", "", f"host {host:.1f} ms to issue a step, wall {wall:.1f} ms", "",
             "Synchronizing calls in one step (source line: count):", ""]
    lines += [f"- {s}: {n}" for s, n in sites] or ["- none"]
    lines += ["", "| operator | self host ms | calls |", "|---|---:|---:|"]
    lines += [f"| {k} | {ms:.2f} | {n} |" for k, ms, n in ops]
    del model, opt, fn
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="Qwen2.5-7B", choices=sorted(fms.SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8 * 768)
    ap.add_argument("--seq", type=int, default=768)
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--arms", default="bf16,nvfp4,nvfp4:fp8")
    ap.add_argument("--out", default="/tmp/update_host_profile")
    a = ap.parse_args(argv)
    parts = [(f"# Host time of a LoRA micro-batch update, {a.shape} width, {a.layers} layers, {a.tokens} tokens, "
              f"{torch.cuda.get_device_name()}, torch {torch.__version__}")]
    for arm in a.arms.split(","):
        parts.append(profile_arm(a, arm))
        print(parts[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "update_host_profile.md").write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
