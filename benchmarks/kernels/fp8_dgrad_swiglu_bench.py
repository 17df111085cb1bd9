"""The down DGrad with SwiGLU's backward in its epilogue (``quarl_kernels.fp8_dgrad_swiglu``) against the path it
would replace: DeepGEMM's DGrad writing dh, then SwiGLU's backward pass (Jet-RL, issue 15, session 32).

    PYTHONPATH=$PWD:$PWD/kernels:/tmp/dg python3 benchmarks/kernels/fp8_dgrad_swiglu_bench.py --out $OUT/dgrad
    TRITON_INTERPRET=1 python3 benchmarks/kernels/fp8_dgrad_swiglu_bench.py --device cpu --models tiny --tokens 256 \
        --iters 1 --out /tmp/dgrad                                                          # a dry run of the script

At each model's width and ``--tokens`` tokens, on the operands the fused MLP's backward passes (dY in 1x128 groups,
the down weight's transposed 128x128 tiles, g and u the column blocks of one stacked [T, 2I] output; dg's and du's
operands in both groupings, the row groups stacked): the two-kernel path (the library's GEMM -- DeepGEMM where it
imports -- then ``fp8_swiglu.swiglu_grad_operands`` at its run-time choice), each of its parts alone, the fused
kernel at every setting, and the fused kernel's GEMM alone (``dgrad_only``: its K loop without the epilogue), so a
loss can be placed: the Triton GEMM slower than DeepGEMM's, or the epilogue costing more than the pass it replaces.
``stream_time`` (CUDA events, ``--iters`` calls after two warm-ups), ms.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "kernels")]

from fp8_linear import stream_time  # the FP8 benchmarks' timer
from outputs import write_outputs

WIDTHS = {"Qwen2.5-7B": (3584, 18944), "Qwen3-8B": (4096, 12288), "Qwen2.5-32B": (5120, 27648), "tiny": (256, 384)}


def paths(tokens: int, h: int, inter: int, device: str = "cuda") -> dict:
    """The timed callables on fresh operands of one width."""
    from quarl_kernels import fp8_dgrad_swiglu as fd

    from quarl.quant import fp8_linear as fl
    from quarl.quant import fp8_swiglu as fsw

    torch.manual_seed(0)
    dy = torch.randn(tokens, h, device=device).to(torch.bfloat16)
    wd = (torch.randn(h, inter, device=device) * 0.02).to(torch.bfloat16)
    gu = (torch.randn(tokens, 2 * inter, device=device) * 2).to(torch.bfloat16)
    g, u = gu[:, :inter], gu[:, inter:]
    mt = -(-tokens // 128) * 128
    dq, ds = fl._master_tiles(wd)
    dyq, dys, _, _ = fl.quantize_act_gemm(dy, tokens, dq.shape[0], None)
    wdt, wdts = fl._transposed(dq), fl._scales_t(ds)

    def two_kernels():
        dh = fl.blockwise_gemm(dyq, dys, wdt, wdts, True, torch.bfloat16)[:tokens, :inter]
        return fsw.swiglu_grad_operands(dh, g, u, tokens, inter, mt, True, stacked=True)

    dh0 = fl.blockwise_gemm(dyq, dys, wdt, wdts, True, torch.bfloat16)[:tokens, :inter]
    out = {
        "GEMM, then SwiGLU's backward pass": two_kernels,
        "  the GEMM alone (library)": lambda: fl.blockwise_gemm(dyq, dys, wdt, wdts, True, torch.bfloat16),
        "  the pass alone": lambda: fsw.swiglu_grad_operands(dh0, g, u, tokens, inter, mt, True, stacked=True),
        "fused, its GEMM alone (Triton)": lambda: fd.dgrad_only(dyq, dys, wdt, wdts, tokens, inter),
    }
    for st in fd.SETTINGS:
        def fused(st=st):
            o, _ = fsw._stacked_outputs(g, tokens, inter, mt)
            return fd.dgrad_swiglu_operands(dyq, dys, wdt, wdts, g, u, tokens, inter, mt, out=o, setting=st)
        out[f"fused {st}"] = fused
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen2.5-7B,Qwen2.5-32B")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (a dry run)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.device == "cpu":
        import os

        os.environ.setdefault("QUARL_FP8_QUANT", "triton")  # the Triton quantizers, interpreted
    from quarl.quant import fp8_linear

    info = {"gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "tokens": a.tokens, "gemm": fp8_linear.gemm_backend(),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    rows = []
    for model in a.models.split(","):
        h, inter = WIDTHS[model]
        for name, fn in paths(a.tokens, h, inter, a.device).items():
            try:
                ms = stream_time(fn, a.iters, a.device)
            except Exception as e:  # noqa: BLE001 -- a setting that fails to compile or launch is reported, not fatal
                ms, err = None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            else:
                err = None
            row = {"model": model, "path": name, "ms": ms, "error": err}
            print(json.dumps(row), flush=True)
            rows.append(row)
        if a.device == "cuda":
            torch.cuda.empty_cache()
    title = (f"# the down DGrad + SwiGLU's backward, two kernels vs fused, {info['gpu']}, {a.tokens} tokens, GEMMs "
             f"{info['gemm']}, {info['date']}")
    L = [title, "", "| model | path | ms |", "|---|---|---:|"]
    L += [f"| {r['model']} | {r['path']} | {r['ms']:.3f} |" if r["ms"] is not None
          else f"| {r['model']} | {r['path']} | {r['error']} |" for r in rows]
    write_outputs(a.out, "fp8_dgrad_swiglu", info, rows, "\n".join(L) + "\n")


if __name__ == "__main__":
    main()
