"""Time and peak memory of one GRPO step on a Qwen2.5-shaped policy (7B default; 14B, 32B).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/grpo_step_gpu.py --out $OUT                  # 7B, BF16 vs NVFP4
    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/grpo_step_gpu.py --preset memory32b --out $OUT
    .venv/bin/python benchmarks/grpo_step_gpu.py --shape tiny --device cpu                       # a CPU smoke test

The step is :class:`quarl.rl.RLTrainer`'s own (``train()``), unchanged: rollout
(``quarl.engine.FastGenerator`` on CUDA) -> rewards -> group advantages -> the
old-policy log-prob pass (no grad; only when ``mu > 1``) -> ``mu`` policy updates
(micro-batches, gradient checkpointing, LoRA-only gradients, AdamW). The phase
times are the trainer's (``time/rollout_s``, ``time/logprob_s``, ``time/update_s``
in ``metrics.jsonl``); from outside, without changing what runs, the script adds

* a ``torch.cuda.synchronize()`` at the end of each phase, so queued work is not
  billed to the next one (the rollout and the update end in a host read already);
* per-phase memory (:class:`PhaseMemory`): the allocator's peak
  (``torch.cuda.max_memory_allocated``, reset at the phase's start), its reserved
  peak, and "device used" = total - free from ``torch.cuda.mem_get_info`` at the
  phase's end (CUDA context, cuBLAS workspaces and the caching allocator's pool
  included: what ``nvidia-smi`` would show). Phases: ``build`` (the random model),
  ``policy`` (``RLTrainer.__init__``: LoRA, optimizer, engine), ``rollout``,
  ``logprob``, ``update``. A phase that runs out of memory is recorded as such
  (its peak up to the failure), and the next format still runs.

Models. Qwen2.5 shapes (q/k/v bias, untied LM head, vocab 152064): 7B (hidden
3584, intermediate 18944, 28 layers, 28 heads, 4 KV heads), 14B (5120, 13824, 48,
40, 8) and 32B (5120, 27648, 64, 40, 8). Random weights are made on the device:
meta-device construction, ``to_empty``, ``normal_(0, 0.02)`` (norms 1) from a
generator seeded by a hash of each parameter's name -- so the weights do not
depend on the order in which they are made. Two constructions
(``--construction``; ``auto`` = stream for 4-bit formats, dense for bf16):

* **dense**: the whole BF16 model is materialized, then the trainer quantizes it
  (``policy.format``) and adds LoRA;
* **stream**: the model stays on the meta device and is materialized one decoder
  layer at a time, each layer quantized with the policy's recipe before the next
  exists -- the library's :func:`quarl.quant.stream.build_streamed`, which ``quarl
  rl`` runs on a real checkpoint with ``policy.load=stream`` (here its fill draws
  random weights); embeddings, final norm and ``lm_head`` stay BF16 as the trainer
  leaves them. ``build_policy`` sees a base quantized with its own recipe and
  only attaches LoRA. Peak while building =
  final model + one BF16 layer + quantization temporaries, instead of the whole
  BF16 model: 32B in BF16 is ~61 GiB, which on an 80 GB GPU would leave nothing
  for the step. Same weights, same packed tensors, same LoRA init as dense
  (tested on CPU, ``tests/benchmarks/test_grpo_step_bench.py``).

Policy: LoRA rank ``--lora-r`` (alpha = r) on q/k/v/o/gate/up/down, fp32
adapter weights; ``optim.optimizer=adamw8bit``, which the trainer replaces by
torch AdamW when bitsandbytes is absent (the ``optimizer`` column says which
ran; LoRA-only states are small either way).

Data and reward: prompts are token ids (a stand-in tokenizer maps prompt ``i``
to ``--prompt-len`` fixed random ids) and the reward is a seeded Bernoulli(0.5)
per answer -- a random model solves nothing, and the step's cost does not depend
on what the reward says, only on the group having spread (otherwise every
advantage is 0). A random model almost never emits the stop token (p ~ 1/V per
token), so every answer runs the full ``--new-tokens``: the worst-case step.

Default run (7B, ``bf16,nvfp4``): 8 prompts x G 8, prompt 256, 512 new tokens,
``mu = 2``, micro-batch 8, 2 steps; step 0 includes CUDA-graph capture and
Triton compilation, step 1 is the steady-state step reported.

``--preset memory32b`` (issue 7, QeRL's headline: RL of a 32B model on one
80 GB GPU): 32B shape, NVFP4 (streamed construction), 1 prompt x G 8 = 8
answers, prompt 256 tokens, 2048 new tokens (every answer is 2048 tokens),
LoRA r32, gradient checkpointing, ``mu = 1`` and one step. With ``mu = 1`` the
trainer takes the old log-probs as the current policy's detached ones (the
ratio is 1) and skips the separate log-prob pass -- the ``logprob`` phase does
not run; the single update's first forward doubles as the trainer-side
log-probs for the rollout/trainer mismatch metric. Micro-batch 8: the whole
group in one forward/backward of 8 x 2304 tokens, ~58 GiB by the estimate
below, which leaves ~21 GiB of an 80 GB card for what the estimate misses (it
was within 0.5 GiB of the measured update peaks of the 7B run); ``--micro-batch
4`` (two passes, ~41 GiB) is the fallback should it not fit. Time is not the
point of this preset: its only step includes Triton compilation and graph
capture.

Estimate (:func:`estimate_memory`, printed with every result; GiB = 2^30 B).
32B NVFP4: 4-bit linears 16.3 + BF16 embeddings and ``lm_head`` 2.9 = 19.3 GiB;
LoRA r32 = 268 M fp32 parameters, 4.0 GiB with their gradients and AdamW
states; rollout KV cache (8 rows x 2304 slots) 4.5 GiB -> rollout ~25 GiB;
update: + checkpointed layer inputs (64 x m x 2304 x 5120 BF16, 1.4 GiB per row)
+ the LM-head chunk's working set (~5 fp32 ``[m, 1024, V]`` tensors: logits,
exp/softmax, gradients; 2.9 GiB per row) -> ~41 GiB at m = 4, ~58 GiB at m = 8.
32B BF16: weights alone are 61.0 GiB; with LoRA states 65.0 GiB; the rollout
adds 4.5 GiB and the update ~17 GiB at m = 4: it does not fit on 79.2 GiB
(at m = 1 the estimate is ~70 GiB -- on the edge, fragmentation decides).
``--formats bf16`` at 32B attempts it anyway and records the OOM as a result.

Time of the preset on an H100 (estimate). Decode: the engine's NVFP4+LoRA step
at 14B batch 8 was 22.7 ms on an H200 (RESULTS.md, "Rollout engine"); per step
it reads ~10 GB (4-bit linears 7.4, BF16 ``lm_head`` 1.6, LoRA cast to BF16),
32B reads ~21 GB plus on average ~2.7 GB of KV cache, so ~2.3x -> ~52 ms on an
H200; the 7B RL step ran its rollout ~1.25x slower on an H100 than the H200
engine table -> ~65 ms x 2048 steps = ~2.2 min. Update: the 7B NVFP4 update
did 49 k tokens per optimizer step in 7.7 s on an H100; 32B has 4.8x the
linear weights and the step has 18.4 k tokens -> ~15 s. Construction ~10-20 s,
Python and CUDA start ~20 s, Triton compile and 8 graph captures ~30 s: about
3.5 min in all, 5 min if the decode is 2x slower than estimated.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from quarl.quant.synthetic import build_random, init_params, param_seed  # noqa: F401  (seeded construction)

SHAPES = {
    "32b": {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
            "num_key_value_heads": 8, "vocab_size": 152064},
    "14b": {"hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8, "vocab_size": 152064},
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096},
}  # fmt: skip
DEFAULTS = {
    "shape": "7b", "formats": "bf16,nvfp4", "prompts": 8, "group": 8, "prompt_len": 256, "new_tokens": 512, "mu": 2,
    "micro_batch": 8, "lora_r": 32, "steps": 2, "logprob_chunk": 1024, "construction": "auto",
}  # fmt: skip
PRESETS = {  # one flag per configuration that an issue asks for; explicit flags still override
    "memory32b": {"shape": "32b", "formats": "nvfp4", "prompts": 1, "group": 8, "prompt_len": 256,
                  "new_tokens": 2048, "mu": 1, "micro_batch": 8, "lora_r": 32, "steps": 1},
}  # fmt: skip
EOS = 3  # a token id in every shape's vocabulary; a random model samples it with probability ~1/V
GiB = 2**30


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


# --------------------------------------------------------------------------- construction
@torch.no_grad()
def build_model(cfg, device: str, dtype=torch.bfloat16, seed: int = 0, quant_format: str | None = None):
    """Random Qwen2 model on ``device``, never on the host, built by the library's streamed
    construction (:func:`quarl.quant.stream.build_streamed`, what ``quarl rl`` runs with
    ``policy.load=stream``) with a fill that draws seeded random weights instead of reading a
    checkpoint: embeddings, final norm and ``lm_head`` first, then one decoder layer at a time.

    ``quant_format=None``: dense -- every layer stays in ``dtype`` (the trainer quantizes later).
    ``quant_format="nvfp4"`` (any quarl.quant spec): each layer is quantized with
    ``{"default": quant_format}`` as soon as it is filled, so at most one layer exists in
    ``dtype`` at a time; the model carries ``quarl_recipe`` as ``quantize_model`` leaves it, and
    the trainer's ``build_policy`` only adds LoRA.
    """
    model, _ = build_random(cfg, None if quant_format is None else {"default": quant_format}, seed=seed,
                            device=device, dtype=dtype)
    model.generation_config.eos_token_id = EOS
    return model


# --------------------------------------------------------------------------- arithmetic
def estimate_memory(cfg, fmt: str, **kw) -> dict[str, float]:
    """:func:`estimate_bytes` in GiB, rounded to 0.01."""
    return {k: round(v / GiB, 2) for k, v in estimate_bytes(cfg, fmt, **kw).items()}


def estimate_bytes(
    cfg,
    fmt: str,
    *,
    rows: int,
    prompt_len: int,
    new_tokens: int,
    micro_batch: int,
    lora_r: int,
    logprob_chunk: int = 1024,
    optimizer: str = "adamw",
    kv_block: int = 256,
) -> dict[str, int]:
    """The step's memory by arithmetic, bytes: what the measurement should come close to.

    Exact: weights (4-bit sizes from quarl's own packing of one row), LoRA parameters with
    gradients and optimizer states, the engine's KV cache (rows padded to a power of two,
    slots to ``kv_block``). Rules of thumb for the update's working set, at micro-batch m
    over L = prompt + completion tokens: the checkpointed input of every layer (m*L*hidden
    BF16), plus the larger of the LM-head chunk's ~5 fp32 [m, chunk, V] tensors (logits,
    exp/softmax, their gradients; calibrated on the 7B run) and one layer's recomputed MLP
    (~6 [m, L, intermediate] BF16 tensors)."""
    from quarl.quant import get_format, make_config

    H, I, NL, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = H // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * hd
    linears = [(H, H), (kv, H), (kv, H), (H, H), (I, H), (I, H), (H, I)]  # (N, K) of q k v o gate up down
    qcfg = make_config(fmt)

    def lin_bytes(n: int, k: int) -> float:
        if qcfg is None:
            return 2.0 * n * k
        nb = [get_format(qcfg.name).quantize(torch.zeros(r, k), qcfg).nbytes for r in (16, 32)]
        per_row = (nb[1] - nb[0]) / 16  # packed codes + block scales of one output row
        return per_row * n + (nb[0] - 16 * per_row)  # + per-tensor state (a global scale)

    layer_w = sum(lin_bytes(n, k) for n, k in linears) + 2 * (H + 2 * kv) + 2 * 2 * H  # + biases, 2 norms (BF16)
    weights = NL * layer_w + 2 * V * H * 2 + 2 * H  # + embeddings, lm_head, final norm (BF16)
    lora = NL * sum(lora_r * (n + k) for n, k in linears)
    state = 2 if optimizer == "adamw8bit" else 8  # two Adam moments per parameter
    B = 1 << max(0, rows - 1).bit_length()
    S = -(-(prompt_len + new_tokens) // kv_block) * kv_block
    kv_cache = NL * 2 * B * S * kv * 2
    m, L = min(micro_batch, rows), prompt_len + new_tokens
    c = new_tokens if logprob_chunk <= 0 else min(new_tokens, logprob_chunk)
    ckpt = NL * m * L * H * 2
    work = max(5 * m * c * V * 4, 6 * m * L * I * 2)
    est = {
        "weights": weights, "lora_params": 4 * lora, "lora_with_grads_and_states": (8 + state) * lora,
        "kv_cache": kv_cache, "update_checkpoints": ckpt, "update_working_set": work,
        "rollout_step0": weights + 4 * lora + kv_cache,
        "update": weights + (8 + state) * lora + ckpt + work,
    }  # fmt: skip
    return {k: int(v) for k, v in est.items()}


# --------------------------------------------------------------------------- data, reward
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


# --------------------------------------------------------------------------- memory probe
class PhaseMemory:
    """Per-phase CUDA memory records (see the module docstring); on CPU only the phase and its status."""

    def __init__(self, dev: torch.device):
        self.dev, self.records, self.current, self.step = dev, [], None, None

    @contextlib.contextmanager
    def phase(self, name: str):
        cuda = self.dev.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.dev)
            torch.cuda.reset_peak_memory_stats(self.dev)
        self.current, status = name, "failed"
        try:
            yield
            status = "ok"
        except torch.OutOfMemoryError:
            status = "oom"
            raise
        finally:
            rec = {"phase": name, "step": self.step, "status": status}
            if cuda:
                if status == "ok":
                    torch.cuda.synchronize(self.dev)
                free, total = torch.cuda.mem_get_info(self.dev)
                rec.update(
                    peak_allocated_gib=round(torch.cuda.max_memory_allocated(self.dev) / GiB, 2),
                    peak_reserved_gib=round(torch.cuda.max_memory_reserved(self.dev) / GiB, 2),
                    allocated_end_gib=round(torch.cuda.memory_allocated(self.dev) / GiB, 2),
                    device_used_gib=round((total - free) / GiB, 2),
                    device_total_gib=round(total / GiB, 2),
                )
            self.records.append(rec)
            self.current = None

    def instrument(self, trainer) -> None:
        """Wrap the trainer's three phase methods (``_draw(step)`` starts every step)."""

        def wrap(name: str, fn):
            def inner(*a, **k):
                if name == "rollout":
                    self.step = a[0] if a else k.get("step")
                with self.phase(name):
                    return fn(*a, **k)

            return inner

        trainer._draw = wrap("rollout", trainer._draw)
        trainer._no_grad_logprobs = wrap("logprob", trainer._no_grad_logprobs)
        trainer._updates = wrap("update", trainer._updates)

    def peaks(self, step: int) -> dict[str, float]:
        """Peak allocated GiB per phase of one step (a phase run twice, e.g. dynamic sampling: the max)."""
        out: dict[str, float] = {}
        for r in self.records:
            if r["step"] == step and "peak_allocated_gib" in r:
                out[r["phase"]] = max(out.get(r["phase"], 0.0), r["peak_allocated_gib"])
        return out

    def summary(self) -> dict:
        cuda = [r for r in self.records if "peak_allocated_gib" in r]
        return {
            "max_allocated_gib": max((r["peak_allocated_gib"] for r in cuda), default=None),
            "max_reserved_gib": max((r["peak_reserved_gib"] for r in cuda), default=None),
            "max_device_used_gib": max((r["device_used_gib"] for r in cuda), default=None),
            "device_total_gib": cuda[0]["device_total_gib"] if cuda else None,
        }


