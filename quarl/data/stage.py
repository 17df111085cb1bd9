"""The data preparation stage: sources -> one validated ``dataset`` artifact.

    run_data_prep(cfg: DataPrepConfig, *, output_uri: str, overwrite=False) -> dict

Flow: load every source (:mod:`.sources`) -> dedup / filter / render / split
(:mod:`.filters`) -> validate with Great Expectations (:mod:`.validation`) ->
write the artifact. Validation runs on the final rows *before* anything is
written, so a dataset that fails it never exists at ``output_uri``.

Artifact (kind ``dataset``, stage ``data_prep``)::

    train.parquet  eval.parquet     schema in quarl.data.schema
    summary.json   summary.md       counts per split/source, length stats, difficulty histogram, drops
    validation.json validation.md   every expectation and its result
    manifest.json                   written by quarl.artifacts (config, inputs, checksums)

On a validation failure the stage writes the report — which expectations
failed and the ids of the failing rows — as a complete ``report`` artifact at
the sibling URI ``<output_uri>-validation-failed`` (replacing an older one),
then raises :class:`DataValidationError` naming that URI. A sibling rather
than a sub-directory of ``output_uri``: the output URI stays free (no
half-written dataset to clean up before a re-run) and the report survives
the failed run as a normal artifact, local or on S3.
"""

from __future__ import annotations

import json
import logging
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from quarl.data.config import DataPrepConfig
from quarl.data.filters import answers_parse, process_rows
from quarl.data.schema import SCHEMA, SCHEMA_VERSION
from quarl.data.sources import load_source
from quarl.data.summary import build_summary, summary_markdown
from quarl.data.templates import PromptTemplate
from quarl.data.validation import DataValidationError, validate_rows

__all__ = ["STAGE", "failed_report_uri", "run_data_prep"]

STAGE = "data_prep"
log = logging.getLogger(__name__)


def failed_report_uri(output_uri: str) -> str:
    """Where a failed validation's report goes: ``<output_uri>-validation-failed``."""
    return str(output_uri).rstrip("/") + "-validation-failed"


def _input_uris(cfg: DataPrepConfig) -> list[str]:
    out = []
    for s in cfg.sources:
        if s.name == "synthetic":
            seed = s.seed if s.seed is not None else cfg.seed
            out.append(f"builtin:synthetic?n={s.num_samples}&seed={seed}")
        elif s.path:
            out.append(s.path)
        else:
            from quarl.data.sources import HUB_DEFAULTS

            repo, subset = HUB_DEFAULTS[s.name]
            out.append(f"hf://{repo}" + (f"?subset={s.hf_subset or subset}" if (s.hf_subset or subset) else ""))
    return out


def _write_table(rows: pd.DataFrame, path) -> None:
    table = pa.Table.from_pandas(rows[list(SCHEMA.names)], schema=SCHEMA, preserve_index=False)
    pq.write_table(table, path)


def run_data_prep(cfg: DataPrepConfig, *, output_uri: str, overwrite: bool = False) -> dict:
    """Prepare, validate and write the dataset artifact; returns a small result dict."""
    from quarl.artifacts import write_artifact

    t0 = time.monotonic()
    template = PromptTemplate(cfg.template, tokenizer=cfg.tokenizer, instruction=cfg.instruction)

    loaded, source_counts = [], {}
    for i, src in enumerate(cfg.sources):
        rows, counts = load_source(src, seed=cfg.seed)
        key = src.name if src.name not in source_counts else f"{src.name}#{i}"
        source_counts[key] = counts
        loaded.append((src.split, rows))
        log.info("source %s: %s", key, counts)

    rows, drops = process_rows(loaded, cfg, template)
    df = pd.DataFrame([r.as_dict() for r in rows], columns=list(SCHEMA.names))
    df["difficulty"] = df["difficulty"].astype("Int64")

    report = None
    if cfg.validation.enabled:
        report = validate_rows(df, cfg, answer_parses=answers_parse(df["answer"].tolist()))  # cached
        if not report.success:
            uri = failed_report_uri(output_uri)
            with write_artifact(
                uri, kind="report", stage=STAGE, config=cfg, inputs=_input_uris(cfg), overwrite=True
            ) as art:
                (art.path / "validation.json").write_text(report.to_json())
                (art.path / "validation.md").write_text(report.to_markdown())
                art.metadata["validation"] = "failed"
                art.metadata["failed_dataset_uri"] = str(output_uri)
            raise DataValidationError(report, report_uri=uri)

    prompt_tokens = template.count_tokens(df["prompt"].tolist()) if template.tokenizer is not None else None
    summary = build_summary(
        df, source_counts=source_counts, drops=drops, prompt_tokens=prompt_tokens, template=cfg.template
    )
    split_rows = {s: int((df["split"] == s).sum()) for s in ("train", "eval")}
    with write_artifact(
        output_uri, kind="dataset", stage=STAGE, config=cfg, inputs=_input_uris(cfg), overwrite=overwrite
    ) as art:
        for split in ("train", "eval"):
            _write_table(df[df["split"] == split], art.path / f"{split}.parquet")
        (art.path / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        (art.path / "summary.md").write_text(summary_markdown(summary))
        if report is not None:
            (art.path / "validation.json").write_text(report.to_json())
            (art.path / "validation.md").write_text(report.to_markdown())
        art.metadata.update(
            schema_version=SCHEMA_VERSION,
            columns=list(SCHEMA.names),
            rows=split_rows,
            template=cfg.template,
            validation="passed" if report is not None else "skipped",
        )
    result = {
        "output_uri": str(output_uri),
        "rows": split_rows,
        "sources": source_counts,
        "dropped": drops,
        "validation": "passed" if report is not None else "skipped",
        "seconds": round(time.monotonic() - t0, 2),
    }
    log.info("data_prep wrote %s: %s", output_uri, split_rows)
    return result
