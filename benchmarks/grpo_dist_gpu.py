"""GRPO on several GPUs: tokens/s of a Qwen2.5-7B-shaped NVFP4 + LoRA step on 1 and 2 GPUs, and the
peak memory per GPU of a 70B-shaped step (issue 18). One torchrun command, a hard time budget:

    PYTHONPATH=$PWD:$PWD/kernels timeout 100 torchrun --nproc-per-node 2 benchmarks/grpo_dist_gpu.py \\
        --budget-s 85 --out $OUT                                                   # 2 x H100
    .venv/bin/torchrun --nproc-per-node 2 benchmarks/grpo_dist_gpu.py --device cpu --shape tiny \\
        --big-shape tiny --budget-s 300 --out /tmp/grpo_dist                      # CPU dry run (gloo)

What runs is :class:`quarl.rl.RLTrainer`'s own step (rollout with the CUDA-graph engine,
rewards, group advantages, LoRA update with gradient checkpointing, AdamW), on random
weights built layer by layer and quantized as built (``benchmarks/grpo_step_gpu.py``'s
``build_model``: BF16 never exists in full, so the 70B shape needs ~35 GB of NVFP4
weights per GPU, never 140 GB of BF16).

Phases (every rank builds the 7B policy once on its own GPU):

* ``1gpu``: each rank runs the whole global batch alone (``Dist()``: no collective) --
  the one-GPU baseline, measured on both GPUs at once (two samples); it also compiles
  the Triton kernels and captures the CUDA graphs of both processes;
* ``2gpu``: the same trainer joins the process group (its LoRA weights broadcast from
  rank 0): each rank rolls out half of the prompts (whole groups) and the LoRA
  gradients are all-reduced -- ``torchrun`` data parallelism as the rl stage runs it.
  Step 0 of each phase includes graph capture (new batch sizes) and is not the measured
  step; the last step is. tokens/s = every rank's prompt + completion tokens of the step
  divided by the step's wall time (rank 0's clock);
* ``70b`` (only if ``--budget-s`` leaves ``--min-70b-s``): the 7B model is freed, each
  rank builds the 80-layer x 8192 x 28672 shape in NVFP4 + LoRA r32 and runs one
  data-parallel step of ``--big-prompts`` prompts; recorded: weights, peak allocated and
  device memory per GPU. Skipped (and said so) when the budget is short.

Results are written after every phase by rank 0 (``grpo_dist.json``; each rank also
``rank<r>.json``) so a killed run keeps what it finished; the last thing printed is a
summary table (also ``grpo_dist.md``). The device keeps ``NCCL_NVLS_ENABLE=0`` and
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (set here too if absent); nothing here uses
multicast or symmetric memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import grpo_step_gpu as gs  # the 7B/32B shapes, build_model, IdTokenizer, BernoulliReward

# the 70B shape (Llama-3-70B's linears and vocabulary) in the Qwen2 module layout build_model makes
gs.SHAPES.setdefault("70b", {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                             "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256})
GiB = 2**30


def rl_config(args, shape_prompts: int, group: int, new_tokens: int, steps: int, device: str, extra=()):
    from quarl.config import load_config
    from quarl.rl import RLConfig

    return load_config(RLConfig, None, [
        "policy.format=nvfp4", f"policy.lora_r={args.lora_r}", f"policy.lora_alpha={args.lora_r}",
        f"policy.dtype={'bfloat16' if device != 'cpu' else 'float32'}", "policy.gradient_checkpointing=true",
        f"rollout.group_size={group}", f"rollout.max_new_tokens={new_tokens}",
        f"rollout.max_prompt_tokens={args.prompt_len}", "rollout.temperature=1.0", "algo.updates_per_rollout=1",
        "algo.algo=grpo", "aqn.enabled=false", f"optim.micro_batch_size={args.micro_batch}",
        "optim.optimizer=adamw", "optim.warmup_ratio=0", f"train.steps={steps}",
        f"train.prompts_per_step={shape_prompts}", f"train.device={device}", "train.checkpoint_every=0",
        "train.sample_every=0", "train.resume=false", *extra,
    ])  # fmt: skip


def step_rows(out: Path) -> list[dict]:
    from quarl.train.metrics import read_metrics

    keep = ("step", "time/rollout_s", "time/update_s", "time/step_s", "throughput/tokens_per_s",
            "rollout/tokens_per_s", "memory/peak_gb", "train/answers", "loss", "grad_norm")
    return [{k: r.get(k) for k in keep} for r in read_metrics(out / "metrics.jsonl")]


def cuda_memory(dev: torch.device) -> dict:
    if dev.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(dev)
    return {"peak_allocated_gib": round(torch.cuda.max_memory_allocated(dev) / GiB, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved(dev) / GiB, 2),
            "device_used_gib": round((total - free) / GiB, 2), "device_total_gib": round(total / GiB, 2)}


class Recorder:
    """Rank 0's incremental result file (every rank keeps its own too)."""

    def __init__(self, out: Path, d, env: dict, args):
        self.out, self.d = out, d
        self.data = {"env": env, "args": vars(args), "world_size": d.world_size, "phases": {}}

    def put(self, phase: str, value) -> None:
        self.data["phases"][phase] = value
        (self.out / f"rank{self.d.rank}.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        if self.d.is_main:
            (self.out / "grpo_dist.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def run_7b(args, d, dev: torch.device, work: Path, rec: Recorder, t_start: float):
    """Phases 1gpu and 2gpu on one trainer; returns nothing (results in ``rec``)."""
    from quarl.rl import RLTrainer
    from quarl.train.distributed import Dist

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg_model = gs.qwen25_config(args.shape)
    t0 = time.perf_counter()
    model = gs.build_model(cfg_model, str(dev), dtype, quant_format="nvfp4")
    build_s = time.perf_counter() - t0
    cfg = rl_config(args, args.prompts, args.group, args.new_tokens, args.steps, str(dev))
    tok = gs.IdTokenizer(cfg_model.vocab_size, args.prompt_len)
    prompts = [f"p{i}" for i in range(args.prompts * args.steps * 2)]
    # phase 1gpu: every rank alone with the whole batch (no collective), into its own directory
    single = Dist(rank=0, world_size=1, local_rank=d.local_rank)
    trainer = RLTrainer(cfg, model, tok, prompts, ["0"] * len(prompts), work / f"1gpu-rank{d.rank}",
                        reward_fn=gs.BernoulliReward(0), dist=single)
    trainer._save = lambda step_done: None  # no checkpoints in a benchmark
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    trainer.train()
    one = {"build_s": round(build_s, 1), "engine": type(trainer.generator).__name__,
           "steps": step_rows(trainer.out), "memory": cuda_memory(dev)}
    ones = d.all_gather_object(one)
    rec.put("1gpu", {"per_rank": ones})
    left = args.budget_s - (time.monotonic() - t_start)
    if not d.enabled:
        return trainer, model
    if left < args.min_2gpu_s:
        rec.put("2gpu", {"skipped": f"budget: {left:.0f} s left < --min-2gpu-s {args.min_2gpu_s}"})
        return trainer, model
    # phase 2gpu: the same policy, data-parallel over the ranks
    d.broadcast_params(trainer.params)  # identical LoRA on every rank (phase 1gpu trained each alone)
    trainer.dist = d
    trainer.out = work / "2gpu"
    trainer.out.mkdir(parents=True, exist_ok=True)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    trainer.train()
    two = {"steps": step_rows(trainer.out) if d.is_main else None, "memory": cuda_memory(dev)}
    twos = d.all_gather_object(two)
    rec.put("2gpu", {"steps": twos[0]["steps"], "memory_per_rank": [t["memory"] for t in twos]})
    return trainer, model


def run_70b(args, d, dev: torch.device, work: Path, rec: Recorder) -> None:
    from quarl.rl import RLTrainer

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg_model = gs.qwen25_config(args.big_shape)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    model = gs.build_model(cfg_model, str(dev), dtype, quant_format="nvfp4")
    res = {"shape": args.big_shape, "rows_per_rank": args.big_prompts * args.big_group // max(d.world_size, 1),
           "layers": cfg_model.num_hidden_layers, "hidden": cfg_model.hidden_size,
           "intermediate": cfg_model.intermediate_size, "build_s": round(time.perf_counter() - t0, 1)}
    if dev.type == "cuda":
        res["weights_gib"] = round(torch.cuda.memory_allocated(dev) / GiB, 2)
        res["build_peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / GiB, 2)
    cfg = rl_config(args, args.big_prompts, args.big_group, args.big_new_tokens, 1, str(dev))
    tok = gs.IdTokenizer(cfg_model.vocab_size, args.prompt_len)
    prompts = [f"p{i}" for i in range(args.big_prompts)]
    trainer = RLTrainer(cfg, model, tok, prompts, ["0"] * len(prompts), work / "70b",
                        reward_fn=gs.BernoulliReward(0), dist=d)
    trainer._save = lambda step_done: None
    if dev.type == "cuda":
        res["policy_gib"] = round(torch.cuda.memory_allocated(dev) / GiB, 2)
        torch.cuda.reset_peak_memory_stats(dev)
    trainer.train()
    res.update(step=step_rows(trainer.out) if d.is_main else None, memory=cuda_memory(dev),
               trainable_params=sum(p.numel() for p in trainer.params))
    rec.put("70b", {"per_rank": d.all_gather_object(res)})


def _dense_on_host(cfg_model, dev: torch.device):
    """A dense BF16 random model on the host, filled on the GPU (fast) and moved out: FSDP2's input."""
    model = gs.build_model(cfg_model, str(dev), torch.bfloat16).to("cpu")
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return model


def run_fsdp(args, d, dev: torch.device, work: Path, rec: Recorder, kind: str) -> None:
    """Full-parameter training under FSDP2 (``fully_shard`` per layer): ``qad`` = one QAT distillation
    (NVFP4 fake-quant student, BF16 teacher, both sharded) step of ``--fsdp-seq-len`` tokens per rank;
    ``jetrl`` = one Jet-RL GRPO step (FP8 GEMMs forward and backward, rollout through the FP8 flow on
    the gathered policy). Per GPU: peak allocated memory and step time; what one GPU cannot hold."""
    import copy
    import tempfile

    cfg_model = gs.qwen25_config(args.fsdp_shape)
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    model = _dense_on_host(cfg_model, dev)
    res = {"kind": kind, "shape": args.fsdp_shape, "world_size": d.world_size, "build_s": round(time.perf_counter() - t0, 1),
           "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3)}
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    steps = []
    if kind == "qad":
        from quarl.config import load_config
        from quarl.distill import DistillConfig
        from quarl.distill.data import Sequences
        from quarl.distill.trainer import DistillTrainer

        class Tok:
            pad_token_id = 0

        L = args.fsdp_seq_len
        g = torch.Generator().manual_seed(0)
        n = 2 * d.world_size
        seqs = Sequences(ids=torch.randint(1, cfg_model.vocab_size, (n, L), generator=g).tolist(), prompt_len=[0] * n)
        cfg = load_config(DistillConfig, None, [
            "student.mode=qat", "student.format=nvfp4", f"student.dtype={'bfloat16' if cuda else 'float32'}",
            "student.gradient_checkpointing=true", "teacher.dtype=auto", "loss.chunk=512",
            f"optim.batch_size={d.world_size}", "optim.micro_batch_size=1", "train.steps=2",
            f"train.device={dev.type}", "train.checkpoint_every=0"])
        teacher = copy.deepcopy(model)
        tr = DistillTrainer(cfg, model, teacher, Tok(), seqs, seqs, tempfile.mkdtemp(dir=work), dist=d)
        res["trainable_params_b"] = round(sum(p.numel() for p in tr.params) / 1e9, 3)
        for i in range(2):
            t = time.perf_counter()
            m = tr.step(i)
            if cuda:
                torch.cuda.synchronize(dev)
            steps.append({"step": i, "step_s": round(time.perf_counter() - t, 2), "kl": m["train/kl"],
                          "tokens_all_ranks": m["train/tokens"]})
    else:
        from quarl.rl import RLTrainer

        cfg = rl_config(args, d.world_size, args.big_group, args.fsdp_new_tokens, 2, str(dev), extra=(
            "policy.mode=full", "policy.format=fp8-block", "precision.mode=jetrl", "algo.beta=0",
            f"rollout.engine={kind.split('-', 1)[1] if '-' in kind else 'auto'}",
            f"optim.micro_batch_size={args.big_group}", "optim.lr=1e-6"))
        tok = gs.IdTokenizer(cfg_model.vocab_size, args.prompt_len)
        prompts = [f"p{i}" for i in range(4 * d.world_size)]
        tr = RLTrainer(cfg, model, tok, prompts, ["0"] * len(prompts), work / "jetrl",
                       reward_fn=gs.BernoulliReward(0), dist=d)
        tr._save = lambda step_done: None
        res["fp8_layers"] = sum(1 for m in tr.model.modules() if getattr(m, "fp8_flow", False))
        res["engine"] = type(tr.generator).__name__ + (" on a rollout replica" if tr.replica is not None else "")
        tr.train()
        steps = step_rows(tr.out) if d.is_main else None
    res.update(steps=steps, memory=cuda_memory(dev))
    rec.put(f"fsdp_{kind}", {"per_rank": d.all_gather_object(res)})


def table(data: dict) -> str:
    ph = data["phases"]
    a = data["args"]
    lines = [(f"GRPO step, NVFP4 + LoRA r{a['lora_r']}, {a['prompts']} prompts x G={a['group']}, prompt "
              f"{a['prompt_len']}, {a['new_tokens']} new tokens, {data['world_size']} ranks; last step of each phase"),
             "",
             "| phase | GPUs | step s | rollout s | update s | tokens/s (all GPUs) | scaling | peak alloc GiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    base = None
    if "1gpu" in ph:
        for r, one in enumerate(ph["1gpu"]["per_rank"]):
            s = one["steps"][-1] if one["steps"] else {}
            thr = s.get("throughput/tokens_per_s")
            base = base or thr
            lines.append(f"| 1gpu (rank {r}) | 1 | {s.get('time/step_s', 0):.2f} | {s.get('time/rollout_s', 0):.2f} | "
                         f"{s.get('time/update_s', 0):.2f} | {thr or 0:.0f} | 1.00 | "
                         f"{one['memory'].get('peak_allocated_gib', '-')} |")
    two = ph.get("2gpu", {})
    if two.get("steps"):
        s = two["steps"][-1]
        thr = s["throughput/tokens_per_s"]
        peak = max((m.get("peak_allocated_gib", 0) for m in two["memory_per_rank"]), default=0)
        lines.append(f"| {data['world_size']} GPUs | {data['world_size']} | {s['time/step_s']:.2f} | {s['time/rollout_s']:.2f} | "
                     f"{s['time/update_s']:.2f} | {thr:.0f} | {thr / base if base else 0:.2f} | {peak or '-'} |")
    elif two:
        lines.append(f"| 2gpu | - | {two.get('skipped') or two.get('error', '-')} |")
    big = ph.get("70b")
    if big and "per_rank" in big:
        lines += ["", "| 70B-shaped step | rank | weights GiB | policy GiB | peak alloc GiB | device used GiB |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r, b in enumerate(big["per_rank"]):
            m = b.get("memory", {})
            lines.append(f"| {b['layers']} x {b['hidden']} x {b['intermediate']} | {r} | {b.get('weights_gib', '-')} | "
                         f"{b.get('policy_gib', '-')} | {m.get('peak_allocated_gib', '-')} | "
                         f"{m.get('device_used_gib', '-')} |")
    elif big:
        lines.append(f"\n70B-shaped step: {big.get('skipped') or big.get('error')}")
    for key in [k for k in ph if k.startswith("fsdp_")]:
        kind, f = key[len("fsdp_"):], ph[key]
        if "per_rank" not in f:
            lines.append(f"\nFSDP2 {kind}: {f.get('skipped') or f.get('error')}")
            continue
        r0 = f["per_rank"][0]
        st = r0.get("steps") or []
        last = st[-1] if st else {}
        step_s = last.get("step_s", last.get("time/step_s"))
        step_s = "-" if step_s is None else f"{step_s:.2f}"
        eng = f", {r0['engine']}" if r0.get("engine") else ""
        roll = last.get("time/rollout_s")
        roll = f" (rollout {roll:.2f} s)" if roll is not None else ""
        lines += ["", (f"FSDP2 full-parameter {kind}{eng}, {r0['shape']} shape ({r0['params_b']} B parameters), "
                      f"{r0['world_size']} ranks, build {r0['build_s']} s; last step {step_s} s{roll}"),
                  "", "| rank | peak alloc GiB | peak reserved GiB | device used GiB |", "|---:|---:|---:|---:|"]
        for r, b in enumerate(f["per_rank"]):
            m = b.get("memory", {})
            lines.append(f"| {r} | {m.get('peak_allocated_gib', '-')} | {m.get('peak_reserved_gib', '-')} | "
                         f"{m.get('device_used_gib', '-')} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (NCCL, one GPU per rank) or cpu (gloo dry run)")
    ap.add_argument("--shape", default="7b", choices=sorted(gs.SHAPES))
    ap.add_argument("--big-shape", default="70b", choices=sorted(gs.SHAPES))
    ap.add_argument("--parts", default="7b,70b", help="comma list of parts: 7b, 70b, qad, jetrl (FSDP2; jetrl-<engine> picks rollout.engine)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (split over the ranks in 2gpu)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2, help="steps per phase (step 0 compiles and captures)")
    ap.add_argument("--big-prompts", type=int, default=2, help="70B: prompts per step (one per rank)")
    ap.add_argument("--big-group", type=int, default=4, help="70B: answers per prompt")
    ap.add_argument("--big-new-tokens", type=int, default=32)
    ap.add_argument("--fsdp-shape", default="7b", choices=sorted(gs.SHAPES), help="qad / jetrl parts: model shape")
    ap.add_argument("--fsdp-seq-len", type=int, default=2048, help="qad: tokens per sequence (one per rank)")
    ap.add_argument("--fsdp-new-tokens", type=int, default=32, help="jetrl: new tokens per answer")
    ap.add_argument("--budget-s", type=float, default=85.0, help="wall-clock budget; phases that would not fit "
                                                                 "are skipped and recorded as skipped")
    ap.add_argument("--min-2gpu-s", type=float, default=15.0, help="seconds the 2gpu phase needs at least")
    ap.add_argument("--min-70b-s", type=float, default=40.0, help="seconds the 70B part needs at least")
    ap.add_argument("--out", default="runs/bench/grpo_dist")
    ap.add_argument("--work", default="/tmp/quarl-grpo-dist", help="trainer work dirs (outside --out)")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    t_start = time.monotonic()
    args = parse_args(argv)
    from quarl.train.distributed import init_distributed

    d, created = init_distributed(args.device)
    dev = d.device(torch.device(args.device))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
           "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
           "TORCH_SYMM_MEM_DISABLE_MULTICAST": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST")}
    rec = Recorder(out, d, env, args)
    parts = set(args.parts.split(","))
    try:
        if "7b" in parts:
            try:
                trainer, model = run_7b(args, d, dev, work, rec, t_start)
                del trainer, model
            except Exception as e:  # noqa: BLE001 -- record it, keep what finished, try the next part
                traceback.print_exc()
                rec.put("7b_error", f"{type(e).__name__}: {str(e)[:600]}")
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        if "70b" in parts:
            left = args.budget_s - (time.monotonic() - t_start)
            if left < args.min_70b_s:
                rec.put("70b", {"skipped": f"budget: {left:.0f} s left < --min-70b-s {args.min_70b_s}"})
            else:
                try:
                    run_70b(args, d, dev, work, rec)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    rec.put("70b", {"error": f"{type(e).__name__}: {str(e)[:600]}",
                                    "oom": isinstance(e, torch.OutOfMemoryError), "memory": cuda_memory(dev)})
        for kind in [k for k in args.parts.split(",") if k == "qad" or k.startswith("jetrl")]:
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            if args.budget_s - (time.monotonic() - t_start) < args.min_70b_s:
                rec.put(f"fsdp_{kind}", {"skipped": "budget"})
                continue
            try:
                run_fsdp(args, d, dev, work, rec, kind)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rec.put(f"fsdp_{kind}", {"error": f"{type(e).__name__}: {str(e)[:600]}",
                                         "oom": isinstance(e, torch.OutOfMemoryError), "memory": cuda_memory(dev)})
        rec.data["wall_s"] = round(time.monotonic() - t_start, 1)
        rec.put("done", True)
        if d.is_main:
            md = table(rec.data)
            (out / "grpo_dist.md").write_text(md + "\n")
            print(md, flush=True)
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()


if __name__ == "__main__":
    main()
