"""Device check and benchmark of the Hopper wgmma decode GEMM (``quarl_kernels.wgmma_decode``), M = 17..64.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/bench_wgmma_decode.py --budget-s 240 --out $OUT/wgmma
    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/bench_wgmma_decode.py --dry-run --out /tmp/wg_dry
    ... bench_wgmma_decode.py --ring --formats nvfp4 --ms 64 --no-check   # + the TMA-ring kernel (wgmma_ring.py)

Phases, in order, each point written to ``--out/wgmma_decode.json`` as soon as it is
measured (a run stopped by ``--budget-s`` or killed keeps what it finished):

1. correctness, NVFP4: ``default_config`` at M in {17, 24, 32, 48, 64} on the 7B / 32B
   layer shapes against the float64 product of x and the format's own dequantized weight
   (``||y - ref|| / ||ref|| < 5e-3``, the GPU tests' bound) and against ``mma_decode``'s
   output (``max |y - y_mma| <= 1e-2 max |ref|``: same decoded weights, another summation
   order); PASS / FAIL per case;
2. speed, NVFP4, M = 32 and 64: every ``candidate_configs`` entry (each checked against the
   reference first), mma_decode's default (what ``wo_matmul`` runs today), the current
   ``wo_matmul`` dispatch (wgmma switched off), and cuBLAS BF16 ``x @ w.T``. Timing as in
   ``bench_wo_gemm.py``: rotating weight copies (>= 4x L2, so weights stream from HBM), the
   calls of all copies captured in one CUDA graph, median per call. % HBM against the
   measured copy rate, bytes = packed weight + scales + x + y;
3. and 4. the same for MXFP4 and INT4 g128 while the budget lasts.

The last lines printed are a markdown table (also ``--out/wgmma_decode.md``).

``--dry-run`` (no GPU): compiles every candidate config x format x token tile for sm_90
with Triton's bundled ptxas and reports registers, spills, shared memory, HGMMA count and
the main loop's instruction mix (``compile_report.py``); then runs this script's own
phases on the CPU at tiny sizes with the kernels replaced by the reference product (the
plumbing, JSON and table: nothing here is a measurement).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # compile_report, bench_wo_gemm

SHAPES = [(18944, 3584), (3584, 18944), (3584, 3584), (512, 3584), (27648, 5120), (5120, 27648)]  # N x K: 7B, 32B
CHECK_MS = [17, 24, 32, 48, 64]
SPEED_MS = [32, 64]
SPECS = ["nvfp4", "mxfp4", "int4-g128"]
TOL = 5e-3
GROUP = {0: 16, 1: 32, 2: 128}  # FMT_NVFP4, FMT_MXFP4, FMT_INT4
NAMES = {0: "nvfp4", 1: "mxfp4", 2: "int4"}


# ---------------------------------------------------------------------------
def compile_wgmma_decode(fmt: int, cfg, nt: int, split: bool = True, even_k: bool = True, blocked: bool = False):
    """``_wgmma_decode_kernel`` compiled for sm_90 as ``launch_wgmma_decode`` specializes it at
    the 7B shapes (word / FP4-scale strides divisible by 16, INT4 scale strides not), no GPU; ``blocked``: the
    words in ``quarl.quant.packed_layout``'s [64, 8] blocks."""
    import triton
    from quarl_kernels import wgmma_decode as wd
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"x_ptr": "*bf16", "wp_ptr": "*i32", "s_ptr": "*fp32" if fmt == 2 else "*u8",
           "z_ptr": "*i8" if fmt == 2 else "*u8", "gs_ptr": "*fp32", "out_ptr": "*fp32" if split else "*bf16"}
    for k in ("M", "N", "KW", "TILES_PER_SPLIT", "stride_xm", "stride_wn", "stride_sn", "stride_zn", "stride_os",
              "stride_om"):
        sig[k] = "i32"
    const = {"FMT": fmt, "GROUP": GROUP[fmt], "HAS_ZP": fmt == 2, "R": cfg.rows, "BKW": cfg.bkw, "NT": nt,
             "W": cfg.warps, "PREFETCH": cfg.prefetch, "EVEN_K": even_k, "NBUF": cfg.nbuf, "BLOCKED": blocked}
    sig.update({k: "constexpr" for k in const})
    odd = ("M", "TILES_PER_SPLIT") + (("stride_sn", "stride_zn") if fmt == 2 else ())
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items()) if t != "constexpr" and k not in odd}
    src = GluonASTSource(fn=wd._wgmma_decode_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps})


