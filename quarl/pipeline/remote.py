"""``quarl submit`` / ``quarl schedule``: a recipe on a Kubeflow Pipelines endpoint.

    client = kfp.Client(host="https://kubeflow.example.com/pipeline", namespace="ml")
    submit(recipe, client)                              # upload (or reuse) a version, start a run
    schedule(recipe, client, cron="0 0 2 * * *")        # the nightly recurring run, pinned to that version

Versions are content-addressed: the version name is ``<pipeline>-<sha256 of the
compiled YAML>[:12]``, so submitting an unchanged recipe reuses the uploaded
version and a changed one (new code, new recipe values) adds exactly one.

Recurring runs pin a pipeline *version* (KFP v2 has no "latest" for recurring
runs). ``schedule`` therefore finds the recurring run by name in the experiment:
absent -> create it; pinned to the current version with the same cron -> keep it;
otherwise delete it and create it again on the new version. One name, one live
schedule, always on the newest code.

Only ``kfp.Client`` methods are used (``get_pipeline_id``, ``upload_pipeline``,
``upload_pipeline_version``, ``list_pipeline_versions``, ``create_experiment``,
``run_pipeline``, ``list_recurring_runs``, ``delete_recurring_run``,
``create_recurring_run``), so tests drive it with a fake client.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarl.pipeline.recipes import Recipe

__all__ = ["Uploaded", "compile_recipe", "load_recurring_spec", "schedule", "spec_body", "submit", "upload"]

log = logging.getLogger(__name__)


@dataclass
class Uploaded:
    pipeline_name: str
    pipeline_id: str
    version_id: str
    version_name: str
    created: bool  # False: an identical version was already there


def compile_recipe(recipe: Recipe, path: str | Path) -> Path:
    """Compile ``recipe``'s pipeline to ``path`` (YAML)."""
    from kfp import compiler
    from quarl_pipelines import get_pipeline

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / path.name
        compiler.Compiler().compile(get_pipeline(recipe.pipeline).build(recipe), str(tmp))
        # KFP's leading "# Inputs:" comment prints dict-valued defaults in protobuf map order, which
        # varies between processes; the spec itself is stable. Keep an existing file whose spec is
        # identical so recompiling never churns the committed YAML.
        if not (path.is_file() and spec_body(path.read_text()) == spec_body(tmp.read_text())):
            shutil.copyfile(tmp, path)
    return path


