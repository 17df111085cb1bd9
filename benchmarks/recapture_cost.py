"""What a rollout pays when the engine frees its KV cache after every call (the RL trainer's default).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/recapture_cost.py --out $OUT/recapture     # a CUDA device

Why. ``rollout.free_cache=true`` (``FastGenerator(keep_cache=False)``) gives the update the KV cache's memory back,
and every rollout then re-allocates the cache and re-captures its decode graphs. In the 7B GRPO step that cost
NVFP4+LoRA ~0.5 s of a 5.7 s rollout and BF16+LoRA ~0.25 s (RESULTS "Issue 17, session 13"). This splits it: per
variant (7B shape, random weights, the rollout table's recipes) and per mode (``keep_cache`` False / True), three
``generate`` calls of the GRPO step's shape (64 rows, 256-token prompts, 512 new tokens), each call's wall time and
the engine's own counters (``last_stats``: graphs captured, seconds in their eager warm-up steps and in recording +
instantiation). The third call is the steady one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks")]

import rollout as R  # the rollout table's model builder, recipes and prompts


def measure(model, keep_cache: bool, rows: int, prompt: int, new_tokens: int, calls: int) -> list[dict]:
    from quarl.engine import FastGenerator
    from quarl.engine.rollout import SamplingParams

    gen = FastGenerator(model, R.PAD, keep_cache=keep_cache)
    prompts = R._prompts(rows, prompt, model.config.vocab_size)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, stop_token_ids=[])
    out = []
    for i in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen.generate(prompts, params, 1, torch.Generator("cuda").manual_seed(i))
        torch.cuda.synchronize()
        st = gen.last_stats
        out.append({"call": i, "keep_cache": keep_cache, "s": time.perf_counter() - t,
                    "graph_captures": st.get("graph_captures", 0), "warmup_s": st.get("warmup_s", 0.0),
                    "capture_s": st.get("capture_s", 0.0), "steps": st.get("steps")})
        print(json.dumps(out[-1]), flush=True)
    gen.release()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="7b")
    ap.add_argument("--variants", default="bf16+lora,nvfp4+lora")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--out", default="/tmp/recapture")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("recapture_cost.py needs a CUDA device")
    from quarl.quant import quantize_model

    rows = []
    for variant in a.variants.split(","):
        model = R.build_model(R.qwen25_config(a.model))
        if R.RECIPES[variant] is not None:
            quantize_model(model, R.RECIPES[variant])
        for keep in (False, True):
            rows += [{"variant": variant, **r} for r in measure(model, keep, a.rows, a.prompt, a.new_tokens, a.calls)]
        del model
        torch.cuda.empty_cache()
    lines = [(f"# one rollout call: {a.model}, {a.rows} rows x {a.prompt} prompt + {a.new_tokens} new tokens, "
             f"{torch.cuda.get_device_name()}"), "",
             "| variant | keep_cache | call | s | graphs captured | warm-up s | record + instantiate s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['variant']} | {r['keep_cache']} | {r['call']} | {r['s']:.3f} | {r['graph_captures']} | "
              f"{r['warmup_s']:.3f} | {r['capture_s']:.3f} |" for r in rows]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recapture_cost.json").write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=1))
    (out / "recapture_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
