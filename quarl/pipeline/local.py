"""``quarl run``: a whole pipeline on this machine, through kfp.local, against a local S3.

    summary = run_local(load_recipe("qerl", profile="local"), run_id="qerl-1")

What it does, in order:

1. ``runs/<run-id>/`` is the run's home: ``s3/`` (SeaweedFS data), ``kfp/`` (the
   kfp.local pipeline root: pointer files and executor outputs), ``recipe.yaml``
   (the resolved recipe), ``run.log`` (every line every step printed),
   ``summary.json`` / ``summary.md``.
2. A SeaweedFS server (``quarl.storage.SeaweedFS``) starts on loopback with its
   data in ``s3/``; the recipe's bucket is created; the ``AWS_*`` variables of
   that server are put in the environment, so the component subprocesses reach
   it exactly as pods reach the cluster's S3 through the ``quarl-s3`` secret.
   (``external_s3=True`` skips this and uses the ``AWS_*`` already set.)
3. ``kfp.local.init(SubprocessRunner(use_venv=False))`` runs each task as a
   subprocess of this Python (no containers, no pip): the same compiled
   components and DAG as on a cluster, minus Kubernetes-only settings
   (resources, secrets, retries), which kfp.local ignores.
4. Every artifact lands under ``s3://<bucket>/<prefix>/<run-id>/<step>/<name>/``;
   the summary is read back from the step records there.

A failing step stops the DAG (kfp.local runs tasks in order and raises); the
summary then names the step and its error, read from the step record or, when
storage itself is down, from the ``QUARL_STEP_FAILED`` line the step printed.
Nothing half-written is marked complete: that is quarl.artifacts' guarantee.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import yaml

from quarl.pipeline.recipes import Recipe
from quarl.pipeline.runtime import FAILURE_MARKER
from quarl.pipeline.summary import RunSummary, collect_summary

__all__ = ["RunFailed", "default_run_id", "run_local"]

log = logging.getLogger(__name__)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONSOLE_PATTERNS = ("[quarl]", "Executing task", "finished with status", FAILURE_MARKER)


class RunFailed(RuntimeError):
    """The pipeline did not finish; ``.summary`` says which step failed and why."""

    def __init__(self, message: str, summary: RunSummary):
        super().__init__(message)
        self.summary = summary


def default_run_id(recipe: Recipe) -> str:
    return f"{recipe.name.replace('_', '-')}-{datetime.now():%Y%m%d-%H%M%S}"


class _Tee(io.TextIOBase):
    """Everything to the log file; to the console, everything (verbose) or just progress lines."""

    def __init__(self, logfile, console, verbose: bool, on_line: Callable[[str], None]):
        self.logfile, self.console, self.verbose, self.on_line = logfile, console, verbose, on_line
        self._buf = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.logfile.write(s)
        self._buf += s
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.on_line(line)
            if self.verbose or any(p in line for p in _CONSOLE_PATTERNS):
                self.console.write(line + "\n")
        return len(s)

    def flush(self) -> None:
        self.logfile.flush()
        self.console.flush()


@contextlib.contextmanager
def _env(update: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in update}
    os.environ.update(update)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_local(
    recipe: Recipe,
    *,
    run_id: str | None = None,
    runs_dir: str | Path = "runs",
    verbose: bool = False,
    external_s3: bool = False,
    console=None,
) -> RunSummary:
    """Run ``recipe``'s pipeline locally; returns the summary, raises RunFailed (with it) on failure."""
    from kfp import local
    from quarl_pipelines import get_pipeline

    from quarl.storage import S3Store, SeaweedFS, is_s3, split_s3

    console = console or sys.stdout
    pdef = get_pipeline(recipe.pipeline)
    pdef.check_available()
    if not is_s3(recipe.s3_root):
        raise ValueError(f"s3_root {recipe.s3_root!r} must be an s3:// URI (e.g. s3://quarl/runs)")
    bucket, _ = split_s3(recipe.s3_root)
    run_id = run_id or default_run_id(recipe)
    run_dir = Path(runs_dir).resolve() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump({
        "pipeline": recipe.pipeline, "recipe": recipe.name, "profile": recipe.profile, "model": recipe.model,
        "s3_root": recipe.s3_root, "stages": recipe.stages, "resources": recipe.resources,
    }, sort_keys=False))
    # fails on a bad recipe before any server starts; a step on several GPUs needs a cluster (TrainJob)
    pipeline = pdef.build(recipe, retries=False, trainjobs=False)
    steps = [(s.id, s.stage) for s in pdef.steps]
    failures: list[dict] = []

    def on_line(line: str) -> None:
        line = _ANSI.sub("", line)
        i = line.find(FAILURE_MARKER)
        if i >= 0:
            with contextlib.suppress(ValueError):
                failures.append(json.loads(line[i + len(FAILURE_MARKER):]))

    with contextlib.ExitStack() as stack:
        if external_s3:
            store = S3Store()
        else:
            # Objects are on disk when a PUT returns, so a short stop grace loses nothing.
            s3 = stack.enter_context(SeaweedFS(run_dir / "s3", buckets=(bucket,), stop_timeout=2.0))
            stack.enter_context(_env(s3.env()))
            store = s3.store()
            console.write(f"[quarl] local S3 (SeaweedFS) at {s3.endpoint}, data in {run_dir / 's3'}\n")
        store.ensure_bucket(bucket)
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(run_dir / "kfp"),
                   workspace_root=str(run_dir / "workspace"), raise_on_error=True)
        console.write(f"[quarl] run {run_id}: pipeline {pdef.name} ({pdef.chain}), model {recipe.model}; "
                      f"log {run_dir / 'run.log'}\n")
        t0 = time.monotonic()
        error = None
        logfile = stack.enter_context(open(run_dir / "run.log", "a", encoding="utf-8"))
        tee = _Tee(logfile, console, verbose, on_line)
        try:
            with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(tee), warnings.catch_warnings():
                # The SubprocessRunner warns when an image name lacks "python"; it ignores images anyway.
                warnings.filterwarnings("ignore", message=".*non-Python base image.*")
                # ... and says so about Kubernetes-only settings (resources, accelerators) it skips.
                warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
                pipeline(run_id=run_id)
        except Exception as e:  # noqa: BLE001 - kfp.local raises RuntimeError naming the failed task; report, not hide
            error = _ANSI.sub("", str(e)).strip()
        finally:
            tee.flush()
        summary = collect_summary(recipe.s3_root, run_id, steps, pipeline=pdef.name, recipe=recipe.name,
                                  profile=recipe.profile, model=recipe.model,
                                  wall_seconds=round(time.monotonic() - t0, 1), error=error)
    for f in failures:  # storage down: the record could not be written, the marker line says what happened
        s = next((x for x in summary.steps if x.step == f.get("step")), None)
        if s is not None and s.status != "failed":
            s.status, s.error = "failed", f.get("error")
    if failures or error:
        summary.status = "failed"
    (run_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2, default=str) + "\n")
    (run_dir / "summary.md").write_text(summary.to_markdown())
    if summary.status != "succeeded":
        bad = summary.failed_step
        why = f"step {bad.step} ({bad.stage}) failed: {bad.error}" if bad else (error or "a step did not finish")
        raise RunFailed(f"run {run_id} failed: {why}; full log: {run_dir / 'run.log'}", summary)
    return summary
