"""The RL loop: one flat, readable step -- sample, score, advantage, log-probs, update, log, save.

    for step in range(start, total_steps):
        prompts   <- PromptSampler (resumable order)
        rollout   <- generator.generate(prompts x G)   inside aqn.perturb(step)   (noisy norms)
        rewards   <- quarl.rewards (accuracy + format, weighted) [+ DAPO overlong penalty]
                     DAPO: drop flat groups, draw again (dynamic sampling)
        adv       <- group-normalized rewards
        old, ref  <- no-grad forwards of the *clean* policy (only when needed)
        mu times:    loss = GRPO/DAPO surrogate over micro-batches; clip grads; AdamW step
        log       -> metrics.jsonl, TensorBoard, tqdm
        save      -> checkpoint every N steps (atomic; mirrored to S3)

Policy. ``policy.mode=lora``: the model's linears become QuantLinear with a frozen
base in ``policy.format`` (nvfp4 = QeRL, nf4 = QLoRA, bf16 = the 16-bit LoRA
baseline, mxfp4) and a LoRA branch on q/k/v/o/gate/up/down; only LoRA trains.
The LoRA weights are float32 whatever the compute dtype (PEFT's default; QuantLinear
casts them to the activation dtype in the forward), so small updates are not lost
to bf16 rounding. ``policy.mode=full``: no quantization, every parameter trains in
the model dtype (the paper's "Full"; bf16 on GPU, as the release trains it).

Rollout engine. ``rollout.engine=auto`` samples with :class:`quarl.engine.FastGenerator`
(static KV cache, CUDA graphs, over these same modules) on CUDA and with the
reference :class:`quarl.engine.rollout.HFGenerator` elsewhere; both return the same
``Rollout`` and read the live weights, so LoRA updates and AQN noise reach them.

Precision. ``precision.mode`` (:mod:`quarl.rl.precision`) picks the flow: the policy's own
(default), ``bf16``, ``fp8-rollout`` (rollouts inside an FP8 cast of the weights) or ``jetrl``
(FP8 GEMMs in training and rollout); with ``precision.rollout_is_threshold`` the policy-gradient
term is reweighted by the truncated / masked ratio pi_train / pi_rollout.

Optimizer. QeRL uses 8-bit AdamW (bitsandbytes). It is used when asked for, on
CUDA, with bitsandbytes importable; otherwise torch's AdamW (fp32 states) is used
and the summary records which one ran -- 8-bit states change memory, not the
algorithm. The learning rate is a pure function of the step (linear warmup, then
cosine or constant), constant within a step's ``mu`` updates, so resuming needs
only the step number.

Determinism. Sampling and noise draw from the run's own generators (seeded from
``train.seed``, saved in checkpoints), the data order from the PromptSampler, and
the LoRA init from the global seed set before the policy is built; so a run that
is stopped after a checkpoint and resumed takes exactly the steps the
uninterrupted run takes (tested).

Divergence. A NaN/Inf reward, loss or gradient norm stops the run with
:class:`RLDivergedError` *before* the optimizer step, so the weights in memory
and every checkpoint on disk are from good steps.

No waiting on the GPU inside an update. Python reading a GPU value (``float(loss)``, ``int(mask.sum())``, a
branch on ``.all()``) waits for every queued kernel, and the host then starts queueing the next kernels from an
idle GPU; a 7B LoRA micro-batch issues its kernels at about the speed the GPU runs them (benchmarks/RESULTS.md,
"Issue 17, session 18"). The micro-batch loop reads nothing: the padding trims of all micro-batches are read once
before it (:meth:`RLTrainer._trims`), the loss and the metrics' token sums accumulate on the device and are read
once per optimizer step (the loss's finiteness checked then, still before the step), and the log-prob forward
trusts the rollout's layout (:func:`quarl.rl.logprobs.completion_logprobs`, which also keeps transformers from
building a block mask when answers differ in length). Measured on the 7B GRPO step with answers of equal length:
the same update time as with the reads, within the run-to-run spread (+-3 %); what it buys there is a host that
may run ahead, not a faster step.

Several processes (``torchrun``; :mod:`quarl.train.distributed`, docs/distributed.md).
Every rank draws the step's prompts from the replicated sampler and rolls out its
contiguous share of them, whole groups of G answers, so group normalisation stays on
one rank. Token / sequence counts are summed over ranks before the loss divides by them
and gradients are summed, so the update is the one-process update of the same rollouts
up to the order of additions (tested). LoRA (``policy.mode=lora``): the frozen base is
replicated and the LoRA gradients are all-reduced once per optimizer step; each rank
samples with its own stream (``train.seed + 1 + 10007 * rank``; rank 0's is the
one-process stream) while the AQN noise is drawn identically everywhere. Full
parameters (``policy.mode=full``): FSDP2 shards the policy (and the KL reference); the
rollout runs the fast engine on an unsharded replica of the policy that is refreshed in
place before every rollout (:mod:`quarl.engine.replica`; the CUDA-graph engine captures
weight addresses, which FSDP frees), or, when the replica does not fit or
``rollout.engine=reference``, the reference engine on the gathered policy; checkpoints are
DCP shards. DAPO's
dynamic sampling selects the kept groups from every rank's draws in rank order, as one
process would. Metrics are computed over the whole batch; rank 0 writes them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from quarl.config import config_to_dict
from quarl.engine.replica import RolloutReplica, fits
from quarl.engine.rollout import Generator, Rollout, SamplingParams
from quarl.quant import (
    QuantLinear,
    dispatch,
    load_adapter,
    save_adapter,
)
from quarl.rewards import RewardFn
from quarl.rl.aqn import AQN
from quarl.rl.config import RLConfig
from quarl.rl.logprobs import completion_logprobs, mismatch
from quarl.rl.losses import group_advantages, overlong_penalty, policy_loss
from quarl.rl.precision import Precision
from quarl.rl.sampling import PromptSampler, ScoredBatch, dynamic_sample
from quarl.train.checkpoint import CheckpointManager
from quarl.train.dequant_cache import DequantCache
from quarl.train.distributed import Dist, current
from quarl.train.fsdp import clip_grad_norm, gathered, shard_model
from quarl.train.fused_glue import apply_compile_glue
from quarl.train.metrics import MetricsLogger, NullLogger
from quarl.train.optim import lr_at, make_optimizer
from quarl.train.policy import (
    build_policy,
    enable_gradient_checkpointing,
    lora_disabled,
    place_policy,
    resolve_device,
    resolve_dtype,
)

log = logging.getLogger(__name__)


class RLDivergedError(RuntimeError):
    """A non-finite reward, loss or gradient: the run stops before corrupting the weights."""


# --------------------------------------------------------------------------- setup helpers
def stop_token_ids(model: nn.Module, tokenizer) -> list[int]:
    """EOS ids from the tokenizer and the generation config (Qwen lists two: <|im_end|>, <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen) if isinstance(gen, (list, tuple)) else {gen}
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer has no EOS token, so rollouts could never stop; set tokenizer.eos_token")
    return sorted(ids)


