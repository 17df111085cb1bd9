"""Calibration and held-out text -> fixed-length token windows.

Where the text comes from:

  * a ``data_prep`` artifact (``data_uri``): its ``train`` split for calibration
    and its ``eval`` split for the held-out metrics, columns ``prompt`` (the
    rendered prompt the policy will actually see) and optionally ``solution``.
    Calibrating on in-domain prompts is what Reasoning-QAT recommends: the
    activation statistics that GPTQ's Hessian and AWQ's scales are built from
    should be those of the task, not of web text;
  * generic text in a local file (there is no internet on the training
    nodes): ``.txt`` (documents separated by blank lines), ``.jsonl`` /
    ``.json`` (field ``text_field``) or ``.parquet``.

Windows. Documents are tokenized, joined with the EOS token and cut into
consecutive ``seq_len``-token windows (packing, as llm-compressor and the
GPTQ repository do for C4/WikiText). Prompts are short (GSM8K ~100 tokens), so
packing wastes nothing, needs no padding or attention masks, and makes every
window exactly ``seq_len`` long -- which the block-by-block loop relies on to
replay one set of rotary embeddings per batch. Documents are shuffled with a
fixed seed first, so the same config always yields the same windows. If there
is not enough text for the requested number of windows, fewer are used and the
stage records the actual count.

Held-out text defaults (first that applies): ``eval.path``; the data
artifact's ``eval`` split; else the documents *after* the ones used for
calibration (``holdout_fraction`` of them), so the held-out windows never
overlap the calibration ones.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from quarl.quant.base import QuantError


class CalibrationDataError(QuantError):
    """Missing or unusable calibration / held-out text; the message names the fix."""


def read_text_file(path: str | Path, text_field: str = "text") -> list[str]:
    """Documents from a local .txt / .jsonl / .json / .parquet file."""
    p = Path(path)
    if not p.is_file():
        raise CalibrationDataError(
            f"calibration text file {p} does not exist; set data.path to a local "
            f".txt/.jsonl/.json/.parquet file or pass a data_prep artifact"
        )
    suf = p.suffix.lower()
    if suf == ".txt":
        docs = [d.strip() for d in p.read_text(encoding="utf-8").split("\n\n")]
    elif suf in (".jsonl", ".ndjson"):
        rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        docs = _field(rows, text_field, p)
    elif suf == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        rows = data if isinstance(data, list) else data.get("data") or data.get("rows") or []
        docs = _field(rows, text_field, p)
    elif suf == ".parquet":
        import pyarrow.parquet as pq

        docs = _field(pq.read_table(p).to_pylist(), text_field, p)
    else:
        raise CalibrationDataError(f"{p}: unsupported text file type {suf!r}; use .txt, .jsonl, .json or .parquet")
    docs = [d for d in docs if d]
    if not docs:
        raise CalibrationDataError(f"{p} holds no text")
    return docs


def _field(rows: list, field: str, p: Path) -> list[str]:
    if rows and field not in rows[0]:
        raise CalibrationDataError(
            f"{p}: records have no field {field!r} (fields: {sorted(rows[0])}); "
            f"set text_field to the one holding the text"
        )
    return [str(r.get(field) or "").strip() for r in rows]


def read_artifact_split(root: str | Path, split: str, columns: list[str]) -> list[str]:
    """Rows of a data_prep artifact split (``<split>.parquet``), ``columns`` joined by a newline."""
    import pyarrow.parquet as pq

    root = Path(root)
    files = sorted(root.rglob(f"{split}.parquet")) or sorted(root.rglob(f"{split}*.parquet"))
    if not files:
        found = sorted(p.name for p in root.rglob("*.parquet"))
        raise CalibrationDataError(
            f"data artifact {root} has no {split!r} split (parquet files: {found}); "
            f"re-run data-prep or set the split name"
        )
    docs: list[str] = []
    for f in files:
        t = pq.read_table(f)
        missing = [c for c in columns if c not in t.column_names]
        if missing:
            raise CalibrationDataError(f"{f}: columns {missing} not found (columns: {t.column_names})")
        cols = [t.column(c).to_pylist() for c in columns]
        docs += ["\n".join(str(v) for v in vals if v) for vals in zip(*cols)]
    return [d for d in docs if d.strip()]


def shuffled(docs: list[str], seed: int) -> list[str]:
    out = list(docs)
    random.Random(seed).shuffle(out)
    return out


def make_windows(docs: list[str], tokenizer, num: int, seq_len: int) -> torch.Tensor:
    """Pack ``docs`` (EOS-separated) into up to ``num`` windows of ``seq_len`` tokens -> [n, seq_len]."""
    if seq_len < 2:
        raise CalibrationDataError(f"seq_len must be at least 2, got {seq_len}")
    eos = tokenizer.eos_token_id
    need = num * seq_len
    ids: list[int] = []
    for d in docs:
        ids += tokenizer(d, add_special_tokens=False)["input_ids"]
        if eos is not None:
            ids.append(eos)
        if len(ids) >= need:
            break
    n = min(num, len(ids) // seq_len)
    if n == 0:
        raise CalibrationDataError(
            f"the text gives only {len(ids)} tokens, less than one window of {seq_len}; add data or lower seq_len"
        )
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def batches(windows: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    return [windows[i : i + batch_size] for i in range(0, windows.shape[0], max(1, batch_size))]
