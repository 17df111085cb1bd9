"""What runs inside a KFP component: typed parameters + artifacts in, one quarl stage call, pointers out.

A component body is one line, ``run_component("<stage>", **locals())``; this module
does the rest, the same way for every stage (see :mod:`quarl.pipeline.stages`).

Where the bytes live (the S3 choice)
------------------------------------
KFP gives every output artifact a location under the *pipeline root* (a local
directory under ``kfp.local``, the bucket of the ``kfp-launcher`` ConfigMap on a
cluster) and copies files between that root and the pod around each task. quarl
stages instead read and write S3 themselves (``quarl.artifacts``: checksummed,
manifest written last, resumable, readable by the CLI outside Kubeflow). So the
two are decoupled:

- the quarl artifact is written by the library to
  ``<s3_root>/<run_id>/<step>/<output>/`` (``s3_root`` and ``run_id`` are pipeline
  parameters; an empty ``run_id`` means the Kubeflow run id);
- the KFP output artifact is a small *pointer*: its file is a JSON document
  ``{"quarl_uri": ..., "kind": ..., ...}`` and the same fields are in its
  metadata (what the UI shows and what downstream tasks receive);
- a downstream component resolves its input from that metadata, else the
  pointer file, else the artifact's own ``s3://`` URI (an artifact brought in with
  ``dsl.importer`` from an existing quarl run), else a local directory holding
  a ``manifest.json``.

Every step also gets two small UI outputs: ``metrics`` (numeric leaves of the
stage's result dict, as KFP Metrics) and ``report`` (the stage's own markdown
file, or one rendered from the result).

Step records and idempotency
----------------------------
Beside its output the runtime keeps ``<s3_root>/<run_id>/<step>/step.json``:
status (running / succeeded / failed), times, the resolved config, input and
output URIs, the result, and the error. It carries a *fingerprint* of (stage,
resolved config, input URIs). When a step starts and finds a succeeded record
with the same fingerprint and a complete output, it reuses the output instead of
recomputing (a KFP retry after the work was done, or ``quarl run --run-id X``
again). A complete output with a different fingerprint is refused: one run id,
one result per step. The record is what ``quarl run`` summarises.

Config precedence: stage dataclass defaults < ``config_yaml`` < typed parameters
< ``overrides`` (``key.sub=value`` strings). A typed parameter that silently
contradicts ``config_yaml`` is logged as a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from quarl.pipeline.stages import COMMON_PARAMS, StageSpec, get_stage

__all__ = [
    "FAILURE_MARKER",
    "StepError",
    "artifact_uri",
    "read_step_record",
    "resolve_config",
    "run_component",
    "step_record_uri",
]

log = logging.getLogger("quarl.pipeline")

# A line the local runner looks for in a task's output to name the failed step and its error.
FAILURE_MARKER = "QUARL_STEP_FAILED "
POINTER_FORMAT = "quarl-pointer/1"
UI_OUTPUTS = ("metrics", "report")


class StepError(RuntimeError):
    """A step that cannot run as asked (bad inputs, output owned by another config); the message says why."""


# ---------------------------------------------------------------- small I/O helpers (local path or s3://)


def _store():
    from quarl.storage import S3Store

    return S3Store()


def _read_text(uri: str) -> str | None:
    from quarl.storage import NoSuchKeyError, is_s3, local_path

    if is_s3(uri):
        try:
            return _store().get_bytes(uri).decode()
        except NoSuchKeyError:
            return None
    p = local_path(uri)
    return p.read_text() if p.is_file() else None


def _write_text(uri: str, text: str) -> None:
    from quarl.storage import is_s3, local_path

    if is_s3(uri):
        _store().put_bytes(text.encode(), uri, content_type="application/json")
        return
    p = local_path(uri)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, p)


def _manifest(uri: str) -> dict | None:
    from quarl.artifacts import MANIFEST
    from quarl.storage import join_uri

    text = _read_text(join_uri(uri, MANIFEST))
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def step_record_uri(s3_root: str, run_id: str, step: str) -> str:
    from quarl.storage import join_uri

    return join_uri(s3_root, run_id, step, "step.json")


def read_step_record(s3_root: str, run_id: str, step: str) -> dict | None:
    text = _read_text(step_record_uri(s3_root, run_id, step))
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


# ---------------------------------------------------------------- config


def resolve_config(spec: StageSpec, config_yaml: str = "", params: dict | None = None, overrides=()) -> Any:
    """The stage config: dataclass defaults < config_yaml < typed params < overrides."""
    from quarl.config import ConfigError, build_config, get_path

    params = params or {}
    base = yaml.safe_load(config_yaml) if config_yaml and config_yaml.strip() else {}
    if base is None:
        base = {}
    if not isinstance(base, dict):
        raise ConfigError(f"config_yaml of stage {spec.name} must be a YAML mapping of config fields, got {base!r}")
    typed = []
    for name, value in params.items():
        p = spec.params.get(name)
        if p is None:
            raise ConfigError(f"stage {spec.name} has no typed parameter {name!r}; valid: {', '.join(spec.params)}")
        v = p.to_config(value)
        found, given = get_path(base, p.key.split("."))
        if found and given != v:
            log.warning("%s: config_yaml sets %s=%r but the typed parameter %s=%r wins; change the parameter instead",
                        spec.name, p.key, given, name, v)
        typed.append(f"{p.key}={json.dumps(v)}")
    return build_config(spec.load_config_class(), base, [*typed, *(overrides or [])])


def _fingerprint(stage: str, cfg: Any, inputs: dict) -> str:
    from quarl.config import config_to_dict

    blob = json.dumps({"stage": stage, "config": config_to_dict(cfg), "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------- KFP artifacts <-> quarl URIs


def artifact_uri(art: Any, name: str = "input") -> str | None:
    """The quarl URI behind a KFP input artifact (see module doc for the lookup order)."""
    if art is None:
        return None
    md = getattr(art, "metadata", None) or {}
    if md.get("quarl_uri"):
        return str(md["quarl_uri"])
    path = getattr(art, "path", None)
    if path and os.path.isfile(path):
        try:
            ptr = json.loads(Path(path).read_text())
            if isinstance(ptr, dict) and ptr.get("quarl_uri"):
                return str(ptr["quarl_uri"])
        except (ValueError, UnicodeDecodeError):
            pass
    uri = getattr(art, "uri", "") or ""
    if uri.startswith("s3://"):
        return uri.rstrip("/")
    if path and (Path(path) / "manifest.json").is_file():
        return str(path)
    raise StepError(
        f"input artifact {name} ({uri or path}) does not point at a quarl artifact: it has no quarl_uri metadata, "
        "no pointer file and no manifest.json; produce it with a quarl component, or bring an existing one in "
        "with dsl.importer(artifact_uri='s3://bucket/.../<name>', artifact_class=...)"
    )


def _write_pointer(art: Any, fields: dict) -> None:
    art.metadata.update(fields)
    path = Path(art.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": POINTER_FORMAT, **fields}, indent=2) + "\n")


def _numeric_leaves(d: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_numeric_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and prefix:
        out[prefix] = float(d)
    return out


def select_metrics(spec: StageSpec, result: dict | None) -> dict[str, float]:
    """Numeric leaves of a step result picked by ``spec.metrics`` prefixes, in the prefixes' order."""
    leaves = _numeric_leaves(result or {})
    if spec.metrics is None:
        return leaves
    out: dict[str, float] = {}
    for p in spec.metrics:
        for k, v in leaves.items():
            if k not in out and (k == p or k.startswith((p + ".", p + "/"))):
                out[k] = v
    return out


