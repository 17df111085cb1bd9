"""The calibrate stage: full-precision model + calibration text -> quantized model artifact.

    run_calibrate(cfg, model_uri=..., data_uri=None, recipe_uri=None, output_uri=...) -> metrics

1. resolve the recipe: ``recipe_uri`` (a YAML/JSON file, or a ``recipe``
   artifact written by a precision search) > ``cfg.recipe`` (inline) >
   ``{default: cfg.format}``; plan the format of every linear layer;
2. build calibration windows (``quarl.calibrate.data``) and, separately,
   held-out windows;
3. calibrate block by block (``quarl.calibrate.sequential``) with RTN, GPTQ,
   AWQ or AWQ+GPTQ;
4. measure: per-layer relative reconstruction error on the calibration inputs,
   KL to the full-precision model and perplexity on the held-out windows,
   memory by format;
5. write a ``model`` artifact: the compressed-tensors checkpoint
   (``quarl.quant.checkpoint``), ``metrics.json`` and ``report.md``.

The full-precision reference for the metrics is loaded again from
``model_uri`` after calibration (calibration replaces the layers in place), so
peak memory is two models only while the held-out metrics run. With
``offload=cpu`` (sequential onloading, :mod:`quarl.calibrate.onload`; ``auto``
picks it when the model would not fit the GPU) the model stays on the host,
calibrated one decoder block at a time on the device, and the held-out metrics
are measured block by block inside that loop: no reference copy anywhere. When
the model is a checkpoint on disk (or in S3) the host does not hold it whole
either: its dense blocks are read one at a time, just before their turn
(:mod:`quarl.calibrate.streaming`); other sources are loaded whole, logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import torch

from quarl import devices
from quarl.calibrate.config import CalibrateConfig
from quarl.calibrate.data import (
    CalibrationDataError,
    batches,
    make_windows,
    read_artifact_split,
    read_text_file,
    shuffled,
)  # fmt: skip
from quarl.calibrate.metrics import compare_models
from quarl.calibrate.onload import Onloader, choose_offload, dense_bytes_of, estimate_dense_bytes
from quarl.calibrate.sequential import calibrate_model
from quarl.calibrate.streaming import StreamedModel, stream_source
from quarl.devices import DTYPES
from quarl.quant.base import QuantError
from quarl.quant.checkpoint import CheckpointError, save_quantized
from quarl.quant.model import QuantRecipe, memory_report, plan_formats
from quarl.quant.spec import spec_string

log = logging.getLogger(__name__)
STAGE = "calibrate"


def resolve_device(name: str) -> torch.device:
    return devices.resolve_device(name, error=QuantError)


def resolve_config(cfg: CalibrateConfig, device: torch.device) -> CalibrateConfig:
    """Fill the device-dependent ``None`` sizes (QeRL's 256 x 2048 on GPU, 32 x 256 on CPU)."""
    gpu = device.type == "cuda"
    data = dataclasses.replace(
        cfg.data,
        num_samples=cfg.data.num_samples or (256 if gpu else 32),
        seq_len=cfg.data.seq_len or (2048 if gpu else 256),
    )
    ev = dataclasses.replace(cfg.eval, seq_len=cfg.eval.seq_len or data.seq_len)
    return dataclasses.replace(cfg, data=data, eval=ev)


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise QuantError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}") from None


def load_recipe(cfg: CalibrateConfig, recipe_uri: str | None) -> QuantRecipe:
    """recipe_uri (a local or s3:// YAML/JSON file, or a recipe artifact) > cfg.recipe > {default: cfg.format}."""
    if recipe_uri and str(recipe_uri).startswith("s3://") and str(recipe_uri).endswith((".yaml", ".yml", ".json")):
        import yaml

        from quarl.storage import S3Store

        data = yaml.safe_load(S3Store().get_bytes(str(recipe_uri)).decode("utf-8")) or {}
        recipe = QuantRecipe.load(data)
    elif recipe_uri:
        path = Path(recipe_uri)
        if str(recipe_uri).startswith("s3://") or (path.is_dir() and (path / "manifest.json").exists()):
            from quarl.artifacts import open_artifact

            root = open_artifact(recipe_uri, kind="recipe").path
            cands = [root / n for n in ("recipe.yaml", "recipe.yml", "recipe.json")] + sorted(root.glob("*.yaml"))
            path = next((c for c in cands if c.is_file()), None)
            if path is None:
                raise QuantError(f"recipe artifact {recipe_uri} holds no recipe.yaml/recipe.json")
        recipe = QuantRecipe.load(path)
    elif cfg.recipe is not None:
        recipe = QuantRecipe.load(dict(cfg.recipe))
    else:
        recipe = QuantRecipe.load({"default": cfg.format})
    if recipe.mode != "frozen":
        raise QuantError(
            f"calibration produces frozen quantized weights; the recipe says mode={recipe.mode!r} "
            f"(QAT belongs to the training stages) -- set mode: frozen"
        )
    if recipe.act_quant:
        raise QuantError(
            f"act_quant={recipe.act_quant!r} is applied at training/rollout time, not stored by "
            f"weight calibration; remove it from the calibration recipe"
        )
    if recipe.lora:
        log.warning("calibrate: ignoring the recipe's lora section (adapters are attached by the RL stage)")
        recipe = dataclasses.replace(recipe, lora=None)
    return recipe


