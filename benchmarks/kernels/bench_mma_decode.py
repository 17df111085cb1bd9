"""Benchmark the Gluon mma.sync decode GEMM (``quarl_kernels.mma_decode``) at Qwen2.5-7B shapes.

    PYTHONPATH=.:kernels:benchmarks/kernels python benchmarks/kernels/bench_mma_decode.py --out DIR [--ms 4,8,16,32,64]
    PYTHONPATH=.:kernels:benchmarks/kernels python benchmarks/kernels/bench_mma_decode.py --compile-report

Timing (GPU): the method of ``bench_wo_gemm.py`` (its helpers are imported):
measured ceilings first, rotating weight copies (>= 4x L2) so every call reads
its weight from HBM, R calls captured in one CUDA graph, median per call. Per
(format, N x K, M in ``--ms``, default 4 / 8 / 16 / 32 / 64): the
``MMA_DECODE_CONFIGS`` entries meant for M's token tile
(``mma_decode.candidate_configs``; ``default_config``'s pick is marked), the
tensor-core path (``wo_gemm.launch_fwd`` with its default config, what
``wo_matmul`` runs at M > 16 without this kernel) and cuBLAS BF16, each output checked
against a float64 reference first. Prints one JSON line per point and writes
``mma_decode.json`` to ``--out`` (default ``$OUT``).

``--compile-report`` (no GPU): compiles every config x format x token tile it is a
candidate for (8 / 16 / 32 / 64) for sm_90 with the bundled ptxas and prints registers, spills (stack),
shared memory, and the main loop's SASS mix per weight (``compile_report.py``'s
loop finder): instructions, integer ops, FMA-pipe ops, HMMA, loads, barriers.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import time

import triton
from quarl_kernels import mma_decode
from quarl_kernels.formats import FMT_INT4, FMT_MXFP4, FMT_NVFP4

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]  # N x K: q/o, k/v, gate/up, down
MS = [4, 8, 16, 32, 64]
SPECS = ["nvfp4", "mxfp4", "int4-g128"]
GROUP = {FMT_NVFP4: 16, FMT_MXFP4: 32, FMT_INT4: 128}
NAMES = {FMT_NVFP4: "nvfp4", FMT_MXFP4: "mxfp4", FMT_INT4: "int4"}


# ---------------------------------------------------------------------------
def compile_mma_decode(fmt: int, cfg: mma_decode.MmaDecodeConfig, nt: int, split: bool = True, even_k: bool = True,
                       lora_a: bool = False, nw: int = 1, pdl: int = 0, blocked: bool = False,
                       w_early: bool | None = None):
    """``_mma_decode_kernel`` compiled for sm_90 as ``launch_mma_decode`` specializes it at
    the Qwen2.5-7B shapes (word / FP4-scale strides divisible by 16, INT4 scale strides
    K/128 not), without a GPU; ``lora_a``: with a LoRA group's A programs (``HAS_LA``); ``nw``: the tiles of that
    many weights in the launch (a group's q/k/v); ``pdl``: the ``PDL`` mode (``quarl_kernels.pdl``); ``blocked``: the
    words in ``quarl.quant.packed_layout``'s [64, 8] blocks; ``w_early``: the ``W_EARLY`` constexpr (None: its
    default)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"x_ptr": "*bf16", "wp_ptr": "*i32", "s_ptr": "*fp32" if fmt == FMT_INT4 else "*u8",
           "z_ptr": "*i8" if fmt == FMT_INT4 else "*u8", "gs_ptr": "*fp32", "out_ptr": "*fp32" if split else "*bf16"}
    for k in ("M", "N", "KW", "TILES_PER_SPLIT", "stride_xm", "stride_wn", "stride_sn", "stride_zn", "stride_os",
              "stride_om"):
        sig[k] = "i32"
    sig.update({"la_w_ptr": "*bf16", "la_out_ptr": "*fp32"})
    for k in ("LA_R", "LA_PER", "LA_PROGS", "la_stride_wr", "la_s_out", "la_m_out"):
        sig[k] = "i32"
    for j in (1, 2):  # the group's other weights (NW = 1 here: placeholders)
        sig.update({f"wp{j}_ptr": "*i32", f"s{j}_ptr": sig["s_ptr"], f"gs{j}_ptr": "*fp32", f"out{j}_ptr": sig["out_ptr"]})
        for k in (f"N{j}", f"T{j - 1}", f"so{j}", f"som{j}"):
            sig[k] = "i32"
    const = {"FMT": fmt, "GROUP": GROUP[fmt], "HAS_ZP": fmt == FMT_INT4, "R": cfg.rows, "BKW": cfg.bkw, "NT": nt,
             "W": cfg.warps, "PREFETCH": cfg.prefetch, "EVEN_K": even_k, "XS": cfg.xsmem, "HAS_LA": lora_a,
             "LA_V": mma_decode.LORA_A_V, "NW": nw, "PDL": pdl, "DIAG": cfg.diag, "BLOCKED": blocked}
    if w_early is not None:
        const["W_EARLY"] = w_early
    sig.update({k: "constexpr" for k in const})
    odd = ("M", "TILES_PER_SPLIT", "LA_R", "LA_PROGS", "T0", "T1") + (("stride_sn", "stride_zn") if fmt == FMT_INT4
                                                                       else ())
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items()) if t != "constexpr" and k not in odd}
    src = GluonASTSource(fn=mma_decode._mma_decode_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps})


