"""``run_rl``: the RL stage -- dataset artifact + model in, one adapter (or model) artifact out.

    run_rl(cfg, model_uri="default", data_uri="runs/r1/data_prep/dataset",
           output_uri="runs/r1/rl/adapter") -> dict

Flow: read the data-prep split (``quarl.data.read_split``, verified), load the
model (``quarl.train.policy.load_policy_model``: dense, or with ``policy.load=stream``
-- the default for a quantized base on CUDA -- built layer by layer and quantized as
read, so a 32B base fits one 80 GB GPU), build the policy and train
(:class:`quarl.rl.trainer.RLTrainer`), then write one artifact:

    kind "adapter" (policy.mode=lora)         kind "model" (policy.mode=full)
        adapter_config.json                      config.json, model.safetensors,
        adapter_model.safetensors  (PEFT)        tokenizer files
        quant_recipe.json  -- the base quantization the adapter was trained on
    and in both:
        metrics.jsonl, samples.jsonl, summary.json, config.yaml (resolved),
        report.md, report.html, tensorboard/

The PEFT files sit at the artifact root, so ``PeftModel.from_pretrained(base, dir)``
and vLLM's LoRA loader take the artifact directory as is. The adapter was trained
against the *quantized* base named in ``quant_recipe.json``; evaluation should
rebuild that policy (``quantize_model`` with the recipe, then ``load_adapter``).

Work directory and checkpoints. Training state lives beside the output so an
interrupted stage resumes: for a local output ``<output>.work/`` (checkpoints in
``<output>.work/checkpoints``); for ``s3://`` outputs the work directory is in the
local cache and each checkpoint is mirrored to ``<output>.checkpoints/`` in the
bucket -- a fresh pod (a retried Kubeflow step) finds it there and continues.
A complete artifact at the output is never overwritten unless ``overwrite=True``,
and that is checked *before* training, not after hours of it.

Under ``torchrun`` (``WORLD_SIZE > 1``; docs/distributed.md) the stage joins the process
group, every rank loads the model and data (rank 0 first, so a shared cache is filled
once) and trains its share (:class:`RLTrainer`), and rank 0 alone writes the artifact;
the other ranks return ``{"complete": True, "rank": r, "output_uri": None}``. A sharded
full-parameter policy is gathered to rank 0 first (its CPU memory holds the whole model
once).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from quarl.artifacts import open_artifact, write_artifact
from quarl.config import dump_config
from quarl.rl.config import RLConfig
from quarl.rl.report import summarize, write_report
from quarl.rl.trainer import RLTrainer
from quarl.train.distributed import Dist, distributed
from quarl.train.metrics import read_metrics
from quarl.train.outputs import checkpoint_remote_for, refuse_existing, work_dir_for
from quarl.train.policy import load_policy_model, resolve_device, resolve_dtype

log = logging.getLogger(__name__)
STAGE = "rl"


def run_rl(cfg: RLConfig, *, model_uri: str, data_uri: str, output_uri: str, init_adapter_uri: str | None = None,
           overwrite: bool = False, stop_after: int | None = None) -> dict:
    """Train with GRPO/DAPO and write the adapter (or full model) artifact. Returns a result dict.

    ``stop_after`` ends the run early after that many steps (a checkpoint is left,
    no artifact is written) -- for tests and for splitting long runs into jobs.
    Under torchrun every rank calls it (the module docstring says who does what).
    """
    with distributed(cfg.train.device) as d:
        return _run_rl(cfg, d, model_uri=model_uri, data_uri=data_uri, output_uri=output_uri,
                       init_adapter_uri=init_adapter_uri, overwrite=overwrite, stop_after=stop_after)


def warn_fp8_dense(cfg: RLConfig) -> bool:
    """Warn (and return True) when ``QUARL_KERNELS_DENSE_FP8`` is on without a rollout importance-sampling correction:
    the FP8 dense path moves the trainer's log-probs away from the rollout's weight-only decode (5x the mean
    |delta log-prob| on SmolLM2, benchmarks/RESULTS.md "Issue 17, session 18"), which verl's TIS / MIS knobs
    (``precision.rollout_is_threshold``) correct. The switch is read as the kernels read it (a bad value stops here)."""
    try:
        from quarl_kernels.env import env_flag
    except ImportError:  # no kernels package: the switch does nothing
        return False
    if env_flag("QUARL_KERNELS_DENSE_FP8", False) and cfg.precision.rollout_is_threshold is None:
        log.warning("QUARL_KERNELS_DENSE_FP8 is on: the 4-bit base's large-M GEMMs run in FP8 (activations "
                    "quantized), so the trainer's log-probs differ more from the rollout's; consider "
                    "precision.rollout_is_threshold=2.0 (truncated importance sampling) for this run")
        return True
    return False


def _run_rl(cfg: RLConfig, d: Dist, *, model_uri: str, data_uri: str, output_uri: str, init_adapter_uri: str | None,
            overwrite: bool, stop_after: int | None) -> dict:
    from quarl.data import read_split

    t0 = time.time()
    cfg = cfg.resolved()
    warn_fp8_dense(cfg)
    refuse_existing(output_uri, overwrite)
    device = d.device(resolve_device(cfg.train.device))
    dtype = resolve_dtype(cfg.policy.dtype, device)
    with d.main_first():  # downloads into the node's cache happen once
        df = read_split(data_uri, cfg.train.split)
        init_dir = open_artifact(init_adapter_uri, kind="adapter").path if init_adapter_uri else None
        # full parameters on several ranks: loaded on the CPU, FSDP2 moves each rank's shard to the GPU
        home = torch.device("cpu") if d.enabled and cfg.policy.mode == "full" else device
        # policy.load: a quantized base on CUDA is built layer by layer, each layer packed as it is read
        # (quarl.quant.stream), so a 32B model never exists in BF16 -- the difference between fitting one 80 GB
        # GPU and not. build_policy then only adds LoRA; the policy is the one the dense load gives.
        t_load = time.time()
        model, tokenizer, load_how = load_policy_model(model_uri, cfg.policy, home, dtype)
        t_load = time.time() - t_load
    if df.empty:
        raise ValueError(f"{data_uri}: the {cfg.train.split!r} split is empty; re-run data-prep with more data")
    work = work_dir_for(output_uri)
    trainer = RLTrainer(cfg, model, tokenizer, df["prompt"].tolist(), df["answer"].astype(str).tolist(), work,
                        checkpoint_remote=checkpoint_remote_for(output_uri), init_adapter=init_dir, dist=d)
    policy_format = _policy_format(trainer.model, cfg)
    summary = trainer.train(stop_after=stop_after)
    summary.update({"policy_load": load_how, "policy_load_build": getattr(model, "quarl_load", None),
                    "policy_load_s": round(t_load, 2)})
    if summary["end_step"] < summary["total_steps"] and not summary["timed_out"]:
        log.info("stopped after step %d of %d; checkpoint %s", summary["end_step"], summary["total_steps"],
                 summary["last_checkpoint"])
        return {"output_uri": None, "complete": False, **summary}
    out_model = trainer.model
    if trainer.sharded:  # FSDP2: the whole policy on rank 0 (a collective), loaded into a plain copy there
        out_model = _gathered_policy(trainer, cfg, model_uri, dtype, d)
    result = d.on_main(lambda: _write(cfg, trainer, out_model, tokenizer, summary, work, policy_format, t0,
                                      model_uri=model_uri, data_uri=data_uri, output_uri=output_uri,
                                      init_adapter_uri=init_adapter_uri, overwrite=overwrite), "rl artifact")
    return result or {"output_uri": None, "complete": True, "rank": d.rank, **summary}


def _gathered_policy(trainer: RLTrainer, cfg: RLConfig, model_uri: str, dtype, d: Dist):
    """The FSDP-sharded full policy as one plain model on rank 0's CPU (None elsewhere)."""
    from quarl.models import load_model
    from quarl.train.fsdp import full_state_dict
    from quarl.train.policy import build_policy

    sd = full_state_dict(trainer.model)
    if not d.is_main:
        return None
    plain, _ = load_model(model_uri, dtype=dtype, device="cpu")
    build_policy(plain, cfg.policy)
    plain.load_state_dict(sd)
    return plain


