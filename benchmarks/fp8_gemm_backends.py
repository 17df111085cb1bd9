"""The three FP8 GEMMs of a training linear, one library against another: cuBLAS vs DeepGEMM vs BF16.

    PYTHONPATH=$PWD:$PWD/kernels:/path/to/DeepGEMM python3 benchmarks/fp8_gemm_backends.py --out $OUT
    python3 benchmarks/fp8_gemm_backends.py --warm 0/8 ...     # compile DeepGEMM's kernels only (shard 0 of 8)
    python3 benchmarks/fp8_gemm_backends.py --render $OUT/fp8_gemm_backends.json

Why. The FP8 layer step (``fp8_layer.py``) stops at ~1.2x BF16 because cuBLAS's blockwise GEMMs are
only ~1.5x BF16's (RESULTS.md "Jet-RL": the GEMMs alone would cap the layer at ~1.46x even with free
quantization). This asks whether another library's blockwise kernels -- DeepGEMM, the kernels
DeepSeek-V3 was trained with -- are faster on the same operands. Every GEMM of one decoder layer's
seven projections (Qwen2.5-7B / Qwen3-8B shapes) is timed in three roles, with the operands quarl's
quantizers produce (``quarl.quant.fp8_linear``):

    fwd    Y  = X W^T      A = X [M, K] 1x128,      B = W [N, K] 128x128 tiles    -> bf16 [M, N]
    dgrad  dX = dY W       A = dY [M, N] 1x128,     B = W^T [K, N] 128x128 tiles  -> bf16 [M, K]
    wgrad  dW = dY^T X     A = dY^T [N, M] 1x128,   B = X^T [K, M] 1x128          -> [N, K] (bf16 master)
    wgrad_t  the same with B = X^T in 128x128 tiles (``fp8_linear(wgrad="tiles")``, not Jet-RL's recipe)

Arms: ``bf16`` (``torch.mm`` of the BF16 operands), ``cublas`` (``fp8_linear.blockwise_gemm``, what
the library runs), ``deepgemm`` (the same call under ``QUARL_FP8_GEMM=deepgemm``: DeepGEMM's 1D2D
kernel for fwd / dgrad / wgrad_t; wgrad with 1x128 groups on both operands stays on cuBLAS -- the
first run of this benchmark, results/gpu_2026-11-26/s7/a, timed DeepGEMM's 1D1D kernel there with its
FP32 accumulator: 0.89-1.0x cuBLAS). Each output of deepgemm is compared with cublas's (relative L2;
the same FP8 operands, so only the FP32 summation order and the final rounding differ).

DeepGEMM compiles each kernel with nvcc on first use (seconds each); ``--warm i/n`` runs only the
first call of every n-th GEMM from i, so several processes can fill its cache in parallel before the
timed run. Times: median of ``--iters`` CUDA-event intervals after warm-up; TFLOP/s from 2 M N K.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "kernels"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fp8_linear import cuda_time  # the FP8 linear benchmark's timer: median of CUDA-event intervals

from quarl.quant import fp8_linear as fl

# (hidden, intermediate, q out, kv out), as in fp8_layer.py
MODELS = {"Qwen2.5-7B": (3584, 18944, 3584, 512), "Qwen3-8B": (4096, 12288, 4096, 1024), "tiny": (256, 640, 256, 128)}
ARMS = ("bf16", "cublas", "deepgemm")


def projections(model: str) -> dict[str, tuple[int, int]]:
    h, inter, q, kv = MODELS[model]
    return {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (inter, h), "up": (inter, h),
            "down": (h, inter)}


def operands(n: int, k: int, m: int, device: str) -> dict:
    """Random BF16 X [M, K], W [N, K], dY [M, N] and their FP8 GEMM operands in each role."""
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    mt = -(-m // 128) * 128
    xq, xs, xtq, xts = fl.quantize_act_gemm(x, m, k, mt)  # [M, K] 1x128 and X^T [K, M] 1x128
    dyq, dys, dytq, dyts = fl.quantize_act_gemm(dy, m, n, mt)
    wq, ws, wtq = fl._weight_tiles(w, transpose=True)
    wtq = wtq if wtq is not None else wq.t().contiguous()
    xtt, xtts = fl._x_tiles_t(x, mt, -(-k // 128) * 128)  # X^T in 128x128 tiles (fp8_linear wgrad="tiles")
    return {
        "fwd": ((xq, xs, wq, ws, True, torch.bfloat16), (x, w.t())),
        "dgrad": ((dyq, dys, wtq, fl._scales_t(ws), True, torch.bfloat16), (dy, w)),
        "wgrad": ((dytq, dyts, xtq, xts, False, torch.bfloat16), (dy.t(), x)),
        "wgrad_t": ((dytq, dyts, xtt, xtts, True, torch.bfloat16), (dy.t(), x)),
    }


def call(arm: str, ops: tuple, bf: tuple):
    if arm == "bf16":
        return lambda: torch.mm(*bf)
    os.environ["QUARL_FP8_GEMM"] = "deepgemm" if arm == "deepgemm" else "cublas"
    return lambda: fl.blockwise_gemm(*ops)


def gemms(models: list[str], tokens: list[int]):
    for model in models:
        for m in tokens:
            for proj, (n, k) in projections(model).items():
                yield model, m, proj, n, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/fp8_gemm_backends")
    ap.add_argument("--models", default="Qwen2.5-7B,Qwen3-8B")
    ap.add_argument("--tokens", default="8192,4096,16384")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--warm", default="", help="i/n: only compile (first call of) every n-th GEMM from i")
    ap.add_argument("--render", default="")
    a = ap.parse_args()
    if a.render:
        print(tables(json.loads(Path(a.render).read_text())))
        return
    models, tokens, arms = a.models.split(","), [int(t) for t in a.tokens.split(",")], a.arms.split(",")
    dev = "cuda"
    t0 = time.time()
    if a.warm:
        i, n = (int(v) for v in a.warm.split("/"))
        for j, (model, m, proj, nn, k) in enumerate(gemms(models, tokens)):
            if j % n != i or proj in ("v", "up"):  # v / up repeat k / gate's shapes
                continue
            ops = operands(nn, k, m, dev)
            for role, (o, _) in ops.items():
                t = time.time()
                call("deepgemm", o, None)()
                torch.cuda.synchronize()
                print(f"warm {model} M={m} {proj} {role}: {time.time() - t:.1f} s", flush=True)
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    try:
        import deep_gemm

        res["deep_gemm"] = getattr(deep_gemm, "__version__", "?")
    except ImportError as e:
        res["deep_gemm"] = f"not importable: {e}"
    for model, m, proj, n, k in gemms(models, tokens):
        if time.time() - t0 > a.budget_s:
            res.setdefault("skipped", []).append(f"{model} M={m} {proj}")
            continue
        torch.manual_seed(0)
        ops = operands(n, k, m, dev)
        for role, (o, bf) in ops.items():
            mm, nn, kk = {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m), "wgrad_t": (n, k, m)}[role]
            row = {"model": model, "tokens": m, "proj": proj, "role": role, "M": mm, "N": nn, "K": kk}
            outs = {}
            for arm in arms:
                try:
                    fn = call(arm, o, bf)
                    outs[arm] = fn()
                    row[f"{arm}_ms"] = cuda_time(fn, a.iters, warmup=2)
                    row[f"{arm}_tflops"] = 2 * mm * nn * kk / row[f"{arm}_ms"] / 1e9
                except Exception as e:  # noqa: BLE001 - one library failing must not lose the others
                    row[f"{arm}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            if "cublas" in outs and "deepgemm" in outs:
                c, d = outs["cublas"].float(), outs["deepgemm"].float()
                row["deepgemm_vs_cublas_rel"] = float((d - c).norm() / c.norm().clamp_min(1e-30))
            os.environ.pop("QUARL_FP8_GEMM", None)
            res["rows"].append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        del ops
        torch.cuda.empty_cache()
        res["wall_s"] = time.time() - t0
        (out / "fp8_gemm_backends.json").write_text(json.dumps(res, indent=1))
    print(tables(res))


def tables(res: dict) -> str:
    """Per GEMM rows, then per layer (model, tokens) sums of each arm and the ratios."""
    L = [f"# FP8 GEMM libraries, {res.get('gpu')}, torch {res.get('torch')}, deep_gemm {res.get('deep_gemm')}", "",
         ("| model | tokens | proj | role | M x N x K | BF16 ms | cuBLAS ms (TFLOP/s) | DeepGEMM ms (TFLOP/s) | "
         "DeepGEMM / cuBLAS speed | rel L2 |"), "|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    sums: dict = {}
    for r in res.get("rows", []):
        def f(k, fmt="{:.3f}", r=r):
            return fmt.format(r[k]) if k in r else r.get(k.replace("_ms", "_error"), "-")[:40]
        sp = f"{r['cublas_ms'] / r['deepgemm_ms']:.2f}x" if "cublas_ms" in r and "deepgemm_ms" in r else "-"
        L.append(f"| {r['model']} | {r['tokens']} | {r['proj']} | {r['role']} | {r['M']}x{r['N']}x{r['K']} | "
                 f"{f('bf16_ms')} | {f('cublas_ms')} ({f('cublas_tflops', '{:.0f}')}) | "
                 f"{f('deepgemm_ms')} ({f('deepgemm_tflops', '{:.0f}')}) | {sp} | "
                 f"{r.get('deepgemm_vs_cublas_rel', float('nan')):.1e} |")
        key = (r["model"], r["tokens"])
        s = sums.setdefault(key, {})
        for arm in ARMS:
            for role in ("all", r["role"]):
                if f"{arm}_ms" in r:
                    s[(arm, role)] = s.get((arm, role), 0.0) + r[f"{arm}_ms"]
    L += ["", "per layer (7 projections x 3 GEMMs, WGrad 1x128), ms; x = BF16 / arm", "",
          ("| model | tokens | BF16 | cuBLAS FP8 | x | DeepGEMM FP8 | x | cuBLAS, X^T tiles | x | DeepGEMM, X^T tiles | x "
          "| DeepGEMM fwd+dgrad / wgrad / wgrad_t vs cuBLAS |"),
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (model, m), s in sums.items():
        # one WGrad per layer in the sums: the 1x128 one (the X^T-tiles one is in the last column)
        b, c, d = (s.get((a, "all"), 0.0) - s.get((a, "wgrad_t"), 0.0) for a in ("bf16", "cublas", "deepgemm"))

        def x(v, b=b):
            return f"{b / v:.2f}x" if b and v else "-"

        parts = []
        for roles in (("fwd", "dgrad"), ("wgrad",), ("wgrad_t",)):
            cc = sum(s.get(("cublas", r_), 0.0) for r_ in roles)
            dd = sum(s.get(("deepgemm", r_), 0.0) for r_ in roles)
            parts.append(f"{cc / dd:.2f}x" if dd else "-")
        tiles = [f"{v:.2f} | {x(v)}" if (a, "wgrad_t") in s else "- | -" for a in ("cublas", "deepgemm")
                 for v in [s.get((a, "all"), 0.0) - s.get((a, "wgrad"), 0.0)]]
        L.append(f"| {model} | {m} | {b or 0:.2f} | {c or 0:.2f} | {x(c)} | {d or 0:.2f} | {x(d)} | "
                 f"{' | '.join(tiles)} | {' / '.join(parts)} |")
    return "\n".join(L)


if __name__ == "__main__":
    main()
