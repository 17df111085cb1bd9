"""The evaluation stage: a model (+ quantization, + adapter) on benchmarks -> one ``metrics`` artifact.

    run_eval(cfg: EvalConfig, *, model_uri, data_uris=None, adapter_uri=None, output_uri) -> dict

Flow: resolve the benchmark list (config + data URIs) -> read every benchmark
(bad paths, unknown names and empty sets fail here, before a model is loaded)
-> load the model as the config says (:mod:`.model`) -> per benchmark: render
prompts with the model's tokenizer, sample (:mod:`.generate`), score with the
RL reward's functions (:mod:`.scoring`) -> write the artifact (:mod:`.report`).

``data_uris`` binds data to benchmarks, so a pipeline can hand eval the
dataset artifact it just made:

* ``{"gsm8k": "/data/gsm8k/test.jsonl"}`` or ``["gsm8k=/data/...", ...]`` --
  name=URI sets that benchmark's path (adding it, from its preset, if the
  config does not list it);
* a bare URI: a data-prep ``dataset`` artifact becomes the ``heldout``
  benchmark (its eval split); a file whose path names a known benchmark
  (``.../gsm8k/test.jsonl``, ``math500.parquet``) becomes that one; anything
  else must be named.

With neither configured benchmarks nor data URIs the stage evaluates the
built-in generator's held-out split (the embedded default: no download).

Artifact (kind ``metrics``, stage ``eval``): ``metrics.json``,
``samples.jsonl``, ``report.md``, ``report.html`` (see :mod:`.report`); the
manifest carries the resolved config, the input URIs and a short
``metrics`` summary (accuracy and pass@k per benchmark).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import torch

from quarl.config import config_to_dict
from quarl.eval.benchmarks import Benchmark, EvalError, load_benchmark, render_prompts
from quarl.eval.config import BENCHMARK_PRESETS, BenchmarkConfig, EvalConfig, canonical_name
from quarl.eval.generate import sample_completions
from quarl.eval.model import load_eval_model
from quarl.eval.report import write_report
from quarl.eval.scoring import benchmark_metrics, score_samples

__all__ = ["STAGE", "resolve_benchmarks", "run_eval"]

STAGE = "eval"
log = logging.getLogger(__name__)


def _manifest(uri: str) -> dict | None:
    """The manifest at ``uri`` (local or s3), None if there is none or it is unreadable."""
    import json

    from quarl.storage import is_s3

    try:
        if is_s3(uri):
            from quarl.storage import NoSuchKeyError, S3Store

            try:
                raw = S3Store().get_bytes(uri.rstrip("/") + "/manifest.json")
            except NoSuchKeyError:
                return None
            return json.loads(raw)
        path = Path(uri).expanduser() / "manifest.json"
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def _is_dataset_artifact(uri: str) -> bool:
    m = _manifest(uri)
    return isinstance(m, dict) and m.get("kind") == "dataset"


def _name_for(uri: str) -> str:
    """The benchmark a bare data URI stands for (see module docstring)."""
    if _is_dataset_artifact(uri):
        return "heldout"
    low = uri.lower().replace("\\", "/")
    parts = [p for p in low.replace("s3://", "").replace("hf://", "").split("/") if p]
    for part in reversed(parts):  # the file name first, then its folders
        stem = part.split(".")[0]
        for cand in (stem, part):
            name = canonical_name(cand)
            if name in BENCHMARK_PRESETS and name != "heldout":
                return name
    raise EvalError(
        f"cannot tell which benchmark {uri} is; pass it as name=URI (e.g. gsm8k={uri}); known names: "
        f"{', '.join(BENCHMARK_PRESETS)}, or any name of your own for a custom file"
    )


def resolve_benchmarks(
    cfg: EvalConfig, data_uris: Sequence[str] | Mapping[str, str] | str | None
) -> list[BenchmarkConfig]:
    """The configured benchmarks with ``data_uris`` bound to them (module docstring)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(data_uris, str):
        data_uris = [data_uris]
    if isinstance(data_uris, Mapping):
        pairs = [(str(k), str(v)) for k, v in data_uris.items()]
    elif data_uris:
        for item in data_uris:
            item = str(item).strip()
            if not item:
                continue
            name, sep, uri = item.partition("=")
            if sep and "/" not in name and name.strip():
                pairs.append((name.strip(), uri.strip()))
            else:
                pairs.append((_name_for(item), item))
    benches = {b.name: b for b in cfg.benchmarks}
    for name, uri in pairs:
        if not uri:
            raise EvalError(f"data URI for benchmark {name!r} is empty")
        key = canonical_name(name)
        try:
            if key in benches:
                benches[key] = dataclasses.replace(benches[key], path=uri)
            else:
                benches[key] = BenchmarkConfig(name=key, path=uri)
        except ValueError as e:
            raise EvalError(str(e)) from e
    if not benches:
        benches["heldout"] = BenchmarkConfig(name="heldout")
    return list(benches.values())


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    threads = info["torch_threads"]
    where = info.get("gpu") or f"{info['cpus']} CPU cores ({threads} torch thread{'s' if threads != 1 else ''})"
    info["summary"] = f"{platform.system()} {info['machine']}, {where}, torch {info['torch']}"
    return info