def compile_table(dump: str | None = None) -> list[dict]:
    import compile_report as cr

    rows = []
    for fmt in (FMT_NVFP4, FMT_MXFP4, FMT_INT4):
        for i, cfg in enumerate(mma_decode.MMA_DECODE_CONFIGS):
            for nt in (8, 16, 32, 64):
                if cfg not in mma_decode.candidate_configs(nt):
                    continue
                label = f"{NAMES[fmt]}_cfg{i}_{cfg}_NT{nt}"
                try:
                    k = compile_mma_decode(fmt, cfg, nt)
                    r = cr.report(k, label, dump)
                except Exception as e:  # noqa: BLE001  (one bad variant must not hide the others)
                    print(f"FAILED {label}: {str(e).splitlines()[0][:300]}", flush=True)
                    continue
                # weights decoded per thread per loop iteration: rows x BK over the CTA's threads
                wpt = cfg.rows * cfg.bkw * 8 // (32 * cfg.warps)
                r.update(weights_per_thread_step=wpt, instr_per_weight=round(r["loop_len"] / wpt, 2),
                         int_per_weight=round(r["loop_int"] / wpt, 2), fma_per_weight=round(r["loop_fma"] / wpt, 2),
                         hmma_per_step=r["loop_mma"], nt=nt, index=i)
                if dump:
                    with open(os.path.join(dump, f"{label}.sass")) as f:
                        sass = f.read()
                    r["loop_mix"] = dict(collections.Counter(cr._main_loop(sass)).most_common(12))
                rows.append(r)
                print(json.dumps(r), flush=True)
    return rows


