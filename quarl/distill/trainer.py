"""The distillation loop: teacher forward (no grad), student forward, chunked divergence, update, log, save.

    for step in range(start, total_steps):
        rows   <- PromptSampler over the training sequences (resumable order)
        for each micro-batch:
            h_t  <- teacher hidden states [b, L, H] (no grad; its logits exist one chunk at a time)
            h_s  <- student hidden states (QAT: straight-through fake-quant weights; LoRA: frozen base + adapter)
            loss <- sum over positions of D(teacher || student), chunked over positions / tokens in the batch
            backward
        clip grads; AdamW step                     (LR: quarl.rl's warmup + cosine, a function of the step)
        every eval.every steps: held-out KL to the teacher and CE (QAD Table 1's two columns)
        log -> metrics.jsonl, TensorBoard, tqdm;   save -> checkpoint (atomic, mirrored to S3)

The loss is normalised by the number of trained positions in the whole batch
(not per micro-batch), so ``optim.micro_batch_size`` changes memory, not the
step. The teacher runs in ``teacher.dtype`` (bf16 halves its memory) and is
never differentiated. Nothing random happens in a step besides the data
order, which the sampler's saved position fixes; so a run stopped after a
checkpoint and resumed takes exactly the step the uninterrupted run takes
(tested), with checkpoints from quarl.train.checkpoint.

Divergence: a non-finite loss or gradient norm stops the run before the
optimizer step, with the last good checkpoint named.

Several processes (``torchrun``; :mod:`quarl.train.distributed`). Every rank draws the
same batch of sequences from the replicated sampler, counts its trained positions
(the global normaliser) and trains on its contiguous share of the rows. A LoRA student
is replicated (teacher too): its gradients are summed by one all-reduce per step. A
QAT student (every linear weight trains) and its teacher are sharded with FSDP2
(:mod:`quarl.train.fsdp`); checkpoints are then DCP shards that resume on any number of
ranks. With the batch's rows a multiple of ``world_size x micro_batch_size`` apart, each
rank's micro-batches are exactly the one-process run's, so 1 and N ranks take the same
step up to the order of the gradient sums (tested).
"""

from __future__ import annotations

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
from quarl.distill.config import DistillConfig
from quarl.distill.data import Sequences, collate
from quarl.distill.losses import ChunkedLoss, chunked_loss, kl_terms
from quarl.distill.student import build_student
from quarl.rl.sampling import PromptSampler
from quarl.train.checkpoint import CheckpointManager
from quarl.train.dequant_cache import DequantCache
from quarl.train.distributed import Dist, current
from quarl.train.fsdp import clip_grad_norm, decoder_hidden, shard_model
from quarl.train.fused_glue import apply_compile_glue
from quarl.train.metrics import MetricsLogger, NullLogger
from quarl.train.optim import lr_at, make_optimizer
from quarl.train.policy import enable_gradient_checkpointing, resolve_device, resolve_dtype

log = logging.getLogger(__name__)


class DistillDivergedError(RuntimeError):
    """A non-finite loss or gradient: the run stops before corrupting the weights."""


def config_digest(cfg: DistillConfig) -> str:
    return hashlib.sha256(json.dumps(config_to_dict(cfg), sort_keys=True).encode()).hexdigest()[:16]