def compile_wgmma_ring(fmt: int, cfg, nt: int, smax: int = 32, split: bool = True, pdl: int = 0,
                       blocked: bool = False, w_early: bool | None = None):
    """``wgmma_ring._wgmma_ring_kernel`` compiled for sm_90 (no GPU), its TMA descriptors as the launcher builds them
    (``blocked``: one [64, 8] box of the blocked words per 64-row band; ``w_early``: the ``W_EARLY`` constexpr, left
    at its default when None)."""
    import triton
    from quarl_kernels import wgmma_ring as wr
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"x_desc": f"tensordesc<bf16[{nt}, {cfg.bkw * 8}],{wr._x_layout(nt)!r}>",
           "w_desc": f"tensordesc<i32[{64 if blocked else cfg.rows}, {cfg.bkw}],{wr._w_layout()!r}>",
           "s_ptr": "*u8", "gs_ptr": "*fp32", "out_ptr": "*fp32" if split else "*bf16"}
    for k in ("M", "N", "KW", "G", "TILES_PER_SPLIT", "stride_sn", "stride_os", "stride_om"):
        sig[k] = "i32"
    const = {"FMT": fmt, "GROUP": GROUP[fmt], "R": cfg.rows, "BKW": cfg.bkw, "NT": nt, "STAGES": cfg.stages,
             "SMAX": smax, "MMA_INFLIGHT": cfg.inflight, "W": cfg.warps, "PDL": pdl, "BLOCKED": blocked}
    if w_early is not None:
        const["W_EARLY"] = w_early
    sig.update({k: "constexpr" for k in const})
    odd = ("M", "G", "TILES_PER_SPLIT")
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items())
             if t != "constexpr" and not t.startswith("tensordesc") and k not in odd}
    src = GluonASTSource(fn=wr._wgmma_ring_kernel, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps})


def compile_table(dump: str | None = None, even_k: bool = True) -> list[dict]:
    """Every config x format x token tile it is a candidate for: resources and the main loop's mix."""
    import collections

    import compile_report as cr
    from quarl_kernels import wgmma_decode as wd

    rows = []
    for fmt in (0, 1, 2):
        for i, cfg in enumerate(wd.WGMMA_DECODE_CONFIGS):
            for nt in (32, 64):
                if cfg not in wd.candidate_configs(nt):
                    continue
                label = f"{NAMES[fmt]}_cfg{i}_{cfg}_NT{nt}{'' if even_k else '_tail'}"
                try:
                    r = cr.report(compile_wgmma_decode(fmt, cfg, nt, even_k=even_k), label, dump)
                except Exception as e:  # noqa: BLE001  (one bad variant must not hide the others)
                    print(f"FAILED {label}: {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}",
                          flush=True)
                    rows.append({"kernel": label, "failed": str(e)[:500]})
                    continue
                wpt = cfg.rows * cfg.bkw * 8 // (32 * cfg.warps)  # weights decoded per thread per K step
                r.update(index=i, nt=nt, weights_per_thread_step=wpt, instr_per_weight=round(r["loop_len"] / wpt, 2),
                         hgmma_per_step=r["loop_mma"])
                if dump:
                    with open(os.path.join(dump, f"{label}.sass")) as f:
                        r["loop_mix"] = dict(collections.Counter(cr._main_loop(f.read())).most_common(12))
                rows.append(r)
                print(f"{label:44s} regs {r['regs']:3d} stack {r['stack']:3d} smem {r['smem']:6d} "
                      f"HGMMA {r['wgmma']:2d} (loop {r['loop_mma']:2d}) HMMA {r['hmma']} loop {r['loop_len']:4d} "
                      f"({r['instr_per_weight']:.2f}/weight) bar {r['loop_bar']} sts {r['loop_sts']} "
                      f"ldg {r['loop_ldg']}", flush=True)
    return rows


