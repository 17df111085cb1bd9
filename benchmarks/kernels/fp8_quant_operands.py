"""The fused FP8 quantizers on one decoder layer's operands, each launch setting timed (Jet-RL, issue 15).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/kernels/fp8_quant_operands.py --out $OUT/quant   # CUDA

What a full-parameter FP8 step quantizes per decoder layer (``quarl.quant.fp8_linear`` with
``precision.fp8_wgrad=tiles``): each distinct projection input X [T, K] in 1x128 groups along K plus X^T in
128x128 tiles (q/k/v share one X, gate/up another), each output gradient dY [T, N] in 1x128 groups along N plus
dY^T in 1x128 groups along the tokens, and each master weight W [N, K] in 128x128 tiles plus their transpose (once per
optimizer step). Per operand this times every candidate launch setting of ``quarl_kernels.fp8_quant`` (the
run-time choice's own timing, ``pick_setting``: CUDA events over 3 launches after a warm-up) and reports the best, with
the rate of *useful* bytes (input read once, every code byte written once) and of the bytes the setting actually
moves (a split setting reads the input twice). For X it also times the path ``fp8_wgrad=tiles`` took before session
26: the row groups, then the weight kernel on X with its transpose (row-major tile codes written and unused).
Shapes: the model's widths at ``--tokens`` tokens (Qwen2.5-7B / Qwen2.5-32B by default).

A second table (session 30) splits each X / dY operand: the row groups alone, X^T alone, and a plain copy of the same
useful bytes (x read, two bytes an element written) -- how far the best setting is from what the memory allows.

``--regs`` (session 31): also ``quarl_kernels.fp8_quant_regs`` (X^T transposed by register order, Gluon) at each of
its settings on each X / dY operand, its outputs checked byte for byte against the library's before they are timed
(the library's own choice includes it since session 31: the best setting can be one of these). ``--staged`` (session
34): the same for ``quarl_kernels.fp8_swiglu_staged``'s plain-activation form (the tile staged in shared memory, X^T by
column chunks; ``ACT_SETTINGS``, in the library's choice since session 35) and ``--tma`` (session 35) its TMA form
(the tile read by one TMA copy: ``TMA_SETTINGS``, in the library's choice since session 35). Sessions 26-27's
``--gluon`` (an earlier Gluon kernel, ``benchmarks/kernels/fp8_quant_gluon.py``, measured and not kept: RESULTS.md
"Session 26", "Session 27") was removed with that kernel in session 31.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks")]  # (this folder is sys.path[0] already)

from fp8_linear import stream_time  # the FP8 benchmarks' timer

WIDTHS = {"Qwen2.5-7B": (3584, 18944, 512), "Qwen2.5-32B": (5120, 27648, 1024)}  # hidden, intermediate, k / v out


def operands(model: str) -> list[tuple[str, str, int]]:
    """(name, kind, columns): X inputs, dY outputs, W weights of one layer (distinct shapes only, with their count)."""
    h, inter, kv = WIDTHS[model]
    return [("X [T, hidden] (q/k/v, o, gate/up inputs: 3 per layer)", "x", h), ("X [T, inter] (down's input)", "x", inter),
            ("dY [T, hidden] (q, o, down)", "dy", h), ("dY [T, kv] (k, v)", "dy", kv), ("dY [T, inter] (gate, up)", "dy", inter),
            ("W [inter, hidden] (gate, up; down transposed)", "w", (inter, h))]


def cuda_ms(fn) -> float:
    """Mean ms of 5 back-to-back calls after one warm-up (``fp8_linear.stream_time``)."""
    return stream_time(fn, 5, "cuda", warmup=1)


def moved_bytes(setting: tuple, numel: int, fq) -> int:
    """Bytes a dual-activation setting moves: a split setting reads its bf16 input twice."""
    split = fq.parse_setting(setting)[3]
    return numel * (2 + 1 + 1 + (2 if split else 0))


def gluon_kernels() -> dict:
    """The Gluon kernels ``--regs`` / ``--staged`` time: name -> (settings, launch(x, outputs, tokens, cols, tiles,
    setting)) -- ``fp8_quant_regs`` (X^T by register order, session 31) and ``fp8_swiglu_staged``'s plain-activation
    form (the tile staged in shared memory, session 34: ``ACT_SETTINGS``) and its TMA form (session 35)."""
    from quarl_kernels import fp8_quant as fq
    from quarl_kernels import fp8_quant_regs as fr
    from quarl_kernels import fp8_swiglu_staged as stg

    return {
        "regs": (fr.SETTINGS, lambda x, got, t, c, tiles, st: fr.launch_setting(x, *got, t, c, t, tiles, st)),
        "tma": (stg.TMA_SETTINGS, lambda x, got, t, c, tiles, st: fq._launch(
            stg.fwd_spec(x, None, *got, t, c, t, tiles, *st, tma=True))),
        "staged": (stg.ACT_SETTINGS,
                   lambda x, got, t, c, tiles, st: fq._launch(stg.fwd_spec(x, None, *got, t, c, t, tiles, *st))),
    }


def gluon_rows(x: torch.Tensor, tokens: int, cols: int, tiles: bool, ref: tuple, name: str) -> dict:
    """ms of the Gluon kernel ``name`` (:func:`gluon_kernels`) at each of its settings on one operand, after checking
    its bytes against ``ref`` (the library's outputs, equal to eager PyTorch's)."""
    from quarl_kernels import fp8_quant as fq

    settings, launch = gluon_kernels()[name]
    out = {}
    for st in settings:
        got = fq._act_outputs(x, tokens, cols, tokens, True, tiles)
        run = lambda got=got, st=st: launch(x, got, tokens, cols, tiles, st)
        run()
        out[f"{name}{st}_same_bits"] = all(
            torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                        b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b) for a, b in zip(got, ref))
        out[f"{name}{st}_ms"] = cuda_ms(run)
    return out


def bench(model: str, tokens: int, gluon: tuple = ()) -> list[dict]:
    from quarl_kernels import fp8_quant as fq

    rows = []
    for name, kind, cols in operands(model):
        torch.manual_seed(0)
        if kind == "w":
            n, k = cols
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            fq.TUNED.clear()  # each operand's choice timed afresh (and the only key below)
            fq.quantize_tiles(w, transpose=True)
            (key,) = fq.TUNED
            ms = fq.TUNED[key]["ms"]
            best = fq.TUNED[key]["best"]
            useful = n * k * 4
            rows.append({"operand": name, "shape": [n, k], "best": list(best), "ms": ms[best],
                         "useful_GBps": useful / ms[best] / 1e6, "candidates": {str(s): t for s, t in ms.items()}})
            print(json.dumps(rows[-1]), flush=True)
            continue
        x = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)
        tiles = kind == "x"
        fq.TUNED.clear()
        ref = fq.quantize_act(x, tokens, cols, tokens, t_tiles=tiles)
        (key,) = fq.TUNED
        ms, best = fq.TUNED[key]["ms"], fq.TUNED[key]["best"]
        useful = x.numel() * 4
        row = {"operand": name, "shape": [tokens, cols], "x_t": "128x128 tiles" if tiles else "1x128 along tokens",
               "best": list(best), "ms": ms[best], "useful_GBps": useful / ms[best] / 1e6,
               "moved_GBps": moved_bytes(best, x.numel(), fq) / ms[best] / 1e6,
               "candidates": {str(s): t for s, t in sorted(ms.items(), key=lambda kv: kv[1])}}
        fq.quantize_act(x, tokens, cols, None)  # tune the rows-only launch (timed below, and the old path's first)
        if tiles:  # the path before session 26: row groups, then the weight kernel on X (+ its transpose)
            old = cuda_ms(lambda x=x, c=cols: (fq.quantize_act(x, tokens, c, None), fq.quantize_tiles(x, transpose=True)))
            row.update(old_path_ms=old, speedup_over_old=old / ms[best])
        for name in gluon:
            row.update(gluon_rows(x, tokens, cols, tiles, ref, name))
            print(json.dumps({k: v for k, v in row.items() if k.startswith(name)}), flush=True)
        # where the one-read kernels' time goes (session 30): the row groups alone (reads x, writes 1 byte an element),
        # X^T alone, and a plain copy of the same useful bytes (x read, 2 bytes an element written) -- the rate the
        # operand could reach
        row["rows_only_ms"] = cuda_ms(lambda x=x, c=cols: fq.quantize_act(x, tokens, c, None))
        fq.quantize_act(x, tokens, cols, tokens, t_tiles=tiles, row_groups=False)
        row["t_only_ms"] = cuda_ms(lambda x=x, c=cols, t=tiles: fq.quantize_act(x, tokens, c, tokens, t_tiles=t,
                                                                                 row_groups=False))
        dst = torch.empty_like(x)  # x.numel() * 2 bytes written, as the codes of both groupings together
        row["copy_ms"] = cuda_ms(lambda x=x, d=dst: d.copy_(x))
        row["copy_GBps"] = useful / row["copy_ms"] / 1e6
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "candidates"}), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen2.5-7B,Qwen2.5-32B")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--out", default="/tmp/fp8_quant_operands")
    ap.add_argument("--regs", action="store_true", help="also quarl_kernels.fp8_quant_regs (X^T by register order)")
    ap.add_argument("--tma", action="store_true", help="also the staged form's TMA form (the tile by one TMA copy)")
    ap.add_argument("--staged", action="store_true",
                    help="also fp8_swiglu_staged's plain-activation form (the tile staged in shared memory)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (the launch settings are timed on it)")
    gluon = tuple(n for n, on in (("regs", a.regs), ("staged", a.staged), ("tma", a.tma)) if on)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": a.tokens, "models": {}}
    for model in a.models.split(","):
        res["models"][model] = bench(model, a.tokens, gluon)
        (out / "fp8_quant_operands.json").write_text(json.dumps(res, indent=1))
    print("\n| model | operand | X^T | best setting | ms | useful GB/s | moved GB/s | before session 26 ms |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    nan = float("nan")
    for model, rows in res["models"].items():
        for r in rows:
            print(f"| {model} | {r['operand']} | {r.get('x_t', 'W^T tiles')} | {tuple(r['best'])} | {r['ms']:.3f} | "
                  f"{r['useful_GBps']:.0f} | {r.get('moved_GBps', r['useful_GBps']):.0f} | "
                  f"{r.get('old_path_ms', nan):.3f} |")
    print("\n| model | operand | both groupings ms | row groups alone ms | X^T alone ms | copy of the useful bytes ms | "
          "copy GB/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, rows in res["models"].items():
        for r in rows:
            if "copy_ms" in r:
                print(f"| {model} | {r['operand']} | {r['ms']:.3f} | {r['rows_only_ms']:.3f} | {r['t_only_ms']:.3f} | "
                      f"{r['copy_ms']:.3f} | {r['copy_GBps']:.0f} |")
    if gluon:
        cols = [(n, st) for n in gluon for st in gluon_kernels()[n][0]]
        print("\n| model | operand | the library's choice ms | " + " | ".join(
            f"{n} {st} ms (bits)" for n, st in cols) + " |")
        print("|---|---|---:|" + "---:|" * len(cols))
        for model, rows in res["models"].items():
            for r in rows:
                if "copy_ms" in r:
                    print(f"| {model} | {r['operand']} | {r['ms']:.3f} | " + " | ".join(
                        f"{r[f'{n}{st}_ms']:.3f} ({r[f'{n}{st}_same_bits']})" for n, st in cols) + " |")


if __name__ == "__main__":
    main()
