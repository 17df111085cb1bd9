"""Data preparation: verifiable math problems from the built-in generator,
GSM8K, MATH/MATH-500, BigMath, DeepMath and OpenR1-Math -> one normalized,
deduplicated, validated parquet dataset artifact.

    run_data_prep(cfg: DataPrepConfig, *, output_uri) -> dict     the stage
    read_split(uri, "train") -> DataFrame                         for downstream stages
    generate_problems(n, seed, levels) -> [GeneratedProblem]       the embedded default source
    PromptTemplate("qerl" | "chat" | "plain", tokenizer=None)      prompt rendering

See ``stage`` (flow and artifact layout), ``schema`` (columns), ``sources``
(field mappings), ``filters`` (dedup/filters/split) and ``validation``.
"""

from quarl.data.config import DataPrepConfig, FilterConfig, SourceConfig, SplitConfig, ValidationConfig
from quarl.data.generator import GeneratedProblem, generate_problems
from quarl.data.io import read_dataset, read_split
from quarl.data.readers import SourceError, read_records
from quarl.data.schema import COLUMNS, SCHEMA, make_id
from quarl.data.sources import load_source, normalize_answer
from quarl.data.stage import failed_report_uri, run_data_prep
from quarl.data.templates import QERL_INSTRUCTION, PromptTemplate, TemplateError
from quarl.data.validation import DataValidationError, ValidationReport, validate_rows

__all__ = [
    "COLUMNS",
    "QERL_INSTRUCTION",
    "SCHEMA",
    "DataPrepConfig",
    "DataValidationError",
    "FilterConfig",
    "GeneratedProblem",
    "PromptTemplate",
    "SourceConfig",
    "SourceError",
    "SplitConfig",
    "TemplateError",
    "ValidationConfig",
    "ValidationReport",
    "failed_report_uri",
    "generate_problems",
    "load_source",
    "make_id",
    "normalize_answer",
    "read_dataset",
    "read_records",
    "read_split",
    "run_data_prep",
    "validate_rows",
]
