"""Why did GRPO on GSM8K stop with a NaN gradient at step 12 (all three policies, finite loss)?

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/rl_nan_probe.py --data DATA/gsm8k --out $OUT/probe.json \
        --set optim.micro_batch_size=16 [--set ...]

Replays the failing run (same seed, data order, settings) up to the step that diverged,
with every differentiable ``torch.nn.functional.scaled_dot_product_attention`` call
instrumented: it records how many query rows of the boolean mask are *fully masked*
(left padding: a pad position has no earlier non-pad key) and, in the backward pass,
whether the gradients it hands back (dq, dk, dv) are NaN while the gradient it received
(d out) is finite -- i.e. whether the attention backward itself makes the NaN -- and
whether the NaN rows of dq are exactly the fully-masked rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

STATS = {"calls": 0, "calls_with_fully_masked_rows": 0, "fully_masked_rows": 0, "dout_nonfinite": 0,
         "dq_nan": 0, "dk_nan": 0, "dv_nan": 0, "dq_nan_rows_all_fully_masked": 0, "dq_nan_rows_other": 0,
         "examples": []}
_sdpa = F.scaled_dot_product_attention


def probed_sdpa(q, k, v, attn_mask=None, *args, **kw):
    if not (torch.is_grad_enabled() and q.requires_grad):
        return _sdpa(q, k, v, attn_mask, *args, **kw)
    STATS["calls"] += 1
    full = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        full = ~attn_mask.any(dim=-1)  # [B, 1|H, Lq] query rows with no key at all
        n = int(full.sum())
        if n:
            STATS["calls_with_fully_masked_rows"] += 1
            STATS["fully_masked_rows"] += n
    q, k, v = (t.clone() for t in (q, k, v))  # own leaves of the graph to hook
    out = _sdpa(q, k, v, attn_mask, *args, **kw)

    def on_out(g):
        if not torch.isfinite(g).all():
            STATS["dout_nonfinite"] += 1

    def on_q(g):
        bad = torch.isnan(g).any(dim=-1)  # [B, H, Lq]
        if bad.any():
            STATS["dq_nan"] += 1
            if full is not None and bool((bad & ~full.expand_as(bad)).sum() == 0):
                STATS["dq_nan_rows_all_fully_masked"] += 1
            else:
                STATS["dq_nan_rows_other"] += 1
            if len(STATS["examples"]) < 5:
                STATS["examples"].append({"q_shape": list(g.shape), "nan_rows": int(bad.sum()),
                                          "fully_masked_rows": int(full.sum()) if full is not None else None,
                                          "mask_shape": list(attn_mask.shape) if attn_mask is not None else None})

    out.register_hook(on_out)
    q.register_hook(on_q)
    k.register_hook(lambda g: STATS.__setitem__("dk_nan", STATS["dk_nan"] + int(torch.isnan(g).any())))
    v.register_hook(lambda g: STATS.__setitem__("dv_nan", STATS["dv_nan"] + int(torch.isnan(g).any())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=13, help="run this many steps (the failure was at step 12)")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    F.scaled_dot_product_attention = probed_sdpa
    torch.nn.functional.scaled_dot_product_attention = probed_sdpa
    from quarl.config import load_config
    from quarl.rl import RLConfig, run_rl
    from quarl.rl.trainer import RLDivergedError

    base = ["train.steps=150", "train.prompts_per_step=16", "rollout.group_size=8", "rollout.max_new_tokens=256",
            "rollout.max_prompt_tokens=512", "rollout.temperature=1.0", "optim.lr=0.0002", "optim.optimizer=adamw",
            "optim.warmup_ratio=0.05", "optim.schedule=constant", "optim.micro_batch_size=16",
            "algo.updates_per_rollout=1", "policy.lora_r=32", "policy.lora_alpha=32", "train.seed=2025",
            "train.checkpoint_every=0", "train.sample_every=0", "train.device=cuda", "optim.logprob_chunk=256",
            "policy.format=bf16", "aqn.enabled=false"]
    cfg = load_config(RLConfig, None, base + args.set)
    res = {"settings": base + args.set}
    try:
        run_rl(cfg, model_uri="default", data_uri=args.data, output_uri="/tmp/nan_probe/adapter",
               stop_after=args.steps)
        res["diverged"] = None
    except RLDivergedError as e:
        res["diverged"] = str(e)
    res["stats"] = STATS
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
