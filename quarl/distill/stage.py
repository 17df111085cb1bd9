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
from quarl.distill.student import check_pairing, finalize_student
from quarl.distill.trainer import DistillTrainer
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
    """Distill the quantized student from its teacher; write the re-quantized model artifact. Returns a result."""
    from quarl.models import load_model
    from quarl.quant import QuantLinear
    from quarl.quant.checkpoint import save_quantized

    t0 = time.time()
    timing: dict[str, float] = {}  # seconds per phase, in the summary (where a run's time goes)
    refuse_existing(output_uri, overwrite)
    teacher_uri = teacher_uri or _source_model(model_uri)
    if not teacher_uri:
        raise ValueError(f"no teacher: {model_uri} does not record the model it was quantized from; pass "
                         f"teacher_uri (CLI/component: teacher_model)")
    device = resolve_device(cfg.train.device)
    dtype = resolve_dtype(cfg.student.dtype, device)
    t_dtype = dtype if cfg.teacher.dtype == "auto" else resolve_dtype(cfg.teacher.dtype, device)
    teacher, t_tok = load_model(teacher_uri, dtype=t_dtype, device=str(device))
    student, tok = load_model(model_uri, dtype=dtype, device=str(device))
    check_pairing(teacher, t_tok, student, tok)  # before any generation or training
    timing["load_s"] = time.time() - t0

    work = work_dir_for(output_uri, stage=stage)
    work.mkdir(parents=True, exist_ok=True)
    vocab = int(student.get_output_embeddings().weight.shape[0])
    t1 = time.time()
    train, held, acc_p, acc_a, generated = _train_sequences(cfg, data_uri, tok, teacher, work, vocab)
    timing["data_s"] = time.time() - t1
    data_out = None
    if generated and cfg.data.save:
        stats = json.loads((work / "generated.json").read_text()) if (work / "generated.json").exists() else {}
        data_out = _publish_generated(cfg, work / "generated.parquet", output_uri, [teacher_uri, data_uri], stats,
                                      overwrite)

    teacher_eval = {}
    acc_before = None
    t1 = time.time()
    if acc_p:
        teacher_eval["accuracy"] = heldout_accuracy(teacher, tok, acc_p, acc_a, cfg.eval.max_new_tokens)
    trainer = DistillTrainer(cfg, student, teacher, tok, train, held, work,
                             checkpoint_remote=checkpoint_remote_for(output_uri))
    if acc_p and not (cfg.train.resume and trainer.ckpt.latest()):  # the step-0 student (before any update)
        acc_before = heldout_accuracy(trainer.model, tok, acc_p, acc_a, cfg.eval.max_new_tokens)
    timing["accuracy_s"] = time.time() - t1
    t1 = time.time()
    summary = trainer.train(stop_after=stop_after)
    timing["loop_s"] = time.time() - t1  # steps + held-out evaluations + checkpoints (summary["timing"])
    if summary["end_step"] < summary["total_steps"]:
        return {"output_uri": None, "complete": False, **summary}

    t1 = time.time()
    mem = finalize_student(trainer.model)  # re-quantize into the student's format
    for m in trainer.model.modules():  # frozen from here on: dequantize each layer once, not per forward
        if isinstance(m, QuantLinear):
            m.cache_dequantized = True
    after = trainer.evaluate(trainer.model)
    timing["requantize_eval_s"] = time.time() - t1
    t1 = time.time()
    acc_after = heldout_accuracy(trainer.model, tok, acc_p, acc_a, cfg.eval.max_new_tokens) if acc_p else None
    timing["accuracy_s"] += time.time() - t1
    teacher_eval["ce"] = trainer.teacher_ce  # from the held-out teacher pass every evaluation shares
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