def _render_report(spec: StageSpec, step: str, rec: dict) -> str:
    lines = [f"# {step} ({spec.name})", "", spec.description, "", f"- status: {rec['status']}",
             f"- seconds: {rec.get('seconds')}", f"- output: `{rec['outputs'].get(spec.output.name)}`"]
    for k, v in rec.get("inputs", {}).items():
        lines.append(f"- input {k}: `{v}`")
    metrics = select_metrics(spec, rec.get("result"))
    if metrics:
        lines += ["", "| metric | value |", "|---|---|"] + [f"| {k} | {v:g} |" for k, v in metrics.items()]
    return "\n".join(lines) + "\n"


def _fill_outputs(spec: StageSpec, step: str, outputs: dict, rec: dict) -> None:
    from quarl.storage import join_uri

    out_uri = rec["outputs"][spec.output.name]
    m = _manifest(out_uri) or {}
    main = outputs.get(spec.output.name)
    if main is not None:
        _write_pointer(main, {"quarl_uri": out_uri, "kind": m.get("kind", spec.output.kind), "stage": spec.name,
                              "step": step, "run_id": rec["run_id"]})
    metrics = outputs.get("metrics")
    if metrics is not None:
        for k, v in select_metrics(spec, rec.get("result")).items():
            metrics.log_metric(k, v)
        metrics.metadata["quarl_uri"] = out_uri
    report = outputs.get("report")
    if report is not None:
        text = _read_text(join_uri(out_uri, spec.report_file)) if spec.report_file else None
        Path(report.path).parent.mkdir(parents=True, exist_ok=True)
        Path(report.path).write_text(text or _render_report(spec, step, rec))
        report.metadata["quarl_uri"] = out_uri


# ---------------------------------------------------------------- the entry point


