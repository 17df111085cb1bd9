"""Is a seeded rollout reproducible? The same FastGenerator call twice, and on a fresh engine, at batch 64.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/rollout_determinism.py [--layers 4] [--batch 64] [--tokens 128]

A Qwen2.5-7B-shaped model (``--layers`` decoder layers, random weights), NVFP4 + LoRA r32 (QeRL's rollout), 256-token
prompts, temperature 1 with a seeded generator. Each arm (the default kernels, ``QUARL_KERNELS_WGMMA_RING=0``,
then ``QUARL_KERNELS_WGMMA_DECODE=0`` as well) builds an engine, generates three times with the same seed -- twice
on one engine (graph replays), once on a fresh engine (a new capture) -- and reports whether the sampled tokens and
their log-probs are identical, and where the first difference is. The GRPO benchmark found its NVFP4 mismatch
statistic differing between two identical runs with the TMA-ring kernel on (session 14, phase d); this isolates
the engine from the trainer. It was the ring overlapping a step's decode with the previous step's wgmma (its A
registers rewritten in flight): phase i, fixed by waiting for each step's MMA (``WgmmaRingConfig.inflight``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import rollout as rb

    from quarl.engine import FastGenerator
    from quarl.engine.rollout import SamplingParams
    from quarl.quant import quantize_model

    cfg = rb.qwen25_config("7b")
    cfg.num_hidden_layers = args.layers
    model = rb.build_model(cfg)
    quantize_model(model, rb.RECIPES["nvfp4+lora"])
    rows = rb._prompts(args.batch, 256, cfg.vocab_size, seed=3)
    sp = SamplingParams(1.0, 1.0, args.tokens, [])
    res = {}
    arms = [("default", {}), ("ring off", {"QUARL_KERNELS_WGMMA_RING": "0"}),
            ("ring + wgmma off", {"QUARL_KERNELS_WGMMA_RING": "0", "QUARL_KERNELS_WGMMA_DECODE": "0"})]
    for name, env in arms:
        with mock.patch.dict(os.environ, env):  # the arm's switches, restored after it
            outs = []
            eng = FastGenerator(model, rb.PAD)
            for _ in range(2):
                outs.append(eng.generate(rows, sp, 1, torch.Generator("cuda").manual_seed(7)))
            eng.release()
            eng = FastGenerator(model, rb.PAD)
            outs.append(eng.generate(rows, sp, 1, torch.Generator("cuda").manual_seed(7)))
            eng.release()
        r = {}
        for j, label in ((1, "replay"), (2, "fresh engine")):
            same_ids = torch.equal(outs[0].completion_ids, outs[j].completion_ids)
            diff = (outs[0].completion_ids != outs[j].completion_ids)
            first = int(diff.any(0).nonzero()[0]) if diff.any() else None
            lp_same = torch.equal(outs[0].logprobs, outs[j].logprobs) if same_ids else None
            r[label] = {"tokens_identical": same_ids, "first_token_diff_at": first,
                        "rows_differing": int(diff.any(1).sum()), "logprobs_identical": lp_same}
        res[name] = r
        print(f"{name}: {json.dumps(r)}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "determinism.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
