"""Dataset validation with Great Expectations, before anything downstream reads it.

A bad dataset found during RL costs GPU hours; found here it costs a second.
We run an ExpectationSuite over the final rows with GE 1.x's *ephemeral*
context (in memory: no ``gx/`` directory, no analytics, no progress bars) and
a pandas data source, one ValidationDefinition per batch:

    rows   (all rows)   id not null + unique (across splits, so no train/eval leak);
                        problem, prompt, answer not null and not blank;
                        problem/answer/prompt lengths within the configured bounds;
                        answer parses with math-verify (precomputed column
                        ``answer_parses``: GE has no math parser, so the check is a
                        boolean column expected to be all True);
                        split in {train, eval}; source not null;
                        difficulty (when present) in [0, 10]
    train / eval        row count >= min_train_rows / min_eval_rows

``result_format=COMPLETE`` with ``unexpected_index_column_names=["id"]`` makes
GE return the ids of the failing rows; the report keeps up to
``max_ids_in_report`` of them per expectation. Cost: ~3 s to import GE the
first time, then ~0.1 s per run on tens of thousands of rows.

The report (:class:`ValidationReport`) renders as JSON and markdown; the
stage writes it inside the dataset artifact on success and as a separate
``report`` artifact when validation fails (see :mod:`quarl.data.stage`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import pandas as pd

from quarl.data.config import DataPrepConfig

__all__ = ["DataValidationError", "ValidationReport", "validate_rows"]

log = logging.getLogger(__name__)


@dataclass
class ValidationReport:
    success: bool
    results: list[dict] = field(default_factory=list)
    row_counts: dict[str, int] = field(default_factory=dict)

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.results if not r["success"]]

    def to_dict(self) -> dict:
        return {
            "success": self.success,
            "row_counts": self.row_counts,
            "n_expectations": len(self.results),
            "n_failed": len(self.failures),
            "results": self.results,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=str)

    def to_markdown(self) -> str:
        status = "PASSED" if self.success else "FAILED"
        lines = [
            f"# Dataset validation: {status}",
            "",
            "Rows: " + ", ".join(f"{k} {v}" for k, v in self.row_counts.items()),
            f"Expectations: {len(self.results)}, failed: {len(self.failures)}",
            "",
            "| batch | expectation | column | result | failing rows | observed |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.results:
            ok = "ok" if r["success"] else "**FAIL**"
            nfail = r.get("unexpected_count")
            obs = r.get("observed_value")
            lines.append(
                f"| {r['batch']} | {r['expectation']} | {r.get('column') or ''} | {ok} | "
                f"{'' if nfail is None else nfail} | {'' if obs is None else obs} |"
            )
        for r in self.failures:
            lines += ["", f"## {r['batch']}: {r['expectation']} ({r.get('column') or 'table'})", ""]
            if r.get("kwargs"):
                lines.append(f"Bounds: `{json.dumps(r['kwargs'], default=str)}`")
            if r.get("failing_ids"):
                more = r.get("unexpected_count", 0) - len(r["failing_ids"])
                ids = ", ".join(f"`{i}`" for i in r["failing_ids"])
                lines.append(f"Failing row ids: {ids}" + (f" (and {more} more)" if more > 0 else ""))
            if r.get("unexpected_values"):
                vals = ", ".join(f"`{_short(v)}`" for v in r["unexpected_values"][:10])
                lines.append(f"Sample values: {vals}")
            if r.get("observed_value") is not None:
                lines.append(f"Observed: {r['observed_value']}")
        return "\n".join(lines) + "\n"

    def summary_line(self) -> str:
        parts = []
        for r in self.failures:
            what = f"{r['expectation']}({r.get('column') or r['batch']})"
            if r.get("failing_ids"):
                what += f" ids {r['failing_ids'][:5]}"
            elif r.get("observed_value") is not None:
                what += f" observed {r['observed_value']}"
            parts.append(what)
        return "; ".join(parts)


class DataValidationError(RuntimeError):
    """The prepared dataset failed validation; ``report`` says which rows and why."""

    def __init__(self, report: ValidationReport, report_uri: str | None = None) -> None:
        self.report = report
        self.report_uri = report_uri
        where = f" Full report: {report_uri}." if report_uri else ""
        super().__init__(
            f"dataset validation failed ({len(report.failures)} of {len(report.results)} expectations): "
            f"{report.summary_line()}.{where} Fix the source data or loosen the filters/validation bounds."
        )


def _short(v, n: int = 80) -> str:
    s = str(v).replace("\n", " ").replace("|", "\\|").replace("`", "'")
    return s if len(s) <= n else s[: n - 3] + "..."


def _context():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    # GE logs its context set-up at INFO ("Skipping registering function ..."): noise in stage logs.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    project = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx, gx.get_context(mode="ephemeral", project_config=project)


def _row_suite(gx, cfg: DataPrepConfig):
    E = gx.expectations
    f, v = cfg.filters, cfg.validation
    exps = [
        E.ExpectColumnValuesToNotBeNull(column="id"),
        E.ExpectColumnValuesToBeUnique(column="id"),
        E.ExpectColumnValuesToNotBeNull(column="source"),
        E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "eval"]),
    ]
    for col in ("problem", "prompt", "answer"):
        exps += [
            E.ExpectColumnValuesToNotBeNull(column=col),
            E.ExpectColumnValuesToMatchRegex(column=col, regex=r"\S"),  # not empty / not blank
        ]
    if f.max_problem_chars is not None:
        exps.append(E.ExpectColumnValueLengthsToBeBetween(column="problem", min_value=1, max_value=f.max_problem_chars))
    if f.max_answer_chars is not None:
        exps.append(E.ExpectColumnValueLengthsToBeBetween(column="answer", min_value=1, max_value=f.max_answer_chars))
    exps.append(E.ExpectColumnValueLengthsToBeBetween(column="prompt", min_value=1, max_value=v.max_prompt_chars))
    exps.append(E.ExpectColumnValuesToBeInSet(column="answer_parses", value_set=[True]))
    exps.append(E.ExpectColumnValuesToBeBetween(column="difficulty", min_value=0, max_value=10))
    return exps


def _run(gx, ctx, name: str, df: pd.DataFrame, expectations: list) -> list[dict]:
    ds = ctx.data_sources.add_pandas(f"quarl_{name}")
    asset = ds.add_dataframe_asset(name)
    batch = asset.add_batch_definition_whole_dataframe(name)
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"quarl_{name}"))
    for e in expectations:
        suite.add_expectation(e)
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=f"quarl_{name}", data=batch, suite=suite))
    res = vd.run(
        batch_parameters={"dataframe": df},
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["id"]},
    )
    return [_result_dict(name, r) for r in res.results]


def _result_dict(batch: str, r) -> dict:
    cfg = r.expectation_config
    kwargs = {k: v for k, v in dict(cfg.kwargs).items() if k not in ("column", "batch_id")}
    res = r.result or {}
    out = {
        "batch": batch,
        "expectation": cfg.type,
        "column": cfg.kwargs.get("column"),
        "success": bool(r.success),
        "kwargs": kwargs,
    }
    if "unexpected_count" in res:
        out["unexpected_count"] = int(res["unexpected_count"])
    if "observed_value" in res:
        out["observed_value"] = res["observed_value"]
    if r.exception_info and r.exception_info.get("raised_exception"):
        out["exception"] = str(r.exception_info.get("exception_message"))[:500]
    if not r.success:
        idx = res.get("unexpected_index_list") or []
        ids = []
        for item in idx:
            rid = item.get("id") if isinstance(item, dict) else item
            if rid is not None and not (isinstance(rid, float) and pd.isna(rid)):
                ids.append(str(rid))
        out["failing_ids"] = ids
        out["unexpected_values"] = [_short(x, 200) for x in (res.get("partial_unexpected_list") or [])[:20]]
    return out


def validate_rows(
    df: pd.DataFrame, cfg: DataPrepConfig, answer_parses: dict[str, bool] | None = None
) -> ValidationReport:
    """Run the suites over ``df`` (schema columns). ``answer_parses`` maps answers
    to parse results already known (recomputed for the others)."""
    from quarl.data.filters import answers_parse

    df = df.copy()
    known = dict(answer_parses or {})
    answers = [a for a in df["answer"].tolist() if isinstance(a, str)]
    missing = [a for a in set(answers) if a not in known]
    if missing:
        known.update(answers_parse(missing))
    df["answer_parses"] = [bool(isinstance(a, str) and known.get(a, False)) for a in df["answer"].tolist()]
    # GE wants a numeric dtype that allows nulls for the between-check.
    df["difficulty"] = pd.to_numeric(df["difficulty"], errors="coerce").astype("Float64")

    gx, ctx = _context()
    v = cfg.validation
    cap = v.max_ids_in_report
    results = _run(gx, ctx, "rows", df, _row_suite(gx, cfg))
    counts = {}
    for split, min_rows in (("train", v.min_train_rows), ("eval", v.min_eval_rows)):
        part = df[df["split"] == split]
        counts[split] = len(part)
        results += _run(gx, ctx, split, part, [gx.expectations.ExpectTableRowCountToBeBetween(min_value=min_rows)])
    for r in results:
        if "failing_ids" in r:
            r["failing_ids"] = r["failing_ids"][:cap]
    return ValidationReport(success=all(r["success"] for r in results), results=results, row_counts=counts)
