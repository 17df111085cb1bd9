"""Render a ``bench_wo_gemm.py`` JSON as the markdown tables of benchmarks/RESULTS.md.

    python benchmarks/kernels/results_md.py benchmarks/kernels/runs/v4_h200.json

Numbers are copied, never rounded beyond the printed precision, so the table in
RESULTS.md can be regenerated from the committed JSON.
"""

from __future__ import annotations

import json
import sys


def render(d: dict) -> str:
    info, rows, bwd = d["info"], d["forward"], d["backward"]
    hbm = info["hbm_copy_GBps"]
    out = [
        ("| format | N x K | M | time us | GB/s | % of HBM copy | TFLOP/s | cuBLAS BF16 us | speedup | "
         "best config | default: us, speedup |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {r['us']:.1f} | {r['GBps']:.0f} | "
            f"{100 * r['GBps'] / hbm:.0f}% | {r['TFLOPs']:.1f} | {r['bf16_us']:.1f} | {r['speedup']:.2f}x | "
            f"{r['best']['config']} | {r['default']['us']:.1f}, {r['speedup_default']:.2f}x |"
        )
    out += ["", "| format | N x K | M | dX time us | TFLOP/s | cuBLAS BF16 us | speedup | config |",
            "|---|---|---|---|---|---|---|---|"]
    for r in bwd:
        out.append(f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {r['us']:.1f} | {r['TFLOPs']:.1f} | "
                   f"{r['bf16_us']:.1f} | {r['speedup']:.2f}x | {r['best']['config']} |")
    errs = [r["max_err"] for r in rows + bwd]
    out += ["", (f"Max relative error over all rows and configs: {max(errs):.1e} "
                 "(vs a float64 product of the same inputs).")]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))
