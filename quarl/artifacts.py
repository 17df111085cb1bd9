"""Artifacts: the only thing that passes between stages — a directory plus ``manifest.json``.

    with write_artifact(out_uri, "model", "rl", config=cfg, inputs=[model_uri, data_uri]) as art:
        save_model(model, art.path)            # write payload files into a local staging dir
        art.metadata["reward_mean"] = 0.61     # extra manifest fields
    art = open_artifact(out_uri, kind="model") # -> Artifact(path, manifest), verified

Guarantees:
- An artifact is *complete* iff its ``manifest.json`` exists with ``complete: true``.
  The manifest is written last — after every payload file is in place (local) or
  uploaded (s3) — so a crash at any point leaves nothing that reads as complete.
- Local URIs are staged in ``<uri>.tmp-<random>`` beside the target (same
  filesystem) and renamed into place, so readers see the old artifact or the new
  one, never a mix. s3 URIs are staged under the cache, any previous objects at
  the prefix are deleted (old manifest first), payload files are uploaded, then
  the manifest; the staged copy then becomes the read cache for that URI.
- On an exception the staged directory stays for inspection, holding a manifest
  with ``complete: false`` and the error; the target is untouched (local) or has
  no manifest (s3).
- A complete artifact is never replaced unless ``overwrite=True``; a local
  directory that is not an artifact is never replaced at all.
- ``open_artifact`` checks the manifest, the kind, and every file's size and
  sha256 (``verify=False`` checks sizes only, for hot paths on trusted disks),
  and names the bad file and the stage to re-run.
Manifest fields: format, kind, stage, uri, config, config_type, inputs (lineage),
git_commit, quarl_version, switches (the compute switches set in the environment, ``quarl.switches``:
a run's numbers depend on them and its config does not name them), created, completed, files {rel: {sha256,
size}}, complete, plus the writer's free-form ``metadata`` merged at top level.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import quarl
from quarl.config import config_to_dict
from quarl.storage import NoSuchKeyError, S3Store, is_s3, local_path, sha256_file
from quarl.switches import compute_switches

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "quarl-artifact/1"
KINDS = ("dataset", "model", "adapter", "metrics", "report", "recipe")
RESERVED = frozenset({
    "format", "kind", "stage", "uri", "config", "config_type", "inputs", "git_commit", "quarl_version",
    "switches", "created", "completed", "files", "complete", "error",
})  # fmt: skip


class ArtifactError(RuntimeError):
    """A missing, incomplete, corrupt or mismatched artifact; the message names the file and the fix."""


class ArtifactExistsError(ArtifactError):
    """The output URI already holds a complete artifact and overwrite was not requested."""


def cache_root() -> Path:
    """``$QUARL_CACHE`` or ``~/.cache/quarl`` (the same root as ``quarl.models.cache_dir``)."""
    return Path(os.environ.get("QUARL_CACHE") or "~/.cache/quarl").expanduser()


def artifact_cache_dir(uri: str) -> Path:
    """Where ``open_artifact`` keeps the local copy of an s3 artifact."""
    return cache_root() / "artifacts" / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """$QUARL_GIT_COMMIT (set in images), else HEAD of the git checkout quarl runs from, else "unknown"."""
    if os.environ.get("QUARL_GIT_COMMIT"):
        return os.environ["QUARL_GIT_COMMIT"]
    pkg = Path(quarl.__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=pkg,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = out.stdout.split()
    # Only trust a repo whose top level is quarl's own source tree (not, say, a repo holding the venv).
    if out.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() / "quarl" == pkg:
        return lines[1]
    return "unknown"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclasses.dataclass
class Artifact:
    """A verified artifact on local disk (for s3 URIs: the local cache copy)."""

    path: Path
    manifest: dict

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    @property
    def uri(self) -> str:
        return self.manifest.get("uri", str(self.path))

    @property
    def config(self) -> dict | None:
        return self.manifest.get("config")

    @property
    def metadata(self) -> dict:
        """The writer's free-form fields (``art.metadata[...]`` at write time)."""
        return {k: v for k, v in self.manifest.items() if k not in RESERVED}

    def file(self, rel: str) -> Path:
        """Path of payload file ``rel``; ArtifactError if the manifest does not list it."""
        if rel not in self.manifest.get("files", {}):
            have = ", ".join(sorted(self.manifest.get("files", {}))[:20])
            raise ArtifactError(f"{self.uri} ({self.kind} from stage {self.stage}) has no file {rel!r}; it has: {have}")
        return self.path / rel


@dataclasses.dataclass
class ArtifactWriter:
    """Yielded by ``write_artifact``: write payload files under ``path``; add fields to ``metadata``.
    After a clean exit ``path`` names the published copy (the target dir, or the s3 read cache)."""

    uri: str
    kind: str
    stage: str
    path: Path
    metadata: dict = dataclasses.field(default_factory=dict)