# --------------------------------------------------------------------------- one format
def compute_path(model: torch.nn.Module, dtype: torch.dtype) -> str | None:
    """Name of the kernel ``quarl.quant.dispatch`` picks for the first quantized linear at this
    dtype ("reference" = dequantize + F.linear); None when the model has no quantized layer."""
    from quarl.quant import QuantLinear, dispatch

    layer = next((m for m in model.modules() if isinstance(m, QuantLinear) and m.config is not None), None)
    if layer is None:
        return None
    dev = next(layer.buffers()).device
    kernel = dispatch.select(torch.zeros(1, layer.in_features, device=dev, dtype=dtype), layer)
    return kernel.name if kernel is not None else "reference"


def resolve_construction(fmt: str, construction: str) -> str:
    from quarl.quant import make_config

    if construction == "auto":
        return "dense" if make_config(fmt) is None else "stream"
    return construction


def run_format(fmt: str, args, work: Path) -> dict:
    """One format's run; never raises for a failed phase -- the result says where and why it failed."""
    from quarl.config import load_config
    from quarl.rl import RLConfig, RLTrainer
    from quarl.train.metrics import read_metrics

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    construction = resolve_construction(fmt, args.construction)
    probe = PhaseMemory(dev)
    res: dict = {"format": fmt, "construction": construction, "steps": []}
    model = trainer = None
    try:
        cfg_model = qwen25_config(args.shape)
        # the optimizer the trainer will pick (adamw8bit needs CUDA and bitsandbytes); recorded as run below
        optimizer = "adamw8bit" if dev.type == "cuda" and importlib.util.find_spec("bitsandbytes") else "adamw"
        res["estimate_gib"] = estimate_memory(
            cfg_model,
            fmt,
            rows=args.prompts * args.group,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            micro_batch=args.micro_batch,
            lora_r=args.lora_r,
            logprob_chunk=args.logprob_chunk,
            optimizer=optimizer,
        )
        t0 = time.perf_counter()
        with probe.phase("build"):
            model = build_model(cfg_model, str(dev), dtype, quant_format=None if construction == "dense" else fmt)
        res["build_model_s"] = round(time.perf_counter() - t0, 2)
        if dev.type == "cuda":
            res["model_gib"] = round(torch.cuda.memory_allocated(dev) / GiB, 2)
        overrides = [
            f"policy.format={fmt}", f"policy.lora_r={args.lora_r}", f"policy.lora_alpha={args.lora_r}",
            f"policy.dtype={'bfloat16' if dev.type == 'cuda' else 'float32'}", "policy.gradient_checkpointing=true",
            f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.new_tokens}",
            f"rollout.max_prompt_tokens={args.prompt_len}", "rollout.temperature=1.0",
            f"algo.updates_per_rollout={args.mu}", "algo.algo=grpo", "aqn.enabled=true", "aqn.num_stages=3",
            f"optim.micro_batch_size={args.micro_batch}", f"optim.logprob_chunk={args.logprob_chunk}",
            "optim.optimizer=adamw8bit", "optim.warmup_ratio=0",
            f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts}", f"train.device={args.device}",
            "train.checkpoint_every=0", "train.sample_every=0", "train.resume=false",
            *args.set,
        ]  # fmt: skip
        cfg = load_config(RLConfig, None, overrides)
        tok = IdTokenizer(cfg_model.vocab_size, args.prompt_len)
        prompts = [f"p{i}" for i in range(args.prompts * args.steps)]
        out = work / fmt
        t1 = time.perf_counter()
        with probe.phase("policy"):
            trainer = RLTrainer(cfg, model, tok, prompts, ["0"] * len(prompts), out, reward_fn=BernoulliReward(0))
        res["build_policy_s"] = round(time.perf_counter() - t1, 2)
        if dev.type == "cuda":
            res["policy_gib"] = round(torch.cuda.memory_allocated(dev) / GiB, 2)
        res.update(
            trainable_params=sum(p.numel() for p in trainer.params),
            optimizer=trainer.optimizer_name,
            engine=type(trainer.generator).__name__,
            policy_report=trainer.policy_report,
            kernel=compute_path(trainer.model, dtype),
        )
        probe.instrument(trainer)
        trainer._save = lambda step_done: None  # no checkpoint in a benchmark (LoRA save is not part of a step)
        trainer.train()
        res["engine_stats"] = getattr(trainer.generator, "last_stats", None)  # graph captures, graph_error, ...
        for r in read_metrics(out / "metrics.jsonl"):
            res["steps"].append({
                "step": r["step"], "rollout_s": r["time/rollout_s"], "logprob_s": r["time/logprob_s"],
                "update_s": r["time/update_s"], "step_s": r["time/step_s"],
                "rollout_tokens_per_s": r["rollout/tokens_per_s"], "response_len_mean": r["response/length_mean"],
                "peak_gib": probe.peaks(r["step"]), "loss": r.get("loss"), "grad_norm": r.get("grad_norm"),
                "mismatch_abs_logprob_diff": r.get("mismatch/abs_logprob_diff"),
                "dequant_cache_held_gib": r.get("dequant_cache/held_gb"),
            })  # fmt: skip
    except Exception as e:  # noqa: BLE001 -- a failed format must not lose its numbers or the next format's
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        res["oom"] = isinstance(e, torch.OutOfMemoryError)
        res["failed_phase"] = next((r["phase"] for r in reversed(probe.records) if r["status"] != "ok"), None)
    res["memory"] = probe.records
    res.update(probe.summary())
    del trainer, model
    return res


