"""DeepGEMM's block layouts for Jet-RL's FP8 GEMMs, measured: the heuristic's choice against every other candidate.

Why. Jet-RL's FP8 layer spends ~18 of its ~26 ms (Qwen2.5-7B width, 16k tokens, H100) in DeepGEMM's SM90 1D2D
kernel, at ~1250-1300 TFLOP/s. DeepGEMM picks each GEMM's block sizes and TMA-multicast cluster by a model of L1 / L2
cycles (``csrc/jit_kernels/heuristics/sm90.hpp``), not by timing. This sweep times the other layouts on the layer's
own shapes, through ``quarl.quant.fp8_linear._deepgemm`` (the operands' layouts the linears pass). It needs DeepGEMM
built with ``benchmarks/deepgemm_layouts.patch`` (``DG_SM90_LAYOUTS="m:n:k=block_m,block_n,cluster_m,cluster_n"``
names the layout; a layout that is not one of the heuristic's candidates raises).

    --warm i/n     compile shard i of n of the candidates (JIT; run n processes in parallel first)
    (default)      time them: two rounds, each shape's heuristic layout and every candidate, ms median of --reps
    --pick FILE    print DG_SM90_LAYOUTS for a sweep's JSON: per shape, the fewest-joules layout at a level speed
    --energy-s S   also the joules a call takes (NVML over >= S seconds of back-to-back calls, ``gpu_energy``), and
                   the layout with the fewest. Why (session 35): the FP8 actor update runs at the H100's 700 W cap,
                   where the step's time follows its energy -- kernels made faster without drawing less energy gave
                   their time to the GEMMs' lower clock -- so the layout to want there is the one with the fewest
                   joules per GEMM, which session 32's timing at full clock did not ask.

Shapes (m, n, k) of one Qwen2.5-7B layer at --tokens T (forward Y = X W^T; DGrad dX = dY W; WGrad dW = dY^T X with
X^T in 128x128 tiles): the gate / up forward and down DGrad (T, 18944, 3584); the down forward and gate / up DGrad
(T, 3584, 18944); the gate / up WGrad (18944, 3584, T); the down WGrad (3584, 18944, T); the o forward / DGrad
(T, 3584, 3584).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = {  # name -> (m, n, k); T substituted
    "gate-up-fwd+down-dgrad": ("T", 18944, 3584),
    "down-fwd+gate-up-dgrad": ("T", 3584, 18944),
    "gate-up-wgrad": (18944, 3584, "T"),
    "down-wgrad": (3584, 18944, "T"),
    "o-fwd+dgrad": ("T", 3584, 3584),
}
ENV = "DG_SM90_LAYOUTS"


def candidates() -> list[tuple[int, int, int, int]]:
    """(block_m, block_n, cluster_m, cluster_n): the 1D2D kernel's block N <= 192, and never both blocks > 128."""
    out = []
    for cm, cn in ((1, 1), (2, 1), (1, 2)):
        for bm in (128, 256):
            for bn in (96, 112, 128, 144, 160, 192):
                if bm > 128 and bn > 128:
                    continue
                out.append((bm, bn, cm, cn))
    return out


