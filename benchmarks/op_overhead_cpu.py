"""Host time per call of the 4-bit linear's entry points, on CPU with a tiny weight (the arithmetic is negligible).

    .venv/bin/python benchmarks/op_overhead_cpu.py

Why. The LoRA update's micro-batch calls the frozen base ~600 times (7 projections x 28 layers x forward,
checkpointed recompute, backward), and the update phase is partly host-bound (benchmarks/lora_update_step.py: the
GPU idles 6-18 ms of a 4-layer micro-batch). This times the Python-side cost of each way in: ``F.linear`` (the BF16
base), ``torch.ops.quarl.wo_linear`` (the custom op; with autograd through ``torch.library.register_autograd``) and
``quarl_kernels.ops.WoLinearEager`` (the same kernels and backward as a plain ``torch.autograd.Function``), each with
grad and without; the reference dequantize that the CPU path runs inside both is timed alone and subtracted, so
the "overhead" column is what the GPU path pays too (its kernels are asynchronous launches instead).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

import quarl_kernels  # noqa: F401 -- registers torch.ops.quarl
from quarl_kernels.ops import WoLinearEager, _reference_weight, layer_args

from quarl.quant import QuantLinear


def per_call_us(fn, n: int = 3000) -> float:
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    torch.manual_seed(0)
    lin = QuantLinear.from_linear(nn.Linear(64, 32), "nvfp4")
    args = layer_args(lin)
    x = torch.randn(2, 64, requires_grad=True)
    w = torch.randn(32, 64)
    deq = per_call_us(lambda: _reference_weight(*args, torch.float32))
    rows = [("F.linear", per_call_us(lambda: F.linear(x, w)), 0.0)]
    rows.append(("torch.ops.quarl.wo_linear", per_call_us(lambda: torch.ops.quarl.wo_linear(x, *args)), deq))
    rows.append(("ops.WoLinearEager", per_call_us(lambda: WoLinearEager.apply(x, *args)), deq))
    with torch.no_grad():
        rows.append(("torch.ops.quarl.wo_linear, no grad", per_call_us(lambda: torch.ops.quarl.wo_linear(x, *args)),
                     deq))
    print(f"torch {torch.__version__}; reference dequantize alone {deq:.1f} us (subtracted below)\n")
    print("| entry (grad unless noted) | us per call | overhead us (minus the dequantize) |")
    print("|---|---:|---:|")
    for name, us, sub in rows:
        print(f"| {name} | {us:.1f} | {us - sub:.1f} |")


if __name__ == "__main__":
    main()
