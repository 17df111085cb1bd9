"""What a quantized layer actually runs, timed: ``wo_gemm.wo_matmul`` vs cuBLAS BF16.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_dispatch.py --out DIR [--quick]

``bench_wo_gemm.py`` and ``bench_gemv.py`` sweep the candidate configs of each
kernel; this script times the *dispatched* call -- the path
``torch.ops.quarl.wo_linear`` takes for that M (CUDA-core GEMV at M = 1, the
Gluon register-operand mma.sync kernel at M = 2..64, the fused tensor-core
kernel, or the dequantize-then-cuBLAS path at
M >= ``dense.dense_min_m()``) -- which is the number a model sees. Same method
as ``bench_wo_gemm.py``: measured ceilings first, rotating weight copies (>= 4x
L2), R calls captured in one CUDA graph, median per call.

Tables:
  * forward, Qwen2.5-7B linear shapes x M = 1, 8, 32, 128, 2048, three formats:
    us, GB/s (fewest bytes), % of measured HBM copy rate, speedup over cuBLAS;
  * the large-M crossover (NVFP4, the two 7B MLP shapes, forward and backward):
    fused kernel vs dense path vs cuBLAS at M = 128 .. 4096 -- where
    ``dense.DEFAULT_DENSE_MIN_M`` comes from.

Writes ``dispatch.json`` and ``dispatch.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import triton
from bench_wo_gemm import SHAPES, SPECS, _copies, graph_time_us, measure_ceilings, rotating_packed
from quarl_kernels import dense, gemv, wo_gemm

MS = [1, 8, 32, 128, 2048]
CROSS_MS = [128, 256, 512, 1024, 2048, 4096]


def _weights(spec: str, n: int, k: int, l2: int):
    """(packed weights rotated to defeat L2, bf16 weights likewise, float64 reference weight, packed bytes)."""
    pws, q = rotating_packed(spec, torch.randn(n, k, device="cuda") * 0.03, l2)
    wb = q.dequantize(torch.bfloat16)
    wbs = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
    return pws, wbs, q.dequantize(torch.float64), q.nbytes


def _path(x2: torch.Tensor, pw) -> str:
    """Which kernel ``wo_matmul`` runs for this call (mirrors its dispatch order)."""
    m = x2.shape[0]
    if dense.use_dense(m):
        return "dense"
    md = wo_gemm._mma_decode()
    if md is not None and m >= wo_gemm.MMA_DECODE_MIN_M and md.preferred(m, pw.n, pw.k) and md.mma_decode_supported(x2, pw):
        return "mma"
    return "gemv" if gemv.gemv_supported(x2, pw) else "fused"


def forward_table(l2: int, hbm: float, shapes, ms) -> list[dict]:
    rows = []
    for n, k in shapes:
        for spec in SPECS:
            torch.manual_seed(n + k)
            pws, wbs, wref, wbytes = _weights(spec, n, k, l2)
            for m in ms:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                y = wo_gemm.wo_matmul(x, pws[0])
                ref = x.double() @ wref.T
                err = ((y.double() - ref).norm() / ref.norm()).item()
                us = graph_time_us([lambda p=p, x=x: wo_gemm.wo_matmul(x, p) for p in pws])
                us_bf16 = graph_time_us([lambda w=w, x=x: x @ w.T for w in wbs])
                nbytes = wbytes + 2 * m * k + 2 * m * n
                row = {"format": spec, "N": n, "K": k, "M": m, "path": _path(x, pws[0]), "us": us,
                       "bf16_us": us_bf16, "GBps": nbytes / us / 1e3, "pct_hbm": 100 * nbytes / us / 1e3 / hbm,
                       "TFLOPs": 2 * m * n * k / us / 1e6, "speedup": us_bf16 / us, "err": err}
                rows.append(row)
                print(json.dumps(row), flush=True)
            del pws, wbs
    return rows


def crossover_table(l2: int, ms) -> list[dict]:
    rows = []
    for n, k in ((18944, 3584), (3584, 18944)):
        torch.manual_seed(1)
        pws, wbs, _, _ = _weights("nvfp4", n, k, l2)
        pws, wbs = pws[:4], wbs[:4]  # compute-bound: L2 reuse is not the question here
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
            cf = wo_gemm.default_config("fwd", m, n, k)
            cb = wo_gemm.default_config("bwd", m, n, k)
            row = {
                "N": n, "K": k, "M": m,
                "fwd_fused_us": graph_time_us([lambda p=p, x=x, c=cf: wo_gemm.launch_fwd(x, p, c) for p in pws]),
                "fwd_dense_us": graph_time_us([lambda p=p, x=x: dense.dense_matmul(x, p) for p in pws]),
                "fwd_bf16_us": graph_time_us([lambda w=w, x=x: x @ w.T for w in wbs]),
                "bwd_fused_us": graph_time_us([lambda p=p, d=dy, c=cb: wo_gemm.launch_bwd(d, p, c) for p in pws]),
                "bwd_dense_us": graph_time_us([lambda p=p, d=dy: dense.dense_matmul_t(d, p) for p in pws]),
                "bwd_bf16_us": graph_time_us([lambda w=w, d=dy: d @ w for w in wbs]),
                "dequant_us": graph_time_us([lambda p=p: dense.dequantize(p) for p in pws]),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del pws, wbs
    return rows


def to_markdown(info: dict, fwd: list[dict], cross: list[dict]) -> str:
    lines = [
        (f"GPU: {info['gpu']} ({info['sms']} SMs), torch {info['torch']}, Triton {info['triton']}, {info['date']}. "
         f"Measured ceilings: HBM copy {info['hbm_copy_GBps']:.0f} GB/s, cuBLAS BF16 8192^3 "
         f"{info['bf16_matmul_TFLOPs']:.0f} TFLOP/s. Dense path from M >= {info['dense_min_m']}."),
        "",
        "| format | N x K | M | path | us | GB/s | % HBM | TFLOP/s | cuBLAS bf16 us | speedup | rel err |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in fwd:
        lines.append(f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {r['path']} | {r['us']:.1f} | "
                     f"{r['GBps']:.0f} | {r['pct_hbm']:.0f}% | {r['TFLOPs']:.1f} | {r['bf16_us']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['err']:.1e} |")
    if cross:
        lines += ["", "Large-M crossover, NVFP4 (speedup over cuBLAS BF16 in brackets):", "",
                  ("| N x K | M | fwd fused us | fwd dense us | fwd bf16 us | bwd fused us | bwd dense us | bwd bf16 us "
                   "| dequantize us |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in cross:
            def c(a, b, r=r):
                return f"{r[a]:.1f} ({r[b] / r[a]:.2f}x)"
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {c('fwd_fused_us', 'fwd_bf16_us')} | "
                         f"{c('fwd_dense_us', 'fwd_bf16_us')} | {r['fwd_bf16_us']:.1f} | "
                         f"{c('bwd_fused_us', 'bwd_bf16_us')} | {c('bwd_dense_us', 'bwd_bf16_us')} | "
                         f"{r['bwd_bf16_us']:.1f} | {r['dequant_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="one shape, M in (1, 2048); crossover at 2 sizes")
    ap.add_argument("--ms", default=None, help="comma-separated M values of the forward table (default 1,8,32,128,2048)")
    ap.add_argument("--no-crossover", action="store_true", help="skip the large-M fused/dense/cuBLAS sweep")
    args = ap.parse_args()
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    info = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat(),
            "dense_min_m": dense.dense_min_m()}
    info.update(measure_ceilings())
    print(json.dumps(info), flush=True)
    shapes, ms, cms = (SHAPES[2:3], [1, 2048], [512, 2048]) if args.quick else (SHAPES, MS, CROSS_MS)
    if args.ms:
        ms = [int(v) for v in args.ms.split(",")]
    fwd = forward_table(l2, info["hbm_copy_GBps"], shapes, ms)
    cross = [] if args.no_crossover else crossover_table(l2, cms)
    info["wall_s"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dispatch.json"), "w") as f:
        json.dump({"info": info, "forward": fwd, "crossover": cross}, f, indent=1)
    md = to_markdown(info, fwd, cross)
    with open(os.path.join(args.out, "dispatch.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
