"""The FP8 decode GEMM (``quarl_kernels.fp8_gemv``) against cuBLAS's blockwise FP8 GEMM, and BF16 for scale.

    PYTHONPATH=.:kernels python benchmarks/kernels/bench_fp8_gemv.py --out DIR [--rows 1,4,8,16,32,64]

Shapes: a Qwen3-8B decoder layer's projections (N x K: q/o 4096x4096, k/v 1024x4096, gate/up 12288x4096, down
4096x12288). Operands are the FP8 linear's own (``quarl.quant.fp8_linear``: x in 1x128 E4M3 groups, padded to
a multiple of 4 rows as the linear pads; W in 128x128 E4M3 tiles). Method as ``bench_gemv.py``: every timed call
reads another copy of the weight (the copies cover >= 4x the L2), 32 calls are captured in one CUDA graph and
the time per call is the median replay / 32 -- no host time, weights from HBM. Each GEMV launch setting of
``fp8_gemv.GEMV_CONFIGS`` is checked against cuBLAS (relative Frobenius error) before it is timed. GB/s counts
the fewest bytes: weight + its scales + x + y once. The HBM ceiling is a 2 GiB device-to-device copy.

Writes ``fp8_gemv.json`` and prints a table: per shape and rows, cuBLAS FP8, BF16 (cuBLAS on a bf16 weight), the
GEMV's default setting and its best setting.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks" / "kernels")]

SHAPES = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (12288, 4096), "down": (4096, 12288)}
CALLS = 32  # calls per captured graph


def graph_us(fns) -> float:
    from bench_wo_gemm import _sync_ms, capture_graph  # the other decode benchmarks' timer and capture (Triton)

    g = capture_graph(fns)
    return statistics.median(_sync_ms(g.replay, 10)) * 1e3 / len(fns)


def hbm_gbs() -> float:
    from bench_wo_gemm import _sync_ms

    n = 1 << 31
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = statistics.median(_sync_ms(lambda: dst.copy_(src), 20))
    return 2 * n / (t * 1e-3) / 1e9


def bench_shape(name: str, n: int, k: int, rows: list[int], l2: int, only_default: bool = False) -> list[dict]:
    from quarl_kernels import fp8_gemv as g

    from quarl.quant import fp8_linear as fl

    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    b0, sb0 = fl.quantize_weight_padded(w)  # [N, K] e4m3, [N/128, K/128] fp32
    copies = max(2, min(64, -(-4 * l2 // (n * k))))
    bs = [(b0, sb0)] + [(b0.clone(), sb0.clone()) for _ in range(copies - 1)]
    ws16 = [w] + [w.clone() for _ in range(min(copies, max(2, -(-4 * l2 // (2 * n * k)))) - 1)]
    out = []
    for m in rows:
        mp = -(-m // 4) * 4  # the linear pads decode rows to a multiple of 4 (cuBLAS's requirement)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        a, sa, _, _ = fl.quantize_act_gemm(x, mp, k)
        nbytes = n * k + sb0.numel() * 4 + a.numel() + sa.numel() * 4 + mp * n * 2
        row = {"shape": name, "n": n, "k": k, "m": m, "bytes": nbytes}
        ref = _cublas(fl, a, sa, b0, sb0).float()
        row["cublas_us"] = graph_us([lambda a=a, sa=sa, b=b, sb=sb: _cublas(fl, a, sa, b, sb)
                                     for b, sb in (bs * CALLS)[:CALLS]])
        row["bf16_us"] = graph_us([lambda x=x, w_=w_: x @ w_.t() for w_ in (ws16 * CALLS)[:CALLS]])
        configs = {}
        dflt = g.default_config(mp, n, k)
        for cfg in [dflt] if only_default else dict.fromkeys((dflt, *g.GEMV_CONFIGS)):
            y = g.fp8_gemv(a, sa, b0, sb0, torch.bfloat16, cfg).float()
            err = ((y - ref).norm() / ref.norm()).item()
            t = graph_us([lambda a=a, sa=sa, b=b, sb=sb, cfg=cfg: g.fp8_gemv(a, sa, b, sb, torch.bfloat16, cfg)
                          for b, sb in (bs * CALLS)[:CALLS]])
            configs[str(cfg)] = {"us": t, "rel_err": err}
        dflt = str(dflt)
        best = min(configs, key=lambda c: configs[c]["us"])
        row.update(configs=configs, default=dflt, default_us=configs[dflt]["us"], best=best,
                   best_us=configs[best]["us"], max_rel_err=max(c["rel_err"] for c in configs.values()))
        print(json.dumps({kk: v for kk, v in row.items() if kk != "configs"}), flush=True)
        out.append(row)
    return out


def _cublas(fl, a, sa, b, sb):
    import os

    old = os.environ.get("QUARL_FP8_GEMV")
    os.environ["QUARL_FP8_GEMV"] = "0"  # the GEMM the linear runs without the GEMV
    try:
        return fl.blockwise_gemm(a, sa, b, sb, True, torch.bfloat16)
    finally:
        if old is None:
            os.environ.pop("QUARL_FP8_GEMV")
        else:
            os.environ["QUARL_FP8_GEMV"] = old


def table(res: dict) -> str:
    hbm = res["hbm_gbs"]
    L = [f"# FP8 decode GEMM vs cuBLAS, {res['gpu']}, torch {res['torch']}, HBM copy {hbm:.0f} GB/s, {res['date']}",
         "", ("| shape | N x K | rows | cuBLAS FP8 us | BF16 us | GEMV default us | GB/s | % HBM | x cuBLAS FP8 "
              "| x BF16 | best setting | best us | max rel err |"), "|---|---|---:|" + "---:|" * 7 + "---|---:|---:|"]
    for r in res["rows"]:
        gbs = r["bytes"] / (r["default_us"] * 1e-6) / 1e9
        L.append(f"| {r['shape']} | {r['n']}x{r['k']} | {r['m']} | {r['cublas_us']:.1f} | {r['bf16_us']:.1f} | "
                 f"{r['default_us']:.1f} | {gbs:.0f} | {100 * gbs / hbm:.0f}% | {r['cublas_us'] / r['default_us']:.2f}x "
                 f"| {r['bf16_us'] / r['default_us']:.2f}x | {r['best']} | {r['best_us']:.1f} | {r['max_rel_err']:.1e} |")
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,8,16,32,64")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--configs", default="all", choices=("all", "default"), help="default: the default setting only")
    ap.add_argument("--out", default="/tmp/bench_fp8_gemv")
    ap.add_argument("--render", default="")
    a = ap.parse_args()
    if a.render:
        print(table(json.loads(Path(a.render).read_text())))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv),
           "hbm_gbs": hbm_gbs(), "rows": []}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for name in a.shapes.split(","):
        if time.time() - t0 > a.budget_s:
            res.setdefault("skipped", []).append(name)
            continue
        n, k = SHAPES[name]
        res["rows"] += bench_shape(name, n, k, [int(r) for r in a.rows.split(",")], l2, a.configs == "default")
        (out / "fp8_gemv.json").write_text(json.dumps(res, indent=1))
    res["wall_s"] = time.time() - t0
    (out / "fp8_gemv.json").write_text(json.dumps(res, indent=1))
    print(table(res))


if __name__ == "__main__":
    main()