def config_digest(cfg: RLConfig) -> str:
    return hashlib.sha256(json.dumps(config_to_dict(cfg), sort_keys=True).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- the trainer
class RLTrainer:
    """Owns the policy, optimizer, generators and the loop. ``cfg`` is resolved here."""

    def __init__(self, cfg: RLConfig, model: nn.Module, tokenizer, prompts: list[str], answers: list[str],
                 out_dir: str | Path, *, checkpoint_remote: str | None = None, reward_fn=None,
                 generator: Generator | None = None, init_adapter: str | Path | None = None,
                 dist: Dist | None = None):
        self.cfg = cfg = cfg.resolved()
        self.tok, self.out = tokenizer, Path(out_dir)
        self.dist = dist = dist or current()
        if dist.enabled and cfg.train.prompts_per_step < dist.world_size:
            raise ValueError(f"train.prompts_per_step={cfg.train.prompts_per_step} is smaller than the "
                             f"{dist.world_size} ranks: every rank rolls out whole prompt groups; raise it to at "
                             f"least the number of processes (a multiple of it balances the ranks)")
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = dist.device(resolve_device(cfg.train.device))
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        dtype = resolve_dtype(cfg.policy.dtype, self.device)

        # Policy: seeded so the LoRA init (and everything after) is reproducible.
        seed = cfg.train.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        # full parameters on several ranks: built on the CPU, then FSDP2 moves only each rank's shard to the device
        self.sharded = dist.enabled and cfg.policy.mode == "full"
        home = torch.device("cpu") if self.sharded else self.device
        self.model = place_policy(model, home, dtype)  # packed 4-bit tensors keep their dtypes
        self.policy_report = build_policy(self.model, cfg.policy)
        if init_adapter is not None:  # continue from an earlier stage's LoRA (e.g. a cold-start SFT)
            if cfg.policy.mode != "lora":
                raise ValueError("an initial adapter needs policy.mode=lora")
            load_adapter(self.model, init_adapter)
            self.policy_report["init_adapter"] = str(init_adapter)
        if cfg.policy.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        # before the reference copy, sharding and the rollout replica's copy: each gets the compiled glue
        glue = apply_compile_glue(self.model, cfg.policy.compile_glue, self.device, "policy.compile_glue",
                                  dist.enabled)
        if glue:
            self.policy_report["compile_glue"] = glue
        self.dequant_cache = DequantCache(self.model, cfg.optim.dequant_cache, self.device)
        cache_deq = str(cfg.rollout.cache_dequantized).lower()
        if cache_deq == "true" or (cache_deq == "auto" and self.device.type == "cpu"):
            for m in self.model.modules():
                if isinstance(m, QuantLinear) and m.mode == "frozen":
                    m.cache_dequantized = True  # the base never changes: dequantize once
        if not any(p.requires_grad for p in self.model.parameters()):
            raise ValueError("the policy has no trainable parameters")
        self.ref_model = None
        if cfg.algo.beta > 0 and cfg.policy.mode == "full":
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        # full parameters: FSDP2 shards policy and reference; LoRA on a frozen base: replicated
        self.replica: RolloutReplica | None = None
        host_copy = None
        if self.sharded and generator is None and cfg.rollout.engine != "reference" and \
                (cfg.rollout.engine == "fast" or self.device.type == "cuda"):
            host_copy = copy.deepcopy(self.model)  # the rollout replica's weights, taken before sharding
        if self.sharded:
            shard_model(self.model, dist, self.device)
            if self.ref_model is not None:
                shard_model(self.ref_model, dist, self.device)
        elif dist.enabled:
            dist.broadcast_params([p for p in self.model.parameters() if p.requires_grad])
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.optimizer_name = make_optimizer(self.params, cfg.optim, self.device)

        # Data: tokenize once; over-long prompts are skipped and counted, never truncated.
        self.prompt_ids, self.answers, self.skipped_prompts = [], [], 0
        for p, a in zip(prompts, answers):
            ids = tokenizer(p, add_special_tokens=False)["input_ids"]
            if 0 < len(ids) <= cfg.rollout.max_prompt_tokens:
                self.prompt_ids.append(ids)
                self.answers.append(a)
            else:
                self.skipped_prompts += 1
        if not self.prompt_ids:
            raise ValueError(f"every prompt is empty or longer than rollout.max_prompt_tokens="
                             f"{cfg.rollout.max_prompt_tokens}; raise the limit or check the dataset")
        t = cfg.train
        self.total_steps = t.steps or max(1, int(t.epochs * len(self.prompt_ids)) // t.prompts_per_step)
        self.sampler = PromptSampler(len(self.prompt_ids), seed)
        self.aqn = AQN(self.model, cfg.aqn, self.total_steps)
        self.rollout_gen = torch.Generator(self.device).manual_seed(seed + 1 + 10007 * dist.rank)  # token sampling
        self.noise_gen = torch.Generator().manual_seed(seed + 2)  # AQN noise (CPU: device-independent)
        self.generators = {"rollout": self.rollout_gen, "noise": self.noise_gen}
        from quarl.engine import make_generator  # lazy: only building a rollout engine needs it

        # rollout.free_cache (default): the fast engine frees its KV cache and graphs after each rollout, for the
        # update's memory; false keeps both, so the next rollout neither re-allocates nor re-captures
        engine, rollout_model = cfg.rollout.engine, self.model
        if host_copy is not None:  # FSDP: the fast engine on an unsharded replica (quarl.engine.replica)
            ok, why = fits(host_copy, self.device)
            ok = dist.all_reduce(float(ok), op="min") > 0  # one path on every rank: the syncs are collectives
            if ok or engine == "fast":
                self.replica = RolloutReplica(host_copy, self.device, copy_model=False)
                rollout_model = self.replica.model
                log.info("rl: rollout.engine=%s under FSDP -> the fast engine on a rollout replica (%s)", engine, why)
            del host_copy
        # the replica's norms take the step's AQN noise (same modules in the same order: the same draws)
        self.replica_aqn = AQN(self.replica.model, cfg.aqn, self.total_steps) if self.replica is not None else None
        if self.sharded and self.replica is None and engine != "reference":
            # graphs would capture weights FSDP frees between rollouts: the reference engine on the gathered policy
            log.info("rl: rollout.engine=%s -> reference under FSDP (no rollout replica)", engine)
            engine = "reference"
        self.generator = generator or make_generator(rollout_model, tokenizer.pad_token_id, engine=engine,
                                                     cache=cfg.rollout.cache,
                                                     batch_size=cfg.rollout.batch_size or None,
                                                     keep_cache=not cfg.rollout.free_cache,
                                                     max_num_batched_tokens=cfg.rollout.max_num_batched_tokens)
        self.sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens,
                                       stop_token_ids(self.model, tokenizer))
        self.reward_fn = reward_fn or RewardFn(cfg.reward)
        self.precision = Precision(cfg.precision)  # fp8-rollout: FP8-cast rollouts; IS correction
        self.ckpt = CheckpointManager(self.out / "checkpoints", checkpoint_remote, keep=t.keep_checkpoints)
        self.start_step = 0
        self.last_checkpoint: Path | None = None

    # ----------------------------------------------------------------------- pieces
    def _draw(self, step: int) -> ScoredBatch:
        """Sample prompts_per_step prompts x G answers under AQN and score them."""
        cfg, G = self.cfg, self.cfg.rollout.group_size
        idx = self.sampler.next(cfg.train.prompts_per_step)  # the global batch, the same on every rank
        idx = idx[self.dist.shard(len(idx))]  # this rank's whole groups
        prompts = [self.prompt_ids[i] for i in idx]
        if self.replica is not None:  # FSDP: refresh the replica layer by layer, then noise and sample on it alone
            self.replica.sync(self.model)
            with self.replica_aqn.perturb(step, self.noise_gen), self.precision.rollout(self.replica.model):
                r = self.generator.generate(prompts, self.sampling, G, self.rollout_gen)
        else:
            full = gathered(self.model) if self.sharded else contextlib.nullcontext()
            with full, self.aqn.perturb(step, self.noise_gen), self.precision.rollout(self.model):
                r = self.generator.generate(prompts, self.sampling, G, self.rollout_gen)
        rows = [i for i in idx for _ in range(G)]
        texts = [self.tok.decode(r.completion_ids[j, :int(n)].tolist(), skip_special_tokens=True)
                 for j, n in enumerate(r.lengths.tolist())]
        comps = self.reward_fn.components(texts, [self.answers[i] for i in rows])
        rewards = torch.tensor(comps["reward"], dtype=torch.float32)
        if cfg.algo.overlong == "penalty":
            rewards = rewards + overlong_penalty(r.lengths.cpu(), cfg.rollout.max_new_tokens,
                                                 cfg.algo.overlong_buffer)
        if not torch.isfinite(rewards).all():
            bad = int((~torch.isfinite(rewards)).sum())
            raise RLDivergedError(f"step {step}: the reward function returned {bad} NaN/Inf rewards; fix the reward "
                                  f"(reward.* settings, answers in the dataset). {self._last_good()}")
        return ScoredBatch(r, rewards, torch.tensor(comps["accuracy"], dtype=torch.float32),
                           torch.tensor(comps["format"], dtype=torch.float32), rows, texts)

    def _forward(self, model: nn.Module, r: Rollout, rows: slice, with_entropy: bool,
                 trim: tuple[int, int] | None = None):
        """Log-probs of rows[...] with padding trimmed -> ([m, T], [m, T] | None), T = rollout width. ``trim``: the
        (first prompt column, completion width) :meth:`_trims` read for these rows; None reads them here."""
        first, T = trim if trim is not None else self._trims(r, [rows])[0]
        pm = r.prompt_mask[rows]
        T_full = r.completion_ids.shape[1]
        ids = torch.cat([r.prompt_ids[rows, first:], r.completion_ids[rows, :T]], dim=1)
        mask = torch.cat([pm[:, first:], r.completion_mask[rows, :T]], dim=1)
        # a rollout's rows are left-padded prompts followed by right-padded completions: no layout check (a GPU read)
        logp, ent = completion_logprobs(model, ids, mask, T, self.cfg.rollout.temperature, with_entropy,
                                        chunk=self.cfg.optim.logprob_chunk, trailing_only=True)
        pad = (0, T_full - T)
        return torch.nn.functional.pad(logp, pad), (torch.nn.functional.pad(ent, pad) if ent is not None else None)

    @staticmethod
    def _trims(r: Rollout, mbs: list[slice | None]) -> list[tuple[int, int] | None]:
        """Per micro-batch, the padding :meth:`_forward` drops: (the first prompt column any of its rows uses, its
        longest completion, at least 1). Read from the device once for all micro-batches: a read waits for the GPU,
        and one per micro-batch kept the host from queueing a micro-batch while the previous one ran."""
        pm = r.prompt_mask.bool()  # [N, P]
        first = torch.where(pm.any(1), pm.float().argmax(1), pm.shape[1])  # [N]: first prompt column, P if none
        firsts, widths = torch.stack([first.long(), r.completion_mask.long().sum(1)]).tolist()
        return [None if rows is None else (min(firsts[rows]), max(max(widths[rows]), 1)) for rows in mbs]

    def _micro_batches(self, n: int) -> list[slice | None]:
        """Row slices of this rank's rollout; a sharded policy pads with ``None`` (a zero-weight stand-in
        forward) to the largest count of any rank, since every FSDP forward is a collective."""
        mb = self.cfg.optim.micro_batch_size
        parts: list[slice | None] = [slice(i, min(i + mb, n)) for i in range(0, n, mb)]
        if self.sharded:
            parts += [None] * (int(self.dist.all_reduce(len(parts), "max")) - len(parts))
        return parts

    @torch.no_grad()
    def _no_grad_logprobs(self, model: nn.Module, r: Rollout, with_entropy: bool):
        model.eval()
        T = r.completion_ids.shape[1]
        lps, ents = [torch.zeros(0, T, device=self.device)], [torch.zeros(0, T, device=self.device)]
        mbs = self._micro_batches(len(r))
        for rows, trim in zip(mbs, self._trims(r, mbs), strict=True):
            if rows is None:
                self._forward(model, self._pad_rollout, slice(0, 1), False)
                continue
            lp, ent = self._forward(model, r, rows, with_entropy, trim)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps), (torch.cat(ents) if with_entropy else None)

    def _last_good(self) -> str:
        if self.last_checkpoint is None:
            return "No checkpoint was written yet."
        return f"The last good checkpoint is {self.last_checkpoint} (resume continues from it)."

    def _save(self, step_done: int) -> None:
        state = {"sampler": self.sampler.state_dict(), "total_steps": self.total_steps,
                 "aqn": {"sigma": self.aqn.sigma(step_done - 1), "stage": self.aqn.stage(step_done - 1),
                         "num_stages": self.cfg.aqn.num_stages},
                 "lr": lr_at(step_done - 1, self.total_steps, self.cfg.optim), "optimizer": self.optimizer_name,
                 "config_digest": config_digest(self.cfg)}
        lora = self.cfg.policy.mode == "lora"

        def extras(d: Path) -> None:
            if lora:
                save_adapter(self.model, d / "adapter")
            for name in ("metrics.jsonl", "samples.jsonl"):  # the history travels with the weights
                if (self.out / name).exists():
                    shutil.copy2(self.out / name, d / name)

        self.last_checkpoint = self.ckpt.save(step_done, self.model, self.optimizer, state, self.generators, extras,
                                              dist=self.dist, sharded=self.sharded)

    def maybe_resume(self) -> int:
        """Load the newest checkpoint if ``train.resume``; returns the step to start at."""
        if not self.cfg.train.resume:
            return 0
        ckpt = self.ckpt.latest(dist=self.dist)
        if ckpt is None:
            return 0
        state = CheckpointManager.load(ckpt, self.model, self.optimizer, self.generators, dist=self.dist)
        if not state["rng_restored"]:  # more ranks than the checkpoint was written by: a fresh stream of its own
            log.warning("rank %d: %s has no sampling state for this rank; it continues with a fresh stream",
                        self.dist.rank, ckpt)
            self.rollout_gen.manual_seed(self.cfg.train.seed + 1 + 10007 * self.dist.rank + 7919 * state["step"])
        if state["total_steps"] != self.total_steps:
            raise ValueError(f"checkpoint {ckpt} belongs to a run of {state['total_steps']} steps, this one has "
                             f"{self.total_steps}: the LR and AQN schedules would differ; keep train.steps the same "
                             f"or use a fresh output")
        if state.get("config_digest") != config_digest(self.cfg):
            log.warning("resuming from %s with a different config than it was written with", ckpt)
        self.sampler.load_state_dict(state["sampler"])
        for name in ("metrics.jsonl", "samples.jsonl"):  # the history up to the checkpoint, exactly
            if (ckpt / name).exists() and self.dist.is_main:
                shutil.copy2(ckpt / name, self.out / name)
        self.last_checkpoint = ckpt
        self.start_step = state["step"]
        log.info("resumed from %s at step %d", ckpt, self.start_step)
        return self.start_step

    # ----------------------------------------------------------------------- the loop
    def train(self, stop_after: int | None = None) -> dict:
        """Run to ``total_steps`` (or until ``stop_after`` steps are done, for tests). Returns the summary."""
        from tqdm.auto import tqdm

        cfg, a, G = self.cfg, self.cfg.algo, self.cfg.rollout.group_size
        start = self.maybe_resume()
        end = self.total_steps if stop_after is None else min(self.total_steps, stop_after)
        main, d = self.dist.is_main, self.dist  # rank 0 alone logs, samples and shows progress
        logger = MetricsLogger(self.out, resume_step=start) if main else NullLogger()
        samples_path = self.out / "samples.jsonl"
        if samples_path.exists() and main:  # keep one consistent history, as metrics.jsonl does
            keep = [ln for ln in samples_path.read_text().splitlines() if ln and json.loads(ln)["step"] < start]
            samples_path.write_text("".join(ln + "\n" for ln in keep))
        bar = tqdm(total=self.total_steps, initial=start, desc="rl", unit="step", disable=None if main else True)
        t_start, timed_out = time.monotonic(), False
        try:
            for step in range(start, end):
                t0 = time.perf_counter()
                if self.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(self.device)
                self.dequant_cache.new_step()
                lr = lr_at(step, self.total_steps, cfg.optim)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr

                # 1) rollout (+ rewards; DAPO: refill flat groups)
                engine_before = dict(getattr(self.generator, "totals", {}))
                if a.dynamic_sampling:
                    batch, drawn, sstats = dynamic_sample(lambda step=step: self._draw(step), G,
                                                          cfg.train.prompts_per_step, a.max_sampling_rounds, dist=d)
                else:
                    batch = drawn = self._draw(step)
                    sstats = {}
                t_roll = time.perf_counter() - t0

                m = {"lr": lr, "aqn/sigma": self.aqn.sigma(step), "aqn/stage": self.aqn.stage(step), **sstats}
                m.update(self._rollout_metrics(drawn))
                m["time/rollout_s"] = t_roll
                m["rollout/tokens_per_s"] = d.all_reduce(float(drawn.rollout.lengths.sum())) / max(t_roll, 1e-9)
                # the fast engine's own counters for this step (this rank's): decode steps, compactions, prefilled
                # rows, graph captures and their seconds
                m.update({f"engine/{k}": v - engine_before.get(k, 0)
                          for k, v in getattr(self.generator, "totals", {}).items()})

                t1 = time.perf_counter()
                t_lp = t_upd = 0.0
                self._pad_rollout = drawn.rollout.select([0])  # input of a sharded rank's stand-in forwards
                if batch is None and not (d.enabled and sstats.get("sampling/groups_kept", 0) > 0):
                    m["update/skipped"] = 1.0  # no informative group at all this step (on any rank)
                else:
                    if batch is None:  # DAPO kept groups on other ranks only: this rank adds no rows
                        batch = drawn.select_groups(torch.zeros(len(drawn) // G, dtype=torch.bool), G)
                    r = batch.rollout
                    adv = group_advantages(batch.rewards, G, a.adv_eps, a.scale_advantages).to(self.device)  # [N]
                    loss_mask = r.completion_mask.float()  # [N, T]
                    if a.overlong == "filter":
                        loss_mask = loss_mask * (~r.truncated).float().unsqueeze(1)
                    # the loss divides by counts over the whole batch (every rank's rows)
                    n_tok = d.all_reduce(float(loss_mask.sum()))
                    n_seq = d.all_reduce(float((loss_mask.sum(1) > 0).sum()))

                    # the frozen base decoded once for both phases when memory allows (optim.dequant_cache); the
                    # working set it leaves room for scales with the largest micro-batch's tokens
                    mb_tokens = min(cfg.optim.micro_batch_size, len(r)) * r.attention_mask.shape[1]
                    with self.dequant_cache.phase(mb_tokens):
                        # 2) log-probs that do not change during the updates (clean policy, no grad)
                        need_old = a.updates_per_rollout > 1 and a.old_logprobs == "trainer"
                        old_lp = ent = train_lp = None
                        if need_old:
                            old_lp, ent = self._no_grad_logprobs(self.model, r, with_entropy=True)
                            train_lp = old_lp
                        elif a.old_logprobs == "rollout":
                            old_lp = r.logprobs
                        ref_lp = None
                        if a.beta > 0:
                            if self.ref_model is not None:
                                ref_lp, _ = self._no_grad_logprobs(self.ref_model, r, with_entropy=False)
                            else:
                                with lora_disabled(self.model):
                                    ref_lp, _ = self._no_grad_logprobs(self.model, r, with_entropy=False)
                        t_lp = time.perf_counter() - t1

                        # 3) mu policy updates on this batch
                        t2 = time.perf_counter()
                        if n_tok == 0:
                            m["update/skipped"] = 1.0  # e.g. every answer truncated and overlong filtering on
                        else:
                            m.update(self._updates(step, r, adv, loss_mask, n_tok, n_seq, old_lp, ref_lp, train_lp,
                                                   ent))
                            m["update/skipped"] = 0.0
                            dispatch.release_transients()  # the last layer's BF16 weights kept for its backward
                    t_upd = time.perf_counter() - t2
                    m.update(self.dequant_cache.last)
                    m["train/answers"] = int(d.all_reduce(len(r)))
                    m["train/loss_tokens"] = n_tok

                dt = time.perf_counter() - t0
                tokens = d.all_reduce(float(drawn.rollout.attention_mask.sum()))
                m.update({"time/logprob_s": t_lp, "time/update_s": t_upd, "time/step_s": dt,
                          "throughput/tokens_per_s": tokens / max(dt, 1e-9),
                          "memory/peak_gb": d.all_reduce(self.dequant_cache.step_peak_gb(), "max"),
                          "data/epoch": self.sampler.epochs_done})
                logger.log(step, m)
                if main and cfg.train.sample_every and step % cfg.train.sample_every == 0:
                    self._write_samples(samples_path, step, drawn)
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward/mean']:.3f}", acc=f"{m['reward/accuracy']:.3f}",
                                tok_s=f"{m['rollout/tokens_per_s']:.0f}", sigma=f"{m['aqn/sigma']:.1e}")
                done = step + 1
                # wall-clock budget: end at this step boundary (the LR / AQN schedules keep total_steps)
                timed_out = bool(cfg.train.max_time_s) and time.monotonic() - t_start > cfg.train.max_time_s
                if cfg.train.max_time_s and d.enabled:  # one decision for every rank (rank clocks differ)
                    timed_out = bool(d.all_reduce(float(timed_out), "max"))
                if done == self.total_steps or (cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0):
                    self._save(done)
                elif timed_out or (stop_after is not None and done == end):
                    self._save(done)  # an interrupted run leaves a checkpoint to resume from
                if timed_out and done < end:
                    log.warning("train.max_time_s=%s reached after step %d of %d; stopping here",
                                cfg.train.max_time_s, done, self.total_steps)
                    end = done
                    break
        finally:
            bar.close()
            logger.close()
        return {"total_steps": self.total_steps, "start_step": start, "end_step": end, "timed_out": timed_out,
                "optimizer": self.optimizer_name, "policy": self.policy_report,
                "skipped_prompts": self.skipped_prompts, "train_prompts": len(self.prompt_ids),
                "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
                "world_size": self.dist.world_size, "sharded": self.sharded,
                "rollout_engine": type(self.generator).__name__ + (" on a rollout replica" if self.replica else "")}

    def _updates(self, step, r, adv, loss_mask, n_tok, n_seq, old_lp, ref_lp, train_lp, ent) -> dict:
        """mu optimizer steps over micro-batches of this rank's rows; returns the update metrics (whole batch)."""
        a, d = self.cfg.algo, self.dist
        mbs = self._micro_batches(len(r))
        capture = train_lp is None  # first pass doubles as the clean trainer log-probs for the mismatch
        T = r.completion_ids.shape[1]
        cap_lp, cap_ent = [torch.zeros(0, T, device=self.device)], [torch.zeros(0, T, device=self.device)]
        # the metrics' sums stay on the device until the end: reading one waits for the GPU ("No waiting", above)
        sums = torch.zeros(4, device=self.device)  # clipped tokens, ratio, kl, tokens
        losses, norms = [], []
        trims = self._trims(r, mbs)
        self.model.train()
        for u in range(a.updates_per_rollout):
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), device=self.device)
            for rows, trim in zip(mbs, trims, strict=True):
                if rows is None:  # sharded policy, this rank has no rows left: the collectives, zero gradient
                    logp, _ = self._forward(self.model, self._pad_rollout, slice(0, 1), with_entropy=False)
                    (logp.sum() * 0.0).backward()
                    continue
                logp, e = self._forward(self.model, r, rows, with_entropy=capture and u == 0, trim=trim)
                if capture and u == 0:
                    cap_lp.append(logp.detach())
                    cap_ent.append(e)
                old = old_lp[rows] if old_lp is not None else logp.detach()
                isw = self.precision.is_weights(old, r.logprobs[rows], loss_mask[rows])  # rollout mismatch
                out = policy_loss(logp, old, adv[rows], loss_mask[rows], weights=isw, eps_low=a.eps_low,
                                  eps_high=a.eps_high,
                                  beta=a.beta, ref_logp=ref_lp[rows] if ref_lp is not None else None,
                                  aggregation=a.loss_agg, num_tokens=n_tok, num_sequences=n_seq)
                out.loss.backward()
                loss_sum += out.loss.detach()
                sums += torch.stack([out.clipped_tokens, out.ratio_sum, out.kl_sum, out.tokens]).to(sums)
            loss = float(loss_sum)  # one read an update: a non-finite micro-batch loss makes the sum non-finite
            if not math.isfinite(loss):
                raise RLDivergedError(f"step {step}: the policy loss is {loss} (update {u + 1}); the weights were not "
                                      f"changed. Lower optim.lr or check the rewards. {self._last_good()}")
            if d.enabled and not self.sharded:
                d.all_reduce_grads(self.params)  # the batch gradient: every rank's share summed (FSDP2 sums itself)
            max_norm = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
            gn = clip_grad_norm(self.params, max_norm)
            if not math.isfinite(gn):
                raise RLDivergedError(f"step {step}: gradient norm is {gn} (update {u + 1}); the weights were not "
                                      f"changed. Lower optim.lr. {self._last_good()}")
            self.optimizer.step()
            losses.append(d.all_reduce(loss))
            norms.append(gn)
        self.model.eval()
        if capture:
            train_lp, ent = torch.cat(cap_lp), torch.cat(cap_ent)
        clipped, ratio, kl, toks = (d.all_reduce(x) for x in sums.tolist())
        # whole-batch views for the metrics (every rank's rows, in rank order; identity on one process)
        g = d.all_gather_rows
        cmask, rollout_lp, lmask, adv = g(r.completion_mask), g(r.logprobs), g(loss_mask), g(adv)
        train_lp, ent = g(train_lp), (g(ent) if ent is not None else None)
        cm = cmask.bool()
        m = {"loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms)),
             "policy/clip_fraction": clipped / max(toks, 1.0), "policy/ratio_mean": ratio / max(toks, 1.0),
             "policy/entropy": float(ent[cm].mean()) if ent is not None and cm.any() else float("nan"),
             "adv/abs_mean": float(adv.abs().mean())}
        if a.beta > 0:
            m["policy/kl_ref"] = kl / max(toks, 1.0)
        m.update(mismatch(rollout_lp, train_lp, cmask))
        m.update(self.precision.is_metrics(train_lp, rollout_lp, lmask))
        return m

    def _rollout_metrics(self, b: ScoredBatch) -> dict:
        """Reward and length statistics of everything drawn this step (every rank's answers)."""
        g = self.dist.all_gather_rows
        rewards, accuracy, fmt = g(b.rewards), g(b.accuracy), g(b.format)
        lengths, truncated = g(b.rollout.lengths.float()), g(b.rollout.truncated)
        return {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                "reward/accuracy": float(accuracy.mean()), "reward/format": float(fmt.mean()),
                "response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
                "response/truncated_fraction": float(truncated.float().mean())}
    def _write_samples(self, path: Path, step: int, b: ScoredBatch, k: int = 4) -> None:
        with path.open("a") as f:
            for j in range(min(k, len(b))):
                f.write(json.dumps({"step": step, "prompt_index": b.prompt_index[j], "completion": b.texts[j],
                                    "answer": self.answers[b.prompt_index[j]], "reward": float(b.rewards[j]),
                                    "accuracy": float(b.accuracy[j])}) + "\n")