def _input_uri(x: Any) -> str:
    if isinstance(x, Artifact):
        return x.uri
    return str(x)


def _read_local_manifest(d: Path) -> dict | None:
    try:
        return json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _complete(m: dict | None) -> bool:
    return isinstance(m, dict) and m.get("complete") is True


def _refuse(uri: str, m: dict) -> ArtifactExistsError:
    return ArtifactExistsError(
        f"{uri} already holds a complete {m.get('kind')} artifact (stage {m.get('stage')}, completed "
        f"{m.get('completed')}); pass overwrite=True (CLI: --overwrite) to replace it, or write to a new URI "
        "such as a new run id"
    )


def _checksums(root: Path) -> dict[str, dict]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {p.relative_to(root).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size} for p in files}


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def write_artifact(
    uri: str | Path,
    kind: str,
    stage: str,
    config: Any = None,
    inputs: Iterable[Any] = (),
    overwrite: bool = False,
    store: S3Store | None = None,
) -> Iterator[ArtifactWriter]:
    """Stage an artifact locally, then publish it to ``uri`` with ``manifest.json`` last (see module doc)."""
    if kind not in KINDS:
        raise ArtifactError(f"unknown artifact kind {kind!r}; use one of: {', '.join(KINDS)}")
    if not stage:
        raise ArtifactError("write_artifact needs the name of the stage writing it")
    uri = str(uri)
    s3 = is_s3(uri)
    if s3:
        uri = uri.rstrip("/")
        store = store or S3Store()
        old = _read_s3_manifest(store, uri)  # fails fast on a missing bucket or bad credentials
        if _complete(old) and not overwrite:
            raise _refuse(uri, old)
        staging = cache_root() / "staging" / f"{hashlib.sha256(uri.encode()).hexdigest()[:12]}-{secrets.token_hex(4)}"
    else:
        target = local_path(uri).absolute()
        old = _read_local_manifest(target)
        if _complete(old) and not overwrite:
            raise _refuse(uri, old)
        if target.exists() and old is None and (not target.is_dir() or any(target.iterdir())):
            raise ArtifactError(
                f"{target} exists and is not a quarl artifact (no {MANIFEST}); refusing to replace it — "
                "choose another output path or remove it yourself"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f"{target.name}.tmp-{secrets.token_hex(4)}"
    staging.mkdir(parents=True)
    created = _now()
    writer = ArtifactWriter(uri=uri, kind=kind, stage=stage, path=staging)
    manifest = {
        "format": FORMAT,
        "kind": kind,
        "stage": stage,
        "uri": uri if s3 else str(target),
        "config": config_to_dict(config) if config is not None else None,
        "config_type": f"{type(config).__module__}.{type(config).__qualname__}" if config is not None else None,
        "inputs": [_input_uri(x) for x in inputs],
        "git_commit": git_commit(),
        "quarl_version": quarl.__version__,
        "switches": compute_switches(),
        "created": created,
    }
    try:
        yield writer
    except BaseException as e:
        _write_json(staging / MANIFEST, {**manifest, "complete": False, "error": f"{type(e).__name__}: {e}"[:4000]})
        log.warning("artifact %s NOT written (%s); staging dir kept for inspection: %s", uri, type(e).__name__, staging)
        raise
    bad = RESERVED.intersection(writer.metadata)
    if bad:
        raise ArtifactError(f"art.metadata may not set reserved manifest fields {sorted(bad)}; rename them")
    if (staging / MANIFEST).exists():
        raise ArtifactError(f"{MANIFEST} is reserved for the artifact manifest; the {stage} stage wrote its own")
    files = _checksums(staging)
    manifest.update(writer.metadata)
    manifest.update(files=files, completed=_now(), complete=True)
    _write_json(staging / MANIFEST, manifest)
    if s3:
        writer.path = _publish_s3(store, staging, uri, files, replace_existing=old is not None or store.exists(uri))
    else:
        _publish_local(staging, target)
        writer.path = target
    log.info("wrote %s artifact %s (%d files, %d bytes)", kind, uri, len(files), sum(f["size"] for f in files.values()))


def _publish_local(staging: Path, target: Path) -> None:
    if not target.exists():
        os.rename(staging, target)
        return
    # Replace an old (incomplete, or overwrite=True) artifact: move it aside, swap in, then delete it.
    aside = target.parent / f"{target.name}.old-{secrets.token_hex(4)}"
    os.rename(target, aside)
    os.rename(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


def _publish_s3(store: S3Store, staging: Path, uri: str, files: dict, replace_existing: bool) -> Path:
    if replace_existing:
        # Unmark first, so a crash mid-replacement leaves an incomplete artifact, never a wrong complete one.
        store.delete_prefix(f"{uri}/{MANIFEST}")
        n = store.delete_prefix(uri)
        log.info("replaced %d old objects under %s", n, uri)
    store.upload_dir(staging, uri, exclude=(MANIFEST,), checksums={k: v["sha256"] for k, v in files.items()})
    store.upload_file(staging / MANIFEST, f"{uri}/{MANIFEST}")
    cache = artifact_cache_dir(uri)
    shutil.rmtree(cache, ignore_errors=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, cache)  # the written copy is a valid read cache for this uri
    except OSError:  # a concurrent reader filled the cache first: keep our (complete) copy where it is
        return staging
    return cache


def _read_s3_manifest(store: S3Store, uri: str) -> dict | None:
    try:
        data = store.get_bytes(f"{uri}/{MANIFEST}")
    except NoSuchKeyError:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"complete": False, "error": "unparseable manifest"}


def _verify_header(m: Any, uri: str, kind: str | None) -> None:
    if not isinstance(m, dict) or "kind" not in m:
        raise ArtifactError(f"{uri} is corrupt: {MANIFEST} is not a quarl manifest; re-run the stage that writes it")
    stage = m.get("stage", "?")
    if not _complete(m):
        why = f" (it failed with {m['error']})" if m.get("error") else ""
        raise ArtifactError(f"{uri} is incomplete: {MANIFEST} is not marked complete{why}; re-run the {stage} stage")
    if not isinstance(m.get("files"), dict):
        raise ArtifactError(f"{uri} is corrupt: {MANIFEST} lists no files; re-run the {stage} stage")
    if kind is not None and m["kind"] != kind:
        raise ArtifactError(f"{uri} is a {m['kind']} artifact (from stage {stage}), but a {kind} artifact was expected")


def _verify(path: Path, m: Any, uri: str, kind: str | None, verify: bool) -> Artifact:
    _verify_header(m, uri, kind)
    stage = m.get("stage", "?")
    for rel, info in m["files"].items():
        p = path / rel
        if not p.is_file():
            raise ArtifactError(f"{uri} is incomplete: {rel} is missing; re-run the {stage} stage")
        size = p.stat().st_size
        if size != info["size"]:
            raise ArtifactError(
                f"{uri} is corrupt: {rel} has {size} bytes, the manifest says {info['size']}; re-run the {stage} stage"
            )
        if verify and sha256_file(p) != info["sha256"]:
            raise ArtifactError(f"{uri} is corrupt: {rel} fails its sha256 check; re-run the {stage} stage")
    return Artifact(path=path, manifest=m)


def open_artifact(
    uri: str | Path, kind: str | None = None, verify: bool = True, store: S3Store | None = None
) -> Artifact:
    """Open and verify an artifact; s3 URIs are downloaded to (or reused from) the local cache."""
    uri = str(uri)
    if not is_s3(uri):
        path = local_path(uri).absolute()
        if not path.is_dir():
            raise ArtifactError(f"no artifact at {uri}: the directory does not exist; run the stage that writes it")
        if not (path / MANIFEST).is_file():
            raise ArtifactError(
                f"{uri} is incomplete: {MANIFEST} is missing (its stage did not finish); re-run the stage that writes it"
            )
        return _verify(path, _read_local_manifest(path) or {}, uri, kind, verify)

    uri = uri.rstrip("/")
    store = store or S3Store()
    try:
        raw = store.get_bytes(f"{uri}/{MANIFEST}")
    except NoSuchKeyError:
        what = f"{MANIFEST} is missing (its stage did not finish)" if store.exists(uri) else "nothing is stored there"
        raise ArtifactError(f"{uri} is incomplete: {what}; re-run the stage that writes it") from None
    try:
        m = json.loads(raw)
    except ValueError:
        m = None
    _verify_header(m, uri, kind)  # refuse incomplete/mismatched artifacts before downloading gigabytes
    cache = artifact_cache_dir(uri)
    if (cache / MANIFEST).is_file() and (cache / MANIFEST).read_bytes() == raw:
        try:
            return _verify(cache, m, uri, kind, verify)
        except ArtifactError as e:
            log.warning("cached copy of %s is bad (%s); downloading it again", uri, e)
    tmp = cache.parent / f"{cache.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        store.download_files([(f"{uri}/{rel}", tmp / rel) for rel in m["files"]], verify=False)
        (tmp / MANIFEST).write_bytes(raw)
        art = _verify(tmp, m, uri, kind, verify=True)  # sha256 against the manifest, the authority
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(cache, ignore_errors=True)
    try:
        os.rename(tmp, cache)
    except OSError:  # a concurrent reader published the same content first
        shutil.rmtree(tmp, ignore_errors=True)
        return _verify(cache, m, uri, kind, verify=False)
    art.path = cache
    return art
