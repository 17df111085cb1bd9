"""The fused FP8 MLP with one of its switches on against off, forward and backward (Jet-RL, issue 15): by default
gate and up as one stacked GEMM against two.

    PYTHONPATH=$PWD:$PWD/kernels:/tmp/dg python3 benchmarks/kernels/fp8_mlp_stack_bench.py --out $OUT/mlp_stack

``quarl.quant.fp8_swiglu.fp8_swiglu`` at a model's width (BF16 master weights, X^T in 128x128 tiles as the rl stage's
Jet-RL recipe), timed with ``QUARL_FP8_STACK=1`` (gate / up one GEMM forward and one DGrad, no BF16 add of the two
DGrads) and ``=0`` (two of each, on copies of the weights: a stacked weight's tile cache is a block of the stack, its
transposed tiles a strided column block) in alternating rounds on the same inputs: each round times ``--iters``
forward + backward calls per mode with CUDA events, the medians of the rounds are reported. The whole actor update
moves by ~0.7 ms a layer between runs of one code (RESULTS.md "Session 31"), more than such a change should save;
this isolates it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks" / "kernels")]

from outputs import write_outputs

WIDTHS = {"Qwen2.5-7B": (3584, 18944), "Qwen3-8B": (4096, 12288), "Qwen2.5-32B": (5120, 27648)}


def time_model(model: str, tokens: int, iters: int, rounds: int, switch: str = "QUARL_FP8_STACK") -> dict:
    """One width: forward + backward and forward alone with ``switch`` at 1 and at 0, ms per call (median of
    rounds)."""
    from quarl.quant.fp8_swiglu import fp8_swiglu

    h, inter = WIDTHS[model]
    torch.manual_seed(0)
    ws = [(torch.randn(*s, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_()
          for s in ((inter, h), (inter, h), (h, inter))]
    # the switch's off side on copies of the weights: once stacked, a weight's tile cache is a block of the stack (its
    # transposed tiles a column block, row stride 2I), which is not what an unstacked run reads
    ws2 = [w.detach().clone().requires_grad_() for w in ws]
    x = torch.randn(tokens, h, device="cuda").to(torch.bfloat16).requires_grad_()
    dy = torch.randn(tokens, h, device="cuda").to(torch.bfloat16)

    def step(backward: bool = True):
        w = ws if os.environ[switch] == "1" else ws2
        y = fp8_swiglu(x, *w, wgrad="tiles")
        if backward:
            y.backward(dy)
            for t in (x, *w):
                t.grad = None

    times = {("1", True): [], ("0", True): [], ("1", False): [], ("0", False): []}
    for mode in ("1", "0"):  # warm: the quantizers' launch choice, the GEMMs' JIT
        os.environ[switch] = mode
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for (mode, bwd), got in times.items():
            os.environ[switch] = mode
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.set_grad_enabled(bwd):
                s.record()
                for _ in range(iters):
                    step(bwd)
                e.record()
            torch.cuda.synchronize()
            got.append(s.elapsed_time(e) / iters)
    return {"model": model, "h": h, "inter": inter, "switch": switch,
            **{f"{'on' if m == '1' else 'off'} {'fwd+bwd' if b else 'fwd'} ms": statistics.median(t)
               for (m, b), t in times.items()},
            "rounds": {f"{m},{b}": t for (m, b), t in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen2.5-7B")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--switch", default="QUARL_FP8_STACK", choices=("QUARL_FP8_STACK",))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from quarl.quant import fp8_linear

    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": a.tokens,
            "gemm": fp8_linear.gemm_backend(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    rows = []
    for model in a.models.split(","):
        row = time_model(model, a.tokens, a.iters, a.rounds, a.switch)
        print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    title = (f"# fused FP8 MLP, {a.switch}=1 vs 0, {info['gpu']}, {a.tokens} tokens, GEMMs {info['gemm']}, "
             f"{info['date']}")
    L = [title, "", "| model | H x I | off fwd+bwd ms | on fwd+bwd ms | x | off fwd ms | on fwd ms |",
         "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, st = r["off fwd+bwd ms"], r["on fwd+bwd ms"]
        L.append(f"| {r['model']} | {r['h']} x {r['inter']} | {t:.3f} | {st:.3f} | {t / st:.3f}x | "
                 f"{r['off fwd ms']:.3f} | {r['on fwd ms']:.3f} |")
    write_outputs(a.out, "fp8_mlp_stack", info, rows, "\n".join(L) + "\n")


if __name__ == "__main__":
    main()