# ---------------------------------------------------------------------------
class Recorder:
    """Append-only results: the JSON file is rewritten after every point (atomic replace)."""

    def __init__(self, out_dir: str, info: dict):
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, "wgmma_decode.json")
        self.data = {"info": info, "check": [], "speed": [], "compile": []}

    def add(self, kind: str, row: dict) -> None:
        self.data[kind].append(row)
        print(json.dumps(row, default=str), flush=True)
        self.flush()

    def flush(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


class Env:
    """What the phases call: real kernels and CUDA-graph timing on a GPU; on the CPU
    (``--dry-run``) the reference product and wall-clock timing (plumbing only)."""

    def __init__(self, dry: bool, ring: bool = False):
        self.ring = ring
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        if dry:
            self.l2 = 50 << 20
            return
        from bench_wo_gemm import _copies, graph_time_us, rotating_packed
        from quarl_kernels import mma_decode, wgmma_decode, wo_gemm

        self.l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        self._copies, self._graph_time_us, self._rotating = _copies, graph_time_us, rotating_packed
        self.md, self.wd, self.wo = mma_decode, wgmma_decode, wo_gemm

    def packed(self, spec: str, w: torch.Tensor, rotate: bool):
        """(list of PackedWeight copies -- one unless ``rotate`` --, float64 reference weight, bytes)."""
        from quarl.quant import get_format, make_config

        if self.dry:
            cfg = make_config(spec)
            q = get_format(cfg.name).quantize(w, cfg)
            return [q], q.dequantize(torch.float64), q.nbytes
        if rotate:
            pws, q = self._rotating(spec, w, self.l2)
        else:
            from quarl_kernels.ops import _packed_weight

            cfg = make_config(spec)
            q = get_format(cfg.name).quantize(w, cfg)
            t = q.tensors
            pws = [_packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                                  t.get("weight_global_scale"), cfg.name, cfg.block_size, w.shape[0], w.shape[1])]
        return pws, q.dequantize(torch.float64), q.nbytes

    # the kernels: (x [M, K] bf16, packed) -> y [M, N]
    def wgmma(self, x, p, cfg):
        if self.dry:
            return self._ref(x, p)
        if str(cfg).startswith("ring-"):  # wgmma_ring.WgmmaRingConfig
            from quarl_kernels import wgmma_ring

            return wgmma_ring.launch_wgmma_ring(x, p, cfg)
        return self.wd.launch_wgmma_decode(x, p, cfg)

    def mma(self, x, p):
        return self._ref(x, p) if self.dry else self.md.launch_mma_decode(x, p, self.md.default_config(x.shape[0],
                                                                                                    p.n))

    def dispatch(self, x, p):
        """``wo_matmul`` as shipped (wgmma switched off): what rollouts run today."""
        if self.dry:
            return self._ref(x, p)
        old = os.environ.pop("QUARL_KERNELS_WGMMA_DECODE", None)
        try:
            return self.wo.wo_matmul(x, p)
        finally:
            if old is not None:
                os.environ["QUARL_KERNELS_WGMMA_DECODE"] = old

    @staticmethod
    def _ref(x, q):
        return (x.double() @ q.dequantize(torch.float64).T).to(x.dtype)

    def candidates(self, m: int, spec: str = "nvfp4"):
        if self.dry:
            return [f"dry-cfg{i}" for i in range(2)]
        ring = []
        if self.ring and spec in ("nvfp4", "mxfp4"):  # the TMA-ring kernel is FP4-only
            from quarl_kernels import wgmma_ring

            ring = list(wgmma_ring.RING_CONFIGS)
        return list(self.wd.candidate_configs(m)) + ring

    def default(self, m: int, n: int):
        if self.dry:
            return self.candidates(m)[0]
        return self.wd.default_config(m, n)

    def time_us(self, fns: list) -> float:
        if self.dry:
            t0 = time.perf_counter()
            for f in fns:
                f()
            return (time.perf_counter() - t0) * 1e6 / len(fns)
        return self._graph_time_us(fns)

    def bf16_copies(self, w: torch.Tensor) -> list[torch.Tensor]:
        wb = w.to(torch.bfloat16)
        n = 1 if self.dry else self._copies(wb.numel() * 2, self.l2)
        return [wb] + [wb.clone() for _ in range(n - 1)]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(y).any():
        return math.inf
    return ((y.double() - ref).norm() / ref.norm()).item()