def spec_body(text: str) -> str:
    """A compiled KFP YAML without its leading ``#`` comment block (the part that is not stable)."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    return "".join(lines[i:])


def _pipeline_name(recipe: Recipe) -> str:
    return f"quarl-{recipe.name.replace('_', '-')}"


def _find_version(client: Any, pipeline_id: str, name: str) -> str | None:
    token = ""
    while True:
        resp = client.list_pipeline_versions(pipeline_id=pipeline_id, page_token=token, page_size=100)
        for v in resp.pipeline_versions or []:
            if v.display_name == name:
                return v.pipeline_version_id
        token = resp.next_page_token or ""
        if not token:
            return None


def upload(recipe: Recipe, client: Any, pipeline_name: str | None = None) -> Uploaded:
    """Compile and upload ``recipe`` as a pipeline version (reusing an identical one)."""
    name = pipeline_name or _pipeline_name(recipe)
    with tempfile.TemporaryDirectory() as d:
        path = compile_recipe(recipe, Path(d) / f"{recipe.name}.yaml")
        digest = hashlib.sha256(spec_body(path.read_text()).encode()).hexdigest()[:12]
        version = f"{name}-{digest}"
        pid = client.get_pipeline_id(name)
        if pid is None:
            p = client.upload_pipeline(str(path), pipeline_name=name, description=recipe.description or None)
            pid = p.pipeline_id
            log.info("uploaded new pipeline %s (%s)", name, pid)
        vid = _find_version(client, pid, version)
        if vid is not None:
            return Uploaded(name, pid, vid, version, created=False)
        v = client.upload_pipeline_version(str(path), pipeline_version_name=version, pipeline_id=pid,
                                           description=f"recipe {recipe.name}" + (f" ({recipe.reproduces})"
                                                                                  if recipe.reproduces else ""))
        return Uploaded(name, pid, v.pipeline_version_id, version, created=True)


def submit(recipe: Recipe, client: Any, *, experiment: str = "quarl", run_name: str | None = None,
           params: dict | None = None, enable_caching: bool = False) -> dict:
    """Upload ``recipe`` (if changed) and start one run; returns ids."""
    up = upload(recipe, client)
    exp = client.create_experiment(experiment)
    run = client.run_pipeline(
        experiment_id=exp.experiment_id, job_name=run_name or f"{up.version_name}", params=params or {},
        pipeline_id=up.pipeline_id, version_id=up.version_id, enable_caching=enable_caching,
    )
    return {"pipeline_id": up.pipeline_id, "version_id": up.version_id, "version": up.version_name,
            "new_version": up.created, "experiment_id": exp.experiment_id, "run_id": run.run_id}


def _list_recurring(client: Any, experiment_id: str) -> list:
    out, token = [], ""
    while True:
        resp = client.list_recurring_runs(page_token=token, page_size=100, experiment_id=experiment_id)
        out += list(resp.recurring_runs or [])
        token = resp.next_page_token or ""
        if not token:
            return out


def _cron_of(rr: Any) -> str | None:
    trig = getattr(rr, "trigger", None)
    cron = getattr(trig, "cron_schedule", None) if trig is not None else None
    return getattr(cron, "cron", None) if cron is not None else None


def schedule(recipe: Recipe, client: Any, *, cron: str, name: str | None = None, experiment: str = "quarl",
             params: dict | None = None, enable_caching: bool = False) -> dict:
    """Create or refresh the recurring run ``name`` so it runs the current version of ``recipe`` on ``cron``.

    ``cron`` is KFP's six-field form with seconds: ``"0 0 2 * * *"`` = every day at 02:00 (UTC).
    """
    fields = cron.split()
    if len(fields) != 6:
        raise ValueError(f"cron {cron!r} must have 6 fields (seconds first), e.g. '0 0 2 * * *' for 02:00 daily")
    name = name or f"nightly-{recipe.name.replace('_', '-')}"
    up = upload(recipe, client)
    exp = client.create_experiment(experiment)
    action = "created"
    for rr in _list_recurring(client, exp.experiment_id):
        if rr.display_name != name:
            continue
        ref = getattr(rr, "pipeline_version_reference", None)
        if ref is not None and ref.pipeline_version_id == up.version_id and _cron_of(rr) in (None, cron):
            return {"recurring_run_id": rr.recurring_run_id, "action": "unchanged", "version": up.version_name,
                    "version_id": up.version_id, "pipeline_id": up.pipeline_id}
        client.delete_recurring_run(rr.recurring_run_id)
        action = "replaced"
        log.info("recurring run %s pinned an older version; replaced", name)
    rr = client.create_recurring_run(
        experiment_id=exp.experiment_id, job_name=name, description=f"quarl recipe {recipe.name} on {cron}",
        cron_expression=cron, max_concurrency=1, no_catchup=True, params=params or {},
        pipeline_id=up.pipeline_id, version_id=up.version_id, enabled=True, enable_caching=enable_caching,
    )
    return {"recurring_run_id": rr.recurring_run_id, "action": action, "version": up.version_name,
            "version_id": up.version_id, "pipeline_id": up.pipeline_id}


RECURRING_KIND = ("quarl.dev/v1", "RecurringRun")


def load_recurring_spec(path: str | Path) -> dict:
    """Read a ``kind: RecurringRun`` manifest (manifests/nightly-recurring-run.yaml) into schedule() arguments."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text()) or {}
    if (doc.get("apiVersion"), doc.get("kind")) != RECURRING_KIND:
        raise ValueError(f"{path}: expected apiVersion {RECURRING_KIND[0]}, kind {RECURRING_KIND[1]}; "
                         f"got {doc.get('apiVersion')}, {doc.get('kind')}")
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    known = {"recipe", "profile", "overrides", "cron", "experiment", "maxConcurrency", "noCatchup"}
    unknown = sorted(set(spec) - known)
    if unknown or not spec.get("recipe") or not spec.get("cron"):
        raise ValueError(f"{path}: spec needs recipe and cron (known keys: {sorted(known)}); unknown: {unknown}")
    return {"name": meta.get("name"), "namespace": meta.get("namespace"), "recipe": spec["recipe"],
            "profile": spec.get("profile"), "overrides": list(spec.get("overrides") or []), "cron": str(spec["cron"]),
            "experiment": spec.get("experiment", "quarl")}
