"""The rollout sampler: ``quarl.engine.sampling.sample`` with the Triton kernels (``fused=True``) against PyTorch's ops.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/bench_sampler.py --out $OUT/sampler            # CUDA
    TRITON_INTERPRET=1 python3 benchmarks/kernels/bench_sampler.py --device cpu --rows 1,3 --vocab 4096 --iters 2 \\
        --out /tmp/sampler                                                                                # dry run

At each batch size (``--rows``), fp32 logits over ``--vocab`` words (Qwen2.5's 152064 by default: the engine's
``st.logits``), temperature 1, top-p 1 (the rollout benchmark's settings): each path is one ``sample`` call -- the
noise draw included -- timed as a whole in one CUDA graph replayed ``--iters`` times (the engine calls it eagerly,
after its graphed step; the graph takes the host out of the figure), median of ``--repeats`` replays, the two paths
alternating (the default CUDA generator in the graphs). Before timing, each path's tokens are checked equal to the
other's from the same generator seed. Beside them, the eval recipes' T 0.6 and top-p 0.95: PyTorch's path (its
``[B, V]`` sort) against the nucleus kernel (``quarl_kernels.nucleus``), tokens checked equal first.
Writes ``sampler.json`` and ``sampler.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]

from quarl.engine import sampling


def graphed(fn, iters: int):
    """``fn`` captured ``iters`` times in one CUDA graph (after a warm-up on a side stream) -> a replay callable."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return g.replay


def time_us(replay, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--iters", type=int, default=50, help="sample calls per graph replay")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(a.device)
    os.environ[sampling.FUSED_ENV] = "1"  # the fused path is opt-in
    if dev.type == "cpu":
        sampling._FORCE_KERNEL = True  # the dry run: the kernels under TRITON_INTERPRET=1
    rows_all = [int(r) for r in a.rows.split(",")]
    results = []
    for rows in rows_all:
        g = torch.Generator(dev).manual_seed(rows)
        logits = torch.randn(rows, a.vocab, device=dev, generator=g) * 4
        gens = {name: torch.Generator(dev).manual_seed(0) for name in ("fused", "pytorch")}
        toks = {name: sampling.sample(logits, 1.0, 1.0, gens[name], fused=name == "fused")[0]
                for name in ("fused", "pytorch")}
        same = bool(torch.equal(toks["fused"], toks["pytorch"]))
        ga, gb = torch.Generator(dev).manual_seed(0), torch.Generator(dev).manual_seed(0)
        same_p = bool(torch.equal(sampling.sample(logits, 0.6, 0.95, ga, fused=True)[0],
                                  sampling.sample(logits, 0.6, 0.95, gb, fused=False)[0]))
        row = {"rows": rows, "vocab": a.vocab, "same_tokens": same, "same_tokens_top_p": same_p}
        if dev.type == "cuda":
            # the default generator in the graphs: CUDA graphs capture its draws without a registration step
            replays = {name: graphed(lambda n=name, x=logits: sampling.sample(x, 1.0, 1.0, None, fused=n == "fused"),
                                     a.iters) for name in ("fused", "pytorch")}
            times = {name: [] for name in replays}
            for _ in range(a.repeats):
                for name, replay in replays.items():
                    times[name].append(time_us(replay, a.iters))
            row |= {f"{name}_us": round(statistics.median(t), 2) for name, t in times.items()}
            row["speedup"] = round(row["pytorch_us"] / row["fused_us"], 2)
            # the eval recipes' settings (T 0.6, top-p 0.95): PyTorch's path with its sort against the nucleus kernel
            for name in ("fused", "pytorch"):
                try:
                    replay = graphed(lambda n=name, x=logits: sampling.sample(x, 0.6, 0.95, None, fused=n == "fused"),
                                     a.iters)
                    row[f"{name}_top_p_us"] = round(statistics.median(time_us(replay, a.iters)
                                                                      for _ in range(a.repeats)), 2)
                except RuntimeError as e:  # a sort that does not capture: say so, keep the table
                    row[f"{name}_top_p_us"] = f"not captured: {str(e).splitlines()[0][:80]}"
        results.append(row)
        print(json.dumps(row), flush=True)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter)"
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "gpu": gpu, "torch": torch.__version__,
            "iters": a.iters, "repeats": a.repeats}
    (out / "sampler.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    title = (f"sampler, {gpu}, vocab {a.vocab}, T 1, top-p 1 (us a call, median of {a.repeats} graph replays of "
             f"{a.iters} calls)")
    head = ("| rows | PyTorch ops | fused | x | same tokens | T 0.6, top-p 0.95: PyTorch (sort) | nucleus kernel | "
            "same tokens |")
    lines = [title, "", head, "|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['rows']} | {r.get('pytorch_us', '-')} | {r.get('fused_us', '-')} | "
                     f"{r.get('speedup', '-')} | {r['same_tokens']} | {r.get('pytorch_top_p_us', '-')} | "
                     f"{r.get('fused_top_p_us', '-')} | {r.get('same_tokens_top_p', '-')} |")
    (out / "sampler.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