# ---------------------------------------------------------------------------
def bench(out_dir: str, shapes, ms, specs, read_ceiling: bool = False) -> dict:
    import torch
    from bench_wo_gemm import _copies, graph_time_us, measure_ceilings, rotating_packed
    from quarl_kernels import wo_gemm

    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    info = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat()}
    info.update(measure_ceilings())
    print(json.dumps(info), flush=True)
    hbm = info["hbm_copy_GBps"]
    rows = []
    for n, k in shapes:
        bf16_cache: dict = {}
        for spec in specs:
            torch.manual_seed(n + k)
            w = torch.randn(n, k, device="cuda") * 0.03
            pws, q = rotating_packed(spec, w, l2)
            p0 = pws[0]
            wref = q.dequantize(torch.float64)
            read_us = None
            if read_ceiling:  # a plain streaming read of the weight's bytes, timed the same way (bench_gemv)
                from bench_gemv import read_ceiling_us

                read_us = read_ceiling_us(q.nbytes, l2)
            for m in ms:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ wref.T
                nbytes = q.nbytes + 2 * m * k + 2 * m * n

                def err(y, ref=ref):
                    return ((y.double() - ref).norm() / ref.norm()).item()

                if m not in bf16_cache:  # the same for every format
                    wb = w.to(torch.bfloat16)
                    wbs = [wb] + [wb.clone() for _ in range(_copies(wb.numel() * 2, l2) - 1)]
                    bf16_cache[m] = graph_time_us([lambda wi=wi, x=x: x @ wi.T for wi in wbs])
                    del wbs, wb
                t_bf16 = bf16_cache[m]
                dcfg = wo_gemm.default_config("fwd", m, n, k)
                e_tc = err(wo_gemm.launch_fwd(x, p0, dcfg))
                t_tc = graph_time_us([lambda p=p, x=x, c=dcfg: wo_gemm.launch_fwd(x, p, c) for p in pws])
                res = []
                mdef = mma_decode.default_config(m, n)
                for c in mma_decode.candidate_configs(m):
                    i = mma_decode.MMA_DECODE_CONFIGS.index(c)
                    e = err(mma_decode.launch_mma_decode(x, p0, c))
                    us = graph_time_us([lambda p=p, c=c, x=x: mma_decode.launch_mma_decode(x, p, c) for p in pws])
                    res.append({"config": str(c), "index": i, "us": us, "err": e, "default": c == mdef,
                                "pct_hbm": 100 * nbytes / us / 1e3 / hbm})
                best = min(res, key=lambda r: r["us"])
                dflt = next(r for r in res if r["default"])
                row = {"format": spec, "N": n, "K": k, "M": m, "bytes": nbytes, "bf16_us": t_bf16,
                       "tc_us": t_tc, "tc_config": str(dcfg), "tc_err": e_tc, "tc_pct_hbm": 100 * nbytes / t_tc / 1e3 / hbm,
                       "best_us": best["us"], "best_config": best["config"], "best_pct_hbm": best["pct_hbm"],
                       "default_us": dflt["us"], "default_config": dflt["config"], "default_pct_hbm": dflt["pct_hbm"],
                       "speedup_vs_bf16": t_bf16 / best["us"], "speedup_vs_tc": t_tc / best["us"],
                       "max_err": max(r["err"] for r in res), "read_us": read_us, "all": res}
                rows.append(row)
                print(json.dumps(row), flush=True)
            del pws
    info["wall_s"] = time.time() - t0
    result = {"info": info, "forward": rows}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "mma_decode.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(f"{r['format']:10s} {r['N']:5d}x{r['K']:5d} M={r['M']:2d}  best {r['best_us']:7.1f} us "
              f"({r['best_pct_hbm']:4.0f}% HBM, {r['best_config']})  default {r['default_us']:7.1f} us "
              f"({r['default_pct_hbm']:4.0f}%)  tc {r['tc_us']:7.1f} us ({r['tc_pct_hbm']:4.0f}%)  "
              f"bf16 {r['bf16_us']:7.1f} us  x{r['speedup_vs_bf16']:.2f} vs bf16  x{r['speedup_vs_tc']:.2f} vs tc  "
              f"err {r['max_err']:.1e}" + (f"  read {r['read_us']:.1f} us" if r["read_us"] else ""), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="18944x3584 only (M from --ms, default 8)")
    ap.add_argument("--ms", default=None, help="comma-separated token counts (1..64), default 4,8,16,32,64")
    ap.add_argument("--formats", default=",".join(SPECS), help=f"comma-separated, default {','.join(SPECS)}")
    ap.add_argument("--compile-report", action="store_true", help="compile for sm_90 and report SASS (no GPU)")
    ap.add_argument("--dump", default=None, help="with --compile-report: write ttgir/ptx/sass here")
    ap.add_argument("--shapes", default=None, help="comma-separated NxK, default the 7B q/o, k/v, gate/up, down")
    ap.add_argument("--read-ceiling", action="store_true",
                    help="also time a plain streaming read of each weight's bytes (bench_gemv's read ceiling)")
    args = ap.parse_args()
    if args.compile_report:
        compile_table(args.dump)
        return
    ms = [int(v) for v in args.ms.split(",")] if args.ms else ([8] if args.quick else MS)
    for m in ms:
        mma_decode.token_tile(m)  # ValueError naming the range for M outside 1..64
    shapes = ([tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")] if args.shapes
              else SHAPES[2:3] if args.quick else SHAPES)
    bench(args.out, shapes, ms, args.formats.split(","), args.read_ceiling)


if __name__ == "__main__":
    main()
