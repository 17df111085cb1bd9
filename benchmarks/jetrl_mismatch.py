"""Rollout/trainer mismatch of the three precision flows over a short GRPO run, same seed.

    python benchmarks/jetrl_mismatch.py --model default --steps 6 --out benchmarks/results   # CPU, SmolLM2
    python3 benchmarks/jetrl_mismatch.py --model random:896,24,4864 --device cuda --out $OUT  # GPU, no weights

Each mode is one :class:`quarl.rl.trainer.RLTrainer` run (the loop behind ``quarl rl``)
with the same seed, prompts (the built-in generator's level-1/2 problems, the model's
chat template), sampler and hyper-parameters; only ``precision.mode`` differs:

    bf16         training and rollout in the policy dtype (the reference)
    fp8-rollout  training as bf16, rollout through an FP8 cast of the weights (128x128) and
                 1x128 FP8 activations -- the common speed-up
    jetrl        training and rollout through the same FP8 GEMMs

The figures per step are the trainer's own ``mismatch/*`` metrics: mean and max
|log p_train - log p_rollout| over the sampled tokens, the k3 estimate of
KL(rollout || train), and the fraction of tokens with pi_train / pi_rollout outside
[0.5, 2]. ``random:H,L,I`` (with ``--tokenizer DIR``) builds a seeded random Qwen2 model (hidden H, L layers,
MLP I; SmolLM2 tokenizer) for a GPU run with no model upload; its distributions are
those of random weights, so only the ordering of the modes carries over, not the values.

Writes ``jetrl_mismatch_<tag>.json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("bf16", "fp8-rollout", "jetrl")
KEYS = ("mismatch/abs_logprob_diff", "mismatch/max_abs_logprob_diff", "mismatch/kl", "mismatch/ratio_outside_0.5_2",
        "reward/mean", "reward/accuracy", "response/length_mean", "time/rollout_s", "time/update_s")


def build_model(ref: str, tokenizer: str | None = None):
    from quarl.models import load_model, tiny_model

    if not ref.startswith("random:"):
        return load_model(ref, dtype=torch.float32, device="cpu")
    h, layers, inter = (int(v) for v in ref.split(":", 1)[1].split(","))
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else tiny_model("qwen2")[1]
    cfg = AutoConfig.for_model("qwen2", vocab_size=len(tok), hidden_size=h, intermediate_size=inter,
                               num_hidden_layers=layers, num_attention_heads=h // 64, num_key_value_heads=2,
                               max_position_embeddings=4096, tie_word_embeddings=True,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
    return model.eval(), tok


def prompts_and_answers(tok, n: int):
    from quarl.data.generator import generate_problems
    from quarl.data.templates import PromptTemplate

    tpl = PromptTemplate("qerl", tokenizer=tok if getattr(tok, "chat_template", None) else None)
    probs = generate_problems(n, seed=0, levels=(1, 2))
    return [tpl.render(p.problem)[0] for p in probs], [p.answer for p in probs]


def run_mode(mode: str, args, prompts, answers, work: Path) -> list[dict]:
    from quarl.config import load_config
    from quarl.rl.config import RLConfig
    from quarl.rl.trainer import RLTrainer
    from quarl.train.metrics import read_metrics

    sets = [f"precision.mode={mode}", f"policy.mode={args.policy}", "aqn.enabled=false",
            f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.max_new_tokens}",
            f"train.prompts_per_step={args.prompts_per_step}", f"train.steps={args.steps}",
            "train.checkpoint_every=0", "train.sample_every=0", f"train.device={args.device}",
            "algo.updates_per_rollout=1", "optim.optimizer=adamw", f"optim.lr={args.lr}", "optim.warmup_ratio=0",
            f"optim.micro_batch_size={args.micro_batch_size}", f"rollout.engine={args.engine}"]
    if args.device == "cpu":
        sets.append("rollout.cache=dynamic")
    cfg = load_config(RLConfig, None, sets)
    model, tok = build_model(args.model, args.tokenizer)
    tr = RLTrainer(cfg, model, tok, prompts, answers, work / mode)
    tr.train()
    rows = read_metrics(work / mode / "metrics.jsonl")
    del tr, model
    if args.device != "cpu":
        torch.cuda.empty_cache()
    return [{k: r.get(k) for k in ("step", *KEYS)} for r in rows]


def summarize(rows: list[dict]) -> dict:
    def mean(k):
        v = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        return sum(v) / len(v) if v else float("nan")

    def mx(k):
        v = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        return max(v) if v else float("nan")

    return {"abs_logprob_diff_mean": mean("mismatch/abs_logprob_diff"),
            "max_abs_logprob_diff": mx("mismatch/max_abs_logprob_diff"), "kl_mean": mean("mismatch/kl"),
            "ratio_outside_mean": mean("mismatch/ratio_outside_0.5_2"), "reward_mean": mean("reward/mean")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir for random: models (default: SmolLM2's)")
    ap.add_argument("--policy", default="lora", choices=("lora", "full"))
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or f"{args.device}_{args.model.replace(':', '-').replace(',', 'x')}_{args.policy}"
    if args.model.startswith("random:"):
        tok = build_model(args.model, args.tokenizer)[1]
    else:
        from quarl.models import load_model

        tok = load_model(args.model)[1]
    prompts, answers = prompts_and_answers(tok, args.steps * args.prompts_per_step)
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": torch.cuda.get_device_name() if args.device != "cpu" else platform.processor() or "cpu",
           "torch": torch.__version__, "args": vars(args), "modes": {}}
    with tempfile.TemporaryDirectory() as d:
        for mode in args.modes.split(","):
            t0 = time.time()
            rows = run_mode(mode, args, prompts, answers, Path(d))
            res["modes"][mode] = {"summary": summarize(rows), "steps": rows, "wall_s": time.time() - t0}
            print(f"{mode}: {json.dumps(res['modes'][mode]['summary'])} ({time.time() - t0:.0f}s)", flush=True)
    (out / f"jetrl_mismatch_{tag}.json").write_text(json.dumps(res, indent=1))
    head = ("| mode | mean abs dlogp | max abs dlogp | KL(roll||train) k3 | tokens with ratio outside [0.5, 2] "
            "| reward mean |")
    lines = [f"# rollout/trainer mismatch, {tag}", "", head, "|---|---:|---:|---:|---:|---:|"]
    for mode, r in res["modes"].items():
        s = r["summary"]
        lines.append(f"| {mode} | {s['abs_logprob_diff_mean']:.2e} | {s['max_abs_logprob_diff']:.3f} | "
                     f"{s['kl_mean']:.2e} | {s['ratio_outside_mean']:.2e} | {s['reward_mean']:.3f} |")
    (out / f"jetrl_mismatch_{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
