"""Training scenarios run once by one process and once by two gloo processes (tests/train/test_distributed.py).

Each scenario takes a :class:`quarl.train.distributed.Dist` and a work directory, trains a
tiny model for a few steps and returns what the comparison needs (weights on CPU, the
metrics history); rank 0's return value is what the parent test sees.

Rollouts. Token sampling is the one thing that cannot match between 1 and N processes
with the library's engines (each rank samples its own rows with its own stream, and a
sampler's stream depends on the batch it draws for). :class:`PerPromptGenerator` makes
them match: it samples each prompt's G answers with a generator seeded by the prompt and
how often it was drawn, so the same prompts get the same answers whichever rank draws
them. What the tests then compare is everything after the rollout: rewards, group
advantages, global normalisation, gradient all-reduce / FSDP2 reduce-scatter, AdamW,
checkpoints -- the distributed machinery.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections import Counter
from pathlib import Path

import torch

from quarl.engine.rollout import HFGenerator, Rollout
from quarl.train.distributed import Dist

VOLATILE = ("time/", "throughput/", "memory/", "rollout/tokens_per_s")


class PerPromptGenerator:
    """The reference engine, one prompt at a time, seeded by (prompt, occurrence): rank-invariant rollouts."""

    def __init__(self, model, pad_id: int):
        self.inner = HFGenerator(model, pad_id, cache="dynamic")
        self.seen: Counter = Counter()

    def generate(self, prompts, params, n, generator=None) -> Rollout:
        parts = []
        for p in prompts:
            key = (tuple(p), self.seen[tuple(p)])
            self.seen[tuple(p)] += 1
            seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:6], "little")
            parts.append(self.inner.generate([p], params, n, torch.Generator().manual_seed(seed)))
        return Rollout.cat(parts)


class FlatForSomePrompts:
    """Parity reward, but every answer to the prompts whose answer is 0 or 4 scores 0 (flat groups for DAPO)."""

    def components(self, texts, answers):
        acc = [0.0 if a in ("0", "4") else float(sum(map(ord, t)) % 2) for t, a in zip(texts, answers)]
        return {"accuracy": acc, "format": [0.0] * len(texts), "reward": acc}


def metrics(out: Path) -> list[dict]:
    p = Path(out) / "metrics.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _weights(model) -> dict[str, torch.Tensor]:
    from quarl.train.fsdp import full_state_dict, is_sharded

    if is_sharded(model):
        return full_state_dict(model)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _trainable(model) -> dict[str, torch.Tensor]:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in _weights(model).items() if k in names}


# --------------------------------------------------------------------------- distill
def _distill(d: Dist, out: Path, *extra: str):
    from quarl.distill.trainer import DistillTrainer
    from tests.distill.conftest import small_tiny_model, tiny_cfg, token_sequences

    cfg = tiny_cfg("train.steps=2", "optim.batch_size=8", "optim.micro_batch_size=2", *extra)
    s, tok = small_tiny_model()
    t, _ = small_tiny_model()
    return DistillTrainer(cfg, s, t, tok, token_sequences(8), token_sequences(4, seed=9), out, dist=d)


def distill_lora(d: Dist, out: Path) -> dict:
    tr = _distill(d, out, "student.mode=lora")
    res = tr.train()
    return {"weights": _trainable(tr.model), "metrics": metrics(out), "eval_before": res["eval_before"],
            "eval_after": tr.evaluate()}


def distill_qat(d: Dist, out: Path) -> dict:
    """Full-parameter QAT: stop after step 1 (checkpoint), then a fresh trainer resumes and takes step 2."""
    first = _distill(d, out, "student.mode=qat", "train.checkpoint_every=1")
    first.train(stop_after=1)
    w1 = _weights(first.model)
    second = _distill(d, out, "student.mode=qat", "train.checkpoint_every=1")
    res = second.train()
    return {"weights_step1": w1, "weights": _weights(second.model), "metrics": metrics(out),
            "start_step": res["start_step"], "sharded": res["sharded"]}


# --------------------------------------------------------------------------- rl
def _rl(d: Dist, out: Path, *extra: str, reward=None):
    from quarl.rl.trainer import RLTrainer
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

    cfg = tiny_cfg(*extra)
    model, tok = small_tiny_model()
    return RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, out, reward_fn=reward or ParityReward(),
                     generator=PerPromptGenerator(model, tok.pad_token_id), dist=d)


def rl_lora(d: Dist, out: Path) -> dict:
    tr = _rl(d, out, "algo.updates_per_rollout=2")  # the old-log-prob pass, AQN noise from step 1
    tr.train()
    return {"weights": _trainable(tr.model), "metrics": metrics(out)}


def rl_dapo(d: Dist, out: Path) -> dict:
    tr = _rl(d, out, "algo.algo=dapo", "algo.overlong=none", "algo.max_sampling_rounds=3", "train.steps=2",
             "algo.updates_per_rollout=1", "aqn.enabled=false", reward=FlatForSomePrompts())
    tr.train()
    return {"weights": _trainable(tr.model), "metrics": metrics(out)}


def rl_full(d: Dist, out: Path) -> dict:
    tr = _rl(d, out, "policy.mode=full", "policy.format=bf16", "algo.beta=0.1", "train.steps=2", "optim.lr=1e-3",
             "algo.updates_per_rollout=1", "policy.gradient_checkpointing=true")
    res = tr.train()
    return {"weights": _weights(tr.model), "metrics": metrics(out), "sharded": res["sharded"]}


def rl_full_glue(d: Dist, out: Path) -> dict:
    """:func:`rl_full` with ``policy.compile_glue=true``: the compiled RMSNorm / RoPE / SwiGLU under FSDP2, which
    swaps a sharded module's parameters around its forward (``auto`` leaves torchrun runs eager until this is
    measured on GPUs). torch.compile's ``aot_eager`` backend: dynamo's graphs and their autograd, no kernel build;
    the backend and transformers' RoPE are put back after (the spawned ranks run every scenario in turn)."""
    from transformers.models.llama import modeling_llama

    from quarl.train import fused_glue

    backend, rope = fused_glue.BACKEND, modeling_llama.apply_rotary_pos_emb
    fused_glue.BACKEND = "aot_eager"
    try:
        tr = _rl(d, out, "policy.mode=full", "policy.format=bf16", "algo.beta=0.1", "train.steps=2", "optim.lr=1e-3",
                 "algo.updates_per_rollout=1", "policy.gradient_checkpointing=true", "policy.compile_glue=true")
        res = tr.train()
        return {"weights": _weights(tr.model), "metrics": metrics(out), "sharded": res["sharded"],
                "glue": tr.policy_report.get("compile_glue")}
    finally:
        fused_glue.BACKEND, modeling_llama.apply_rotary_pos_emb = backend, rope


