"""One prefill per prompt: what running a prompt once for its ``n`` samples saves a GRPO-shaped rollout.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/rollout_prefill_share.py [--models 7b] [--variants
        nvfp4+lora,bf16+lora] [--prompts 8] [--n 8] [--prompt-lens 256,1024] [--new-tokens 512] [--out DIR]
    python benchmarks/rollout_prefill_share.py --models tiny --device cpu --prompt-lens 16 --new-tokens 8   # smoke

GRPO asks for ``n`` answers to each prompt (8 prompts x 8 answers in ``benchmarks/grpo_step_gpu.py``): the engine's
rows are each prompt ``n`` times in a row. ``FastGenerator(share_prefill=True)`` (the default) prefills each prompt
once and copies its K/V columns and logits to its other rows. Per (model, variant, prompt length), with sharing
off and on (random-weight model, ``rollout.build_model``; no stop token, so both arms decode the same steps): the
prefill alone (a ``max_new_tokens=1`` call, median of 3 after one warm call) and a whole rollout of
``--new-tokens`` tokens (the last of two calls, ``keep_cache=True``). Writes ``prefill_share.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics

import rollout
import torch

from quarl.engine import FastGenerator
from quarl.engine.rollout import SamplingParams


def timed_calls(eng, rows, params, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        gen = torch.Generator(rollout.DEVICE).manual_seed(0)
        out.append(rollout._sync_time(lambda g=gen: eng.generate(rows, params, 1, g))[1])
    return out


def one_length(model, prompts: int, n: int, plen: int, new_tokens: int) -> dict:
    uniq = rollout._prompts(prompts, plen, model.config.vocab_size)
    rows = [p for p in uniq for _ in range(n)]  # what generate(prompts, n=...) builds
    res = {"prompt_len": plen, "rows": len(rows)}
    for share in (False, True):
        eng = FastGenerator(model, rollout.PAD, kv_block=256, sync_every=16, share_prefill=share)
        one = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=1, stop_token_ids=[])
        prefill = statistics.median(timed_calls(eng, rows, one, 4)[1:])
        full = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, stop_token_ids=[])
        whole = timed_calls(eng, rows, full, 2)[-1]
        tag = "on" if share else "off"
        res[tag] = {"prefill_s": prefill, "rollout_s": whole, "prefilled_rows": eng.last_stats.get("prefilled_rows")}
        print(json.dumps({"prompt_len": plen, "share": share, **res[tag]}), flush=True)
        eng.release()
        del eng
        gc.collect()
    return res


def render(res: dict) -> str:
    a = res["args"]
    lines = [f"# one prefill per prompt ({res['env'].get('gpu')}, {res['date']})", "",
             (f"{a['prompts']} prompts x {a['n']} samples, {a['new_tokens']} new tokens (no stop token); prefill = a "
              "1-token call (median of 3), rollout = the second of two calls; x = off / on"), "",
             "| model | variant | prompt tokens | prefill s off / on (x) | rollout s off / on (x) |",
             "|---|---|---:|---|---|"]
    for c in res["cells"]:
        off, on = c["off"], c["on"]
        pre, roll = off["prefill_s"] / on["prefill_s"], off["rollout_s"] / on["rollout_s"]
        lines.append(f"| {c['model']} | {c['variant']} | {c['prompt_len']} | {off['prefill_s']:.3f} / "
                     f"{on['prefill_s']:.3f} (**{pre:.2f}x**) | {off['rollout_s']:.2f} / {on['rollout_s']:.2f} "
                     f"(**{roll:.3f}x**) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rollout.add_variant_args(ap, "benchmarks/runs/prefill_share")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-lens", default="256,1024")
    ap.add_argument("--new-tokens", type=int, default=512)
    a = ap.parse_args(argv)
    rollout.run_variants(a, "prefill_share", lambda model: (one_length(model, a.prompts, a.n, int(p), a.new_tokens)
                                                            for p in a.prompt_lens.split(",")), render)


if __name__ == "__main__":
    main()
