"""Sampling entropy of a quantized policy vs full precision at step 0 (QeRL's Fig. 5 claim), measured.

    .venv/bin/python -m benchmarks.rl_entropy [--model default] [--formats bf16,nvfp4,mxfp4,nf4]
                                              [--prompts 64] [--new-tokens 64] [--samples 2]

QeRL (arXiv:2510.11696, Sec. 3.2, Fig. 5) reports that the NVFP4 policy starts RL
with a *higher* sampling entropy than the 16-bit one: quantization noise flattens
the token distribution, which the paper reads as extra exploration. This script
measures that on one model, untrained (step 0), with nothing else varying:

* the same ``--prompts`` problems: the first N of the built-in generator's
  held-out split (levels 1-5, exactly what ``quarl eval`` calls ``heldout``),
  rendered with the model's chat template and QeRL's instruction;
* the same sampler: the RL rollout engine (``quarl.engine.rollout.HFGenerator``),
  temperature 1, top-p 1, ``--new-tokens`` new tokens, ``--samples`` answers per
  prompt, one seeded ``torch.Generator`` per format (same seed);
* the same entropy: the trainer's own (``quarl.rl.logprobs.completion_logprobs``,
  ``H = logsumexp(z) - E_p[z]`` over the full vocabulary at every generated
  position), averaged over generated tokens (EOS included, padding excluded).

Two views, both reported:

``own``   each policy's entropy along its *own* samples -- what a training run
          logs as ``policy/entropy`` at step 0 (Fig. 5's quantity). Trajectories
          differ between formats, so this mixes "flatter distributions" with
          "different text".
``fixed`` every policy's entropy on the *same* token sequences (the bf16
          policy's samples), teacher-forced: isolates how quantization changes
          the distribution at identical contexts. Paired per token, so its
          standard error is small.

Formats are round-to-nearest through ``quarl.quant.quantize_model`` (QeRL's
NVFP4 policy is RTN; ``bf16`` = the unquantized weights, held in the compute
dtype, float32 on a CPU). Results: ``benchmarks/results/rl_entropy.json``.
Standard errors are over prompts (each prompt's token-mean entropy is one
observation); the paired difference vs bf16 is per prompt too.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks/results"


def load_prompts(tokenizer, n: int) -> list[list[int]]:
    from quarl.eval import BenchmarkConfig, load_benchmark, render_prompts

    bench = render_prompts(load_benchmark(BenchmarkConfig(name="heldout", max_problems=n)), tokenizer)
    return [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in bench.problems]


def perturbed(base: torch.nn.Module, fmt: str, seed: int) -> tuple[torch.nn.Module, float]:
    """The control for QeRL's entropy claim: ``base`` with Gaussian noise in every linear that ``fmt``
    would quantize, each layer's noise scaled to the Frobenius norm of that layer's own quantization
    error ``||Q(W) - W||`` -- the same relative size of perturbation, with none of the structure
    (rounding to a grid, block scales). Returns (model, mean relative error ||Q(W)-W|| / ||W||)."""
    from quarl.quant import QuantLinear, quantize_model

    q = copy.deepcopy(base)
    quantize_model(q, {"default": fmt})
    qmods = {n: m for n, m in q.named_modules() if isinstance(m, QuantLinear)}
    m = copy.deepcopy(base)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rels = []
    with torch.no_grad():
        for name, lin in m.named_modules():
            if name not in qmods:
                continue
            w = lin.weight
            err = (qmods[name].dequantized_weight().to(torch.float32) - w.float()).norm().cpu()
            noise = torch.randn(w.shape, generator=gen, dtype=torch.float32)
            w.add_((noise * (err / noise.norm())).to(device=w.device, dtype=w.dtype))
            rels.append(float(err / w.float().norm().cpu()))
    del q
    return m, sum(rels) / max(len(rels), 1)


def policy(base: torch.nn.Module, fmt: str, seed: int = 0) -> torch.nn.Module:
    from quarl.quant import quantize_model

    if fmt in ("bf16", "none", "fp32"):
        return base
    if fmt.startswith("perturb-"):
        return perturbed(base, fmt.removeprefix("perturb-"), seed)[0]
    m = copy.deepcopy(base)
    quantize_model(m, {"default": fmt})
    for mod in m.modules():  # decode once: the base never changes (eval/RL do the same on CPU)
        if hasattr(mod, "cache_dequantized"):
            mod.cache_dequantized = True
    return m


@torch.no_grad()
def token_entropy(model, r, rows_per_batch: int = 16) -> torch.Tensor:
    """``[N, T]`` entropy at every completion position of rollout ``r`` (0 on padding)."""
    from quarl.rl.logprobs import completion_logprobs

    out = []
    for i in range(0, len(r), rows_per_batch):
        s = slice(i, i + rows_per_batch)
        T = r.completion_ids.shape[1]
        ids = torch.cat([r.prompt_ids[s], r.completion_ids[s]], dim=1)
        mask = torch.cat([r.prompt_mask[s], r.completion_mask[s]], dim=1)
        _, ent = completion_logprobs(model, ids, mask, T, 1.0, with_entropy=True, chunk=0)
        out.append(ent * r.completion_mask[s])
    return torch.cat(out)


def per_prompt_mean(ent: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """``[N, T]`` -> ``[P]``: token-mean entropy of each prompt over its ``n`` samples."""
    tok = (ent * mask).view(-1, n, ent.shape[1]).sum(dim=(1, 2))
    cnt = mask.view(-1, n, mask.shape[1]).sum(dim=(1, 2)).clamp(min=1)
    return tok / cnt


def mean_se(x: torch.Tensor) -> tuple[float, float]:
    x = x.double()
    return float(x.mean()), (float(x.std(unbiased=True) / math.sqrt(len(x))) if len(x) > 1 else 0.0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--formats", default="bf16,nvfp4,mxfp4,nf4")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2, help="answers per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (float32 on CPU, bfloat16 on CUDA)")
    ap.add_argument("--out", default=str(RESULTS / "rl_entropy.json"))
    args = ap.parse_args(argv)
    from quarl.engine.rollout import HFGenerator, SamplingParams
    from quarl.models import load_model
    from quarl.rl.trainer import stop_token_ids

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    base, tok = load_model(args.model, dtype=torch.float32 if dev.type == "cpu" else torch.bfloat16, device=dev)
    base.eval()
    prompts = load_prompts(tok, args.prompts)
    sp = SamplingParams(1.0, 1.0, args.new_tokens, stop_token_ids(base, tok))
    fmts = [f for f in args.formats.split(",") if f]
    if fmts[0] != "bf16":
        raise SystemExit("--formats must start with bf16 (the reference the others are compared with)")
    res = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "model": args.model, "settings": vars(args),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), torch {torch.__version__}",
           "formats": {}}  # fmt: skip
    ref_rollout = ref_own = ref_fixed = None
    for fmt in fmts:
        t0 = time.time()
        m = policy(base, fmt, args.seed)
        gen = torch.Generator(dev).manual_seed(args.seed)
        r = HFGenerator(m, tok.pad_token_id, cache="dynamic", batch_size=32).generate(prompts, sp, args.samples, gen)
        mask = r.completion_mask.float()
        own = per_prompt_mean(token_entropy(m, r), mask, args.samples)  # [P]
        if ref_rollout is None:
            ref_rollout = r
        rmask = ref_rollout.completion_mask.float()
        fixed_tok = token_entropy(m, ref_rollout)  # [N, T] on the bf16 samples
        fixed = per_prompt_mean(fixed_tok, rmask, args.samples)
        if ref_own is None:
            ref_own, ref_fixed = own, fixed
        row = {
            "own": mean_se(own), "fixed": mean_se(fixed),
            "own_minus_bf16": mean_se(own - ref_own), "fixed_minus_bf16": mean_se(fixed - ref_fixed),
            "fixed_higher_fraction_of_prompts": float((fixed > ref_fixed).double().mean()),
            "mean_tokens": float(mask.sum(1).mean()), "truncated": float(r.truncated.float().mean()),
            "seconds": round(time.time() - t0, 1),
        }  # fmt: skip
        res["formats"][fmt] = row
        print(fmt, json.dumps(row), flush=True)
        if m is not base:
            del m
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res))
    return res


def _delta(r: dict, key: str, ref: bool) -> str:
    return "-" if ref else f"{r[key][0]:+.3f} ± {r[key][1]:.3f}"


def markdown(res: dict) -> str:
    s = res["settings"]
    lines = [
        f"{s['prompts']} held-out prompts x {s['samples']} samples, T=1, {s['new_tokens']} new tokens, seed {s['seed']}",
        (
            "| policy | entropy, own samples (± s.e.) | Δ vs bf16 (paired) | entropy, bf16's samples (± s.e.) | "
            "Δ vs bf16 (paired) | prompts higher | mean tokens |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f, r in res["formats"].items():
        ref = f == "bf16"
        higher = "-" if ref else f"{100 * r['fixed_higher_fraction_of_prompts']:.0f}%"
        lines.append(
            f"| {f} | {r['own'][0]:.3f} ± {r['own'][1]:.3f} | {_delta(r, 'own_minus_bf16', ref)} | "
            f"{r['fixed'][0]:.3f} ± {r['fixed'][1]:.3f} | {_delta(r, 'fixed_minus_bf16', ref)} | {higher} | "
            f"{r['mean_tokens']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
