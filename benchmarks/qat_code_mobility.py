"""How far a QAT student's codes are from flipping, by init (RTN, GPTQ) and scales mode: a CPU probe.

    python benchmarks/qat_code_mobility.py --data .dev/data/distill      # ~4 min on one CPU thread

Written to look into one row of the 2026-11-25 distillation table (RESULTS.md, "Distillation"):
QAT of the GPTQ INT3 student with ``student.scales=recompute`` at lr 1e-4 moved far from the
teacher (held-out KL 0.156 -> 4.860, CE 2.485 -> 0.234) while the RTN INT3 and GPTQ NVFP4 students'
QAT lowered their KL at the same lr. Hypothesis: re-deriving the group scales from a *dequantized GPTQ*
weight (the QAT latent at step 0) puts many latents on or near a rounding midpoint of the new grid
(wherever GPTQ left a group's extreme code unused, the range shrinks and the old grid points land
between new ones), so an AdamW step of ~lr flips their codes by a whole INT3 level. RTN's latents
sit on grid points of a grid derived from the same weights, half a step from any midpoint.

For every quantized linear of SmolLM2-135M-Instruct (the benchmark's formats; GPTQ with a small
calibration here, 4 x 64 tokens of --data, column loop on the CPU) this counts, over all weights:

    rerounded   |fake_quant(latent) - latent| > 1e-6 at step 0 (the re-derived grid moves the weight)
    jump@d      |fake_quant(latent + s) - fake_quant(latent)| > 4 d, s = d * sign(noise): weights that
                one step of size d (AdamW's first step moves every weight by ~lr; d = 1e-4, 1e-3)
                moves by far more than d -- a code flip or a zero-point jump, a whole grid step.
                A continuous rescale of the group (its min/max moved by d) moves a weight by <= 2 d
                and is not counted
    gain@d      ||fake_quant(latent + s) - fake_quant(latent)|| / ||s||: how much the quantized
                weights move per unit the latent weights move

for ``recompute`` (scales from the latent) and ``calibrated`` (the layer's own grid kept). A
probe of the mechanism, not a reproduction of the GPU row (no training runs here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from distill_table import COLUMNS, FORMATS  # the table's formats and text columns


def quantized(model_ref: str, fmt: str, init: str, data: str, calib: tuple[int, int]):
    from quarl.models import load_model
    from quarl.quant import QuantRecipe, quantize_model

    m, tok = load_model(model_ref, dtype=torch.float32, device="cpu")
    m.eval()
    if init == "rtn":
        quantize_model(m, FORMATS[fmt])
        return m
    from quarl.calibrate.config import GPTQConfig
    from quarl.calibrate.data import batches, make_windows, read_artifact_split, shuffled
    from quarl.calibrate.sequential import calibrate_model
    from quarl.quant.model import plan_formats

    docs = shuffled(read_artifact_split(data, "train", COLUMNS), 0)
    win = make_windows(docs, tok, *calib)
    calibrate_model(m, plan_formats(m, QuantRecipe.load(FORMATS[fmt])), batches(win, 4), method="gptq",
                    gptq={**GPTQConfig().__dict__, "device": "cpu"}, progress=False)
    return m


@torch.no_grad()
def probe(model, deltas=(1e-4, 1e-3), seed: int = 0) -> dict:
    from quarl.distill.student import FROZEN_SCALES
    from quarl.quant import QuantLinear
    from quarl.quant.base import get_format

    g = torch.Generator().manual_seed(seed)
    n = 0
    modes = ("recompute", "calibrated")
    cnt = {"rerounded": 0, **{f"{mode}_{k}@{d:g}": 0.0 for mode in modes for d in deltas for k in ("jump", "gain")}}
    for m in model.modules():
        if not (isinstance(m, QuantLinear) and m.config is not None and m.mode == "frozen"):
            continue
        fmt, cfg = get_format(m.config.name), m.config
        w = m.dequantized_weight(torch.float32)  # [N, K]: the QAT latent at step 0
        base = {"global_scale": m.weight_global_scale.float()} if "weight_global_scale" in m._tensor_names else {}
        states = {"recompute": base or None,
                  "calibrated": {**base, **{k: getattr(m, k) for k in FROZEN_SCALES[m.config.name]
                                            if k in m._tensor_names}}}
        q0 = {mode: fmt.fake_quant(w, cfg, state=s) for mode, s in states.items()}
        cnt["rerounded"] += int(((q0["recompute"] - w).abs() > 1e-6).sum())
        for d in deltas:
            step = d * torch.sign(torch.randn(w.shape, generator=g))  # [N, K]: one AdamW-sized step
            for mode, s in states.items():
                dq = fmt.fake_quant(w + step, cfg, state=s) - q0[mode]  # [N, K]
                cnt[f"{mode}_jump@{d:g}"] += int((dq.abs() > 4 * d).sum())
                cnt[f"{mode}_gain@{d:g}"] += float(dq.square().sum())  # / ||step||^2 = n d^2 below
        n += w.numel()
    out = {k: v / n for k, v in cnt.items() if "gain" not in k}
    out.update({k: (v / (n * float(k.rsplit("@", 1)[1]) ** 2)) ** 0.5 for k, v in cnt.items() if "gain" in k})
    return {"weights": n, **out}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--data", required=True, help="a data_prep dataset (distill_table.py --make-data writes one)")
    ap.add_argument("--formats", default="int3-g128,nvfp4")
    ap.add_argument("--inits", default="rtn,gptq")
    ap.add_argument("--calib", default="4,64", help="GPTQ calibration windows x tokens")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    calib = tuple(int(x) for x in a.calib.split(","))
    rows = []
    for fmt in a.formats.split(","):
        for init in a.inits.split(","):
            t = time.time()
            r = {"format": fmt, "init": init, **probe(quantized(a.model, fmt, init, a.data, calib)),
                 "seconds": round(time.time() - t, 1)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    keys = [k for k in rows[0] if k not in ("format", "init", "weights", "seconds")]
    print("\n| format | init | " + " | ".join(keys) + " |\n|---|---|" + "---:|" * len(keys))
    for r in rows:
        print(f"| {r['format']} | {r['init']} | " + " | ".join(f"{r[k]:.2f}" if "gain" in k else f"{100 * r[k]:.2f}%"
                                                            for k in keys) + " |")
    res = {"calib": list(calib), "torch": torch.__version__, "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
