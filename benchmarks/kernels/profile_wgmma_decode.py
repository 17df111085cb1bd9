"""One launch per decode-GEMM config at M = 17..64 under Nsight Compute: where the time goes.

    ncu --clock-control none --profile-from-start off -k regex:"wgmma|splitk" \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \\
        python3 benchmarks/kernels/profile_wgmma_decode.py [--spec nvfp4] [--shapes 18944x3584,3584x3584] \\
        [--m 64] [--configs 1,0]

Each listed config is compiled and run once before the profiler starts (``cudaProfilerStart``),
so ncu sees one launch (plus its split-K reduction) per (shape, M, config). Configs are
indices into ``wgmma_decode.WGMMA_DECODE_CONFIGS``, or ``rI`` into ``wgmma_ring.RING_CONFIGS``
(the TMA-ring kernel; its kernel name also matches ``wgmma``). ``--clock-control none`` leaves the GPU
clocks as found (the device README's rule).
"""

from __future__ import annotations

import argparse

import torch
from quarl_kernels import wgmma_decode
from quarl_kernels.ops import _packed_weight

from quarl.quant import get_format, make_config


def _config(c: str):
    if c.startswith("r"):
        from quarl_kernels import wgmma_ring

        return wgmma_ring.RING_CONFIGS[int(c[1:])]
    return wgmma_decode.WGMMA_DECODE_CONFIGS[int(c)]


def _launch(x, pw, cfg):
    if str(cfg).startswith("ring-"):
        from quarl_kernels import wgmma_ring

        return wgmma_ring.launch_wgmma_ring(x, pw, cfg)
    return wgmma_decode.launch_wgmma_decode(x, pw, cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="nvfp4")
    ap.add_argument("--shapes", default="18944x3584,3584x3584", help="comma-separated NxK")
    ap.add_argument("--m", default="64", help="comma-separated token counts (17..64)")
    ap.add_argument("--configs", default="1,0", help="indices into WGMMA_DECODE_CONFIGS, rI into RING_CONFIGS")
    args = ap.parse_args()
    qcfg = make_config(args.spec)
    torch.manual_seed(0)
    runs = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        q = get_format(qcfg.name).quantize(torch.randn(n, k, device="cuda") * 0.03, qcfg)
        t = q.tensors
        pw = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                            t.get("weight_global_scale"), qcfg.name, qcfg.block_size, n, k)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            for c in args.configs.split(","):
                cfg = _config(c)
                runs.append((f"{n}x{k} M={m} {cfg}", x, pw, cfg))
    for _, x, pw, c in runs:  # compile + warm
        _launch(x, pw, c)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, x, pw, c in runs:
        print(f"profiling {label}", flush=True)
        _launch(x, pw, c)
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
