"""FP8 training linear vs BF16 over one decoder layer, forward + backward: main's FP8 linear vs this one.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/fp8_layer.py --out $OUT --budget-s 150
    python benchmarks/fp8_layer.py --device cpu --out /tmp/fp8layer      # CPU dry run (tiny shapes, emulated)

(``benchmarks/fp8_speed_gpu.sh`` runs the GPU tests and this in one device call.)

One step ("layer" timing) is what a training step runs for a decoder layer's projections: every
master weight changed in place (an optimizer step: the FP8 arms re-quantize their weights), the
seven forwards -- q, k, v on one input X_attn, o on the attention output, gate and up on one input
X_mlp, down on the MLP hidden -- and one backward pass through all of them (the dX of q/k/v and of
gate/up accumulate, as in the model). Attention, norms and activations are not included. Steps are
launched back to back between two CUDA events (the host runs ahead as far as it can); ``host ms`` is
one step's launch time on an idle GPU (perf_counter around the step after a sync: the Python, the
autograd engine and the launches): where it is close to the GPU time, the step is host-bound.

Arms: ``bf16`` (``F.linear``); ``fp8-main`` (``benchmarks/fp8_linear_v0.py``: main's FP8 linear at
c569ec4, quantizers at its fixed launch setting); ``fp8`` (``quarl.quant.fp8_linear`` now: each
activation quantized once for the projections that read it, quantizer launch settings chosen by
shape, fewer launches). Ablations at the first token count: ``fp8-nomemo`` (``QUARL_FP8_MEMO=0``),
``fp8-notune`` (``QUARL_FP8_TUNE=0``). Extra timings of bf16 / fp8-main / fp8:

* ``proj-sum``: each projection timed on its own loop and summed (the method of the earlier table in
  RESULTS.md, 0.62-1.06x), for comparison with it; a small projection's host floor shows fully there;
* ``no update``: the layer step without the weight change (a later micro-batch of an optimizer step:
  the FP8 weights are cached);
* ``graph``: the layer step captured in one CUDA graph (no host at all: the GPU work alone; a
  diagnostic, not what the library runs in training).

Before timing, the fp8 and fp8-main arms are run on the same inputs: outputs and gradients must be
equal bit for bit (same quantizers, same GEMMs; the memo and the launch settings change no bit).

A hard wall-clock budget (``--budget-s``) is checked before every measurement; ``fp8_layer.json`` is
rewritten after every row, and the tables are printed last.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "kernels"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fp8_linear_v0  # main's FP8 linear (frozen copy)
from fp8_linear import stream_time as stream_ms  # the FP8 linear benchmark's timer
from fp8_linear import sync

from quarl.quant import fp8_gemm
from quarl.quant import fp8_linear as fl

# (hidden, intermediate, q out, kv out)
MODELS = {"Qwen2.5-7B": (3584, 18944, 3584, 512), "Qwen3-8B": (4096, 12288, 4096, 1024),
          "tiny": (256, 640, 256, 128)}  # tiny: the CPU dry run
NOSPLIT = "_nosplit"  # not an environment variable: the arm runs with the quantizers' split settings removed
ARMS = {  # name: (linear, environment for the call)
    "bf16": (F.linear, {}),
    "fp8-main": (fp8_linear_v0.fp8_linear, {}),
    "fp8": (fl.fp8_linear, {"QUARL_FP8_GEMM": "cublas"}),
    "fp8-nomemo": (fl.fp8_linear, {"QUARL_FP8_MEMO": "0", "QUARL_FP8_GEMM": "cublas"}),
    "fp8-notune": (fl.fp8_linear, {"QUARL_FP8_TUNE": "0", "QUARL_FP8_GEMM": "cublas"}),
    "fp8-deepgemm": (fl.fp8_linear, {"QUARL_FP8_GEMM": "deepgemm"}),  # the same quantizers, DeepGEMM's GEMMs
    # X^T in 128x128 tiles for WGrad (not Jet-RL's recipe: fp8_linear's module docstring)
    "fp8-xtiles": (functools.partial(fl.fp8_linear, wgrad="tiles"), {"QUARL_FP8_GEMM": "cublas"}),
    "fp8-deepgemm-xtiles": (functools.partial(fl.fp8_linear, wgrad="tiles"), {"QUARL_FP8_GEMM": "deepgemm"}),
    # the fused quantizers without their split launch settings (X^T by its own kernel): what those add
    "fp8-nosplit": (fl.fp8_linear, {NOSPLIT: "1", "QUARL_FP8_GEMM": "cublas"}),
    "fp8-deepgemm-nosplit": (fl.fp8_linear, {"QUARL_FP8_GEMM": "deepgemm", NOSPLIT: "1"}),
    "fp8-xtiles-nosplit": (functools.partial(fl.fp8_linear, wgrad="tiles"), {NOSPLIT: "1", "QUARL_FP8_GEMM": "cublas"}),
}
PROJ = ("q", "k", "v", "o", "gate", "up", "down")
# arms of the DeepGEMM / X^T-tiles / split-quantizer table
EXTRA = ("fp8-deepgemm", "fp8-xtiles", "fp8-deepgemm-xtiles", "fp8-nosplit", "fp8-deepgemm-nosplit", "fp8-xtiles-nosplit")
CLOSE = ("fp8-deepgemm",)  # checked against fp8 (cuBLAS) before timing


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.time(), seconds

    def ok(self, need: float = 0.0) -> bool:
        return self.seconds - (time.time() - self.t0) > need


class Env:
    """Set environment variables for a block (the FP8 linear reads them per call); ``NOSPLIT`` swaps the fused
    quantizers' candidate settings for those without a split launch, with a choice cache of their own."""

    def __init__(self, env: dict):
        self.env, self.old, self.saved = env, {}, None

    def __enter__(self):
        for k, v in self.env.items():
            if k == NOSPLIT:
                fq = fl._fused_module()
                if fq is not None:
                    self.saved = (fq.ACT_SETTINGS, dict(fq.TUNED))
                    fq.ACT_SETTINGS = tuple(st for st in fq.ACT_SETTINGS if len(st) < 5)
                    fq.TUNED.clear()
                    fq.TUNED.update(NOSPLIT_TUNED)
                continue
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        if self.saved is not None:
            fq = fl._fused_module()
            NOSPLIT_TUNED.clear()
            NOSPLIT_TUNED.update(fq.TUNED)
            fq.ACT_SETTINGS = self.saved[0]
            fq.TUNED.clear()
            fq.TUNED.update(self.saved[1])
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


