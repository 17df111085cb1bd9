"""One launch per GEMV config under Nsight Compute: where the decode GEMV's time goes.

    ncu --clock-control none --profile-from-start off -k regex:_gemv_kernel \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/kernels/profile_gemv.py [--spec nvfp4] [--n 18944] [--k 3584] [--m 1] [--configs 1,3,7]

Kernels are compiled and run once before the profiler starts (``cudaProfilerStart``),
so ncu sees exactly one launch per listed config (indices into
``gemv.GEMV_CONFIGS``). ``--clock-control none`` leaves the GPU clocks as found.
"""

from __future__ import annotations

import argparse

import torch
from quarl_kernels import gemv
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="nvfp4")
    ap.add_argument("--n", type=int, default=18944)
    ap.add_argument("--k", type=int, default=3584)
    ap.add_argument("--m", default="1", help="comma-separated token counts")
    ap.add_argument("--configs", default="1,3,7")
    args = ap.parse_args()
    cfg = make_config(args.spec)
    torch.manual_seed(0)
    q = get_format(cfg.name).quantize(torch.randn(args.n, args.k, device="cuda") * 0.03, cfg)
    t = q.tensors
    pw = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                        t.get("weight_global_scale"), cfg.name, cfg.block_size, args.n, args.k)
    runs = [(int(m), gemv.GEMV_CONFIGS[int(c)]) for m in args.m.split(",") for c in args.configs.split(",")]
    xs = {m: torch.randn(m, args.k, device="cuda").to(torch.bfloat16) for m, _ in runs}
    for m, c in runs:  # compile + warm
        gemv.launch_gemv(xs[m], pw, c)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for m, c in runs:
        print(f"profiling M={m} {c}", flush=True)
        gemv.launch_gemv(xs[m], pw, c)
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