def hidden_states(model: nn.Module, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Final hidden states [b, L, H] of a causal LM (its decoder, without the LM head)."""
    return decoder_hidden(model, input_ids=ids, attention_mask=attn, use_cache=False)


def head_fn(model: nn.Module):
    head = model.get_output_embeddings()
    return lambda h: head(h.to(head.weight.dtype))


class DistillTrainer:
    """Owns the student, the teacher, the optimizer and the loop."""

    def __init__(self, cfg: DistillConfig, student: nn.Module, teacher: nn.Module, tokenizer, train: Sequences,
                 heldout: Sequences, out_dir: str | Path, *, checkpoint_remote: str | None = None,
                 dist: Dist | None = None):
        self.cfg, self.tok, self.out = cfg, tokenizer, Path(out_dir)
        self.dist = dist = dist or current()
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = dist.device(resolve_device(cfg.train.device))
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        dtype = resolve_dtype(cfg.student.dtype, self.device)
        t_dtype = dtype if cfg.teacher.dtype == "auto" else resolve_dtype(cfg.teacher.dtype, self.device)
        seed = cfg.train.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # LoRA init
        # QAT trains every linear weight: on several ranks student and teacher are built on the CPU and sharded
        # with FSDP2 (each rank's shard moves to the device); a LoRA student is replicated
        self.sharded = dist.enabled and cfg.student.mode == "qat"
        home = torch.device("cpu") if self.sharded else self.device
        self.model = student.to(device=home, dtype=dtype)
        self.student_report = build_student(self.model, cfg.student)
        self.teacher = teacher.to(device=home, dtype=t_dtype).eval().requires_grad_(False)
        if cfg.student.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        glue = apply_compile_glue(self.model, cfg.student.compile_glue, self.device, "student.compile_glue",
                                  dist.enabled)
        if glue:  # the teacher's forward is glue too (no backward): the same compiled functions
            self.student_report["compile_glue"] = glue
            apply_compile_glue(self.teacher, cfg.student.compile_glue, self.device, "student.compile_glue",
                               dist.enabled)
        if self.sharded:
            shard_model(self.model, dist, self.device)
            shard_model(self.teacher, dist, self.device)
        elif dist.enabled:
            dist.broadcast_params([p for p in self.model.parameters() if p.requires_grad])
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # a LoRA student's frozen 4-bit base decoded once a step when memory allows (a QAT student holds nothing)
        self.dequant_cache = DequantCache(self.model, cfg.optim.dequant_cache, self.device)
        self.optimizer, self.optimizer_name = make_optimizer(self.params, cfg.optim, self.device)
        self.train_seqs, self.heldout = train, heldout
        o, t = cfg.optim, cfg.train
        self.total_steps = t.steps or max(1, math.ceil(t.epochs * len(train) / o.batch_size))
        self.sampler = PromptSampler(len(train), seed)
        self.ckpt = CheckpointManager(self.out / "checkpoints", checkpoint_remote, keep=t.keep_checkpoints)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.last_checkpoint: Path | None = None
        self.eval_before: dict | None = None
        self.uses_teacher = cfg.loss.objective != "ce"
        self._held_h: list[torch.Tensor] | None = None  # the teacher's held-out hidden states (see evaluate)
        self.teacher_ce: float | None = None  # the teacher's held-out CE, known after the first evaluate()
        self.timing = {"eval_s": 0.0, "checkpoint_s": 0.0, "train_s": 0.0}  # seconds, for the stage summary

    # ----------------------------------------------------------------------- forward pieces
    def _batch(self, seqs: Sequences, rows: list[int]):
        ids, attn, labels, mask = collate(seqs, rows, self.pad_id, self.cfg.loss.tokens == "completion")
        d = self.device
        return ids.to(d), attn.to(d), labels.to(d), mask.to(d)

    def teacher_hidden(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return hidden_states(self.teacher, ids, attn)[mask]  # [n, Ht]: only trained positions are kept

    def batch_loss(self, model: nn.Module, seqs: Sequences, rows: list[int], *, grad: bool,
                   with_teacher: bool = True, teacher_h: torch.Tensor | None = None) -> ChunkedLoss:
        """Summed loss of ``rows``; the student graph is kept only with ``grad``. ``teacher_h``: the
        teacher's hidden states at the trained positions, when already known (the held-out set's)."""
        ids, attn, labels, mask = self._batch(seqs, rows)
        ht = None
        if with_teacher:
            ht = teacher_h if teacher_h is not None else self.teacher_hidden(ids, attn, mask)
        with torch.set_grad_enabled(grad):
            hs = hidden_states(model, ids, attn)[mask]  # [n, H]
            return chunked_loss(hs, head_fn(model), ht, head_fn(self.teacher) if with_teacher else None,
                                labels[mask], self.cfg.loss)

    def _micro_batches(self, rows: list[int], model: nn.Module) -> list[list[int] | None]:
        """This rank's share of ``rows`` in micro-batches; a sharded model pads with ``None`` (a zero-weight
        stand-in) to the largest count of any rank, since every FSDP forward is a collective."""
        mb = self.cfg.optim.micro_batch_size
        mine = rows[self.dist.shard(len(rows))]
        parts: list[list[int] | None] = [mine[i:i + mb] for i in range(0, len(mine), mb)]
        if self.sharded and (model is self.model or model is self.teacher):
            parts += [None] * (int(self.dist.all_reduce(len(parts), "max")) - len(parts))
        return parts

    @torch.no_grad()
    def _heldout_teacher(self) -> list[torch.Tensor]:
        """The teacher's hidden states on every held-out micro-batch, computed once: the teacher never
        changes, so each evaluation runs only the student (and the final teacher CE costs no forward).
        Kept where they fit (under 1 GiB), else recomputed per evaluation."""
        if self._held_h is None:
            mb = self.cfg.optim.micro_batch_size
            rows = list(range(len(self.heldout)))
            hs, self.teacher_ce = [], 0.0
            for i in range(0, len(rows), mb):
                ids, attn, labels, mask = self._batch(self.heldout, rows[i:i + mb])
                h = self.teacher_hidden(ids, attn, mask)  # [n, Ht]
                head = head_fn(self.teacher)
                self.teacher_ce += sum(kl_terms(head(h[j:j + 1024]), None, labels[mask][j:j + 1024])[1]
                                       for j in range(0, h.shape[0], 1024))
                hs.append(h)
            size = sum(h.numel() * h.element_size() for h in hs)
            self._held_h = hs if size <= 2**30 else []
            self.teacher_ce /= max(sum(h.shape[0] for h in hs), 1)
            return hs
        return self._held_h

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None, *, local: bool = False) -> dict:
        """Held-out forward KL(teacher || student) per token and student CE (nats/token).

        Under torchrun the held-out rows are split over the ranks (a collective: every rank
        calls it); ``local=True`` evaluates every row here with no collective (rank 0 alone,
        on a gathered model after training). One process (or ``local``) reuses the teacher's
        held-out hidden states, computed once (:meth:`_heldout_teacher`)."""
        model = model or self.model
        t0 = time.perf_counter()
        use_cache = local or not self.dist.enabled  # every held-out row here, in _heldout_teacher's batches
        cached = self._heldout_teacher() if use_cache else None
        was = model.training
        model.eval()
        kl = ce = 0.0
        n = 0
        rows = list(range(len(self.heldout)))
        if use_cache:
            mb = self.cfg.optim.micro_batch_size
            parts: list[list[int] | None] = [rows[i:i + mb] for i in range(0, len(rows), mb)]
        else:
            parts = self._micro_batches(rows, model)
        try:
            for k, part in enumerate(parts):
                r = self.batch_loss(model, self.heldout, part or rows[:1], grad=False,
                                    teacher_h=cached[k] if cached else None)
                if part is not None:
                    kl, ce, n = kl + r.kl_sum, ce + r.ce_sum, n + r.count
        finally:
            model.train(was)
        if not use_cache and self.dist.enabled:
            kl, ce, n = (self.dist.all_reduce(x) for x in (kl, ce, n))
            n = int(n)
        self.timing["eval_s"] += time.perf_counter() - t0
        return {"kl": kl / max(n, 1), "ce": ce / max(n, 1), "ppl": math.exp(min(ce / max(n, 1), 50.0)), "tokens": n}

    # ----------------------------------------------------------------------- checkpoints
    def _last_good(self) -> str:
        return (f"The last good checkpoint is {self.last_checkpoint}." if self.last_checkpoint else
                "No checkpoint was written yet.")

    def _save(self, done: int) -> None:
        state = {"sampler": {"epoch": self.sampler.epoch, "position": self.sampler.position},
                 "total_steps": self.total_steps, "config_digest": config_digest(self.cfg),
                 "eval_before": self.eval_before, "optimizer": self.optimizer_name}

        def extras(d: Path) -> None:
            if (self.out / "metrics.jsonl").exists():
                shutil.copy2(self.out / "metrics.jsonl", d / "metrics.jsonl")

        t0 = time.perf_counter()
        self.last_checkpoint = self.ckpt.save(done, self.model, self.optimizer, state, {}, extras, dist=self.dist,
                                              sharded=self.sharded)
        self.timing["checkpoint_s"] += time.perf_counter() - t0

    def maybe_resume(self) -> int:
        if not self.cfg.train.resume:
            return 0
        ckpt = self.ckpt.latest(dist=self.dist)
        if ckpt is None:
            return 0
        state = CheckpointManager.load(ckpt, self.model, self.optimizer, {}, dist=self.dist)
        if state["total_steps"] != self.total_steps:
            raise ValueError(f"checkpoint {ckpt} belongs to a run of {state['total_steps']} steps, this one has "
                             f"{self.total_steps}: the LR schedule would differ; keep train.steps (and the data "
                             f"size) the same or use a fresh output")
        if state.get("config_digest") != config_digest(self.cfg):
            log.warning("resuming from %s with a different config than it was written with", ckpt)
        s = state["sampler"]
        self.sampler.epoch, self.sampler.position = s["epoch"], s["position"]
        self.sampler._order = self.sampler._permutation(self.sampler.epoch)
        self.eval_before = state.get("eval_before")
        if (ckpt / "metrics.jsonl").exists() and self.dist.is_main:
            shutil.copy2(ckpt / "metrics.jsonl", self.out / "metrics.jsonl")
        self.last_checkpoint = ckpt
        log.info("resumed from %s at step %d", ckpt, state["step"])
        return int(state["step"])

    # ----------------------------------------------------------------------- one step
    def step(self, step: int) -> dict:
        cfg = self.cfg
        lr = lr_at(step, self.total_steps, cfg.optim)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        rows = self.sampler.next(cfg.optim.batch_size)
        _, _, _, mask = collate(self.train_seqs, rows, self.pad_id, cfg.loss.tokens == "completion")
        n_tok = int(mask.sum())
        if n_tok == 0:
            raise ValueError(f"step {step}: the batch has no trained position (loss.tokens={cfg.loss.tokens}); "
                             f"use longer sequences or loss.tokens=all")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = kl = ce = 0.0
        mb_tokens = min(cfg.optim.micro_batch_size, len(rows)) * mask.shape[1]
        with self.dequant_cache.phase(mb_tokens):
            for rows_mb in self._micro_batches(rows, self.model):  # this rank's share (all rows on one process)
                r = self.batch_loss(self.model, self.train_seqs, rows_mb or rows[:1], grad=True,
                                    with_teacher=self.uses_teacher)
                part = r.loss_sum / n_tok  # the global count: rank shares add up to the batch loss
                if not torch.isfinite(part):
                    raise DistillDivergedError(f"step {step}: the loss is {float(part.detach())}; the weights were "
                                               f"not changed. Lower optim.lr. {self._last_good()}")
                if rows_mb is None:  # a padding micro-batch (sharded model): the collectives, no contribution
                    part = part * 0.0
                part.backward()
                if rows_mb is not None:
                    loss += float(part.detach())
                    kl += r.kl_sum
                    ce += r.ce_sum
        if self.dist.enabled:
            if not self.sharded:
                self.dist.all_reduce_grads(self.params)  # FSDP2 reduce-scatters (sums) by itself
            loss, kl, ce = (self.dist.all_reduce(x) for x in (loss, kl, ce))
        max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
        gn = clip_grad_norm(self.params, max_norm)
        if not math.isfinite(gn):
            raise DistillDivergedError(f"step {step}: gradient norm is {gn}; the weights were not changed. Lower "
                                       f"optim.lr. {self._last_good()}")
        self.optimizer.step()
        return {"loss": loss, "train/kl": kl / n_tok, "train/ce": ce / n_tok, "grad_norm": gn, "lr": lr,
                "train/tokens": n_tok, "data/epoch": self.sampler.epochs_done, **self.dequant_cache.last}

    # ----------------------------------------------------------------------- the loop
    def train(self, stop_after: int | None = None) -> dict:
        from tqdm.auto import tqdm

        cfg = self.cfg
        start = self.maybe_resume()
        if self.eval_before is None:
            self.eval_before = self.evaluate()
        end = self.total_steps if stop_after is None else min(self.total_steps, stop_after)
        main = self.dist.is_main  # rank 0 alone logs and shows progress
        logger = MetricsLogger(self.out, resume_step=start) if main else NullLogger()
        bar = tqdm(total=self.total_steps, initial=start, desc=f"distill ({cfg.loss.objective})", unit="step",
                   disable=None if main else True)
        try:
            for step in range(start, end):
                t0 = time.perf_counter()
                if self.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(self.device)
                self.dequant_cache.new_step()
                m = self.step(step)
                m["time/step_s"] = time.perf_counter() - t0
                self.timing["train_s"] += m["time/step_s"]
                m["memory/peak_gb"] = self.dequant_cache.step_peak_gb()
                done = step + 1
                if cfg.eval.every and (done % cfg.eval.every == 0 or done == self.total_steps):
                    ev = self.evaluate()
                    m.update({"eval/kl": ev["kl"], "eval/ce": ev["ce"]})
                logger.log(step, m)
                bar.update(1)
                bar.set_postfix(loss=f"{m['loss']:.4f}", kl=f"{m['train/kl']:.4f}")
                if done == self.total_steps or (cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0):
                    self._save(done)
                elif stop_after is not None and done == end:
                    self._save(done)  # an interrupted run leaves a checkpoint to resume from
        finally:
            bar.close()
            logger.close()
        return {"total_steps": self.total_steps, "start_step": start, "end_step": end,
                "optimizer": self.optimizer_name, "student": self.student_report,
                "train_sequences": len(self.train_seqs), "heldout_sequences": len(self.heldout),
                "eval_before": self.eval_before, "timing": dict(self.timing),
                "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
                "world_size": self.dist.world_size, "sharded": self.sharded}
