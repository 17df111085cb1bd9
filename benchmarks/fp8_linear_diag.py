"""Where the FP8 training linear's time goes on the GPU (a follow-up to benchmarks/fp8_linear.py).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/fp8_linear_diag.py --out $OUT

1. Which compiled quantizer differs from the eager one (bytes that differ), per quantizer.
2. One decoder layer (Qwen2.5-7B shapes) forward + backward at M tokens: eager-launched
   (CUDA events; includes host gaps) with the fused (Triton), compiled and eager quantizers
   (``QUARL_FP8_QUANT``), and the same
   step captured in a CUDA graph (GPU time only, no host overhead), FP8 vs BF16.
3. The CUDA kernels of one FP8 forward + backward of the gate projection, by total time
   (fused quantizers; ``PROFILE_QUANT=eager`` for the earlier profile).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_linear import MODELS, cuda_time, projections

from quarl.quant.formats import fp8
from quarl.quant.fp8_linear import _tiles_padded, fp8_linear


def bit_identity() -> dict:
    torch.manual_seed(0)
    x = torch.randn(4096, 3584, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(18944, 3584, device="cuda", dtype=torch.bfloat16) * 0.02
    out = {}
    comp = torch.compile(fp8.quantize_act_1x128, dynamic=True)
    for name, t in (("act_1x128", x), ("act_128x1_transposed", x.t())):
        qc, sc = comp(t)
        qe, se = fp8.quantize_act_1x128(t)
        out[name] = {"bytes_differ": int((qc.contiguous().view(torch.uint8) != qe.contiguous().view(torch.uint8)).sum()),
                     "scales_differ": int((sc != se).sum()), "numel": t.numel()}
    qc, sc = torch.compile(_tiles_padded, dynamic=True)(w)
    qe, se = _tiles_padded(w)
    out["weight_128x128"] = {"bytes_differ": int((qc.view(torch.uint8) != qe.view(torch.uint8)).sum()),
                             "scales_differ": int((sc != se).sum()), "numel": w.numel()}
    return out


def layer_step(kind: str, m: int, model: str):
    h, inter, q, kv, _ = MODELS[model]
    ps = []
    for _, n, k in projections(h, inter, q, kv):
        ps.append((torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True),
                   torch.nn.Parameter(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02),
                   torch.randn(m, n, device="cuda", dtype=torch.bfloat16)))
    f = F.linear if kind == "bf16" else fp8_linear

    def step():
        for x, w, g in ps:
            with torch.no_grad():
                w.mul_(1.0)
            x.grad = w.grad = None
            f(x, w).backward(g)

    return step


def graphed(step, iters):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return cuda_time(g.replay, iters)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tokens", default="8192")
    ap.add_argument("--iters", type=int, default=6)
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "bit_identity": bit_identity(),
           "layer": []}
    print(json.dumps(res["bit_identity"]), flush=True)
    for m in (int(t) for t in args.tokens.split(",")):
        row = {"model": "Qwen2.5-7B", "tokens": m}
        for kind, quant in (("bf16", "triton"), ("fp8", "triton"), ("fp8", "compile"), ("fp8", "eager")):
            os.environ["QUARL_FP8_QUANT"] = quant
            step = layer_step(kind, m, "Qwen2.5-7B")
            key = kind if kind == "bf16" else f"fp8_{quant}"
            row[f"{key}_eager_ms"] = cuda_time(step, args.iters)
            try:
                row[f"{key}_graph_ms"] = graphed(step, args.iters)
            except Exception as e:  # noqa: BLE001 - report, do not stop the run
                row[f"{key}_graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            del step
            torch.cuda.empty_cache()
        res["layer"].append(row)
        print(json.dumps(row), flush=True)
    os.environ["QUARL_FP8_QUANT"] = os.environ.get("PROFILE_QUANT", "triton")
    x = torch.randn(8192, 3584, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(18944, 3584, device="cuda", dtype=torch.bfloat16) * 0.02)
    g = torch.randn(8192, 18944, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        fp8_linear(x, w).backward(g)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.no_grad():
            w.mul_(1.0)
        fp8_linear(x, w).backward(g)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
    res["profile_gate_8192"] = table
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fp8_linear_diag.json").write_text(json.dumps(res, indent=1))
    print(table)


if __name__ == "__main__":
    main()