NOSPLIT_TUNED: dict = {}  # the NOSPLIT arms' own setting choices, kept between their blocks


class Layer:
    """One decoder layer's projection weights, inputs and output gradients (random, BF16)."""

    def __init__(self, model: str, m: int, device: str):
        h, inter, q, kv = MODELS[model]
        torch.manual_seed(0)
        shapes = {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (inter, h), "up": (inter, h),
                  "down": (h, inter)}
        self.w = {p: torch.nn.Parameter(torch.randn(*shapes[p], device=device, dtype=torch.bfloat16) * 0.02)
                  for p in PROJ}
        xa, xo, xm, xd = (torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
                          for k in (h, q, h, inter))
        self.x = {"q": xa, "k": xa, "v": xa, "o": xo, "gate": xm, "up": xm, "down": xd}  # q/k/v, gate/up share X
        self.g = {p: torch.randn(m, shapes[p][0], device=device, dtype=torch.bfloat16) for p in PROJ}
        self.leaves = [xa, xo, xm, xd, *self.w.values()]

    def step(self, lin, update: bool = True, only: str | None = None) -> None:
        """One training step of the layer's projections (or of the projection ``only``)."""
        names = PROJ if only is None else (only,)
        if update:
            with torch.no_grad():
                for p in names:
                    self.w[p].mul_(1.0)  # an optimizer step: in place, the version moves, FP8 re-quantizes
        for t in self.leaves:
            t.grad = None
        ys = [lin(self.x[p], self.w[p]) for p in names]
        torch.autograd.backward(ys, [self.g[p] for p in names])




def host_ms(fn, reps: int, device: str) -> float:
    """Median ms of one call's host time, each started on an idle GPU (the launch cost alone)."""
    ts = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    sync(device)
    return statistics.median(ts)


