"""The normalized dataset schema every source is mapped to.

One row per problem, written as ``train.parquet`` / ``eval.parquet``:

    id          string   stable: sha256(source + "\\x00" + problem)[:16] — the same
                         problem from the same source gets the same id on every run
    problem     string   the raw problem text as the source wrote it
    prompt      string   the text fed to the model (template applied; see templates)
    messages    string   JSON list of {"role", "content"}: the chat form of the prompt
    answer      string   the reference final answer, normalized ("1000", "7/12",
                         "\\frac{\\sqrt{3}}{2}"); rewards compare against it with math-verify
    solution    string?  the reference worked solution when the source has one
    source      string   source name (synthetic, gsm8k, math, bigmath, ...)
    difficulty  int64?   in the source's own scale (MATH/BigMath/generator 1-5,
                         DeepMath 1-10); null when unknown
    split       string   "train" | "eval"

The rendered ``prompt`` is stored (rather than re-rendered downstream) so that
the RL and eval stages read exactly what validation checked and what the
summary's length statistics describe.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

__all__ = ["COLUMNS", "SCHEMA", "SCHEMA_VERSION", "make_id"]

SCHEMA_VERSION = 1

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("problem", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("messages", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("solution", pa.string(), nullable=True),
        pa.field("source", pa.string(), nullable=False),
        pa.field("difficulty", pa.int64(), nullable=True),
        pa.field("split", pa.string(), nullable=False),
    ]
)
COLUMNS = tuple(SCHEMA.names)


def make_id(source: str, problem: str) -> str:
    """Stable 16-hex-digit id of a problem within a source."""
    return hashlib.sha256(f"{source}\x00{problem}".encode()).hexdigest()[:16]