# --------------------------------------------------------------------------- report
def table(results: list[dict], args) -> str:
    """Two markdown tables: time and phase peaks per step; memory and status per format."""

    def f(x, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    head = (
        f"GRPO step, Qwen2.5-{args.shape} shape, {args.prompts} prompt(s) x G={args.group}, prompt "
        f"{args.prompt_len} tokens, {args.new_tokens} new tokens, mu={args.mu}, micro-batch {args.micro_batch}, "
        f"LoRA r{args.lora_r}, grad ckpt on. GiB = 2^30 B; step 0 includes Triton compilation and CUDA-graph "
        f"capture" + (" (the only step here: time is not the point of this run)" if args.steps == 1 else "")
        + (f"; overrides: {' '.join(args.set)}" if args.set else "")
    )
    lines = [head, "",
             ("| format | step | rollout s | log-prob s | update s | step s | peak alloc GiB rollout / log-prob / update "
              "| base held GiB |"),
             "|---|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for r in results:
        for s in r["steps"]:
            pk = s["peak_gib"]
            lines.append(
                f"| {r['format']} | {s['step']} | {s['rollout_s']:.2f} | {s['logprob_s']:.2f} | "
                f"{s['update_s']:.2f} | {s['step_s']:.2f} | {f(pk.get('rollout'))} / "
                f"{f(pk.get('logprob'))} / {f(pk.get('update'))} | {f(s.get('dequant_cache_held_gib'))} |"
            )
    lines += ["",
              ("| format | construction | build peak GiB | model GiB | policy GiB | max alloc GiB | max reserved GiB | "
               "device used GiB (of) | estimate rollout / update GiB | optimizer | kernel | status |"),
              "|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        build = next((m.get("peak_allocated_gib") for m in r["memory"] if m["phase"] == "build"), None)
        est = r.get("estimate_gib") or {}
        if "error" not in r:
            status = "ok"
        elif r.get("oom"):
            status = f"OOM in {r['failed_phase']}"
        else:
            status = f"failed in {r['failed_phase']}: {r['error'][:80]}"
        lines.append(
            f"| {r['format']} | {r['construction']} | {f(build)} | {f(r.get('model_gib'))} | "
            f"{f(r.get('policy_gib'))} | {f(r.get('max_allocated_gib'))} | {f(r.get('max_reserved_gib'))} | "
            f"{f(r.get('max_device_used_gib'))} ({f(r.get('device_total_gib'))}) | "
            f"{f(est.get('rollout_step0'))} / {f(est.get('update'))} | {r.get('optimizer', '-')} | "
            f"{r.get('kernel') or '-'} | {status} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI
def parse_args(argv=None) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=sorted(PRESETS), default=None)
    known, _ = pre.parse_known_args(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], parents=[pre])
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--formats", help="comma-separated policy.format values, run one after the other")
    ap.add_argument(
        "--construction",
        choices=("auto", "stream", "dense"),
        help="auto: stream (layer by layer, quantized as built) for 4-bit formats, dense for bf16",
    )
    ap.add_argument("--prompts", type=int, help="prompts per step")
    ap.add_argument("--group", type=int, help="answers per prompt (G)")
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--new-tokens", type=int, help="every answer is this long (a random model never stops)")
    ap.add_argument("--mu", type=int, help="policy updates per rollout (>1 adds the log-prob pass)")
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--logprob-chunk", type=int, help="optim.logprob_chunk: completion positions per LM-head chunk")
    ap.add_argument("--lora-r", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="runs/bench/grpo_step_gpu", help="grpo_step_gpu.json and .md go here")
    ap.add_argument("--work", default=None, help="trainer work dirs (metrics.jsonl, TensorBoard); default OUT/work")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an RL config override applied after the benchmark's own (e.g. rollout.free_cache=false)")
    ap.set_defaults(**{**DEFAULTS, **PRESETS.get(known.preset, {})})
    return ap.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
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
        res = run_format(fmt, args, Path(args.work) if args.work else out / "work")
        gc.collect()  # the failed format's frames (and its model) are gone only now
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
        (out / "grpo_step_gpu.json").write_text(
            json.dumps({"env": env, "args": vars(args), "results": results}, indent=2) + "\n"
        )
    md = table(results, args)
    (out / "grpo_step_gpu.md").write_text(md + "\n")
    print(md, flush=True)
    return results


if __name__ == "__main__":
    main()
