"""Time and peak memory of one GRPO step on a Qwen2.5-7B-shaped policy: BF16-LoRA vs NVFP4-LoRA.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/grpo_step_gpu.py --out $OUT
    .venv/bin/python benchmarks/grpo_step_gpu.py --shape tiny --device cpu     # a CPU smoke test

The step is :class:`quarl.rl.RLTrainer`'s own (``train()``), unchanged: rollout
(``quarl.engine.FastGenerator`` on CUDA) -> rewards -> group advantages -> the
old-policy log-prob pass (no grad) -> ``mu`` policy updates (micro-batches,
gradient checkpointing, LoRA-only gradients, AdamW). The phase times are the
trainer's (``time/rollout_s``, ``time/logprob_s``, ``time/update_s`` in
``metrics.jsonl``); two things are added from outside, without changing what
runs:

* a ``torch.cuda.synchronize()`` at the end of the log-prob pass, so work it
  queued is not billed to the update (the rollout and the update end in a host
  read already);
* the CUDA peak-memory counter is reset at the start of each phase and read at
  its end, giving a per-phase peak (``torch.cuda.max_memory_allocated``).

Model: Qwen2.5-7B's shape (hidden 3584, intermediate 18944, 28 layers, 28 heads,
4 KV heads, vocab 152064, q/k/v bias, untied LM head), random weights created on
the device (meta-device construction, ``to_empty``, ``normal_(0, 0.02)``, norms
1): nothing is allocated on the host. The policy is built by the trainer
(``policy.format`` bf16 = frozen BF16 base, nvfp4 = QeRL's RTN NVFP4 base; LoRA
rank 32 on q/k/v/o/gate/up/down, fp32 adapter weights).

Data and reward: prompts are token ids (a stand-in tokenizer maps prompt ``i``
to 256 fixed random ids) and the reward is a seeded Bernoulli(0.5) per answer --
a random model solves nothing, and the step's cost does not depend on what the
reward says, only on the group having spread (otherwise every advantage is 0).
A random model almost never emits the stop token, so every answer runs the full
``--new-tokens``: the worst-case step for that budget.

Each format runs ``--steps`` steps (default 2); step 0 includes CUDA-graph
capture and Triton compilation, step 1 is the steady-state step reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SHAPES = {
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096},
}  # fmt: skip
EOS = 3  # a token id in every shape's vocabulary; a random model samples it with probability ~1/V


def qwen25_config(shape: str, num_layers: int | None = None):
    from transformers import Qwen2Config

    kw = dict(SHAPES[shape])
    if num_layers is not None:
        kw["num_hidden_layers"] = num_layers
    return Qwen2Config(
        **kw,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=EOS,
        pad_token_id=0,
    )


@torch.no_grad()
def build_model(cfg, device: str, dtype=torch.bfloat16, seed: int = 0):
    """Random model built directly on ``device``: meta init, ``to_empty``, random fill there."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.to_empty(device=device)
    g = torch.Generator(device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1 and not name.endswith("bias"):
            p.fill_(1.0)  # RMSNorm weights
        else:
            p.normal_(0.0, 0.02, generator=g)
    rotary = model.model.rotary_emb  # non-persistent buffers were emptied by to_empty: rebuild on the device
    with torch.device(device):
        model.model.rotary_emb = type(rotary)(config=cfg)
    for name, b in model.named_buffers():
        if b.is_floating_point() and not torch.isfinite(b).all():
            raise RuntimeError(f"buffer {name} is not initialised after to_empty; rebuild it in build_model")
    model.generation_config.eos_token_id = EOS
    return model.eval().requires_grad_(False)


class IdTokenizer:
    """Stand-in tokenizer: prompt string ``"p<i>"`` -> ``prompt_len`` fixed random ids; decode -> ids as text."""

    pad_token_id, eos_token_id = 0, EOS

    def __init__(self, vocab: int, prompt_len: int, seed: int = 0):
        self.vocab, self.prompt_len, self.seed = vocab, prompt_len, seed

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(text.lstrip("p")))
        return {"input_ids": torch.randint(16, self.vocab, (self.prompt_len,), generator=g).tolist()}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


class BernoulliReward:
    """Seeded 0/1 rewards (the step's cost does not depend on them; GRPO needs in-group spread)."""

    def __init__(self, seed: int = 0):
        self.g = torch.Generator().manual_seed(seed)

    def components(self, completions, answers) -> dict[str, list[float]]:
        r = torch.bernoulli(torch.full((len(completions),), 0.5), generator=self.g).tolist()
        return {"reward": r, "accuracy": r, "format": [0.0] * len(r)}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def instrument(trainer, phase_peaks: dict[str, list[float]]) -> None:
    """Per-phase peak memory, and a sync after the no-grad log-prob pass (see module docstring)."""
    dev = trainer.device

    def wrap(name: str, fn, sync: bool):
        def inner(*a, **k):
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            out = fn(*a, **k)
            if sync:
                _sync(dev)
            if dev.type == "cuda":
                phase_peaks.setdefault(name, []).append(torch.cuda.max_memory_allocated(dev) / 2**30)
            return out

        return inner

    trainer._draw = wrap("rollout", trainer._draw, sync=False)
    trainer._no_grad_logprobs = wrap("logprob", trainer._no_grad_logprobs, sync=True)
    trainer._updates = wrap("update", trainer._updates, sync=False)


