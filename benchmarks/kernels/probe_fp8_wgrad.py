"""Each launch setting of the Triton WGrad GEMM (``benchmarks/kernels/fp8_wgrad_triton.py``) alone: does it finish, is it right, how
fast is it at the WGrad shapes of a Qwen2.5-7B / Qwen3-8B layer -- beside cuBLAS's 1x128 x 1x128 ``scaled_mm`` and
BF16 ``torch.mm`` on the same data.

    python3 benchmarks/kernels/probe_fp8_wgrad.py --baseline --out $OUT/probe.jsonl      # cuBLAS + BF16 rows
    python3 benchmarks/kernels/probe_fp8_wgrad.py --setting 128,128,8,3,0 --out $OUT/probe.jsonl
    python3 benchmarks/kernels/probe_fp8_wgrad.py --render $OUT/probe.jsonl

Why a process per setting: the first session-8 device call hung inside the WGrad autotuning (the GPU tests, the
GEMM table and the layer step all stopped at their first Triton WGrad call), and a hung kernel cannot be caught
in-process. ``benchmarks/gpu_session8.sh`` runs one process per candidate under ``timeout``; a setting that does
not finish leaves no row. Each row: the setting, the relative L2 distance to cuBLAS on a checked shape, and the
median ms of ``--iters`` CUDA-event intervals per WGrad shape (dW = dY^T X, M = out features, N = in features,
T = tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "kernels")]

from fp8_linear import cuda_time  # the benchmarks' CUDA-event timer

from quarl.quant import fp8_linear as fl

# WGrad shapes of one layer (M = out, N = in) and how many projections have each
LAYERS = {
    "Qwen2.5-7B": {(3584, 3584): 2, (512, 3584): 2, (18944, 3584): 2, (3584, 18944): 1},
    "Qwen3-8B": {(4096, 4096): 2, (1024, 4096): 2, (12288, 4096): 2, (4096, 12288): 1},
}


def operands(m: int, n: int, t: int):
    torch.manual_seed(0)
    dy = torch.randn(t, m, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    _, _, aq, sa = fl.quantize_act_gemm(dy, t, -(-m // 128) * 128, -(-t // 128) * 128, row_groups=False)
    _, _, bq, sb = fl.quantize_act_gemm(x, t, -(-n // 128) * 128, -(-t // 128) * 128, row_groups=False)
    return dy, x, aq, sa, bq, sb


def time_shape(m: int, n: int, t: int, setting, a) -> float | dict:
    """ms of the Triton kernel at ``setting`` on one WGrad shape, or (``setting`` None) of cuBLAS and BF16."""
    import fp8_wgrad_triton as fw

    dy, x, aq, sa, bq, sb = operands(m, n, t)
    if setting is None:
        return {"cublas": cuda_time(lambda: fl.blockwise_gemm(aq, sa, bq, sb, False, torch.bfloat16), a.iters, warmup=2),
                "bf16": cuda_time(lambda: torch.mm(dy.t(), x), a.iters, warmup=2)}
    return cuda_time(lambda: fw.wgrad_1d1d(aq, sa, bq, sb, torch.bfloat16, setting=setting), a.iters, warmup=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", default="", help="BLOCK_M,BLOCK_N,warps,stages,tma")
    ap.add_argument("--baseline", action="store_true", help="cuBLAS's 1x128 x 1x128 GEMM and BF16 torch.mm")
    ap.add_argument("--tokens", default="8192,16384")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="/tmp/probe.jsonl")
    ap.add_argument("--render", default="")
    a = ap.parse_args()
    if a.render:
        print(render([json.loads(line) for line in Path(a.render).read_text().splitlines() if line.strip()]))
        return
    import fp8_wgrad_triton as fw

    setting = tuple(int(v) for v in a.setting.split(",")) if a.setting else None
    row = {"arm": "baseline" if a.baseline else "triton", "setting": setting, "gpu": torch.cuda.get_device_name(),
           "ms": {}}
    t0 = time.time()
    # correctness first, on a shape with masked edges and a few token blocks
    _, _, aq, sa, bq, sb = operands(640, 576, 384)
    ref = fl.blockwise_gemm(aq, sa, bq, sb, False, torch.float32)
    if setting is not None:
        got = fw.wgrad_1d1d(aq, sa, bq, sb, torch.float32, setting=setting)
        torch.cuda.synchronize()
        row["rel_vs_cublas"] = float((got - ref).norm() / ref.norm())
        row["first_call_s"] = time.time() - t0
        print(f"{setting}: rel {row['rel_vs_cublas']:.2e}, first call {row['first_call_s']:.1f} s", flush=True)
    for t in (int(v) for v in a.tokens.split(",")):
        for model, shapes in LAYERS.items():
            for m, n in shapes:
                row["ms"][f"{model}|{t}|{m}x{n}"] = time_shape(m, n, t, setting, a)
    row["wall_s"] = time.time() - t0
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def render(rows: list[dict]) -> str:
    """Per model and token count: the layer's WGrad ms (7 projections) for BF16, cuBLAS, each setting and the best
    setting per shape; x = BF16 / arm."""
    base = next((r for r in rows if r["arm"] == "baseline"), None)
    tri = [r for r in rows if r["arm"] == "triton"]
    if base is None:
        return "no baseline row"
    L = [f"# Triton WGrad settings, {base['gpu']}", "",
         "| model | tokens | BF16 ms | cuBLAS ms | x | best Triton per shape ms | x | vs cuBLAS | " +
         " | ".join(str(tuple(r["setting"])) for r in tri) + " |",
         "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(tri)]
    groups = sorted({tuple(k.split("|")[:2]) for k in base["ms"]}, key=lambda g: (int(g[1]), g[0]))
    for model, t in groups:
        keys = [k for k in base["ms"] if k.startswith(f"{model}|{t}|")]
        mult = {k: LAYERS[model][tuple(int(v) for v in k.split("|")[2].split("x"))] for k in keys}
        bf = sum(base["ms"][k]["bf16"] * mult[k] for k in keys)
        cb = sum(base["ms"][k]["cublas"] * mult[k] for k in keys)
        best = sum(min([r["ms"][k] for r in tri if k in r["ms"]] or [float("nan")]) * mult[k] for k in keys)
        per = [sum(r["ms"].get(k, float("nan")) * mult[k] for k in keys) for r in tri]
        L.append(f"| {model} | {t} | {bf:.2f} | {cb:.2f} | {bf / cb:.2f}x | {best:.2f} | {bf / best:.2f}x | "
                 f"{cb / best:.2f}x | " + " | ".join(f"{v:.2f}" for v in per) + " |")
    L += ["", "| setting | rel L2 vs cuBLAS | first call s |", "|---|---:|---:|"]
    L += [f"| {tuple(r['setting'])} | {r.get('rel_vs_cublas', float('nan')):.1e} | {r.get('first_call_s', 0):.1f} |"
          for r in tri]
    return "\n".join(L)


if __name__ == "__main__":
    main()
