"""Host time per training call of a frozen base linear on CUDA: ``nn.Linear`` (BF16) vs the 4-bit ``QuantLinear``.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/train_linear_host.py --out $OUT/host      # a CUDA device

Why. The LoRA update's NVFP4 micro-batch leaves the GPU idle longer than BF16's (benchmarks/lora_update_step.py:
6.0 vs 8.3 ms idle in a 4-layer step, RESULTS "Issue 17, session 12"): host time. ``op_overhead_cpu.py`` times the
Python entry points on a CPU, where the 4-bit path runs the reference dequantize instead of the Triton kernel; this
times the real CUDA path -- the dispatch, ``recent_weights``, the dequantize kernel's launch, cuBLAS -- on a weight
so small that the GPU finishes each call long before the host issues the next, so wall time per call *is* host
time. Per arm, ``--calls`` forward + backward calls of ``x [M, K] -> y [M, N]`` (M >= the dense path's threshold,
as in the update; ``x`` requires grad as a LoRA-wrapped base's input does, the weight is frozen), timed from the
first launch to a final synchronize; then one ``cProfile`` run of the 4-bit arm, whose top functions by own time
say where its host time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]


def call_fn(lin: nn.Module, x: torch.Tensor):
    """One training call: forward with grad, a scalar of it backward (as the update's chain rule reaches it)."""

    def call():
        lin(x).sum().backward()
    return call


def host_us(fn, calls: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def gpu_us(fn, calls: int) -> float:
    """GPU time per call (CUDA events around the same loop): if this is close to host_us the GPU, not the host,
    bounds the loop and host_us over-states the host time."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
    kernels = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return kernels / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=512, help="tokens (>= the dense path's threshold, as in the update)")
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--formats", default="nvfp4", help="4-bit formats to time beside BF16 (comma-separated)")
    ap.add_argument("--out", default="/tmp/train_linear_host")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("train_linear_host.py needs a CUDA device (op_overhead_cpu.py is the CPU counterpart)")
    import quarl_kernels  # noqa: F401 -- registers the kernels

    from quarl.quant import QuantLinear

    torch.manual_seed(0)
    base = nn.Linear(a.k, a.n, bias=False, dtype=torch.bfloat16, device="cuda").requires_grad_(False)
    x = torch.randn(a.m, a.k, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    arms = {"bf16 nn.Linear": base}
    for fmt in a.formats.split(","):
        arms[f"{fmt} QuantLinear"] = QuantLinear.from_linear(base, fmt).cuda()
    rows = []
    for name, lin in arms.items():
        fn = call_fn(lin, x)
        rows.append({"arm": name, "host_us": host_us(fn, a.calls), "gpu_us": gpu_us(fn, min(a.calls, 200))})
        print(json.dumps(rows[-1]), flush=True)
    prof = cProfile.Profile()
    fn = call_fn(list(arms.values())[-1], x)
    prof.enable()
    for _ in range(200):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bf = rows[0]["host_us"]
    lines = [(f"# host time per training call (forward + backward), x [{a.m}, {a.k}] -> [{a.m}, {a.n}], "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}"), "",
             "| arm | host us per call | GPU kernel us per call | host - BF16's us |", "|---|---:|---:|---:|"]
    lines += [f"| {r['arm']} | {r['host_us']:.1f} | {r['gpu_us']:.1f} | {r['host_us'] - bf:+.1f} |" for r in rows]
    lines += ["", f"cProfile of 200 calls of {list(arms)[-1]} (own time first):", "", "```", buf.getvalue().strip(),
              "```"]
    text = "\n".join(lines)
    (out / "train_linear_host.md").write_text(text + "\n")
    (out / "train_linear_host.json").write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