def check_phase(env: Env, rec: Recorder, spec: str, shapes, ms, deadline: float) -> bool:
    """Correctness of the default config vs the float64 reference and vs mma_decode."""
    for n, k in shapes:
        torch.manual_seed(n + 7 * k)
        w = torch.randn(n, k, device=env.device) * 0.03
        pws, wref, _ = env.packed(spec, w, rotate=False)
        for m in ms:
            if time.time() > deadline:
                return False
            x = torch.randn(m, k, device=env.device).to(torch.bfloat16)
            ref = x.double() @ wref.T
            cfg = env.default(m, n)
            row = {"format": spec, "N": n, "K": k, "M": m, "config": str(cfg)}
            try:
                y = env.wgmma(x, pws[0], cfg)
                ym = env.mma(x, pws[0])
                if not env.dry:
                    torch.cuda.synchronize()
                e = rel(y, ref)
                d = (y.double() - ym.double()).abs().max().item() / ref.abs().max().item()
                ok = e < TOL and d <= 1e-2
                row.update(rel_err=e, rel_err_mma=rel(ym, ref), max_diff_vs_mma=d, result="PASS" if ok else "FAIL")
            except Exception as ex:  # noqa: BLE001  (record and go on: the next case may work)
                row.update(result="ERROR", error=f"{type(ex).__name__}: {str(ex)[:300]}")
            rec.add("check", row)
            print(f"{row['result']} {spec} {n}x{k} M={m} {cfg}", flush=True)
        del pws, wref, w
    return True


def speed_phase(env: Env, rec: Recorder, spec: str, shapes, ms, hbm: float, deadline: float) -> bool:
    """Every candidate, mma_decode's default, the current dispatch and cuBLAS BF16."""
    for n, k in shapes:
        torch.manual_seed(n + k)
        w = torch.randn(n, k, device=env.device) * 0.03
        pws, wref, qbytes = env.packed(spec, w, rotate=True)
        wbs = env.bf16_copies(w)
        for m in ms:
            if time.time() > deadline:
                return False
            x = torch.randn(m, k, device=env.device).to(torch.bfloat16)
            ref = x.double() @ wref.T
            nbytes = qbytes + 2 * m * k + 2 * m * n

            def pct(us, nbytes=nbytes):
                return 100 * nbytes / (us * 1e-6) / (hbm * 1e9)

            row = {"format": spec, "N": n, "K": k, "M": m, "bytes": nbytes}
            row["bf16_us"] = env.time_us([lambda wi=wi, x=x: x @ wi.T for wi in wbs])
            row["mma_us"] = env.time_us([lambda p=p, x=x: env.mma(x, p) for p in pws])
            row["mma_err"] = rel(env.mma(x, pws[0]), ref)
            row["dispatch_us"] = env.time_us([lambda p=p, x=x: env.dispatch(x, p) for p in pws])
            dflt = env.default(m, n)
            res = []
            for c in env.candidates(m, spec):
                if time.time() > deadline:
                    break
                r = {"config": str(c), "default": str(c) == str(dflt)}
                try:
                    r["err"] = rel(env.wgmma(x, pws[0], c), ref)
                    if r["err"] >= TOL:
                        r["result"] = "FAIL"
                    else:
                        r["us"] = env.time_us([lambda p=p, c=c, x=x: env.wgmma(x, p, c) for p in pws])
                        r["pct_hbm"] = pct(r["us"])
                        r["result"] = "PASS"
                except Exception as ex:  # noqa: BLE001
                    r.update(result="ERROR", error=f"{type(ex).__name__}: {str(ex)[:300]}")
                res.append(r)
            timed = [r for r in res if "us" in r]
            best = min(timed, key=lambda r: r["us"]) if timed else None
            row.update(
                bf16_pct_hbm=pct(row["bf16_us"]), mma_pct_hbm=pct(row["mma_us"]),
                dispatch_pct_hbm=pct(row["dispatch_us"]), candidates=res,
                best_config=best and best["config"], best_us=best and best["us"], best_pct_hbm=best and best["pct_hbm"],
                best_vs_bf16=best and row["bf16_us"] / best["us"], best_vs_mma=best and row["mma_us"] / best["us"],
                best_vs_dispatch=best and row["dispatch_us"] / best["us"],
                default_us=next((r["us"] for r in timed if r["default"]), None))
            rec.add("speed", row)
        del pws, wbs, w, wref
        if not env.dry:
            torch.cuda.empty_cache()
    return True


