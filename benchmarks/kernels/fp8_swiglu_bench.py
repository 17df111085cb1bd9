"""SwiGLU's backward inside the FP8 quantizers against the glue + quantizer it replaces, per MLP (Jet-RL, issue 15).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/fp8_swiglu_bench.py --out $OUT/swiglu      # CUDA
    TRITON_INTERPRET=1 python3 benchmarks/kernels/fp8_swiglu_bench.py --device cpu --tokens 128 --out /tmp/sw  # dry run

At each model's intermediate width and ``--tokens`` tokens, BF16 inputs: fused, ``quarl_kernels.fp8_swiglu.
swiglu_grad_operands(dh, g, u)`` (dg and du in 1x128 groups both ways, its two passes); unfused, SwiGLU's gradients as
one compiled kernel (``quarl.quant.fp8_swiglu.silu_mul_grads`` through ``torch.compile``: reads dh, g, u, writes dg,
du -- the bytes of the glue's compiled backward), then ``fp8_quant.quantize_act`` of dg and of du. Each kernel's launch
settings are chosen first (the run-time choice, in ``tuned``), then each path is timed as a whole: ``stream_time``
(CUDA events, ``--iters`` calls after two warm-ups). The useful bytes (dh, g, u read once, both gradients' codes
written once both ways) give each path's rate; the fused passes read their inputs twice.

Session 27's first run of this script (commit 3d653a8, H200) also timed the *forward* fused the same way (h = silu(g)
* u inside the down projection's quantizer) against the glue's compiled ``silu_mul`` + ``quantize_act(h,
t_tiles=True)``: 1.315 / 1.094 ms (7B width) and 1.904 / 1.600 ms (32B width), fused slower; that kernel was removed
(RESULTS.md "Session 27"). Session 31 times it again as ``quarl_kernels.fp8_quant_regs``' SWIGLU form (one read of g
and u, h's codes in both groupings from registers, fast ``exp``): "forward fused" beside "forward: glue + quantizer".
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks")]

from fp8_linear import stream_time  # the FP8 benchmarks' timer

INTERMEDIATE = {"Qwen2.5-7B": 18944, "Qwen2.5-32B": 27648}


def paths(m: int, i: int, device: str):
    """The two timed callables on fresh [m, i] BF16 inputs: fused / unfused."""
    from quarl_kernels import fp8_quant as fq
    from quarl_kernels import fp8_swiglu as fs

    from quarl.quant.fp8_swiglu import silu_mul_eager, silu_mul_grads

    torch.manual_seed(0)
    g, u, dh = ((torch.randn(m, i, device=device) * s).to(torch.bfloat16) for s in (3.0, 1.0, 1e-3))
    grads = torch.compile(silu_mul_grads, backend="inductor" if device == "cuda" else "aot_eager", dynamic=False)
    mt = -(-m // 128) * 128
    glue = torch.compile(silu_mul_eager, backend="inductor" if device == "cuda" else "aot_eager", dynamic=False)
    fwd = {"forward: glue + quantizer (X^T tiles)": lambda: fq.quantize_act(glue(g, u), m, i, mt, t_tiles=True)}
    if device == "cuda":
        from quarl_kernels import fp8_quant_regs as fr

        for st in fr.SWIGLU_SETTINGS:  # h never written (session 31)
            outs = fq._act_outputs(g, m, i, mt, True, True)
            fwd[f"forward fused {st}"] = lambda st=st, outs=outs: fr.launch_setting(g, *outs, m, i, mt, True, st, u=u)
        stg = fs.staged_module()
        # staged in shared memory (session 33), and its TMA form (session 35)
        for st in fq.staged_settings(g, stg.FWD_SETTINGS) if stg is not None else ():
            outs = fq._act_outputs(g, m, i, mt, True, True)
            fwd[f"forward {st[0]} {st[1:]}"] = lambda st=st, outs=outs: fq._launch(
                stg.fwd_spec(g, u, *outs, m, i, mt, True, *st[1:], tma=st[0] == "tma"))
    merged = {}
    if device == "cuda":  # each one-launch candidate alone
        for mg in fs.MERGED_SETTINGS + fs.regs_settings(g):
            merged[f"backward merged {mg}"] = lambda mg=mg: fs.swiglu_grad_operands(dh, g, u, m, i, mt, merged=mg)
    return {
        **fwd,
        **merged,
        "backward fused": lambda: fs.swiglu_grad_operands(dh, g, u, m, i, mt),
        "backward fused, two passes": lambda: _two_passes(fs, dh, g, u, m, i, mt),
        "backward unfused": lambda: [fq.quantize_act(t, m, i, mt) for t in grads(g, u, dh)],
    }


def _two_passes(fs, dh, g, u, m: int, i: int, mt: int):
    """The fused backward with its merged launch ruled out (``QUARL_FP8_SWIGLU_MERGE=0``: session 27's two passes)."""
    import os

    os.environ["QUARL_FP8_SWIGLU_MERGE"] = "0"
    try:
        return fs.swiglu_grad_operands(dh, g, u, m, i, mt)
    finally:
        os.environ.pop("QUARL_FP8_SWIGLU_MERGE")


def useful_gb(m: int, i: int, path: str = "backward") -> float:
    """Backward: dh, g, u read once (2 bytes an element), dg and du's codes written once both ways (scales are < 1 %);
    forward: g, u read once, h's codes written both ways."""
    return ((2 * 2 + 2) if path.startswith("forward") else (3 * 2 + 4)) * m * i / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen2.5-7B,Qwen2.5-32B")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from quarl_kernels import fp8_quant as fq

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    rows = []
    for model in a.models.split(","):
        i = INTERMEDIATE[model]
        fns = paths(a.tokens, i, a.device)
        for name, fn in fns.items():
            ms = stream_time(fn, a.iters, a.device)
            gbs = useful_gb(a.tokens, i, name) / ms * 1e3
            rows.append({"model": model, "path": name, "ms": ms, "useful_gb_s": gbs})
            print(json.dumps(rows[-1]), flush=True)
        del fns
    title = (f"# SwiGLU's backward + FP8 quantizers, {a.tokens} tokens, {gpu}, torch {torch.__version__}, "
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    lines = [title, "", "| model | path | ms | useful GB/s |", "|---|---|---:|---:|"]
    lines += [f"| {r['model']} | {r['path']} | {r['ms']:.3f} | {r['useful_gb_s']:.0f} |" for r in rows]
    tuned = [{"key": [str(k) for k in key], "best": v["best"], "ms": {str(s): round(t, 4) for s, t in v["ms"].items()}}
             for key, v in fq.TUNED.items()]
    merges = [t for t in tuned if t["key"][0] == "swiglu-merge"]  # the merged launches against the pair, as timed
    if merges:
        lines += ["", "| merge choice: setting | ms |", "|---|---:|"]
        lines += [f"| {st} | {ms:.3f} |" for t in merges for st, ms in sorted(t["ms"].items(), key=lambda kv: kv[1])]
    (out / "fp8_swiglu_bench.md").write_text("\n".join(lines) + "\n")
    (out / "fp8_swiglu_bench.json").write_text(json.dumps({"gpu": gpu, "tokens": a.tokens, "rows": rows,
                                                           "tuned": tuned}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