def rl_jetrl_full(d: Dist, out: Path) -> dict:
    """Jet-RL's full mode: FP8 GEMMs (QuantLinear QAT master weights through quarl.quant.fp8_linear) under FSDP2.

    One step: after it the 1- and 2-process weights differ by reduction order (~1e-8), and the next
    rollout quantizes them to FP8 with per-128x128-tile scales, where such a difference can move a
    tile's amax and so every code in the tile; the sampled answers then part (seen at step 1: reward
    0.5 vs 0.375). That is FP8 rounding amplifying summation order, not a distributed bug; the bf16
    full-parameter scenario above stays equal over 2 steps."""
    tr = _rl(d, out, "policy.mode=full", "precision.mode=jetrl", "train.steps=1", "optim.lr=1e-3",
             "algo.updates_per_rollout=1", "aqn.enabled=false")
    res = tr.train()
    return {"weights": _weights(tr.model), "metrics": metrics(out), "sharded": res["sharded"],
            "fp8_layers": sum(1 for m in tr.model.modules() if getattr(m, "fp8_flow", False))}


def rl_full_replica(d: Dist, out: Path) -> dict:
    """``rollout.engine=fast`` under FSDP2: the fast engine on an unsharded rollout replica.

    Sampling differs between 1 and N processes here (each rank's own stream), so what is checked
    is the replica itself, on every rank: synced layer by layer and given the step's AQN noise it
    holds exactly what the gathered policy holds under that noise; its storage never moves
    (graph-safe); and a greedy rollout on it equals the reference engine's on the gathered policy."""
    from quarl.engine.rollout import HFGenerator, SamplingParams
    from quarl.rl.trainer import RLTrainer
    from quarl.train.fsdp import gathered
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

    cfg = tiny_cfg("policy.mode=full", "policy.format=bf16", "train.steps=2", "optim.lr=1e-3",
                   "algo.updates_per_rollout=1", "rollout.engine=fast")
    model, tok = small_tiny_model()
    tr = RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, out, reward_fn=ParityReward(), dist=d)
    rep = tr.replica
    ptrs = [p.data_ptr() for p in rep.model.parameters()]
    res = tr.train()
    step = 1  # a step whose AQN sigma is > 0 (3 stages over 2 steps)
    greedy = SamplingParams(1.0, 1e-7, 6, [])
    with gathered(tr.model), tr.aqn.perturb(step, torch.Generator().manual_seed(7)) as sigma:  # the old path
        noisy = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
        ref = HFGenerator(tr.model, tok.pad_token_id, cache="dynamic").generate([tr.prompt_ids[0]], greedy, 1)
    rep.sync(tr.model)  # layer by layer, then the same noise on the replica's norms
    with tr.replica_aqn.perturb(step, torch.Generator().manual_seed(7)):
        diff = max(float((noisy[n] - p).abs().max()) for n, p in rep.model.named_parameters())
        fast = tr.generator.generate([tr.prompt_ids[0]], greedy, 1)
    return {"sharded": res["sharded"], "engine": res["rollout_engine"], "sigma": sigma, "max_diff": diff,
            "same_storage": ptrs == [p.data_ptr() for p in rep.model.parameters()],
            "greedy_ref": ref.completion_ids.tolist(), "greedy_fast": fast.completion_ids.tolist(),
            "steps": [r["step"] for r in metrics(out)]}