def to_markdown(data: dict) -> str:
    info = data["info"]
    title = (f"wgmma_decode on {info.get('gpu')} (HBM copy {info.get('hbm_copy_GBps', 0):.0f} GB/s), "
             f"{info.get('date')}{' -- DRY RUN (CPU, no measurement)' if info.get('dry_run') else ''}")
    head = ("| format | N x K | M | wgmma best (us, %HBM, config) | wgmma default us | mma_decode us (%HBM) | "
            "dispatch us | cuBLAS BF16 us (%HBM) | best vs BF16 | best vs mma |")
    lines = [title, "", head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["speed"]:
        best = (f"{r['best_us']:.1f}, {r['best_pct_hbm']:.0f}%, {r['best_config']}" if r["best_us"] else "none")
        dflt = f"{r['default_us']:.1f}" if r.get("default_us") else "-"
        vb = f"{r['best_vs_bf16']:.2f}x" if r["best_us"] else "-"
        vm = f"{r['best_vs_mma']:.2f}x" if r["best_us"] else "-"
        lines.append(f"| {r['format']} | {r['N']}x{r['K']} | {r['M']} | {best} | {dflt} | {r['mma_us']:.1f} "
                     f"({r['mma_pct_hbm']:.0f}%) | {r['dispatch_us']:.1f} | {r['bf16_us']:.1f} "
                     f"({r['bf16_pct_hbm']:.0f}%) | {vb} | {vm} |")
    checks = data["check"]
    npass = sum(r["result"] == "PASS" for r in checks)
    if not checks:  # --no-check: each timed candidate was still checked against the reference first
        return "\n".join(lines + ["", (f"correctness of the defaults not run (--no-check); every timed candidate "
                                        f"passed rel. error < {TOL} first")])
    lines += ["", (f"correctness: {npass} / {len(checks)} PASS (rel. error < {TOL} vs float64 reference, "
                   f"max diff vs mma_decode <= 1e-2 max|ref|)")]
    lines += [f"  {r['result']}: {r['format']} {r['N']}x{r['K']} M={r['M']} {r.get('error', r.get('rel_err'))}"
              for r in checks if r["result"] != "PASS"]
    return "\n".join(lines)


def smoke(timeout_s: float, ring: bool = False) -> dict:
    """Every candidate once at M = 24 and 64 on a small weight, in a child process with a time
    limit: a kernel that hangs (a barrier or wgmma wait that never completes) costs
    ``timeout_s``, not the whole device session. Also fills Triton's compile cache."""
    import subprocess

    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--smoke-child"] + (["--ring"] if ring else []),
                           check=False, capture_output=True,
                           text=True, timeout=timeout_s)
        return {"rc": p.returncode, "wall_s": time.time() - t0, "tail": (p.stdout + p.stderr)[-3000:]}
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"rc": "timeout", "wall_s": time.time() - t0, "tail": out[-3000:]}