def _write(cfg: RLConfig, trainer: RLTrainer, out_model, tokenizer, summary: dict, work: Path, policy_format: str,
           t0: float, *, model_uri: str, data_uri: str, output_uri: str, init_adapter_uri: str | None,
           overwrite: bool) -> dict:
    """Rank 0: the artifact."""
    from quarl.models import save_model
    from quarl.quant import save_adapter

    rows = read_metrics(work / "metrics.jsonl")
    summary.update(summarize(rows))
    summary.update({"model_uri": model_uri, "data_uri": data_uri, "init_adapter_uri": init_adapter_uri,
                    "algo": cfg.algo.algo, "policy_mode": cfg.policy.mode, "policy_format": policy_format,
                    "policy_format_requested": cfg.policy.format, "wall_s": time.time() - t0})
    kind = "adapter" if cfg.policy.mode == "lora" else "model"
    inputs = [model_uri, data_uri] + ([init_adapter_uri] if init_adapter_uri else [])
    with write_artifact(output_uri, kind, STAGE, config=cfg, inputs=inputs, overwrite=overwrite) as art:
        if kind == "adapter":
            save_adapter(out_model, art.path, base_model_name_or_path=str(model_uri))
            (art.path / "quant_recipe.json").write_text(json.dumps(getattr(out_model, "quarl_recipe", {}), indent=2))
        else:
            save_model(out_model, tokenizer, art.path)
        for name in ("metrics.jsonl", "samples.jsonl"):
            if (work / name).exists():
                (art.path / name).write_bytes((work / name).read_bytes())
        _copy_tree(work / "tensorboard", art.path / "tensorboard")
        dump_config(cfg, art.path / "config.yaml")
        (art.path / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        title = f"quarl RL: {cfg.algo.algo.upper()} {cfg.policy.mode} {policy_format} on {model_uri}"
        write_report(art.path, rows, summary, title=title)
        art.metadata.update({"algo": cfg.algo.algo, "policy_format": policy_format,
                             "steps": summary["total_steps"],
                             "reward_last": rows[-1].get("reward/mean") if rows else None,
                             "accuracy_last": rows[-1].get("reward/accuracy") if rows else None})
    return {"output_uri": output_uri, "kind": kind, "complete": True, "work_dir": str(work), **summary}


def _policy_format(model, cfg: RLConfig) -> str:
    """The base format the policy actually trains on, warning when it is not ``policy.format``.

    A calibrated checkpoint keeps its own format (re-quantizing it would throw the
    calibration away), so ``policy.format`` is only a request; the artifact must say what
    was used. Mixed formats are joined with "+" (e.g. ``int8-g64+nvfp4``)."""
    from quarl.quant.model import quantized_formats
    from quarl.quant.spec import make_config, spec_string

    if cfg.policy.mode == "full":
        return "bf16"
    used = "+".join(quantized_formats(model)) or "bf16"
    if cfg.policy.quant_recipe is None:
        wanted = spec_string(make_config(cfg.policy.format))
        if used != wanted:
            log.warning("rl: the base model arrived quantized as %s but policy.format=%s; training on %s (the "
                        "checkpoint's format) and recording that. Set policy.format=%s, or pass an unquantized "
                        "model to quantize it to %s.", used, cfg.policy.format, used, used, cfg.policy.format)
    return used


def _copy_tree(src: Path, dst: Path) -> None:
    if not src.is_dir():
        return
    for p in src.rglob("*"):
        if p.is_file():
            q = dst / p.relative_to(src)
            q.parent.mkdir(parents=True, exist_ok=True)
            q.write_bytes(p.read_bytes())
