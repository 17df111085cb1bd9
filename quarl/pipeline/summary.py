"""Run summaries: what every step of a run did, read back from its step records.

    s = collect_summary("s3://quarl/runs", "qerl-20250101-120000", steps=[("data_prep", "data_prep"), ...])
    print(s.to_text())            # console table: status, seconds, headline metrics, artifact URIs
    s.to_markdown(); s.to_dict()

The source of truth is ``<s3_root>/<run_id>/<step>/step.json`` (written by
:mod:`quarl.pipeline.runtime` inside each component), so the same summary works
for a local ``quarl run`` and for a run on a cluster.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RunSummary", "StepSummary", "collect_summary"]

MAX_CONSOLE_METRICS = 8


@dataclass
class StepSummary:
    step: str
    stage: str
    status: str  # succeeded | failed | running | not run
    seconds: float | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    reused: bool = False


@dataclass
class RunSummary:
    run_id: str
    pipeline: str
    recipe: str
    s3_root: str
    steps: list[StepSummary]
    status: str = "succeeded"
    wall_seconds: float | None = None
    error: str | None = None
    profile: str | None = None
    model: str | None = None

    @property
    def failed_step(self) -> StepSummary | None:
        return next((s for s in self.steps if s.status == "failed"), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_text(self) -> str:
        w = max([len(s.step) for s in self.steps] + [4])
        head = (f"run {self.run_id}: pipeline {self.pipeline} (recipe {self.recipe}"
                f"{', profile ' + self.profile if self.profile else ''}), model {self.model}: {self.status.upper()}")
        lines = [head]
        if self.wall_seconds is not None:
            lines.append(f"wall time {_fmt_s(self.wall_seconds)}; artifacts under {self.s3_root}/{self.run_id}/")
        lines.append("")
        lines.append(f"  {'step':<{w}}  {'status':<10} {'time':>8}  metrics")
        for s in self.steps:
            status = s.status + (" (reused)" if s.reused else "")
            ms = list(s.metrics.items())[:MAX_CONSOLE_METRICS]
            mtxt = ", ".join(f"{k}={_fmt_v(v)}" for k, v in ms) or "-"
            if len(s.metrics) > MAX_CONSOLE_METRICS:
                mtxt += f", ... ({len(s.metrics)} in summary.json)"
            lines.append(f"  {s.step:<{w}}  {status:<10} {_fmt_s(s.seconds):>8}  {mtxt}")
            for name, uri in s.outputs.items():
                lines.append(f"  {'':<{w}}  {'':<10} {'':>8}  {name}: {uri}")
            if s.error:
                lines.append(f"  {'':<{w}}  {'':<10} {'':>8}  error: {s.error}")
        if self.error and not self.failed_step:
            lines += ["", f"error: {self.error}"]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        out = [f"# Run `{self.run_id}`", "",
               (f"- pipeline: **{self.pipeline}** (recipe `{self.recipe}`"
                f"{', profile `' + self.profile + '`' if self.profile else ''})"),
               f"- model: `{self.model}`", f"- status: **{self.status}**",
               f"- wall time: {_fmt_s(self.wall_seconds)}", f"- artifacts: `{self.s3_root}/{self.run_id}/`", "",
               "| step | stage | status | time | outputs |", "|---|---|---|---|---|"]
        for s in self.steps:
            outs = "<br>".join(f"{k}: `{v}`" for k, v in s.outputs.items()) or "-"
            out.append(f"| {s.step} | {s.stage} | {s.status}{' (reused)' if s.reused else ''} | "
                       f"{_fmt_s(s.seconds)} | {outs} |")
        for s in self.steps:
            if s.metrics or s.error:
                out += ["", f"## {s.step}", ""]
                if s.error:
                    out += [f"**error**: {s.error}", ""]
                if s.metrics:
                    out += ["| metric | value |", "|---|---|"] + [f"| {k} | {_fmt_v(v)} |" for k, v in s.metrics.items()]
        if self.error and not self.failed_step:
            out += ["", f"**error**: {self.error}"]
        return "\n".join(out) + "\n"


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.1f}s" if s < 120 else f"{int(s // 60)}m{int(s % 60):02d}s"


def _fmt_v(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _metrics(stage: str, result: dict | None) -> dict[str, float]:
    from quarl.pipeline.runtime import _numeric_leaves, select_metrics
    from quarl.pipeline.stages import STAGES

    spec = STAGES.get(stage)
    return select_metrics(spec, result) if spec is not None else _numeric_leaves(result or {})


def collect_summary(s3_root: str, run_id: str, steps: list[tuple[str, str]], *, pipeline: str = "", recipe: str = "",
                    profile: str | None = None, model: str | None = None, wall_seconds: float | None = None,
                    error: str | None = None) -> RunSummary:
    """Read each step's record; ``steps`` is ``[(step, stage), ...]`` in pipeline order."""
    from quarl.pipeline.runtime import read_step_record

    out = []
    for step, stage in steps:
        try:
            rec = read_step_record(s3_root, run_id, step)
        except Exception as e:  # noqa: BLE001 - storage unreachable: say so per step, keep the summary
            out.append(StepSummary(step, stage, "unknown", error=f"cannot read its record: {e}"))
            continue
        if rec is None:
            out.append(StepSummary(step, stage, "not run"))
            continue
        out.append(StepSummary(
            step=step, stage=stage, status=rec.get("status", "unknown"), seconds=rec.get("seconds"),
            outputs=rec.get("outputs") or {}, metrics=_metrics(stage, rec.get("result")), error=rec.get("error"),
            reused=bool(rec.get("reused")),
        ))
    if error or any(s.status != "succeeded" for s in out):
        status = "failed"
    else:
        status = "succeeded"
    return RunSummary(run_id=run_id, pipeline=pipeline, recipe=recipe, s3_root=s3_root.rstrip("/"), steps=out,
                      status=status, wall_seconds=wall_seconds, error=error, profile=profile, model=model)
