"""One LoRA micro-batch update of the rl stage on Qwen-shaped decoder layers: BF16 base vs NVFP4 base, profiled.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/lora_update_step.py --out $OUT              # 7B width, 4 layers
    python benchmarks/lora_update_step.py --device cpu --shape tiny --layers 2 --tokens 64 --seq 32 --out /tmp/lu

Why. Issue 17 asks that a 7B NVFP4+LoRA GRPO step be no slower than the BF16+LoRA one; ``grpo_step_gpu.py`` times
whole steps and found the update phase 0.6 s slower in NVFP4 (11.39 vs 10.80 s: 16 micro-batches of 8 x 768 tokens).
This isolates one micro-batch -- what the update repeats -- on a few decoder layers, so the arms can be profiled
and changed quickly: forward with activation checkpointing (the rl stage's ``policy.gradient_checkpointing``), the
rl stage's chunked token log-probs (``quarl.rl.logprobs.completion_logprobs``) under a policy-gradient loss,
backward, AdamW on the adapter. The base is built by the trainer's own ``quarl.train.policy.build_policy`` (LoRA
rank ``--lora-r``, alpha 2r, fp32 adapters on all seven projections).

Arms (each on a fresh model from the same seed): ``bf16`` and ``nvfp4`` (``policy.format``), and ``nvfp4:nokeep``
(``QUARL_KERNELS_DENSE_KEEP=0``: the backward decodes the NVFP4 weight again instead of reusing the one the
checkpointed recompute made, ``quarl_kernels.recent_weights``) and ``nvfp4:keepall`` (every decoded BF16 weight
kept: since nothing releases them between the timed steps, no step decodes at all -- the bound on what keeping the
BF16 weights through an update can save, at the BF16 weights' memory); ``nvfp4:fp8`` (``QUARL_KERNELS_DENSE_FP8=1``:
the base's large-M GEMMs of >= 256 GFLOP on FP8 tiles, ``quarl_kernels.dense_fp8``; its expansion counts as the
4-bit decode) and ``nvfp4:fp8:allgemms`` (every dense GEMM in FP8, whatever its size). ``--profile`` adds one profiled step per arm: GPU ms
by kernel class (the 4-bit decode to BF16 counted apart) and the top kernels.

Reading it: the arms share everything but the base projections, so (arm - bf16) / layers is what the 4-bit base
costs per decoder layer and micro-batch; times 28 layers and 16 micro-batches it is the 7B update's difference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import unittest.mock
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks")]

import fp8_model_step as fms  # the model builder, the rl loss step, the profiler's kernel classes

MODIFIERS = {"nokeep": ("QUARL_KERNELS_DENSE_KEEP", "0"),  # decode again in the backward
             "keepall": ("QUARL_KERNELS_DENSE_KEEP", "100000"),  # every decoded weight kept: decoded once, ever
             "fp8": ("QUARL_KERNELS_DENSE_FP8", "1"),  # large M as FP8 tiles and FP8 GEMMs (dense_fp8.py)
             "allgemms": ("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP", "0")}  # ... on every GEMM, however small
CLASSES = [("4-bit decode", ("_dequant_kernel", "_expand_kernel")), *fms.KERNEL_CLASSES]


def parse_arm(arm: str) -> tuple[str, dict]:
    """``nvfp4:nokeep`` -> ("nvfp4", {env: value}); unknown modifiers refused."""
    fmt, *mods = arm.split(":")
    bad = [m for m in mods if m not in MODIFIERS]
    if bad:
        raise SystemExit(f"arm {arm!r}: unknown modifier(s) {bad}; known: {', '.join(MODIFIERS)}")
    return fmt, dict(MODIFIERS[m] for m in mods)


def build_arm(shape: str, layers: int, fmt: str, lora_r: int, device: str):
    from quarl.rl.config import PolicyConfig
    from quarl.train.policy import build_policy, enable_gradient_checkpointing

    model = fms.build(shape, layers, device)
    build_policy(model, PolicyConfig(format=fmt, lora_r=lora_r, lora_alpha=2.0 * lora_r))
    enable_gradient_checkpointing(model)
    model.train()
    return model


def time_arm(a, arm: str) -> dict:
    fmt, env = parse_arm(arm)
    with unittest.mock.patch.dict(os.environ, env):
        model = build_arm(a.shape, a.layers, fmt, a.lora_r, a.device)
        ids = torch.randint(0, fms.SHAPES[a.shape][4], (max(a.tokens // a.seq, 1), a.seq), device=a.device,
                            generator=torch.Generator(a.device).manual_seed(0))
        return {"arm": arm, **fms.measure(model, ids, "rl", a.iters, a.device, a.profile, CLASSES, fused_adam=False)}


def render(res: dict) -> str:
    rows = [r for r in res["rows"] if "ms" in r]
    base = next((r["ms"] for r in rows if r["arm"] == "bf16"), None)
    L = [(f"# LoRA micro-batch update, {res['shape']} width, {res['layers']} decoder layers, {res['tokens']} tokens "
          f"({res['seq']} per sequence), r={res['lora_r']}, checkpointing, {res['gpu']}"), "",
         "| arm | step ms | vs bf16 | (arm - bf16) per layer ms | x 28 layers x 16 micro-batches s | peak GiB |",
         "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = (r["ms"] - base) / res["layers"] if base is not None else float("nan")
        L.append(f"| {r['arm']} | {r['ms']:.1f} | {r['ms'] / base:.3f}x | {d:+.2f} | {d * 28 * 16 / 1e3:+.2f} | "
                 f"{r.get('peak_gib', float('nan')):.1f} |" if base else f"| {r['arm']} | {r['ms']:.1f} | | | | |")
    for r in res["rows"]:
        if "error" in r:
            L.append(f"| {r['arm']} | {r['error'][:100]} | | | | |")
    prof = {r["arm"]: r["profile"] for r in rows if r.get("profile")}
    if prof:
        cls = [c for c, _ in CLASSES] + ["other"]
        L += ["", "GPU ms of one profiled step by kernel class (torch.profiler):", "",
              "| arm | " + " | ".join(cls) + " | sum |", "|---|" + "---:|" * (len(cls) + 1)]
        for arm, p in prof.items():
            L.append(f"| {arm} | " + " | ".join(f"{p['classes'].get(c, 0.0):.1f}" for c in cls) +
                     f" | {p['total_ms']:.1f} |")
        for arm, p in prof.items():
            L += ["", f"Top kernels, {arm} (ms per step):", ""] + [f"- {ms:.2f} {k}" for k, ms in p["top"]]
    return "\n".join(L)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="Qwen2.5-7B", choices=sorted(fms.SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8 * 768, help="tokens per micro-batch (the GRPO step's 8 x 768)")
    ap.add_argument("--seq", type=int, default=768, help="tokens per sequence (256 prompt + the completion)")
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--arms", default="bf16,nvfp4,nvfp4:nokeep")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="/tmp/lora_update_step")
    a = ap.parse_args(argv)
    arms = a.arms.split(",")
    for arm in arms:
        parse_arm(arm)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__,
           "shape": a.shape, "layers": a.layers, "tokens": a.tokens, "seq": a.seq, "lora_r": a.lora_r, "rows": []}
    t0 = time.time()
    for arm in arms:
        try:
            row = time_arm(a, arm)
        except Exception as e:  # noqa: BLE001 -- keep the other arms
            row = {"arm": arm, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        fms.record_row(res, row, out / "lora_update_step.json", a.device, t0)
    fms.write_report(render(res), out / "lora_update_step.md")


if __name__ == "__main__":
    main()
