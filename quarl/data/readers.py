"""Read raw records (dicts) from local files, S3, or the Hugging Face hub.

    read_records(path, hf_subset=None, hf_split=None) -> list[dict]

``path`` forms:

* a local file: ``.jsonl``/``.ndjson`` (one JSON object per line), ``.json``
  (a list of objects, or ``{"data"|"rows"|"examples": [...]}``),
  ``.parquet``; a ``.gz`` suffix on the JSON forms is accepted;
* a local directory or glob (``data/train-*.parquet``): every supported file
  in it, in sorted order (a Hugging Face snapshot directory works as is);
* ``s3://bucket/key`` — one object or a prefix, downloaded through
  :class:`quarl.storage.S3Store` into a temporary directory, then read as
  above (boto3 is only imported on this path);
* ``hf://org/name`` — ``datasets.load_dataset(org/name, hf_subset,
  split=hf_split)``. Offline (as in CI and air-gapped clusters) this fails
  with a message that says to pass a local path or an ``s3://`` URI instead.

Records are plain dicts; mapping their fields to our schema is the job of
:mod:`quarl.data.sources`.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import tempfile
from pathlib import Path

__all__ = ["SUPPORTED_SUFFIXES", "SourceError", "read_records"]

SUPPORTED_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".jsonl.gz", ".ndjson.gz", ".json.gz")


class SourceError(ValueError):
    """A data source cannot be read or mapped; the message names the fix."""


def _suffix(p: Path) -> str:
    name = p.name.lower()
    for s in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if name.endswith(s):
            return s
    return p.suffix.lower()


def _open_text(p: Path):
    return gzip.open(p, "rt", encoding="utf-8") if p.name.lower().endswith(".gz") else open(p, encoding="utf-8")


def _read_file(p: Path) -> list[dict]:
    suf = _suffix(p)
    if suf == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if suf in (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz"):
        out = []
        with _open_text(p) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SourceError(f"{p}:{lineno}: not valid JSON ({e.msg}); fix or remove that line") from e
                if not isinstance(rec, dict):
                    raise SourceError(f"{p}:{lineno}: expected a JSON object per line, got {type(rec).__name__}")
                out.append(rec)
        return out
    if suf in (".json", ".json.gz"):
        with _open_text(p) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise SourceError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from e
        if isinstance(data, dict):
            for key in ("data", "rows", "examples", "train", "test"):
                if isinstance(data.get(key), list):
                    data = data[key]
                    break
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise SourceError(f"{p}: expected a JSON list of objects (or {{'data': [...]}})")
        return data
    raise SourceError(f"{p}: unsupported file type; use one of {', '.join(SUPPORTED_SUFFIXES)}")


def _files_in(path: str) -> list[Path]:
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [f for f in sorted(p.rglob("*")) if f.is_file() and _suffix(f) in SUPPORTED_SUFFIXES]
        if not files:
            raise SourceError(f"{path}: directory holds no {', '.join(SUPPORTED_SUFFIXES)} files")
        return files
    if any(c in path for c in "*?["):
        files = [Path(f) for f in sorted(glob.glob(os.path.expanduser(path), recursive=True)) if Path(f).is_file()]
        if not files:
            raise SourceError(f"{path}: the glob matches no files")
        return files
    raise SourceError(f"{path}: no such file or directory; pass a local file/dir, an s3:// URI or hf://org/name")


def _read_local(path: str) -> list[dict]:
    out: list[dict] = []
    for f in _files_in(path):
        out.extend(_read_file(f))
    return out


def _read_s3(uri: str) -> list[dict]:
    from quarl.storage import S3Store, split_s3

    store = S3Store()
    _, key = split_s3(uri)
    with tempfile.TemporaryDirectory(prefix="quarl-data-") as tmp:
        objs = store.list_objects(uri)
        exact = [o for o in objs if o.key == key]
        if exact and key:
            dest = Path(tmp) / Path(key).name
            store.download_file(uri, dest)
        else:
            store.download_dir(uri, tmp)
        return _read_local(tmp)


def _read_hub(repo: str, subset: str | None, split: str | None) -> list[dict]:
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise SourceError("reading hf:// sources needs the `datasets` package") from e
    try:
        ds = datasets.load_dataset(repo, subset, split=split or "train")
    except Exception as e:
        raise SourceError(
            f"cannot load hf://{repo} (subset={subset}, split={split or 'train'}) from the Hugging Face hub: "
            f"{type(e).__name__}: {str(e)[:300]}. If the hub is unreachable (offline cluster, CI), download the "
            "files elsewhere and pass a local path (jsonl/json/parquet file or directory) or an s3:// URI as "
            "`path` instead."
        ) from e
    return [dict(r) for r in ds]


def read_records(path: str, hf_subset: str | None = None, hf_split: str | None = None) -> list[dict]:
    """Raw records from ``path`` (see module docstring)."""
    if not path:
        raise SourceError("empty source path; pass a local file/dir, an s3:// URI or hf://org/name")
    if path.startswith("s3://"):
        return _read_s3(path)
    if path.startswith("hf://"):
        return _read_hub(path[len("hf://") :], hf_subset, hf_split)
    path = path.removeprefix("file://")
    return _read_local(path)