def graph_ms(layer: Layer, lin, iters: int) -> float:
    """Mean ms per replay of the layer step captured in one CUDA graph (warmed up on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            layer.step(lin)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        layer.step(lin)
    try:
        return stream_ms(g.replay, iters, "cuda")
    finally:
        for t in layer.leaves:
            t.grad = None
        del g
        torch.cuda.synchronize()


def _outputs(layer: Layer, name: str) -> list[torch.Tensor]:
    """One step of arm ``name``: the seven outputs and every gradient (weights not updated)."""
    lin, env = ARMS[name]
    for t in layer.leaves:
        t.grad = None
    with Env(env):
        ys = [lin(layer.x[p], layer.w[p]) for p in PROJ]
        torch.autograd.backward(ys, [layer.g[p] for p in PROJ])
    out = [y.detach() for y in ys] + [t.grad.clone() for t in layer.leaves]
    for t in layer.leaves:
        t.grad = None
    return out


def check_equal(layer: Layer) -> dict:
    """fp8 vs fp8-main on the same inputs: y and every gradient, bit for bit."""
    main, now = _outputs(layer, "fp8-main"), _outputs(layer, "fp8")
    diff = [i for i, (a, b) in enumerate(zip(main, now)) if not torch.equal(a, b)]
    return {"equal": not diff, "differing": diff, "compared": len(now)}


def check_close(layer: Layer, other: str) -> dict:
    """fp8 (cuBLAS) vs ``other`` (same FP8 operands, another GEMM library): the largest relative L2 difference
    over the outputs and gradients (FP32 sums in another order, rounded to BF16: ~1e-3 expected)."""
    ref, got = _outputs(layer, "fp8"), _outputs(layer, other)
    rels = [float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)) for a, b in zip(got, ref)]
    return {"max_rel_l2": max(rels), "rel_l2": rels}


def bench_shape(model: str, m: int, arms: list[str], ablations: bool, a: argparse.Namespace, budget: Budget) -> dict:
    dev, cuda = a.device, a.device == "cuda"
    layer = Layer(model, m, dev)
    row: dict = {"model": model, "tokens": m}
    if "fp8" in arms and "fp8-main" in arms:
        row["fp8_equals_main"] = check_equal(layer)
        print(f"{model} M={m}: fp8 == fp8-main: {row['fp8_equals_main']}", flush=True)
    for other in (o for o in CLOSE if "fp8" in arms and o in arms):
        name = "deepgemm_vs_cublas" if other == "fp8-deepgemm" else f"{other}_vs_cublas"
        try:
            row[name] = check_close(layer, other)
            print(f"{model} M={m}: {other} vs fp8 (cuBLAS) max rel L2 {row[name]['max_rel_l2']:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded; the arm's timing below reports its own failure
            row[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    use = arms + (["fp8-nomemo", "fp8-notune"] if ablations and "fp8" in arms else [])
    for arm in use:
        lin, env = ARMS[arm]
        if not budget.ok(3):
            row.setdefault("skipped", []).append(arm)
            continue
        main = arm in ("bf16", "fp8-main", "fp8")
        with Env(env):
            try:
                row[f"{arm}_ms"] = stream_ms(lambda lin=lin: layer.step(lin), a.iters, dev)
                row[f"{arm}_host_ms"] = host_ms(lambda lin=lin: layer.step(lin), 5 if cuda else 1, dev)
                if main and not a.quick:
                    row[f"{arm}_noupdate_ms"] = stream_ms(lambda lin=lin: layer.step(lin, update=False), a.iters, dev)
                    per = {p: stream_ms(lambda lin=lin, p=p: layer.step(lin, only=p), a.proj_iters, dev)
                           for p in PROJ}
                    row[f"{arm}_proj"] = per
                    row[f"{arm}_projsum_ms"] = sum(per.values())
                if arm in a.graph_arms.split(",") and cuda and not a.no_graph and budget.ok(3):
                    try:
                        row[f"{arm}_graph_ms"] = graph_ms(layer, lin, a.iters)
                    except Exception as e:  # noqa: BLE001 - a diagnostic: record, keep the eager figures
                        row[f"{arm}_graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            except Exception as e:  # noqa: BLE001 - one arm failing must not lose the others
                row[f"{arm}_error"] = f"{type(e).__name__}: {str(e)[:400]}"
                print(f"{model} M={m} {arm} failed: {row[f'{arm}_error']}", flush=True)
        for t in layer.leaves:
            t.grad = None
        fl.clear_input_memo()
    b = row.get("bf16_ms")
    for arm in use:
        if b and row.get(f"{arm}_ms"):
            row[f"speedup_{arm}"] = b / row[f"{arm}_ms"]
    for kind in ("noupdate", "projsum", "graph"):
        if row.get(f"bf16_{kind}_ms"):
            for arm in ("fp8-main", "fp8"):
                if row.get(f"{arm}_{kind}_ms"):
                    row[f"speedup_{arm}_{kind}"] = row[f"bf16_{kind}_ms"] / row[f"{arm}_{kind}_ms"]
    layer.leaves.clear()  # the caller's empty_cache frees the shape's tensors once this frame is gone
    return row


def profiles(model: str, m_kernels: int, m_host: int, device: str,
             arms: tuple[str, ...] = ("bf16", "fp8-main", "fp8")) -> str:
    """Where the time goes: a kernel profile of one layer step per arm (GPU time by kernel) at ``m_kernels``
    tokens, and a host profile (cProfile, by own time) of fp8 layer steps at ``m_host`` tokens."""
    import cProfile
    import io
    import pstats

    out = []
    layer = Layer(model, m_kernels, device)
    act = torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    for arm in arms:
        lin, env = ARMS[arm]
        with Env(env):
            for _ in range(2):
                layer.step(lin)
            sync(device)
            with torch.profiler.profile(activities=[act]) as prof:
                layer.step(lin)
                sync(device)
        out += [f"== kernels, {arm}, {model} M={m_kernels}, one layer step",
                prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60)]
    del layer
    layer = Layer(model, m_host, device)
    for arm in ("fp8-main", "fp8", "bf16"):
        lin = ARMS[arm][0]
        layer.step(lin)
        sync(device)
        pr = cProfile.Profile()
        for _ in range(3):
            sync(device)
            pr.enable()
            layer.step(lin)
            pr.disable()
        sync(device)
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(22)
        out += [f"== host (cProfile, 3 steps, each started on an idle GPU), {arm}, {model} M={m_host}", buf.getvalue()]
    return "\n".join(out)


def tuned_entry(key: tuple, v: dict) -> dict:
    """One launch-setting choice of the fused quantizers, with the HBM bandwidth of each candidate: bytes
    read (the input) + written (codes; scales ignored) over time. Activation keys carry the token count
    rounded up to a power of two (the benchmark's are powers of two: exact)."""
    e = {"key": [str(x) for x in key], "best": list(v["best"]), "ms": {str(s): round(t, 4) for s, t in v["ms"].items()}}
    if v.get("situ_ms"):  # QUARL_FP8_TUNE=situ: the finalists' in-situ medians ({}: no trial for this key)
        e["situ_ms"] = {str(s): round(t, 4) for s, t in v["situ_ms"].items()}
    el = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}.get(key[3] if key[0] == "act" else key[2])
    if key[0] == "act" and el:
        _, rows, cols_g, _, extent, cols, _, *_tiles = key  # (a trailing "tiles": X^T in 128x128 tiles)
        nbytes = extent * cols * (el + int(rows) + int(cols_g))
    elif key[0] == "tiles" and el:
        _, trans, _, n, k, _ = key
        nbytes = n * k * (el + 1 + int(trans))
    else:
        return e
    e["bytes"] = nbytes
    e["GBps"] = {str(s): round(nbytes / t / 1e6) for s, t in v["ms"].items() if t > 0}
    return e


