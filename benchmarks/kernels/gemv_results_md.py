"""Render a ``bench_gemv.py`` JSON as the decode table of benchmarks/RESULTS.md.

    PYTHONPATH=.:kernels python benchmarks/kernels/gemv_results_md.py benchmarks/kernels/runs/v6_gemv_h200.json

Per (format, shape, M) the row shows what ``wo_gemm.wo_matmul`` runs today: the GEMV
with ``gemv.default_gemv_config`` for M <= ``gemv.GEMV_MAX_M``, the tensor-core decode
path above it; every candidate's time is in the JSON, so the default's time is read
from the same run. Numbers are copied, never re-measured.
"""

from __future__ import annotations

import json
import sys

from quarl_kernels import gemv
from quarl_kernels.formats import FORMAT_IDS


def render(d: dict) -> str:
    info, rows = d["info"], d["rows"]
    hbm = info["hbm_copy_GBps"]
    out = [
        ("| format | N x K | M | path | time us | GB/s | % of HBM copy | vs cuBLAS BF16 | vs v5 TC path | "
         "cuBLAS BF16 us | v5 TC us | GEMV best: us, config |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fmt = FORMAT_IDS["int" if r["format"].startswith("int") else r["format"]]
        if r["M"] <= gemv.GEMV_MAX_M:
            name = str(gemv.default_gemv_config(fmt, r["M"], r["N"], r["K"]))
            us = next(g["us"] for g in r["gemv"] if g["config"] == name)
            path = "GEMV " + name.removeprefix("gemv-")
        else:
            us, path = r["tc_us"], "TC (v5)"
        best = r["best"]
        out.append(
            f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {path} | {us:.1f} | {r['bytes'] / us / 1e3:.0f} | "
            f"{100 * r['bytes'] / us / 1e3 / hbm:.0f}% | {r['bf16_us'] / us:.2f}x | {r['tc_us'] / us:.2f}x | "
            f"{r['bf16_us']:.1f} | {r['tc_us']:.1f} | {best['us']:.1f}, {best['config'].removeprefix('gemv-')} |")
    errs = [r["max_err"] for r in rows] + [r["tc_err"] for r in rows]
    out += ["", (f"Max relative error over all rows and configs: {max(errs):.1e} "
                 "(vs a float64 product of the same inputs and the reference dequantized weight).")]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))
