"""Does the dense path's decode cost less in chunks that stay in L2? (issue 17: M >= 2048 at >= 0.95x cuBLAS)

The dense path (``quarl_kernels.dense``) decodes a packed weight into a transient BF16 ``[N, K]`` and runs cuBLAS:
at M = 2048 the decode -- 0.56 B read and 2 B written per weight -- is the 6-14 % it loses to cuBLAS on BF16
weights (RESULTS "What a layer runs"). Written in chunks of ``Nc`` rows into one reused scratch buffer small enough
for L2 (``Nc x K`` BF16: 7-29 MB at K = 3584), each chunk's 2 B per weight could stay in L2 -- written there,
read there by cuBLAS, overwritten there by the next chunk -- so that HBM sees only the 0.56 B read. cuBLAS then
runs ``N / Nc`` narrower GEMMs into column slices of y (``torch.mm(out=y[:, n0:n1])``: a leading dimension, no
copy), at whatever efficiency those shapes get. This script times, per shape and M: cuBLAS on the BF16 weight, the
dense path as it is, and the chunked one at several ``Nc``; each checked against the dense path's output first.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/kernels/bench_dense_chunks.py --out $OUT

Method as ``bench_gemv.py``: rotating weight copies that together exceed L2 several times, the calls in one CUDA
graph, median time per call; ``--repeats R`` alternates the cuBLAS and dense timings R times and reports medians
(at 8k-16k rows one unpaired run put the dense path at 0.79-1.00x, not monotonic in M: session 17, phase e).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from bench_gemv import _quantized, graph_us
from bench_wo_gemm import _copies
from quarl_kernels import dense, wo_gemm

SHAPES = [(18944, 3584), (3584, 18944), (3584, 3584), (27648, 5120)]  # 7B gate / up, down, q / o; 14B gate+up
MS = [2048, 4096]
CHUNKS = [1024, 2048, 4096]


def rows(pw, n0: int, n1: int):
    """Rows ``[n0, n1)`` of a packed weight (views)."""
    return wo_gemm.PackedWeight(pw.fmt, pw.group, n1 - n0, pw.k, pw.words[n0:n1], pw.scale[n0:n1],
                                None if pw.zero is None else pw.zero[n0:n1], pw.gscale, pw.bytes32)


def chunked(x: torch.Tensor, pw, scratch: torch.Tensor, nc: int) -> torch.Tensor:
    """y = x @ dequant(W)^T with the weight decoded ``nc`` rows at a time into ``scratch``."""
    y = torch.empty((x.shape[0], pw.n), device=x.device, dtype=x.dtype)
    for n0 in range(0, pw.n, nc):
        n1 = min(n0 + nc, pw.n)
        w = dense.dequantize(rows(pw, n0, n1), out=scratch[: n1 - n0])
        torch.mm(x, w.T, out=y[:, n0:n1])
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--chunks", default=",".join(map(str, CHUNKS)))
    ap.add_argument("--repeats", type=int, default=1, help="alternating cuBLAS / dense timings per point (median)")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    out = {"gpu": props.name, "l2": l2, "torch": torch.__version__, "rows": []}
    for n, k in SHAPES:
        w, q, pw0 = _quantized("nvfp4", n, k, n + k)
        pws = [pw0] + [wo_gemm.PackedWeight(pw0.fmt, pw0.group, n, k, pw0.words.clone(), pw0.scale.clone(), None,
                                            pw0.gscale.clone(), pw0.bytes32) for _ in range(_copies(q.nbytes, l2) - 1)]
        wb = w.to(torch.bfloat16)
        wbs = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
        for m in [int(v) for v in args.ms.split(",")]:
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            row = {"N": n, "K": k, "M": m}
            # the two arms alternate, `--repeats` times: at large M a GEMM runs long enough for the clocks to fall
            # (power), so a single cuBLAS-then-dense pair would credit cuBLAS with the cooler GPU
            pairs = []
            for _ in range(args.repeats):
                t_c = graph_us([lambda wi=wi, x=x: x @ wi.T for wi in wbs])
                t_d = graph_us([lambda p=p, x=x: x @ dense.dequantize(p).T for p in pws])
                pairs.append((t_c, t_d))
            row["pairs_us"] = pairs
            row["cublas_us"] = sorted(c for c, _ in pairs)[len(pairs) // 2]
            row["dense_us"] = sorted(d for _, d in pairs)[len(pairs) // 2]
            row["ratio_median"] = sorted(c / d for c, d in pairs)[len(pairs) // 2]  # cuBLAS / dense, per pair
            ref = dense.dequantize(pw0)
            want = x @ ref.T
            del ref
            for nc in [int(v) for v in args.chunks.split(",")]:
                if nc >= n:
                    continue
                scratch = torch.empty((nc, k), device="cuda", dtype=torch.bfloat16)
                got = chunked(x, pw0, scratch, nc)
                err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                us = graph_us([lambda p=p, s=scratch, x=x, nc=nc: chunked(x, p, s, nc) for p in pws])
                row[f"chunk{nc}_us"], row[f"chunk{nc}_err"] = us, err
                del scratch
            out["rows"].append(row)
            cells = "  ".join(f"Nc={c}: {row[f'chunk{c}_us']:.1f} us ({row['cublas_us'] / row[f'chunk{c}_us']:.3f}x, "
                              f"err {row[f'chunk{c}_err']:.1e})" for c in map(int, args.chunks.split(","))
                              if f"chunk{c}_us" in row)
            spread = " ".join(f"{c / d:.3f}" for c, d in pairs)
            print(f"{n}x{k} M={m}: cuBLAS {row['cublas_us']:.1f} us, dense {row['dense_us']:.1f} us "
                  f"({row['ratio_median']:.3f}x; pairs {spread}); {cells}", flush=True)
        del pws, wbs, wb
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dense_chunks.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