def run_component(stage: str, executor: Callable[..., dict] | None = None, **kwargs: Any) -> dict:
    """Run stage ``stage`` from a component's arguments (``**locals()`` of the component function).

    Returns the step record. On failure prints one ``QUARL_STEP_FAILED {json}`` line,
    records the error in step.json when storage is reachable, and re-raises.

    ``executor(spec, cfg, output_uri, inputs, record) -> result`` runs the stage somewhere else
    than in this process (:func:`quarl.pipeline.trainjob.launch_component`: a TrainJob); ``inputs``
    maps input names to resolved URIs. Everything around it (config, record, reuse) is the same.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    spec = get_stage(stage)
    common = {k: kwargs.pop(k, None) for k in COMMON_PARAMS}
    step = common["step"] or stage
    run_id = common["run_id"] or common["kfp_run_id"] or ""
    s3_root = (common["s3_root"] or "").rstrip("/")
    rec: dict[str, Any] = {"stage": stage, "step": step, "run_id": run_id, "status": "running", "started": _now(),
                           "host": socket.gethostname(), "inputs": {}, "outputs": {}}
    t0 = time.monotonic()
    try:
        if not run_id:
            raise StepError(f"step {step}: no run id (set the run_id parameter, or pass kfp_run_id from the pipeline)")
        if not s3_root:
            raise StepError(f"step {step}: s3_root is empty; set it to s3://<bucket>/<prefix> (e.g. s3://quarl/runs)")
        return _run(spec, step, run_id, s3_root, common, kwargs, rec, t0, executor)
    except BaseException as e:
        rec.update(status="failed", finished=_now(), seconds=round(time.monotonic() - t0, 2),
                   error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-8000:])
        if run_id and s3_root:
            try:
                _write_text(step_record_uri(s3_root, run_id, step), json.dumps(_jsonable(rec), indent=2))
            except Exception as e2:  # noqa: BLE001 - storage down: the marker line below still names the failure
                log.error("could not record the failure of step %s: %s", step, e2)
        print(FAILURE_MARKER + json.dumps({"step": step, "stage": stage, "error": rec["error"]}), flush=True)
        sys.stdout.flush()
        raise


def _run(spec: StageSpec, step: str, run_id: str, s3_root: str, common: dict, kwargs: dict, rec: dict,
         t0: float, executor: Callable[..., dict] | None = None) -> dict:
    from quarl.config import config_to_dict
    from quarl.storage import join_uri

    # Split the remaining arguments into input artifacts, output artifacts and typed parameters.
    inputs_art = {i.name: kwargs.pop(i.name, None) for i in spec.inputs}
    outputs = {n: kwargs.pop(n, None) for n in (spec.output.name, *UI_OUTPUTS)}
    refs = {i.ref_param: kwargs.pop(i.ref_param, "") for i in spec.inputs if i.ref_param}
    cfg = resolve_config(spec, common["config_yaml"] or "", kwargs, common["overrides"] or [])

    in_uris: dict[str, str] = {}
    for i in spec.inputs:
        uri = artifact_uri(inputs_art[i.name], i.name)
        if uri is None and i.ref_param:
            uri = refs.get(i.ref_param) or None
        if uri is None and not i.optional:
            hint = f" or set the {i.ref_param} parameter" if i.ref_param else ""
            raise StepError(f"step {step} ({spec.name}) needs input {i.name!r} ({i.kind}): connect an upstream "
                            f"artifact{hint}")
        if uri is not None:
            in_uris[i.name] = uri
    out_uri = join_uri(s3_root, run_id, step, spec.output.name)
    rec["inputs"], rec["outputs"] = in_uris, {spec.output.name: out_uri}
    rec["config"] = _jsonable(config_to_dict(cfg))
    rec["fingerprint"] = fp = _fingerprint(spec.name, cfg, in_uris)
    rec_uri = step_record_uri(s3_root, run_id, step)

    prev = read_step_record(s3_root, run_id, step)
    done = _manifest(out_uri)
    if done is not None and done.get("complete"):
        if prev is not None and prev.get("fingerprint") == fp:
            log.info("step %s: %s is already complete for this config and inputs; reusing it", step, out_uri)
            if prev.get("status") == "succeeded":
                rec = {**prev, "reused": True}
            else:  # the work finished but the record did not: adopt the artifact
                rec.update(status="succeeded", finished=_now(), seconds=prev.get("seconds"), result=prev.get("result"),
                           adopted=True)
            _write_text(rec_uri, json.dumps(_jsonable(rec), indent=2))
            _fill_outputs(spec, step, outputs, rec)
            return rec
        raise StepError(
            f"step {step}: {out_uri} already holds a complete artifact made with a different config or inputs; "
            f"use a new run_id (each run id holds one result per step) or delete that prefix"
        )

    _write_text(rec_uri, json.dumps(_jsonable(rec), indent=2))
    log.info("[quarl] step %s (%s) run %s -> %s", step, spec.name, run_id, out_uri)
    if executor is not None:
        result = executor(spec, cfg, out_uri, dict(in_uris), rec)
    else:
        fn = spec.load_run()
        call = {}
        for i in spec.inputs:
            uri = in_uris.get(i.name)
            if uri is not None or not i.optional:
                call[i.kwarg] = [uri] if i.as_list else uri
        result = fn(cfg, output_uri=out_uri, **call)
    rec.update(status="succeeded", finished=_now(), seconds=round(time.monotonic() - t0, 2),
               result=_jsonable(result if isinstance(result, dict) else {"result": result}))
    _write_text(rec_uri, json.dumps(_jsonable(rec), indent=2))
    _fill_outputs(spec, step, outputs, rec)
    log.info("[quarl] step %s done in %.1fs", step, rec["seconds"])
    return rec