def _texts(cfg: CalibrateConfig, data_uri: str | None) -> tuple[list[str], list[str] | None, dict]:
    """(calibration documents, held-out documents or None, provenance)."""
    d, e = cfg.data, cfg.eval
    src: dict = {}
    root = None
    if data_uri:
        from quarl.artifacts import open_artifact

        root = open_artifact(data_uri, kind="dataset").path
        calib = read_artifact_split(root, d.split, d.columns)
        src["calibration"] = f"{data_uri} [{d.split}] columns={d.columns}"
    elif d.path:
        calib = read_text_file(d.path, d.text_field)
        src["calibration"] = f"{d.path} (field {d.text_field!r})" if not d.path.endswith(".txt") else d.path
    else:
        raise CalibrationDataError(
            "calibration needs text (only method=rtn runs without it): pass a data_prep artifact (data_uri / --data) or set "
            "data.path to a local .txt/.jsonl/.json/.parquet file"
        )
    calib = shuffled(calib, d.seed)
    held = None
    if e.enabled:
        if e.path:
            held = read_text_file(e.path, e.text_field)
            src["held_out"] = f"{e.path} (field {e.text_field!r})"
        elif root is not None:
            try:
                held = read_artifact_split(root, e.split, e.columns)
                src["held_out"] = f"{data_uri} [{e.split}] columns={e.columns}"
            except CalibrationDataError:
                held = None
        if held is None:
            k = max(1, int(len(calib) * e.holdout_fraction))
            if len(calib) - k < 1:
                raise CalibrationDataError("too little calibration text to hold any out; set eval.path or add data")
            calib, held = calib[:-k], calib[-k:]
            src["held_out"] = f"last {k} of the shuffled calibration documents (not used for calibration)"
    return calib, held, src


def _report(metrics: dict) -> str:
    c, q = metrics["calibration"], metrics.get("quality", {})
    lines = [
        f"# Calibration: {c['method']} -> {c['recipe_default']}",
        "",
        f"- model: `{metrics['inputs']['model']}`",
        f"- calibration data: {c['data']['calibration']} -- {c['windows']} x {c['seq_len']} tokens",
        f"- held-out data: {c['data'].get('held_out', 'none')}",
        f"- device: {c['device']}, wall time {c['seconds']:.1f} s",
        "",
    ]
    if q:
        lines += ["## Quality on held-out text", "", "| metric | value |", "|---|---|"]
        for k in ("kl", "ppl", "ref_ppl", "kl_max_token", "tokens"):
            if k in q:
                v = q[k]
                lines.append(f"| {k} | {v:.5g} |" if isinstance(v, float) else f"| {k} | {v} |")
        lines.append("")
    m = metrics["memory"]
    lines += ["## Memory by format", "", "| format | params | MiB | bits/param |", "|---|---:|---:|---:|"]
    for f, r in sorted(m["by_format"].items()):
        lines.append(f"| {f} | {r['params']:,} | {r['bytes'] / 2**20:.2f} | {r['bits_per_param']:.3f} |")
    lines += [
        f"| total | {m['total_params']:,} | {m['total_bytes'] / 2**20:.2f} | |",
        "",
        "## Per-layer relative reconstruction error ||WX - Q(W)X||^2 / ||WX||^2",
        "",
        "| layer | format | method | rel. error | AWQ alpha |",
        "|---|---|---|---:|---:|",
    ]
    for r in metrics["layers"]:
        a = "" if r["awq_alpha"] is None else f"{r['awq_alpha']:.2f}"
        lines.append(f"| {r['name']} | {r['format']} | {r['method']} | {r['rel_error']:.3e} | {a} |")
    return "\n".join(lines) + "\n"