def _input_uri(b: BenchmarkConfig) -> str:
    if b.path:
        return b.path
    return (
        f"builtin:heldout?n={b.generated_samples}&seed={b.generated_seed}"
        f"&eval_size={b.generated_eval_size}&split={b.split}"
    )


def _check_output_free(uri: str, overwrite: bool) -> None:
    """Refuse a complete artifact at ``uri`` *before* the (long) evaluation, not after it;
    write_artifact re-checks at the end."""
    from quarl.artifacts import ArtifactExistsError

    m = _manifest(uri)
    if not overwrite and isinstance(m, dict) and m.get("complete") is True:
        raise ArtifactExistsError(
            f"{uri} already holds a complete {m.get('kind')} artifact (stage {m.get('stage')}, completed "
            f"{m.get('completed')}); pass overwrite=True (CLI: --overwrite) or write to a new URI"
        )


def run_eval(
    cfg: EvalConfig,
    *,
    model_uri: str,
    data_uris: Sequence[str] | Mapping[str, str] | str | None = None,
    adapter_uri: str | None = None,
    output_uri: str,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Evaluate and write the metrics artifact; returns a small summary dict."""
    threads = torch.get_num_threads()
    if cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        return _run(cfg, model_uri, data_uris, adapter_uri, output_uri, overwrite, progress)
    finally:
        torch.set_num_threads(threads)


def _run(cfg, model_uri, data_uris, adapter_uri, output_uri, overwrite, progress) -> dict:
    from quarl.artifacts import write_artifact

    t0 = time.monotonic()
    _check_output_free(str(output_uri), overwrite)
    bench_cfgs = resolve_benchmarks(cfg, data_uris)
    cfg = dataclasses.replace(cfg, benchmarks=bench_cfgs)  # the artifact records what actually ran
    benches: list[Benchmark] = [load_benchmark(b) for b in bench_cfgs]
    for b in benches:
        log.info("benchmark %s: %d problems (%s)", b.name, len(b), b.info.get("origin"))

    model, tokenizer, model_info = load_eval_model(model_uri, cfg, adapter_uri=adapter_uri)
    log.info("model: %s", model_info)
    s = cfg.sampling
    results: dict[str, dict] = {}
    samples: dict[str, list] = {}
    for b in benches:
        render_prompts(b, tokenizer)
        comps, gen = sample_completions(
            model, tokenizer, [p.prompt for p in b.problems], s, desc=f"eval {b.name}", progress=progress
        )
        scored = score_samples(b, comps, cfg.reward)
        m = benchmark_metrics(b, scored, cfg.pass_k)
        m.update(
            origin=b.info.get("origin", ""),
            template=b.config.template,
            available=b.info.get("available"),
            generation=gen,
        )
        results[b.name] = m
        samples[b.name] = scored
        log.info(
            "%s: avg@%d %.4f ± %.4f over %d problems (%.0f s)",
            b.name,
            m["samples_per_problem"],
            m["accuracy"],
            m["accuracy_stderr"],
            m["problems"],
            gen["seconds"],
        )

    doc = {
        "stage": STAGE,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": model_info,
        "sampling": config_to_dict(s),
        "pass_k": cfg.pass_k,
        "benchmarks": results,
        "machine": machine_info(),
        "seconds": round(time.monotonic() - t0, 2),
        "config": config_to_dict(cfg),
    }
    inputs = [str(model_uri), *[_input_uri(b) for b in bench_cfgs]] + ([str(adapter_uri)] if adapter_uri else [])
    with write_artifact(output_uri, kind="metrics", stage=STAGE, config=cfg, inputs=inputs, overwrite=overwrite) as art:
        write_report(art.path, doc, samples, examples=cfg.examples_in_report)
        art.metadata["metrics"] = {
            n: {"accuracy": r["accuracy"], "accuracy_stderr": r["accuracy_stderr"], "pass_at_k": r["pass_at_k"],
                "problems": r["problems"]}
            for n, r in results.items()
        }  # fmt: skip
        art.metadata["model"] = {k: model_info[k] for k in ("model_uri", "quantization") if k in model_info}
    summary = {
        "output_uri": str(output_uri),
        "benchmarks": {
            n: {k: r[k] for k in ("accuracy", "accuracy_stderr", "pass_at_k", "format_rate", "problems")}
            for n, r in results.items()
        },
        "seconds": round(time.monotonic() - t0, 2),
    }
    return summary
