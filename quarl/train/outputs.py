"""Where a training stage keeps its work, and the guard against training into a finished artifact.

A training stage (rl, distill, kd_coldstart, precision_search) writes one artifact at its
output URI, but works for hours before that: checkpoints live in a work directory *beside*
the output (``<output>.work/`` for a local output, a per-URI folder of the local cache for
an ``s3://`` one) and are mirrored to ``<output>.checkpoints`` on S3, so a retried pod
resumes where the last one stopped and a complete artifact is never half-overwritten.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from quarl.artifacts import ArtifactExistsError, cache_root
from quarl.storage import is_s3, local_path

__all__ = ["checkpoint_remote_for", "refuse_existing", "work_dir_for"]


def work_dir_for(output_uri: str, stage: str = "rl") -> Path:
    """Local work directory (checkpoints, metrics, tensorboard) of the run writing ``output_uri``."""
    if is_s3(output_uri):
        return cache_root() / f"{stage}-work" / hashlib.sha256(output_uri.rstrip("/").encode()).hexdigest()[:24]
    p = local_path(output_uri).absolute()
    return p.parent / f"{p.name}.work"


def checkpoint_remote_for(output_uri: str) -> str | None:
    """The S3 mirror of the checkpoints (None for a local output: the work directory is already durable)."""
    return f"{output_uri.rstrip('/')}.checkpoints" if is_s3(output_uri) else None


def refuse_existing(output_uri: str, overwrite: bool) -> None:
    """Raise ArtifactExistsError if ``output_uri`` already holds a complete artifact and not ``overwrite``."""
    if overwrite:
        return
    if is_s3(output_uri):
        from quarl.storage import S3Store

        exists = S3Store().exists(f"{output_uri.rstrip('/')}/manifest.json")
    else:
        m = local_path(output_uri) / "manifest.json"
        exists = m.exists() and json.loads(m.read_text()).get("complete") is True
    if exists:
        raise ArtifactExistsError(f"{output_uri} already holds a complete artifact; pass overwrite=True "
                                  f"(CLI: --overwrite) to train again into it, or choose a new output")
