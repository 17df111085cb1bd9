"""Weight-gradient error of the FP8 WGrad groupings on real activations and gradients (CPU, SmolLM2).

    python benchmarks/fp8_wgrad_numerics.py --out benchmarks/results/gpu_2026-11-26/s7/wgrad_tiles_numerics_cpu.json

One forward + backward of the embedded default (SmolLM2-135M-Instruct, fp32) on 16 GSM8K training texts (128
tokens each); for 16 projections (q, o, gate, down of layers 0, 10, 20, 29) their input X and output gradient dY
are captured and dW = dY^T X is recomputed from FP8 operands in three groupings, against the float64 product:

    spec         dY^T and X^T in 1x128 groups along the tokens (Jet-RL; ``fp8_linear`` default)
    X^T tiles    X^T in 128x128 tiles (``fp8_linear(wgrad="tiles")``: the 1x128 x 128x128 GEMM)
    dY^T tiles   dY^T in 128x128 tiles instead (the other operand; for comparison)

The quantizers are the library's own (``quarl.quant.formats.fp8`` 1x128 groups, ``fp8_linear._tiles_padded``).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quarl.models.loading import load_model
from quarl.quant.formats.fp8 import dequantize_act_1x128, quantize_act_1x128
from quarl.quant.fp8_linear import _pad2, _round_up, _tiles_padded

MODES = ("spec 1x128/1x128", "X^T tiles", "dY^T tiles")


def _tiles(t: torch.Tensor) -> torch.Tensor:
    q, s = _tiles_padded(t)
    return q.float() * s.repeat_interleave(128, 0)[:q.shape[0]].repeat_interleave(128, 1)[:, :q.shape[1]]


def _groups(t: torch.Tensor) -> torch.Tensor:
    return dequantize_act_1x128(*quantize_act_1x128(t))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/gsm8k"))
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.manual_seed(0)
    model, tok = load_model("default", dtype=torch.float32)
    path = min(glob.glob(f"{a.data}/*train*"))
    with open(path) as f:
        rows = [json.loads(line) for line, _ in zip(f, range(a.texts), strict=False)]
    enc = tok([r.get("question", "") + " " + r.get("answer", "") for r in rows], return_tensors="pt",
              padding="max_length", truncation=True, max_length=128)
    cap: dict = {}

    def hook(name):
        def f(mod, inp, out):
            x = inp[0].detach()
            out.register_hook(lambda g: cap.__setitem__(name, (x.reshape(-1, x.shape[-1]),
                                                               g.reshape(-1, g.shape[-1]).detach())))
        return f

    names = [f"model.layers.{i}.{p}" for i in (0, 10, 20, 29)
             for p in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")]
    for n in names:
        model.get_submodule(n).register_forward_hook(hook(n))
    model(**enc, labels=enc["input_ids"]).loss.backward()
    res = {}
    for n in names:
        x, g = cap[n]
        mt = _round_up(x.shape[0], 128)
        xt = _pad2(x.t().contiguous(), _round_up(x.shape[1], 128), mt)  # X^T [Kp, Mt]
        gt = _pad2(g.t().contiguous(), _round_up(g.shape[1], 128), mt)  # dY^T [Np, Mt]
        ref = gt.double() @ xt.double().t()

        def err(da, db, ref=ref):
            return float((da.double() @ db.double().t() - ref).norm() / ref.norm())

        res[n] = dict(zip(MODES, (err(_groups(gt), _groups(xt)), err(_groups(gt), _tiles(xt)),
                                  err(_tiles(gt), _groups(xt))), strict=True))
        print(n, {k: round(v, 4) for k, v in res[n].items()}, flush=True)
    summary = {k: {"mean": statistics.mean(r[k] for r in res.values()), "max": max(r[k] for r in res.values())}
               for k in MODES}
    for k, v in summary.items():
        print(f"{k}: mean {v['mean']:.4f}, max {v['max']:.4f}")
    if a.out:
        Path(a.out).write_text(json.dumps({"per_layer": res, "summary": summary, "texts": a.texts}, indent=1))


if __name__ == "__main__":
    main()