def _f(r: dict, k: str, fmt: str = "{:.2f}") -> str:
    v = r.get(k)
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def tables(res: dict) -> str:
    L = [(f"# one decoder layer's 7 projections fwd+bwd, {res.get('gpu')}, torch {res.get('torch')}, "
          f"wall {res.get('wall_s', 0):.0f} s")]
    rows = res.get("rows", [])
    if rows:
        L += ["", "layer step (weights updated every step), ms per step; x = BF16 / FP8; host = launch time of one step",
              "", "| model | tokens | BF16 | FP8 main | x | FP8 now | x | host BF16 / main / now | fp8 == main |",
              "|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rows:
            eq = r.get("fp8_equals_main", {}).get("equal", "-")
            L.append(f"| {r['model']} | {r['tokens']} | {_f(r, 'bf16_ms')} | {_f(r, 'fp8-main_ms')} | "
                     f"{_f(r, 'speedup_fp8-main', '{:.2f}x')} | {_f(r, 'fp8_ms')} | {_f(r, 'speedup_fp8', '{:.2f}x')} | "
                     f"{_f(r, 'bf16_host_ms')} / {_f(r, 'fp8-main_host_ms')} / {_f(r, 'fp8_host_ms')} | {eq} |")
        L += ["", "other timings, x = BF16 / FP8 now (FP8 main in brackets)", "",
              "| model | tokens | no update: BF16, FP8, x | proj-sum: BF16, FP8, x | graph: BF16, FP8, x |",
              "|---|---:|---|---|---|"]
        for r in rows:
            cells = []
            for kind in ("noupdate", "projsum", "graph"):
                cells.append(f"{_f(r, f'bf16_{kind}_ms')}, {_f(r, f'fp8_{kind}_ms')}, "
                             f"{_f(r, f'speedup_fp8_{kind}', '{:.2f}x')} ({_f(r, f'speedup_fp8-main_{kind}', '{:.2f}x')})")
            L.append(f"| {r['model']} | {r['tokens']} | " + " | ".join(cells) + " |")
        dg = [r for r in rows if any(f"{a}_ms" in r or f"{a}_error" in r for a in EXTRA)]
        if dg:
            L += ["", ("the same layer step with DeepGEMM's GEMMs (same quantizers) and with X^T in 128x128 tiles for "
                       "WGrad (xtiles: not Jet-RL's recipe), x = BF16 / arm"), "",
                  "| model | tokens | BF16 | FP8 cuBLAS | x | " + " | ".join(f"{a} | x" for a in EXTRA)
                  + " | max rel L2 vs cuBLAS (DeepGEMM) |",
                  "|---|---:|---:|---:|---:|" + "---:|---:|" * len(EXTRA) + "---:|"]
            for r in dg:
                rels = []
                for other in CLOSE:
                    close = r.get("deepgemm_vs_cublas" if other == "fp8-deepgemm" else f"{other}_vs_cublas", {})
                    rels.append(f"{close['max_rel_l2']:.1e}" if "max_rel_l2" in close else close.get("error", "-")[:40])
                rel = " / ".join(rels)
                L.append(f"| {r['model']} | {r['tokens']} | {_f(r, 'bf16_ms')} | {_f(r, 'fp8_ms')} | "
                         f"{_f(r, 'speedup_fp8', '{:.2f}x')} | "
                         + " | ".join(f"{_f(r, a + '_ms')} | {_f(r, 'speedup_' + a, '{:.2f}x')}" for a in EXTRA)
                         + f" | {rel} |")
        gr = [(r, arm) for r in rows for arm in ARMS if arm not in ("bf16", "fp8") and f"{arm}_graph_ms" in r]
        if gr:
            L += ["", "other arms as one CUDA graph per step (GPU work alone), x = BF16's graph / arm's graph", "",
                  "| model | tokens | arm | step ms | graph ms | x |", "|---|---:|---|---:|---:|---:|"]
            for r, arm in gr:
                bg = r.get("bf16_graph_ms")
                x = f"{bg / r[arm + '_graph_ms']:.2f}x" if bg else "-"
                L.append(f"| {r['model']} | {r['tokens']} | {arm} | {_f(r, arm + '_ms')} | {_f(r, arm + '_graph_ms')} | {x} |")
        abl = [r for r in rows if "fp8-nomemo_ms" in r or "fp8-notune_ms" in r]
        if abl:
            L += ["", "| ablation | model | tokens | ms | x |", "|---|---|---:|---:|---:|"]
            for r in abl:
                for arm in ("fp8-nomemo", "fp8-notune"):
                    L.append(f"| {arm} | {r['model']} | {r['tokens']} | {_f(r, arm + '_ms')} | "
                             f"{_f(r, 'speedup_' + arm, '{:.2f}x')} |")
        errs = [f"{r['model']} {r['tokens']} {k}: {v}" for r in rows for k, v in r.items() if k.endswith("_error")]
        L += [""] + [f"error: {e}" for e in errs] if errs else []
    if res.get("tuned"):
        L += ["", "fused quantizers: launch setting chosen per shape class, GB/s of the default (32, 8) and of the best",
              "", "| operand (kind, rows, cols groupings, dtype, tokens / N, cols / K) | MB | default GB/s | best | GB/s |",
              "|---|---:|---:|---|---:|"]
        for e in res["tuned"]:
            gb = e.get("GBps", {})
            best = str(tuple(e["best"]))
            L.append(f"| {' '.join(e['key'][:-1])} | {e.get('bytes', 0) / 1e6:.0f} | {gb.get('(32, 8)', '-')} | "
                     f"{best} | {gb.get(best, '-')} |")
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", default=None, help="default Qwen2.5-7B,Qwen3-8B (cuda) / tiny (cpu)")
    ap.add_argument("--tokens", default=None, help="default 8192,16384,4096 (cuda) / 64,128 (cpu), in this order")
    ap.add_argument("--arms", default="bf16,fp8-main,fp8")
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--proj-iters", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="layer timings only (no proj-sum / no-update)")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--graph-arms", default="bf16,fp8",
                    help="arms also timed as one CUDA graph per step (the GPU work alone, no host)")
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel / host profiles at the end")
    ap.add_argument("--profile-arms", default="bf16,fp8-main,fp8", help="arms of the kernel profile")
    ap.add_argument("--profile-tokens", type=int, default=8192, help="tokens of the kernel profile (CUDA)")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new measurements after this")
    ap.add_argument("--render", default="", help="print the tables of an earlier run's fp8_layer.json and exit")
    a = ap.parse_args()
    if a.render:
        print(tables(json.loads(Path(a.render).read_text())))
        return
    cuda = a.device == "cuda"
    models = (a.models or ("Qwen2.5-7B,Qwen3-8B" if cuda else "tiny")).split(",")
    tokens = [int(t) for t in (a.tokens or ("8192,16384,4096" if cuda else "64,128")).split(",")]
    arms = a.arms.split(",")
    bad = [x for x in arms if x not in ARMS] + [x for x in models if x not in MODELS]
    if bad or "bf16" not in arms:
        raise SystemExit(f"unknown arm/model {bad} (arms {list(ARMS)}, models {list(MODELS)}); bf16 is required")
    budget = Budget(a.budget_s)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # the CPU dry run without Triton: eager quantizers
        triton_version = None
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "triton": triton_version, "quant_backend": fl.quant_backend(torch.empty(0, device=a.device)),
           "budget_s": a.budget_s, "rows": []}

    def save():
        res["wall_s"] = time.time() - budget.t0
        fq = fl._fused_module() if triton_version else None
        res["tuned"] = [tuned_entry(k, v) for k, v in (fq.TUNED.items() if fq is not None else ())]
        res["scale_layout"] = {str(k): v for k, v in fp8_gemm.SCALE_LAYOUT.items()}
        res["cublas_fallbacks"] = dict(fl.CUBLAS_FALLBACKS) | dict(fp8_linear_v0.CUBLAS_FALLBACKS)
        (out / "fp8_layer.json").write_text(json.dumps(res, indent=1))

    first = True
    for m in tokens:
        for model in models:
            if not budget.ok(6):
                print(f"budget: skipping {model} M={m} and later", flush=True)
                res.setdefault("skipped", []).append(f"{model} M={m}")
                continue
            try:
                row = bench_shape(model, m, arms, first, a, budget)
                if cuda:
                    torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 - e.g. out of memory at one shape: keep the others
                row = {"model": model, "tokens": m, "shape_error": f"{type(e).__name__}: {str(e)[:400]}"}
            first = False
            res["rows"].append(row)
            save()
            print(f"layer {model} M={m}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()
                                                         if k.endswith("_ms") and isinstance(v, float)), flush=True)
    if not a.no_profile and budget.ok(12):
        try:
            text = profiles(models[0], a.profile_tokens if cuda else tokens[0], 4096 if cuda else tokens[0], a.device,
                            tuple(a.profile_arms.split(",")))
            (out / "fp8_layer_profile.txt").write_text(text)
            res["profile"] = "fp8_layer_profile.txt"
        except Exception as e:  # noqa: BLE001 - a diagnostic: record it, keep the tables
            res["profile_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print("profile failed:", res["profile_error"], flush=True)
    else:
        res.setdefault("skipped", []).append("profile")
    save()
    print()
    print(tables(res))


if __name__ == "__main__":
    main()