def run_calibrate(
    cfg: CalibrateConfig,
    *,
    model_uri: str,
    data_uri: str | None = None,
    recipe_uri: str | None = None,
    output_uri: str,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Calibrate ``model_uri`` and write a quantized ``model`` artifact to ``output_uri``; returns metrics."""
    with devices.cpu_threads(cfg.threads):
        return _run_calibrate(cfg, model_uri=model_uri, data_uri=data_uri, recipe_uri=recipe_uri,
                              output_uri=output_uri, overwrite=overwrite, progress=progress)


def _run_calibrate(cfg: CalibrateConfig, *, model_uri: str, data_uri: str | None, recipe_uri: str | None,
                   output_uri: str, overwrite: bool, progress: bool) -> dict:
    from quarl.artifacts import write_artifact
    from quarl.models import load_model

    device = resolve_device(cfg.device)
    cfg = resolve_config(cfg, device)
    dtype = _dtype(cfg.dtype)
    recipe = load_recipe(cfg, recipe_uri)
    inputs = [u for u in (model_uri, data_uri, recipe_uri) if u]
    mode, reason, dense, local = _offload_mode(cfg, model_uri, dtype, device)
    with write_artifact(output_uri, "model", STAGE, config=cfg, inputs=inputs, overwrite=overwrite) as art, \
            contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        streamed, stream_why = None, "offload is not cpu"
        if mode == "cpu":  # the dense blocks straight from the checkpoint, one at a time (quarl.calibrate.streaming)
            src = stream_source(model_uri, local)
            stream_why = src.reason
            if src.path is not None:
                try:
                    streamed = stack.enter_context(StreamedModel.open(src.path, dtype))
                except CheckpointError as e:  # names/shapes the reader cannot map: load_model may (or says why)
                    stream_why = str(e)
            if streamed is not None:
                log.info("calibrate: streaming the dense decoder blocks from %s (host: stem + one dense block + "
                         "the packed blocks)", src.path)
            else:
                log.warning("calibrate: offload=cpu cannot stream %s from disk (%s): loading the whole dense model "
                            "on the host", model_uri, stream_why)
        if streamed is not None:
            model, tok = streamed.model, streamed.tokenizer
        else:
            model, tok = load_model(model_uri, dtype=dtype, device=device if mode == "none" else "cpu")
        model.eval()
        if mode is None:  # size unknown before loading (an s3:// model): measured on the host, then decided
            dense = dense_bytes_of(model)
            mode, reason = choose_offload("auto", device, dense, torch.cuda.mem_get_info(device)[0],
                                          copies=2 if cfg.eval.enabled else 1)
            reason += " (sized after loading on the host)"
            if mode == "none":
                model.to(device)
        onload = Onloader(device) if mode == "cpu" else None
        log.info("calibrate: offload=%s (%s); model %s", mode, reason,
                 "on the host, one block at a time on " + str(device) if onload else "on " + str(device))
        plan = plan_formats(model, recipe)
        if not plan or all(c is None for c in plan.values()):
            raise QuantError("the recipe quantizes no linear layer: check its default/overrides/exclude")
        if cfg.method == "rtn" and not data_uri and not cfg.data.path:  # weights only: no text needed
            held_docs = read_text_file(cfg.eval.path, cfg.eval.text_field) if cfg.eval.enabled and cfg.eval.path else None
            provenance = {"calibration": "none (rtn quantizes the weights alone)"}
            windows = torch.empty(0, cfg.data.seq_len, dtype=torch.long)
        else:
            calib_docs, held_docs, provenance = _texts(cfg, data_uri)
            windows = make_windows(calib_docs, tok, cfg.data.num_samples, cfg.data.seq_len)
        if 0 < windows.shape[0] < cfg.data.num_samples:
            log.warning(
                "calibrate: only %d of %d windows of %d tokens available",
                windows.shape[0],
                cfg.data.num_samples,
                cfg.data.seq_len,
            )
        held = None if held_docs is None else make_windows(held_docs, tok, cfg.eval.num_samples, cfg.eval.seq_len)
        result = calibrate_model(
            model,
            plan,
            batches(windows, cfg.data.batch_size),
            method=cfg.method,
            gptq=dataclasses.asdict(cfg.gptq),
            awq=dataclasses.asdict(cfg.awq),
            propagate_quantized=cfg.propagate_quantized,
            progress=progress,
            onload=onload,  # offloaded: the held-out check runs block by block inside the loop
            held_out=held if onload else None,
            held_out_batch_size=cfg.eval.batch_size,
            fill=streamed.fill_block if streamed is not None else None,
        )
        quality: dict = result.quality
        if held is not None and not onload:  # two whole models on the device, as before offload existed
            ref, _ = load_model(model_uri, dtype=dtype, device=device)
            quality = compare_models(model, ref.eval(), held, cfg.eval.batch_size)
            del ref
        mem = memory_report(model)
        errs = [r.rel_error for r in result.layers if r.method != "none" and math.isfinite(r.rel_error)]
        metrics = {
            "stage": STAGE,
            "inputs": {"model": model_uri, "data": data_uri, "recipe": recipe_uri},
            "calibration": {
                "method": cfg.method,
                "recipe_default": spec_string(plan_default(recipe)),
                "windows": int(windows.shape[0]),
                "seq_len": int(windows.shape[1]),
                "device": str(device),
                "dtype": cfg.dtype,
                "seconds": result.seconds,
                "data": provenance,
                "gptq": dataclasses.asdict(cfg.gptq) if cfg.method.endswith("gptq") else None,
                "awq": dataclasses.asdict(cfg.awq) if cfg.method.startswith("awq") else None,
                "offload": {
                    "mode": mode,
                    "requested": cfg.offload,
                    "reason": reason,
                    "dense_bytes": dense,
                    "peak_device_bytes": result.peak_device_bytes,
                    "block_peak_device_bytes": result.block_peaks,
                    "streamed": streamed is not None,
                    "stream_reason": "" if streamed is not None else stream_why,
                    "host_peak_materialized_bytes": streamed.peak_bytes if streamed is not None else None,
                },
            },
            "quality": quality,
            "rel_error": {"mean": sum(errs) / len(errs) if errs else None, "max": max(errs) if errs else None},
            "memory": mem,
            "layers": [dataclasses.asdict(r) for r in result.layers],
            "awq_scales": result.awq,
        }
        save_quantized(
            model,
            tok,
            art.path,
            max_shard_size=cfg.max_shard_size,
            dtype=_dtype(cfg.save_dtype),
            extra={"method": cfg.method, "recipe": recipe.to_dict(), "source_model": model_uri},
        )
        (art.path / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        (art.path / "report.md").write_text(_report(metrics))
        metrics["calibration"]["total_seconds"] = time.perf_counter() - t0
        art.metadata["metrics"] = {k: quality[k] for k in ("kl", "ppl", "ref_ppl") if k in quality}
        art.metadata["method"] = cfg.method
    log.info("calibrate: %s -> %s (%s)", model_uri, output_uri, metrics["quality"] or "no held-out metrics")
    return metrics


def _offload_mode(cfg: CalibrateConfig, model_uri: str, dtype: torch.dtype,
                  device: torch.device) -> tuple[str | None, str, int | None, Path | None]:
    """(cpu | none | None, why, the dense size estimated from the checkpoint, the local directory of an
    ``s3://`` model): ``offload`` resolved before any weight is read (quarl.calibrate.onload). An ``s3://``
    model that may be offloaded is downloaded (and verified) here, once, to be sized from its headers
    and streamed from disk. ``None``: ``auto`` on CUDA with a size that cannot be read (the model is
    then loaded on the host and sized there)."""
    local = None
    if str(model_uri).lower().startswith("s3://") and (cfg.offload == "cpu" or
                                                     (cfg.offload == "auto" and device.type == "cuda")):
        from quarl.models import resolve_model_dir

        local = resolve_model_dir(model_uri)  # to disk, not memory; load_model would download it the same way
    if cfg.offload != "auto" or device.type != "cuda":
        mode, reason = choose_offload(cfg.offload, device, None, None)
        return mode, reason, None, local
    dense = estimate_dense_bytes(str(local) if local is not None else model_uri, dtype)
    if dense is None:
        return None, "", None, local
    free = torch.cuda.mem_get_info(device)[0]
    mode, reason = choose_offload("auto", device, dense, free, copies=2 if cfg.eval.enabled else 1)
    return mode, reason, dense, local


def plan_default(recipe: QuantRecipe):
    from quarl.quant.spec import make_config

    return make_config(recipe.default)
