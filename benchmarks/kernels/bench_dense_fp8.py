"""The dense path in FP8 against cuBLAS BF16 at M >= 2048 (issue 17: ">= 0.95x cuBLAS"), forward and DGrad.

Per shape and M, in one process, each arm timed as one CUDA graph over rotating weight copies (the weights
stream from HBM, as in a model), the arms alternating ``--repeats`` times (medians; at large M the clocks fall
with power, so a fixed order would favour the first arm):

* ``cublas``: ``x @ W^T`` / ``dy @ W`` on the BF16 weight (the reference the issue names);
* ``dense``: the product path -- decode to a transient BF16 weight, then cuBLAS (``quarl_kernels.dense``);
* ``fp8``: ``QUARL_KERNELS_DENSE_FP8=1`` -- the weight expanded to E4M3 128x128 tiles, x (dy) to 1x128 groups,
  cuBLAS's blockwise FP8 GEMM (``quarl_kernels.dense_fp8``); ``fp8-dg`` the same on DeepGEMM when importable;
* the FP8 arm's parts alone: the expansion, the activation quantizer, the GEMM on ready operands.

Every output is checked against the float64 product of the packed weight first (relative L2, ``err`` columns):
the BF16 dense path's error is its output rounding, the FP8 path's the activations' and the codes' E4M3 rounding.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/bench_dense_fp8.py --out $OUT
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import unittest.mock

import torch
from bench_gemv import _quantized, graph_us
from bench_wo_gemm import _copies
from quarl_kernels import dense, dense_fp8, wo_gemm

from quarl.quant import fp8_linear

SHAPES = [(18944, 3584), (3584, 18944), (3584, 3584), (27648, 5120)]  # 7B gate / up, down, q / o; 14B gate+up
MS = [2048, 4096, 8192, 16384]


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def _median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def _point(n: int, k: int, m: int, d: str, a: torch.Tensor, w64, wbs: list, pws: list, fp8_arms: dict,
           repeats: int) -> dict:
    """One (shape, M, direction): every arm's error, its alternating timings, and the FP8 arm's parts."""
    fwd = d == "fwd"
    ref = a.double() @ (w64.T if fwd else w64)
    fns = {
        "cublas": [lambda wi=wi: a @ (wi.T if fwd else wi) for wi in wbs],
        "dense": [lambda p=p: (dense.dense_matmul if fwd else dense.dense_matmul_t)(a, p) for p in pws],
    }
    mm = dense_fp8.matmul if fwd else dense_fp8.matmul_t
    for arm in fp8_arms:
        fns[arm] = [lambda p=p: mm(a, p) for p in pws]
    row = {"N": n, "K": k, "M": m, "dir": d, "err": {}}
    for arm, f in fns.items():
        with unittest.mock.patch.dict(os.environ, fp8_arms.get(arm, {})):
            row["err"][arm] = _rel(f[0](), ref)
    times = {arm: [] for arm in fns}
    for _ in range(repeats):
        for arm, f in fns.items():
            with unittest.mock.patch.dict(os.environ, fp8_arms.get(arm, {})):
                times[arm].append(graph_us(f))
    row["us"] = {arm: _median(t) for arm, t in times.items()}
    row["all_us"] = times
    # the FP8 arm's parts (cuBLAS GEMM), each alone
    row["parts_us"] = {
        "expand": graph_us([lambda p=p: dense_fp8.expand(p, transpose=not fwd) for p in pws]),
        "act_quant": graph_us([lambda: fp8_linear.quantize_act_gemm(a, m, a.shape[1])]),
    }
    tiles = [dense_fp8.expand(p, transpose=not fwd) for p in pws]
    aq, sa, _, _ = fp8_linear.quantize_act_gemm(a, m, a.shape[1])
    with unittest.mock.patch.dict(os.environ, {"QUARL_FP8_GEMM": "cublas"}):
        row["parts_us"]["gemm"] = graph_us(
            [lambda t=t: fp8_linear.blockwise_gemm(aq, sa, t[0], t[1], True, torch.bfloat16) for t in tiles])
    c = row["us"]["cublas"]
    cells = "  ".join(f"{arm} {us:.1f} us ({c / us:.3f}x, err {row['err'][arm]:.1e})" for arm, us in row["us"].items())
    parts = " + ".join(f"{p} {us:.1f}" for p, us in row["parts_us"].items())
    print(f"{n}x{k} M={m} {d}: {cells}; fp8 parts: {parts} us", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--repeats", type=int, default=3, help="alternating timings of the arms per point (median)")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    dg = importlib.util.find_spec("deep_gemm") is not None
    out = {"gpu": props.name, "torch": torch.__version__, "deepgemm": dg, "rows": []}
    fp8_arms = {"fp8": {"QUARL_FP8_GEMM": "cublas"}, **({"fp8-dg": {"QUARL_FP8_GEMM": "deepgemm"}} if dg else {})}
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        w, q, pw0 = _quantized("nvfp4", n, k, n + k)
        pws = [pw0] + [wo_gemm.PackedWeight(pw0.fmt, pw0.group, n, k, pw0.words.clone(), pw0.scale.clone(), None,
                                            pw0.gscale.clone(), pw0.bytes32) for _ in range(_copies(q.nbytes, l2) - 1)]
        w64 = q.dequantize(torch.float64)
        wb = q.dequantize(torch.bfloat16)
        wbs = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
        del w
        for m in [int(v) for v in args.ms.split(",")]:
            torch.manual_seed(m)
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            dy = (torch.randn(m, n, device="cuda") * 0.5).to(torch.bfloat16)
            for d, a in (("fwd", x), ("bwd", dy)):
                out["rows"].append(_point(n, k, m, d, a, w64, wbs, pws, fp8_arms, args.repeats))
        del pws, wbs, wb, w64
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dense_fp8.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(render(out))
    with open(os.path.join(args.out, "dense_fp8.md"), "w") as f:
        f.write(render(out) + "\n")


def render(out: dict) -> str:
    """The table: x = cuBLAS BF16 time / arm time (median of the alternating runs)."""
    arms = [a for a in ("dense", "fp8", "fp8-dg") if any(a in r["us"] for r in out["rows"])]
    head = "| N x K | M | dir | cuBLAS BF16 us | " + " | ".join(f"{a} us (x)" for a in arms) + \
        " | err dense | err fp8 | fp8 parts: expand + quant + GEMM us |"
    lines = [f"# dense path in FP8 vs cuBLAS BF16, {out['gpu']}, torch {out['torch']}", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in out["rows"]:
        c = r["us"]["cublas"]
        cells = " | ".join(f"{r['us'][a]:.1f} ({c / r['us'][a]:.3f}x)" if a in r["us"] else "-" for a in arms)
        p = r["parts_us"]
        lines.append(f"| {r['N']} x {r['K']} | {r['M']} | {r['dir']} | {c:.1f} | {cells} | {r['err']['dense']:.1e} | "
                     f"{r['err']['fp8']:.1e} | {p['expand']:.1f} + {p['act_quant']:.1f} + {p['gemm']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
