"""Host cost of one large-M dense-path call, BF16 vs FP8 (``QUARL_KERNELS_DENSE_FP8``): is a call blocking?

Session 18's LoRA update (``benchmarks/lora_update_step.py``) ran 152 ms a micro-batch with the FP8 dense path
against 115 ms without, while its GPU kernels summed to 91 ms against 103: the host, not the GPU, set the time. This
times each call shape of a 7B decoder layer at the update's 6144 rows: host microseconds per call while queueing 50
calls (no synchronization) against wall microseconds per call once they have run. A call whose host time equals its
wall time waits for the GPU (a synchronization inside); a cProfile of 20 calls of the FP8 path names where the host
time goes.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/dense_host_cost.py --out $OUT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch
from bench_gemv import _quantized
from quarl_kernels import dense, dense_fp8


def _per_call(f, calls: int = 50) -> tuple[float, float]:
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def _calls(x: torch.Tensor, dy: torch.Tensor, pw) -> dict:
    return {"dense fwd": lambda: dense.dense_matmul(x, pw), "dense dgrad": lambda: dense.dense_matmul_t(dy, pw),
            "fp8 fwd": lambda: dense_fp8.matmul(x, pw), "fp8 dgrad": lambda: dense_fp8.matmul_t(dy, pw),
            "fp8 expand": lambda: dense_fp8.expand(pw)}


def gemm_calls(m: int) -> list[str]:
    """Host cost of the FP8 GEMM entry points on the same operands: ``F.scaled_mm`` (what ``blockwise_gemm`` calls),
    the legacy ``torch._scaled_mm`` with the same blockwise scales (if this torch takes them), and BF16 ``mm``."""
    import torch.nn.functional as F

    from quarl.quant import fp8_linear

    n = k = 3584
    _, _, pw = _quantized("nvfp4", n, k, 7)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    q, s = dense_fp8.expand(pw)
    aq, sa, _, _ = fp8_linear.quantize_act_gemm(x, m, k)
    wb = dense.dequantize(pw)
    ref = fp8_linear.blockwise_gemm(aq, sa, q, s, True, torch.bfloat16)
    cands = {
        "F.scaled_mm (blockwise_gemm's)": lambda: F.scaled_mm(aq, q.t(), sa, F.ScalingType.BlockWise1x128, s.t(),
                                                             F.ScalingType.BlockWise128x128,
                                                             output_dtype=torch.bfloat16),
        "torch._scaled_mm, scale_b [K/128, N/128]": lambda: torch._scaled_mm(aq, q.t(), sa, s.t(),
                                                                             out_dtype=torch.bfloat16),
        "blockwise_gemm": lambda: fp8_linear.blockwise_gemm(aq, sa, q, s, True, torch.bfloat16),
        "bf16 mm": lambda: x @ wb.T,
    }
    out = []
    for name, f in cands.items():
        try:
            y = f()
            same = "-" if name == "bf16 mm" else str(torch.equal(y, ref))
            h, w = _per_call(f)
            out.append(f"| {name} | {h:.1f} | {w:.1f} | {same} |")
        except Exception as e:  # noqa: BLE001 - a call this torch refuses is a result too
            out.append(f"| {name} | refused: {type(e).__name__}: {str(e).splitlines()[0][:100]} | | |")
    return out


def training_calls(m: int) -> tuple[list[str], str]:
    """Host cost of the base projection as the trainer calls it (``ops.WoLinearEager``, x requiring grad, inside
    ``recent_weights.keeping``: ``registration.forward``'s path) against the op's kernel alone and ``dense_matmul``;
    and a cProfile of 50 trainer-path calls by cumulative time (where its Python goes)."""
    from quarl_kernels import recent_weights
    from quarl_kernels.ops import WoLinearEager, _wo_linear_cuda

    n = k = 3584
    _, q, pw = _quantized("nvfp4", n, k, 11)
    t = q.tensors
    args = (t["weight_packed"], t["weight_scale"], None, t["weight_global_scale"], "nvfp4", 16, n, k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    xg = x.clone().requires_grad_(True)

    def trainer_call():
        with recent_weights.keeping(True):
            return WoLinearEager.apply(xg, *args)

    cands = {"dense.dense_matmul": lambda: dense.dense_matmul(x, pw), "op kernel (_wo_linear_cuda)":
             lambda: _wo_linear_cuda(x, *args), "trainer path (WoLinearEager, keeping)": trainer_call}
    rows = []
    for name, f in cands.items():
        h, w = _per_call(f)
        rows.append(f"| {name} | {h:.1f} | {w:.1f} |")
    recent_weights.release()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        trainer_call()
    pr.disable()
    torch.cuda.synchronize()
    recent_weights.release()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30)
    return rows, f"\n## cProfile, 50 trainer-path calls (3584 x 3584, {m} rows), by cumulative time\n\n{s.getvalue()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--m", type=int, default=6144)
    args = ap.parse_args()
    lines = [f"# host / wall us per call, M = {args.m}, {torch.cuda.get_device_name()}", "",
             "| N x K | call | host us | wall us |", "|---|---|---:|---:|"]
    prof_text = ""
    for n, k in ((3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)):
        _, _, pw = _quantized("nvfp4", n, k, n + k)
        x = torch.randn(args.m, k, device="cuda").to(torch.bfloat16)
        dy = torch.randn(args.m, n, device="cuda").to(torch.bfloat16)
        calls = _calls(x, dy, pw)
        for name, f in calls.items():
            h, w = _per_call(f)
            lines.append(f"| {n} x {k} | {name} | {h:.1f} | {w:.1f} |")
            print(lines[-1], flush=True)
        if (n, k) == (3584, 3584):
            for name in ("fp8 fwd", "fp8 dgrad"):
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(20):
                    calls[name]()
                pr.disable()
                torch.cuda.synchronize()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
                prof_text += f"\n## cProfile, 20 calls of {name} ({n} x {k}), by own time\n\n{s.getvalue()}"
    lines += ["", "The GEMM calls alone (3584 x 3584, operands ready): host / wall us per call", "",
              "| call | host us | wall us | equal to F.scaled_mm |", "|---|---:|---:|---|"]
    calls = gemm_calls(args.m)
    lines += calls
    print("\n".join(calls), flush=True)
    lines += ["", "The base projection as the trainer calls it (3584 x 3584): host / wall us per call", "",
              "| call | host us | wall us |", "|---|---:|---:|"]
    rows, trainer_prof = training_calls(args.m)
    lines += rows
    prof_text += trainer_prof
    print("\n".join(rows), flush=True)
    text = "\n".join(lines) + "\n" + prof_text
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dense_host_cost.md"), "w") as f:
        f.write(text)
    print(prof_text)


if __name__ == "__main__":
    main()