def run_format(fmt: str, args, work: Path) -> dict:
    from quarl.config import load_config
    from quarl.rl import RLConfig, RLTrainer
    from quarl.rl.metrics import read_metrics

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    cfg_model = qwen25_config(args.shape)
    model = build_model(cfg_model, str(dev), dtype)
    _sync(dev)
    t_build = time.perf_counter() - t0
    mem_model = torch.cuda.memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    overrides = [
        f"policy.format={fmt}", f"policy.lora_r={args.lora_r}", f"policy.lora_alpha={args.lora_r}",
        f"policy.dtype={'bfloat16' if dev.type == 'cuda' else 'float32'}", "policy.gradient_checkpointing=true",
        f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.new_tokens}",
        f"rollout.max_prompt_tokens={args.prompt_len}", "rollout.temperature=1.0",
        f"algo.updates_per_rollout={args.mu}", "algo.algo=grpo", "aqn.enabled=true", "aqn.num_stages=3",
        f"optim.micro_batch_size={args.micro_batch}", "optim.optimizer=adamw8bit", "optim.warmup_ratio=0",
        f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts}", f"train.device={args.device}",
        "train.checkpoint_every=0", "train.sample_every=0", "train.resume=false",
    ]  # fmt: skip
    cfg = load_config(RLConfig, None, overrides)
    tok = IdTokenizer(cfg_model.vocab_size, args.prompt_len)
    prompts = [f"p{i}" for i in range(args.prompts * args.steps)]
    out = work / fmt
    t1 = time.perf_counter()
    trainer = RLTrainer(cfg, model, tok, prompts, ["0"] * len(prompts), out, reward_fn=BernoulliReward(0))
    _sync(dev)
    t_policy = time.perf_counter() - t1
    mem_policy = torch.cuda.memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    trainable = sum(p.numel() for p in trainer.params)
    peaks: dict[str, list[float]] = {}
    instrument(trainer, peaks)
    trainer._save = lambda step_done: None  # no checkpoint in a timing run (LoRA save is not part of a step)
    trainer.train()
    rows = read_metrics(out / "metrics.jsonl")
    steps = []
    for i, r in enumerate(rows):
        steps.append({
            "step": r["step"], "rollout_s": r["time/rollout_s"], "logprob_s": r["time/logprob_s"],
            "update_s": r["time/update_s"], "step_s": r["time/step_s"],
            "rollout_tokens_per_s": r["rollout/tokens_per_s"], "response_len_mean": r["response/length_mean"],
            "peak_gb": {k: round(v[i], 2) for k, v in peaks.items() if i < len(v)},
            "loss": r.get("loss"), "grad_norm": r.get("grad_norm"),
            "mismatch_abs_logprob_diff": r.get("mismatch/abs_logprob_diff"),
        })  # fmt: skip
    res = {
        "format": fmt,
        "build_model_s": round(t_build, 2),
        "build_policy_s": round(t_policy, 2),
        "model_gb": round(mem_model, 2),
        "policy_gb": round(mem_policy, 2),
        "trainable_params": trainable,
        "optimizer": trainer.optimizer_name,
        "engine": type(trainer.generator).__name__,
        "steps": steps,
    }
    del trainer, model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def table(results: list[dict], args) -> str:
    lines = [
        (
            f"GRPO step, Qwen2.5-{args.shape} shape, {args.prompts} prompts x G={args.group}, prompt "
            f"{args.prompt_len}, {args.new_tokens} new tokens, mu={args.mu}, micro-batch {args.micro_batch}, "
            f"LoRA r{args.lora_r}, grad ckpt on"
        ),
        "| format | step | rollout s | logprob s | update s | step s | peak GB roll/lp/upd | policy GB |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        for s in r["steps"]:
            pk = s["peak_gb"]
            lines.append(
                f"| {r['format']} | {s['step']} | {s['rollout_s']:.2f} | {s['logprob_s']:.2f} | "
                f"{s['update_s']:.2f} | {s['step_s']:.2f} | {pk.get('rollout', 0):.1f} / "
                f"{pk.get('logprob', 0):.1f} / {pk.get('update', 0):.1f} | {r['policy_gb']:.1f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    ap.add_argument("--formats", default="bf16,nvfp4")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--mu", type=int, default=2, help="policy updates per rollout (>1 adds the log-prob pass)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="runs/bench/grpo_step_gpu", help="grpo_step_gpu.json goes here")
    ap.add_argument("--work", default=None, help="trainer work dirs (metrics.jsonl, TensorBoard); default OUT/work")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import transformers
        import triton

        env.update(transformers=transformers.__version__, triton=triton.__version__)
    except ImportError:
        pass
    results = []
    for fmt in [f for f in args.formats.split(",") if f]:
        t0 = time.perf_counter()
        try:
            res = run_format(fmt, args, Path(args.work) if args.work else out / "work")
        except Exception as e:  # noqa: BLE001 -- one format failing must not lose the other's numbers
            import traceback

            traceback.print_exc()
            res = {"format": fmt, "error": f"{type(e).__name__}: {e}", "steps": []}
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
        (out / "grpo_step_gpu.json").write_text(
            json.dumps({"env": env, "args": vars(args), "results": results}, indent=2) + "\n"
        )
    print(table([r for r in results if r["steps"]], args), flush=True)
    return results


if __name__ == "__main__":
    main()