def smoke_child(ring: bool) -> None:
    env = Env(False, ring)
    torch.manual_seed(0)
    w = torch.randn(1024, 1024, device="cuda") * 0.03
    for spec in SPECS:
        pws, wref, _ = env.packed(spec, w, rotate=False)
        for m in (24, 64):
            x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
            ref = x.double() @ wref.T
            for c in env.candidates(m, spec):
                y = env.wgmma(x, pws[0], c)
                torch.cuda.synchronize()
                print(f"smoke {spec} M={m} {c} rel_err {rel(y, ref):.2e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "wgmma"))
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new points after this many seconds")
    ap.add_argument("--formats", default=",".join(SPECS), help=f"comma-separated, default {','.join(SPECS)}")
    ap.add_argument("--shapes", default=None, help="N x K list, e.g. 18944x3584,3584x18944 (default: 7B + 32B set)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: sm_90 compile report + CPU plumbing run")
    ap.add_argument("--dump", default=None, help="with --dry-run: write ttgir/ptx/sass of every variant here")
    ap.add_argument("--no-compile", action="store_true", help="with --dry-run: skip the compile report")
    ap.add_argument("--smoke-timeout-s", type=float, default=150.0,
                    help="GPU: time limit of the first run of every config (child process); 0 skips it")
    ap.add_argument("--smoke-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ring", action="store_true", help="also time the TMA-ring kernel's configs (wgmma_ring.py, FP4)")
    ap.add_argument("--ms", default=None, help=f"speed phase token counts (default {','.join(map(str, SPEED_MS))})")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness phase of the defaults")
    args = ap.parse_args()
    if args.smoke_child:
        smoke_child(args.ring)
        return
    t0 = time.time()
    deadline = t0 + args.budget_s
    specs = args.formats.split(",")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    if args.dry_run:
        shapes = [(192, 256), (64, 512)]  # tiny: the plumbing, not the kernels
        info = {"gpu": "cpu (dry run)", "hbm_copy_GBps": 1.0, "dry_run": True}
    else:
        import triton
        from bench_wo_gemm import measure_ceilings

        props = torch.cuda.get_device_properties(0)
        info = {"gpu": props.name, "sms": props.multi_processor_count, "capability": list(torch.cuda.get_device_capability()),
                "torch": torch.__version__, "triton": triton.__version__}
        info.update(measure_ceilings())
    info.update(date=datetime.date.today().isoformat(), budget_s=args.budget_s, shapes=shapes, formats=specs)
    rec = Recorder(args.out, info)
    if args.dry_run and not args.no_compile:
        for r in compile_table(args.dump):
            rec.add("compile", r)
    if not args.dry_run and args.smoke_timeout_s > 0:
        sm = smoke(min(args.smoke_timeout_s, max(10.0, deadline - time.time())), args.ring)
        rec.data["info"]["smoke"] = sm
        rec.flush()
        print(sm["tail"], flush=True)
        if sm["rc"] != 0:
            print(f"SMOKE FAILED (rc {sm['rc']} after {sm['wall_s']:.0f} s): no benchmark; see {rec.path}", flush=True)
            sys.exit(1)
    env = Env(args.dry_run, args.ring)
    hbm = info["hbm_copy_GBps"]
    speed_ms = [int(v) for v in args.ms.split(",")] if args.ms else SPEED_MS
    done = True
    for spec in specs:  # NVFP4 first: its check, then its speed, then the next format
        if not args.no_check:
            done = done and check_phase(env, rec, spec, shapes, CHECK_MS, deadline)
        done = done and speed_phase(env, rec, spec, shapes, speed_ms, hbm, deadline)
    rec.data["info"].update(wall_s=time.time() - t0, complete=done)
    rec.flush()
    md = to_markdown(rec.data)
    with open(os.path.join(args.out, "wgmma_decode.md"), "w") as f:
        f.write(md + "\n")
    if not done:
        print(f"budget of {args.budget_s:.0f} s reached: stopped cleanly, partial results in {rec.path}", flush=True)
    print(md, flush=True)


if __name__ == "__main__":
    main()