# --------------------------------------------------------------------------- whole stages (artifact on rank 0)
RL_STAGE = ["rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.cache=dynamic", "train.prompts_per_step=2",
            "train.steps=2", "optim.micro_batch_size=4", "train.device=cpu", "policy.mode=full",
            "policy.format=bf16", "optim.lr=1e-3"]
DISTILL_STAGE = ["train.steps=2", "train.device=cpu", "optim.batch_size=4", "optim.micro_batch_size=2",
                 "data.num_sequences=4", "data.seq_len=48", "data.max_new_tokens=8", "eval.num_sequences=2",
                 "eval.seq_len=48", "eval.accuracy_samples=2", "eval.max_new_tokens=4", "loss.chunk=32",
                 "data.source=bos", "student.mode=qat"]


def stage_rl_full(d: Dist, out: Path) -> dict:
    from quarl.config import load_config
    from quarl.rl import RLConfig, run_rl

    cfg = load_config(RLConfig, None, RL_STAGE)
    return run_rl(cfg, model_uri="tiny-llama", data_uri=str(out.parent / "dataset"), output_uri=str(out / "model"))


def stage_distill_qat(d: Dist, out: Path, *extra: str) -> dict:
    from quarl.config import load_config
    from quarl.distill import DistillConfig, run_distill

    cfg = load_config(DistillConfig, None, [*DISTILL_STAGE, *extra])
    return run_distill(cfg, model_uri="tiny-llama", teacher_uri="tiny-llama", data_uri=str(out.parent / "dataset"),
                       output_uri=str(out / "model"))


SCENARIOS = {"distill_lora": distill_lora, "distill_qat": distill_qat, "rl_lora": rl_lora, "rl_dapo": rl_dapo,
             "rl_full": rl_full, "rl_full_glue": rl_full_glue, "rl_jetrl_full": rl_jetrl_full, "rl_full_replica": rl_full_replica, "stage_rl_full": stage_rl_full, "stage_distill_qat": stage_distill_qat,
             "stage_distill_lora": lambda d, out: stage_distill_qat(d, out, "student.mode=lora")}


# --------------------------------------------------------------------------- two gloo processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, root: str, names: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import warnings

    warnings.simplefilter("ignore")
    from quarl.train.distributed import distributed

    with distributed("cpu") as d:
        for name in names:
            out = Path(root) / name
            res = SCENARIOS[name](d, out)
            torch.save(res, Path(root) / f"{name}-rank{d.rank}.pt")


def make_dataset(out: Path) -> None:
    from tests.datasets import synthetic_dataset

    synthetic_dataset(out)


def run_two_ranks(root: Path, names: list[str]) -> dict[str, dict]:
    """Every scenario in ``names`` on 2 gloo processes (one spawn). Rank 0's results by name, rank 1's
    under ``"<name>@1"``. ``root/dataset`` is the data-prep artifact the stage scenarios read."""
    import torch.multiprocessing as mp

    root.mkdir(parents=True, exist_ok=True)
    make_dataset(root / "dataset")
    mp.start_processes(_worker, args=(2, free_port(), str(root), names), nprocs=2, join=True, start_method="spawn")
    out = {n: torch.load(root / f"{n}-rank0.pt", weights_only=False) for n in names}
    out.update({f"{n}@1": torch.load(root / f"{n}-rank1.pt", weights_only=False) for n in names})
    return out


def checkpoint_copy(src: Path, dst: Path, step: int) -> None:
    """``dst`` becomes a work directory whose only (and latest) checkpoint is ``src``'s step ``step``."""
    name = f"step-{step:06d}"
    (dst / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)
    (dst / "checkpoints" / "latest").write_text(name + "\n")