def operands(m: int, n: int, k: int):
    """A [m, k] E4M3 with M-major 1x128 scales, B [n, k] E4M3 with 128x128 tile scales (what the linears pass)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(m, k, device="cuda", generator=g) * 64).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda", generator=g) * 64).to(torch.float8_e4m3fn)
    sa = torch.rand(k // 128, m, device="cuda", generator=g).t() + 0.5  # [m, k/128], stride(0) == 1
    sb = torch.rand(n // 128, k // 128, device="cuda", generator=g) + 0.5
    return a, sa, b, sb


def call(ops, layout=None, shape=None):
    from quarl.quant.fp8_linear import _deepgemm

    if layout is None:
        os.environ.pop(ENV, None)
    else:
        m, n, k = shape
        os.environ[ENV] = f"{m}:{n}:{k}=" + ",".join(map(str, layout))
    return _deepgemm(*ops, torch.bfloat16)


def time_ms(ops, layout, shape, reps: int) -> float:
    for _ in range(3):
        call(ops, layout, shape)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        call(ops, layout, shape)
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def joules_per_call(meter, ops, layout, shape, ms: float, seconds: float) -> tuple[float | None, float | None]:
    """(J, mean SM MHz) of one call of ``layout`` on ``shape``: ``meter`` (``gpu_energy.EnergyMeter``) around
    ``seconds`` of back-to-back calls (``ms`` each, as timed); (None, None) where the meter reads nothing."""
    n = max(1, round(seconds * 1e3 / ms))
    torch.cuda.synchronize()
    meter.start()
    for _ in range(n):
        call(ops, layout, shape)
    torch.cuda.synchronize()
    meter.stop()
    return (None if meter.joules is None else meter.joules / n), meter.sm_mhz


def pick(res: dict, max_slower: float = 1.01, max_joules: float = 0.98) -> str:
    """``DG_SM90_LAYOUTS`` naming, per shape of a sweep with joules (``res``: this script's JSON), the layout with the
    fewest joules a call over its rounds (mean) when that is <= ``max_joules`` x the heuristic's and its time <=
    ``max_slower`` x the heuristic's (level speed); shapes where none qualifies keep the heuristic's (not named)."""
    by: dict[str, list[dict]] = {}
    for r in res["rows"]:
        by.setdefault(r["shape"], []).append(r)
    out = []
    for rows in by.values():
        if any(r.get("heuristic_j") is None for r in rows):
            continue
        hj = statistics.mean(r["heuristic_j"] for r in rows)
        hms = statistics.mean(r["heuristic"] for r in rows)
        mean = {}
        for c in rows[0]["ms"]:
            js = [r.get("j", {}).get(c) for r in rows]
            ms = [r["ms"].get(c) for r in rows]
            if None not in js and None not in ms:
                mean[c] = (statistics.mean(js), statistics.mean(ms))
        ok = {c: jm for c, jm in mean.items() if jm[0] <= max_joules * hj and jm[1] <= max_slower * hms}
        if ok:
            best = min(ok, key=lambda c: ok[c][0])
            m, n, k = rows[0]["mnk"]
            out.append(f"{m}:{n}:{k}=" + ",".join(t.strip() for t in best.strip("()").split(",")))
    return ";".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    ap.add_argument("--warm", default="", help="i/n: compile shard i of n of the candidates, then exit")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="deepgemm_layouts")
    ap.add_argument("--energy-s", type=float, default=0.0, help="also J a call over >= this many seconds (0: off)")
    ap.add_argument("--pick", default="", help="a sweep's deepgemm_layouts.json: print DG_SM90_LAYOUTS (pick())")
    a = ap.parse_args()
    if a.pick:
        print(pick(json.loads(Path(a.pick).read_text())))
        return
    names = [s for s in a.shapes.split(",") if s]
    shapes = {nm: tuple(a.tokens if v == "T" else v for v in SHAPES[nm]) for nm in names}
    cands = candidates()
    if a.warm:
        i, n = map(int, a.warm.split("/"))
        jobs = [(nm, c) for nm in shapes for c in cands][i::n]
        for nm, c in jobs:
            t0 = time.time()
            try:
                call(operands(*shapes[nm]), c, shapes[nm])
                torch.cuda.synchronize()
                print(f"warm {nm} {c}: {time.time() - t0:.1f} s", flush=True)
            except RuntimeError as e:
                print(f"warm {nm} {c}: refused ({str(e).splitlines()[0][:120]})", flush=True)
        return
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": a.tokens, "reps": a.reps,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "energy_s": a.energy_s, "rows": []}
    meter = None
    if a.energy_s > 0:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from gpu_energy import EnergyMeter

        meter = EnergyMeter(torch.cuda.current_device())
        if meter.lib is None:
            raise SystemExit(f"--energy-s: NVML reads nothing here ({meter.why})")
    for rnd in range(2):
        for nm, shape in shapes.items():
            ops = operands(*shape)
            row = {"round": rnd, "shape": nm, "mnk": shape, "heuristic": time_ms(ops, None, shape, a.reps), "ms": {}}
            if meter is not None:
                row["j"], row["mhz"] = {}, {}
                row["heuristic_j"], _ = joules_per_call(meter, ops, None, shape, row["heuristic"], a.energy_s)
            for c in cands:
                try:
                    row["ms"][str(c)] = time_ms(ops, c, shape, a.reps)
                    if meter is not None:
                        row["j"][str(c)], row["mhz"][str(c)] = joules_per_call(meter, ops, c, shape, row["ms"][str(c)],
                                                                               a.energy_s)
                except RuntimeError as e:
                    row["ms"][str(c)] = None
                    row.setdefault("refused", []).append(str(c))
                    del e
            os.environ.pop(ENV, None)
            ok = {c: t for c, t in row["ms"].items() if t is not None}
            row["best"] = min(ok, key=ok.get) if ok else None
            if meter is not None:
                oj = {c: j for c, j in row["j"].items() if j is not None}
                row["fewest_j"] = min(oj, key=oj.get) if oj else None
            m, n, k = shape
            tf = 2 * m * n * k / 1e9
            print(json.dumps({"round": rnd, "shape": nm, "heuristic_ms": round(row["heuristic"], 4),
                              "heuristic_tflops": round(tf / row["heuristic"], 1), "best": row["best"],
                              "best_ms": round(ok[row["best"]], 4) if ok else None,
                              "best_tflops": round(tf / ok[row["best"]], 1) if ok else None}), flush=True)
            res["rows"].append(row)
            del ops
            torch.cuda.empty_cache()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deepgemm_layouts.json").write_text(json.dumps(res, indent=1))
    L = [f"# DeepGEMM SM90 1D2D layouts, {res['gpu']}, torch {res['torch']}, {a.tokens} tokens, {res['date']}", "",
         ("| shape (m, n, k) | round | heuristic ms | best layout (bm, bn, cm, cn) | best ms | x "
          "| TFLOP/s heur. / best |"),
         "|---|---:|---:|---|---:|---:|---|"]
    for r in res["rows"]:
        m, n, k = r["mnk"]
        tf = 2 * m * n * k / 1e9
        b = r["ms"].get(r["best"]) if r["best"] else None
        L.append(f"| {r['shape']} ({m}, {n}, {k}) | {r['round']} | {r['heuristic']:.3f} | {r['best']} | "
                 + (f"{b:.3f} | {r['heuristic'] / b:.3f}x | {tf / r['heuristic']:.0f} / {tf / b:.0f} |" if b
                    else "- | - | - |"))
    if meter is not None:
        L += ["", f"Joules a call (NVML over >= {a.energy_s:g} s of back-to-back calls; the cap's regime):", "",
              "| shape | round | heuristic mJ | fewest-J layout | its mJ | its ms | x (J) | its SM MHz |",
              "|---|---:|---:|---|---:|---:|---:|---:|"]
        for r in res["rows"]:
            f, hj = r.get("fewest_j"), r.get("heuristic_j")
            if f is None or hj is None:
                L.append(f"| {r['shape']} | {r['round']} | - | - | - | - | - | - |")
                continue
            L.append(f"| {r['shape']} | {r['round']} | {hj * 1e3:.1f} | {f} | {r['j'][f] * 1e3:.1f} | "
                     f"{r['ms'][f]:.3f} | {hj / r['j'][f]:.3f}x | {r['mhz'][f] or 0:.0f} |")
    (out / "deepgemm_layouts.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
