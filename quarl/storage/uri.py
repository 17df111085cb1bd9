"""URIs: a stage's inputs and output are either local paths or ``s3://bucket/key``.

Only the ``s3://`` scheme is special; ``file://`` is accepted and stripped; every
other string is a local path. Bucket names are checked against the S3 rules
here so that a typo fails before any network call with a readable message.
"""

from __future__ import annotations

import re
from pathlib import Path

from quarl.storage.errors import InvalidURIError

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


def is_s3(uri: str | Path) -> bool:
    return isinstance(uri, str) and uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; the key has no leading slash (may be empty)."""
    if not is_s3(uri):
        raise InvalidURIError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    check_bucket_name(bucket, uri)
    return bucket, key.lstrip("/")


def check_bucket_name(bucket: str, uri: str | None = None) -> str:
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        where = f" in {uri!r}" if uri else ""
        raise InvalidURIError(
            f"invalid S3 bucket name {bucket!r}{where}: use 3-63 lowercase letters, digits, '-' or '.', "
            "starting and ending with a letter or digit (e.g. s3://quarl-runs/...)"
        )
    return bucket


def s3_uri(bucket: str, key: str = "") -> str:
    return f"s3://{bucket}/{key.lstrip('/')}" if key else f"s3://{bucket}"


def join_uri(base: str | Path, *parts: str) -> str:
    """Join path segments onto a local path or an s3:// URI (no normalisation of ``..``)."""
    base = str(base)
    segs = [p.strip("/") for p in parts if p and p.strip("/")]
    if is_s3(base):
        return "/".join([base.rstrip("/")] + segs)
    return str(Path(local_path(base), *segs))


def local_path(uri: str | Path) -> Path:
    """The local path a non-s3 URI names (``file://`` stripped, ``~`` expanded)."""
    if is_s3(uri):
        raise InvalidURIError(f"expected a local path, got {uri!r}")
    return Path(str(uri).removeprefix("file://")).expanduser()
