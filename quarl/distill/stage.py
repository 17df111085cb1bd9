"""``run_distill`` / ``run_kd_coldstart``: teacher + calibrated student + data in, one quantized model out.

    run_distill(cfg, model_uri="runs/r1/calibrate/model", data_uri="runs/r1/data_prep/dataset",
                output_uri="runs/r1/distill/model", teacher_uri="default") -> dict

Flow:

1. load the teacher (``teacher_uri``; default: the model the student was
   calibrated from, as its ``quarl_quantization.json`` records) and the student
   (``model_uri``: a calibrate artifact, or a full-precision model that is RTN-
   quantized here), and **check the pairing** (same vocabulary and tokenizer)
   before any other work;
2. training sequences from ``data.source`` (quarl.distill.data); a generated set
   is kept in the work directory (a resumed run reuses it) and published as a
   ``dataset`` artifact at ``<output>.data`` for other runs to train on;
   held-out text is the dataset's eval split;
3. eval before (held-out KL/CE; greedy held-out accuracy), train
   (quarl.distill.trainer, checkpoints beside the output as in the rl stage),
   re-quantize the student into its format, eval after on the *re-quantized*
   model (what is shipped is what is measured);
4. one ``model`` artifact: the compressed-tensors checkpoint (the rl, eval and
   export stages load it like a calibrate output), ``metrics.jsonl``,
   ``summary.json``, ``config.yaml``, ``report.md`` and ``curves.png``.

Under ``torchrun`` (``WORLD_SIZE > 1``; docs/distributed.md) every rank loads teacher and
student (rank 0 first, filling a shared cache once); rank 0 alone builds the training
sequences (generating them with the teacher if asked) and hands them to the others,
every rank trains its share (:class:`~quarl.distill.trainer.DistillTrainer`: LoRA
replicated, QAT sharded with FSDP2), and rank 0 alone measures greedy accuracy,
re-quantizes, evaluates and writes the artifact. A sharded QAT student is gathered to
rank 0 and loaded into a freshly built copy there (the teacher, which never changes, is
loaded again); the other ranks return ``{"complete": True, "rank": r, "output_uri": None}``.

``kd_coldstart`` is this stage under Reasoning-QAT's defaults
(:class:`~quarl.distill.config.KDColdStartConfig`); its model is what the rl
stage starts from (the rl stage adds LoRA to a calibrated-format checkpoint).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

from quarl.artifacts import open_artifact, write_artifact
from quarl.config import dump_config
from quarl.distill.config import DistillConfig, KDColdStartConfig
from quarl.distill.data import (
    CONTENT,
    FILE,
    Sequences,
    generate_sequences,
    is_sequence_artifact,
    load_sequences,
    random_sequences,
    save_sequences,
    sft_sequences,
)
from quarl.distill.report import write_report
from quarl.distill.student import build_student, check_pairing, finalize_student
from quarl.distill.trainer import DistillTrainer
from quarl.train.distributed import Dist, distributed
from quarl.train.metrics import read_metrics
from quarl.train.outputs import checkpoint_remote_for, refuse_existing, work_dir_for
from quarl.train.policy import resolve_device, resolve_dtype

log = logging.getLogger(__name__)


def _source_model(model_uri: str) -> str | None:
    """The model a calibrate artifact was quantized from (its quarl_quantization.json), else None."""
    try:
        path = open_artifact(model_uri, kind="model", verify=False).path
    except Exception:  # noqa: BLE001 - not an artifact (an HF id, 'default', a plain directory)
        p = Path(str(model_uri))
        path = p if p.is_dir() else None
    meta = path / "quarl_quantization.json" if path is not None else None
    if meta is not None and meta.is_file():
        return json.loads(meta.read_text()).get("source_model")
    return None


def heldout_accuracy(model, tokenizer, prompts: list[str], answers: list[str], max_new_tokens: int,
                     batch_size: int = 16) -> float:
    """Greedy answers to held-out prompts, scored by quarl.rewards accuracy (a frozen copy of a QAT model)."""
    from quarl.eval.config import SamplingConfig
    from quarl.eval.generate import sample_completions
    from quarl.quant import QuantLinear
    from quarl.rewards import RewardFn

    if any(isinstance(m, QuantLinear) and (m.mode == "qat" or m.lora_cfg is not None) for m in model.modules()):
        model = copy.deepcopy(model)
        finalize_student(model)  # what would ship: packed weights, no fake-quant in every decode step
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.mode == "frozen":
            m.cache_dequantized = True
    was = model.training
    model.eval()
    try:
        comps, _ = sample_completions(model, tokenizer, prompts,
                                      SamplingConfig(greedy=True, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                     engine="reference", cache="dynamic"), desc="accuracy", progress=False)
    finally:
        model.train(was)
        for m in model.modules():
            if isinstance(m, QuantLinear):
                m.cache_dequantized, m._wcache = False, None
    acc = RewardFn().components([c[0].text for c in comps], answers)["accuracy"]
    return float(sum(acc) / max(len(acc), 1))


def _train_sequences(cfg: DistillConfig, data_uri: str, tokenizer, teacher, work: Path, vocab: int):
    """(training Sequences, held-out Sequences, eval prompts, eval answers, generated?)"""
    art = open_artifact(data_uri, kind="dataset")
    d, e = cfg.data, cfg.eval
    if is_sequence_artifact(art):  # a generated set saved by an earlier run: train on exactly it
        seqs = load_sequences(art.file(FILE))
        k = min(e.num_sequences, max(1, len(seqs) // 10))
        held = Sequences(seqs.ids[-k:], seqs.prompt_len[-k:], "heldout (last sequences of the set)")
        train = Sequences(seqs.ids[:-k], seqs.prompt_len[:-k], f"tokens ({seqs.source})")
        if d.num_sequences:
            train = Sequences(train.ids[:d.num_sequences], train.prompt_len[:d.num_sequences], train.source)
        return train, held, [], [], False
    from quarl.data import read_dataset

    frames = read_dataset(data_uri)
    df = frames[d.split]
    ev = frames.get(e.split)
    if ev is None or ev.empty:
        raise ValueError(f"{data_uri}: the {e.split!r} split is empty; distillation needs held-out text for its KL "
                         f"curve -- give data_prep an eval split or set eval.split=train")
    held = sft_sequences(ev, tokenizer, d.text_columns, e.seq_len, e.num_sequences)
    acc_prompts = ev["prompt"].astype(str).tolist()[:e.accuracy_samples]
    acc_answers = ev["answer"].astype(str).tolist()[:e.accuracy_samples]
    if d.source == "sft":
        return sft_sequences(df, tokenizer, d.text_columns, d.seq_len, d.num_sequences), held, acc_prompts, \
            acc_answers, False
    if d.source == "tokens":
        raise ValueError(f"data.source=tokens needs a saved sequence set as the data input; {data_uri} is a "
                         f"data_prep dataset (use data.source=sft, teacher, teacher_correct, bos or random)")
    cached = work / "generated.parquet"
    if cached.exists():  # a resumed run trains on the set it generated before the interruption
        return load_sequences(cached), held, acc_prompts, acc_answers, True
    n = d.num_sequences or len(df)
    if d.source == "random":
        seqs = random_sequences(vocab, n, d.seq_len, cfg.train.seed)
    elif d.source == "bos":
        seqs = generate_sequences(teacher, tokenizer, cfg.data, cfg.train.seed)
    else:
        sub = df.head(n)
        seqs = generate_sequences(teacher, tokenizer, cfg.data, cfg.train.seed, sub["prompt"].astype(str).tolist(),
                                  sub["answer"].astype(str).tolist(), keep_correct=d.source == "teacher_correct")
    save_sequences(seqs, cached)
    (work / "generated.json").write_text(json.dumps(seqs.stats))
    return seqs, held, acc_prompts, acc_answers, True


def _publish_generated(cfg, seqs_path: Path, output_uri: str, inputs: list[str], stats: dict,
                       overwrite: bool) -> str:
    uri = f"{output_uri.rstrip('/')}.data"
    with write_artifact(uri, "dataset", "distill", config=cfg.data, inputs=inputs, overwrite=True) as art:
        (art.path / FILE).write_bytes(seqs_path.read_bytes())
        art.metadata.update({"content": CONTENT, "source": cfg.data.source, **stats})
    return uri


def run_distill(cfg: DistillConfig, *, model_uri: str, data_uri: str, output_uri: str, teacher_uri: str | None = None,
                overwrite: bool = False, stop_after: int | None = None, stage: str = "distill") -> dict:
    """Distill the quantized student from its teacher; write the re-quantized model artifact. Returns a result.

    Under torchrun every rank calls it (the module docstring says who does what)."""
    with distributed(cfg.train.device) as d:
        return _run_distill(cfg, d, model_uri=model_uri, data_uri=data_uri, output_uri=output_uri,
                            teacher_uri=teacher_uri, overwrite=overwrite, stop_after=stop_after, stage=stage)


def _run_distill(cfg: DistillConfig, d: Dist, *, model_uri: str, data_uri: str, output_uri: str,
                 teacher_uri: str | None, overwrite: bool, stop_after: int | None, stage: str) -> dict:
    from quarl.models import load_model
    from quarl.train.checkpoint import CheckpointManager

    t0 = time.time()
    timing: dict[str, float] = {}  # seconds per phase, in the summary (where a run's time goes)
    refuse_existing(output_uri, overwrite)
    device = d.device(resolve_device(cfg.train.device))
    dtype = resolve_dtype(cfg.student.dtype, device)
    t_dtype = dtype if cfg.teacher.dtype == "auto" else resolve_dtype(cfg.teacher.dtype, device)
    with d.main_first():  # downloads into the node's cache happen once
        teacher_uri = teacher_uri or _source_model(model_uri)
        if not teacher_uri:
            raise ValueError(f"no teacher: {model_uri} does not record the model it was quantized from; pass "
                             f"teacher_uri (CLI/component: teacher_model)")
        # a QAT student on several ranks: loaded on the CPU, FSDP2 moves each rank's shard to the GPU
        home = "cpu" if d.enabled and cfg.student.mode == "qat" else str(device)
        teacher, t_tok = load_model(teacher_uri, dtype=t_dtype, device=home)
        student, tok = load_model(model_uri, dtype=dtype, device=home)
    check_pairing(teacher, t_tok, student, tok)  # before any generation or training
    timing["load_s"] = time.time() - t0

    work = work_dir_for(output_uri, stage=stage)
    work.mkdir(parents=True, exist_ok=True)
    vocab = int(student.get_output_embeddings().weight.shape[0])
    data_out = None
    teacher_eval = {}
    acc_before = None
    t1 = time.time()
    if d.is_main:  # the sequences (maybe generated by the teacher) and the accuracy of the untrained models
        teacher.to(device)  # a CPU-loaded teacher (QAT on several ranks) generates on rank 0's GPU meanwhile
        train, held, acc_p, acc_a, generated = _train_sequences(cfg, data_uri, tok, teacher, work, vocab)
        timing["data_s"] = time.time() - t1
        t1 = time.time()
        if generated and cfg.data.save:
            stats = json.loads((work / "generated.json").read_text()) if (work / "generated.json").exists() else {}
            data_out = _publish_generated(cfg, work / "generated.parquet", output_uri, [teacher_uri, data_uri],
                                          stats, overwrite)
        if acc_p:
            teacher_eval["accuracy"] = heldout_accuracy(teacher, tok, acc_p, acc_a, cfg.eval.max_new_tokens)
        resuming = cfg.train.resume and CheckpointManager(work / "checkpoints",
                                                          checkpoint_remote_for(output_uri)).latest() is not None
        if acc_p and not resuming and d.enabled and cfg.student.mode == "qat":
            # the step-0 student, measured before FSDP2 shards it (a built copy; QAT set-up is deterministic)
            s0 = copy.deepcopy(student)
            build_student(s0, cfg.student)
            acc_before = heldout_accuracy(s0.to(device), tok, acc_p, acc_a, cfg.eval.max_new_tokens)
            del s0
        teacher.to(home)
    else:
        train = held = acc_p = acc_a = None
    train, held, acc_p, acc_a = d.broadcast_object((train, held, acc_p, acc_a))
    trainer = DistillTrainer(cfg, student, teacher, tok, train, held, work,
                             checkpoint_remote=checkpoint_remote_for(output_uri), dist=d)
    if d.is_main and acc_p and not trainer.sharded and not (cfg.train.resume and trainer.ckpt.latest()):
        acc_before = heldout_accuracy(trainer.model, tok, acc_p, acc_a, cfg.eval.max_new_tokens)  # step 0
    timing["accuracy_s"] = time.time() - t1
    t1 = time.time()
    summary = trainer.train(stop_after=stop_after)
    timing["loop_s"] = time.time() - t1  # steps + held-out evaluations + checkpoints (summary["timing"])
    if summary["end_step"] < summary["total_steps"]:
        return {"output_uri": None, "complete": False, **summary}
    if trainer.sharded:  # the whole student on rank 0 (a collective), in a plain copy; the teacher reloaded there
        _gather_to_main(trainer, cfg, model_uri, teacher_uri, dtype, t_dtype, device, d)

    result = d.on_main(lambda: _finish(cfg, trainer, tok, summary, work, t0, acc_before, teacher_eval, acc_p, acc_a,
                                       stage=stage, model_uri=model_uri, data_uri=data_uri, output_uri=output_uri,
                                       teacher_uri=teacher_uri, data_out=data_out, train=train,
                                       overwrite=overwrite, timing=timing), f"{stage} artifact")
    return result or {"output_uri": None, "complete": True, "rank": d.rank, **summary}


def _gather_to_main(trainer: DistillTrainer, cfg: DistillConfig, model_uri: str, teacher_uri: str, dtype, t_dtype,
                    device, d: Dist) -> None:
    """Replace the FSDP-sharded student/teacher by plain whole models on rank 0 (the others drop theirs)."""
    import torch

    from quarl.models import load_model
    from quarl.train.fsdp import full_state_dict

    sd = full_state_dict(trainer.model)
    trainer.model = trainer.teacher = trainer.optimizer = None  # free the shards before building the copies
    trainer.sharded = False
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not d.is_main:
        return
    plain, _ = load_model(model_uri, dtype=dtype, device="cpu")
    build_student(plain, cfg.student)
    plain.load_state_dict(sd)
    trainer.model = plain.to(device)
    trainer.teacher = load_model(teacher_uri, dtype=t_dtype, device=str(device))[0].eval().requires_grad_(False)


def _finish(cfg: DistillConfig, trainer: DistillTrainer, tok, summary: dict, work: Path, t0: float, acc_before,
            teacher_eval: dict, acc_p, acc_a, *, stage: str, model_uri: str, data_uri: str, output_uri: str,
            teacher_uri: str, data_out: str | None, train: Sequences, overwrite: bool, timing: dict) -> dict:
    """Rank 0: re-quantize, evaluate what ships, write the artifact."""
    from quarl.quant import QuantLinear
    from quarl.quant.checkpoint import save_quantized

    t1 = time.time()
    mem = finalize_student(trainer.model)  # re-quantize into the student's format
    for m in trainer.model.modules():  # frozen from here on: dequantize each layer once, not per forward
        if isinstance(m, QuantLinear):
            m.cache_dequantized = True
    after = trainer.evaluate(trainer.model, local=True)
    timing["requantize_eval_s"] = time.time() - t1
    t1 = time.time()
    acc_after = heldout_accuracy(trainer.model, tok, acc_p, acc_a, cfg.eval.max_new_tokens) if acc_p else None
    timing["accuracy_s"] = timing.get("accuracy_s", 0.0) + time.time() - t1
    # the teacher's held-out CE: known from the held-out teacher pass the evaluations share, except after an
    # FSDP2 run (the teacher was re-loaded whole on rank 0), where one local pass measures it
    teacher_eval["ce"] = (trainer.teacher_ce if trainer.teacher_ce is not None
                          else trainer.evaluate(trainer.teacher, local=True)["ce"])
    t1 = time.time()
    rows = read_metrics(work / "metrics.jsonl")
    summary.update({"eval_after": after, "accuracy_before": acc_before, "accuracy_after": acc_after,
                    "teacher_eval": teacher_eval, "model_uri": model_uri, "teacher_uri": teacher_uri,
                    "data_uri": data_uri, "data_source": train.source, "generated_data_uri": data_out,
                    "generated_stats": train.stats or None, "objective": cfg.loss.objective,
                    "memory_bytes": mem["total_bytes"], "wall_s": time.time() - t0, "phases": timing})
    inputs = [model_uri, data_uri, teacher_uri]
    with write_artifact(output_uri, "model", stage, config=cfg, inputs=inputs, overwrite=overwrite) as art:
        save_quantized(trainer.model, tok, art.path,
                       extra={"method": f"{stage}:{cfg.loss.objective}", "source_model": teacher_uri,
                              "student_init": model_uri})
        if (work / "metrics.jsonl").exists():
            (art.path / "metrics.jsonl").write_bytes((work / "metrics.jsonl").read_bytes())
        dump_config(cfg, art.path / "config.yaml")
        (art.path / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        title = f"quarl {stage}: {cfg.loss.objective} ({cfg.student.mode}) from {teacher_uri}"
        write_report(art.path, rows, summary, title)
        art.metadata.update({"objective": cfg.loss.objective, "steps": summary["total_steps"],
                             "kl_before": summary["eval_before"]["kl"], "kl_after": after["kl"]})
        timing["write_s"] = time.time() - t1  # the artifact's files (its upload follows when the block exits)
        log.info("%s: %s", stage, ", ".join(f"{k} {v:.1f}" for k, v in {**timing, **summary["timing"]}.items()))
    return {"output_uri": output_uri, "kind": "model", "complete": True, "work_dir": str(work), **summary}


def run_kd_coldstart(cfg: KDColdStartConfig, *, model_uri: str, data_uri: str, output_uri: str,
                     teacher_uri: str | None = None, overwrite: bool = False, stop_after: int | None = None) -> dict:
    """Reasoning-QAT's KD cold start: :func:`run_distill` under :class:`KDColdStartConfig` defaults."""
    return run_distill(cfg, model_uri=model_uri, data_uri=data_uri, output_uri=output_uri, teacher_uri=teacher_uri,
                       overwrite=overwrite, stop_after=stop_after, stage="kd_coldstart")


__all__ = ["heldout_accuracy", "run_distill", "run_kd_coldstart"]
