"""quarl.artifacts: manifest-last writes, verification on open, overwrite rules; local and s3."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quarl.artifacts import (
    MANIFEST,
    ArtifactError,
    ArtifactExistsError,
    artifact_cache_dir,
    git_commit,
    open_artifact,
    write_artifact,
)
from quarl.storage import NoSuchBucketError, S3Store
from quarl.switches import COMPUTE_SWITCHES


@dataclass
class StageCfg:
    lr: float = 1e-5
    steps: int = 3
    formats: list[str] = field(default_factory=lambda: ["nvfp4"])


PAYLOAD = {"weights.bin": bytes(range(256)) * 40, "sub/config.json": b'{"hidden": 64}', "empty.txt": b""}


def _fill(path: Path, payload=PAYLOAD) -> None:
    for rel, data in payload.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUARL_CACHE", str(tmp_path / "cache"))


# ------------------------------------------------------------------------------------------------ local
def test_local_round_trip_and_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("QUARL_GIT_COMMIT", "abc123")
    for k in COMPUTE_SWITCHES:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("QUARL_KERNELS_DENSE_FP8", "1")
    monkeypatch.setenv("QUARL_KFP_TOKEN", "secret")
    monkeypatch.setenv("QUARL_S3_ENDPOINT", "http://127.0.0.1:1")
    git_commit.cache_clear()
    out = tmp_path / "runs" / "r1" / "rl" / "model"
    with write_artifact(out, "model", "rl", config=StageCfg(), inputs=["s3://b/data", tmp_path / "base"]) as art:
        assert art.path != out and art.path.parent == out.parent  # staged beside the target
        _fill(art.path)
        art.metadata["reward_mean"] = 0.61
    git_commit.cache_clear()
    assert art.path == out  # after the block: the published copy

    a = open_artifact(str(out), kind="model")
    m = a.manifest
    assert a.path == out and a.kind == "model" and a.stage == "rl" and m["complete"] is True
    assert m["config"] == {"lr": 1e-5, "steps": 3, "formats": ["nvfp4"]} and m["config_type"].endswith("StageCfg")
    assert m["inputs"] == ["s3://b/data", str(tmp_path / "base")]
    assert m["git_commit"] == "abc123" and m["quarl_version"] and m["format"] == "quarl-artifact/1"
    assert m["switches"] == {"QUARL_KERNELS_DENSE_FP8": "1"}  # compute switches only: no token, no S3 endpoint
    assert m["created"] <= m["completed"] and m["uri"] == str(out)
    assert m["files"] == {r: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for r, d in PAYLOAD.items()}
    assert m["reward_mean"] == 0.61 and a.metadata == {"reward_mean": 0.61}
    assert a.file("sub/config.json").read_bytes() == PAYLOAD["sub/config.json"]
    with pytest.raises(ArtifactError, match="has no file 'nope'"):
        a.file("nope")
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]  # no staging leftovers
    assert json.loads((out / MANIFEST).read_text()) == m


def test_git_commit_is_a_sha_or_unknown(monkeypatch):
    monkeypatch.delenv("QUARL_GIT_COMMIT", raising=False)
    git_commit.cache_clear()
    try:
        assert git_commit() == "unknown" or re.fullmatch(r"[0-9a-f]{40}", git_commit())
    finally:
        git_commit.cache_clear()


def test_crash_inside_block_marks_nothing_complete(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(RuntimeError, match="boom"), write_artifact(out, "model", "rl") as art:
        _fill(art.path)
        raise RuntimeError("boom")
    assert not out.exists()
    with pytest.raises(ArtifactError, match="does not exist"):
        open_artifact(out)
    (staging,) = tmp_path.glob("model.tmp-*")  # kept for inspection, explicitly incomplete
    m = json.loads((staging / MANIFEST).read_text())
    assert m["complete"] is False and "RuntimeError: boom" in m["error"]
    with pytest.raises(ArtifactError, match=r"incomplete.*RuntimeError: boom.*re-run the rl stage"):
        open_artifact(staging)
    # the crash does not block a retry at the same URI
    with write_artifact(out, "model", "rl") as art:
        _fill(art.path)
    assert open_artifact(out).manifest["complete"] is True


def test_corrupt_truncated_and_missing_files_are_named(tmp_path):
    out = tmp_path / "ds"
    with write_artifact(out, "dataset", "data-prep") as art:
        _fill(art.path)
    w = out / "weights.bin"
    data = bytearray(w.read_bytes())
    data[100] ^= 1  # same size, one flipped bit
    w.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"corrupt: weights.bin fails its sha256 check; re-run the data-prep stage"):
        open_artifact(out)
    open_artifact(out, verify=False)  # sizes only: a trusted hot path
    w.write_bytes(bytes(data[:-1]))
    with pytest.raises(ArtifactError, match=r"weights.bin has 10239 bytes, the manifest says 10240"):
        open_artifact(out, verify=False)
    (out / "sub" / "config.json").unlink()
    (out / "weights.bin").write_bytes(PAYLOAD["weights.bin"])
    with pytest.raises(ArtifactError, match=r"incomplete: sub/config.json is missing"):
        open_artifact(out)
    (out / MANIFEST).unlink()
    with pytest.raises(ArtifactError, match=r"manifest.json is missing"):
        open_artifact(out)


def test_overwrite_refused_unless_asked(tmp_path):
    out = tmp_path / "m"
    with write_artifact(out, "model", "rl") as art:
        _fill(art.path)
    with (
        pytest.raises(ArtifactExistsError, match=r"already holds a complete model artifact.*overwrite=True"),
        write_artifact(out, "model", "rl"),
    ):
        pytest.fail("the block must not run")
    with write_artifact(out, "model", "rl", overwrite=True) as art:
        (art.path / "only.txt").write_text("new")
    a = open_artifact(out)
    assert sorted(a.manifest["files"]) == ["only.txt"] and not (out / "weights.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_refuses_to_replace_a_directory_that_is_not_an_artifact(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "precious.txt").write_text("x")
    for overwrite in (False, True):
        with (
            pytest.raises(ArtifactError, match="not a quarl artifact"),
            write_artifact(tmp_path / "home", "report", "eval", overwrite=overwrite),
        ):
            pass
    assert (tmp_path / "home" / "precious.txt").exists()
    (tmp_path / "empty").mkdir()
    with write_artifact(tmp_path / "empty", "report", "eval") as art:  # an empty dir is fine
        (art.path / "r.md").write_text("# ok")
    assert open_artifact(tmp_path / "empty", kind="report").stage == "eval"


def test_kind_and_reserved_names(tmp_path):
    with (
        pytest.raises(ArtifactError, match="unknown artifact kind 'weights'; use one of: dataset, model"),
        write_artifact(tmp_path / "x", "weights", "rl"),
    ):
        pass
    with (
        pytest.raises(ArtifactError, match="reserved manifest fields"),
        write_artifact(tmp_path / "y", "metrics", "eval") as art,
    ):
        art.metadata["files"] = {}
    with (
        pytest.raises(ArtifactError, match="manifest.json is reserved"),
        write_artifact(tmp_path / "z", "metrics", "eval") as art,
    ):
        (art.path / MANIFEST).write_text("{}")
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
    with write_artifact(tmp_path / "m", "metrics", "eval") as art:
        (art.path / "m.json").write_text("{}")
    with pytest.raises(ArtifactError, match=r"is a metrics artifact \(from stage eval\), but a model"):
        open_artifact(tmp_path / "m", kind="model")


# --------------------------------------------------------------------------------------------------- s3
@pytest.mark.s3
def test_s3_round_trip_manifest_last_and_cache(s3_bucket, monkeypatch):
    uri = f"s3://{s3_bucket}/runs/r1/rl/model"
    with write_artifact(uri, "model", "rl", config=StageCfg(), inputs=["s3://x/y"]) as art:
        _fill(art.path)
    assert art.path == artifact_cache_dir(uri)
    store = S3Store()
    assert sorted(o.removeprefix(uri + "/") for o in store.list(uri)) == sorted([*PAYLOAD, MANIFEST])
    remote = json.loads(store.get_bytes(f"{uri}/{MANIFEST}"))
    assert remote["complete"] is True and remote["uri"] == uri

    a = open_artifact(uri, kind="model")
    assert a.path == artifact_cache_dir(uri) and a.manifest == remote  # the written copy became the cache
    assert (a.path / "weights.bin").read_bytes() == PAYLOAD["weights.bin"]

    # a cold cache downloads and verifies against the manifest
    shutil.rmtree(artifact_cache_dir(uri))
    b = open_artifact(uri + "/", kind="model")
    assert {r: (b.path / r).read_bytes() for r in PAYLOAD} == PAYLOAD

    # a warm cache is reused without downloading ...
    def no_download(*a, **k):
        raise AssertionError("cache hit expected")

    with monkeypatch.context() as mp:  # (not monkeypatch.undo(): that would also drop the s3 env)
        mp.setattr(S3Store, "download_files", no_download)
        open_artifact(uri)
    # ... unless the cached copy went bad, which heals by downloading again
    (b.path / "weights.bin").write_bytes(b"\0" * len(PAYLOAD["weights.bin"]))
    assert (open_artifact(uri).path / "weights.bin").read_bytes() == PAYLOAD["weights.bin"]


@pytest.mark.s3
def test_s3_crash_uploads_nothing(s3_bucket):
    uri = f"s3://{s3_bucket}/runs/r1/rl/model"
    with pytest.raises(KeyError), write_artifact(uri, "model", "rl") as art:
        _fill(art.path)
        raise KeyError("bad step")
    assert S3Store().list(f"s3://{s3_bucket}") == []
    with pytest.raises(ArtifactError, match="nothing is stored there"):
        open_artifact(uri)


@pytest.mark.s3
def test_s3_interrupted_upload_reads_as_incomplete_then_retry_cleans_up(s3_bucket, monkeypatch):
    uri = f"s3://{s3_bucket}/r/eval/metrics"
    real_upload = S3Store.upload_file

    def die_on_manifest(self, local, dest, sha256=None):
        if dest.endswith(MANIFEST):
            raise ConnectionError("pod evicted")
        return real_upload(self, local, dest, sha256)

    with monkeypatch.context() as mp:
        mp.setattr(S3Store, "upload_file", die_on_manifest)
        with pytest.raises(ConnectionError), write_artifact(uri, "metrics", "eval") as art:
            _fill(art.path)
    assert S3Store().exists(f"{uri}/weights.bin")  # payload landed, manifest did not
    with pytest.raises(ArtifactError, match=r"manifest.json is missing \(its stage did not finish\)"):
        open_artifact(uri)
    with write_artifact(uri, "metrics", "eval") as art:  # no overwrite needed for an incomplete artifact
        (art.path / "scores.json").write_text("{}")
    assert sorted(S3Store().list(uri)) == [f"{uri}/{MANIFEST}", f"{uri}/scores.json"]  # stale payload removed


@pytest.mark.s3
def test_s3_corrupt_object_and_overwrite(s3_bucket):
    uri = f"s3://{s3_bucket}/r/rl/adapter"
    with write_artifact(uri, "adapter", "rl") as art:
        _fill(art.path)
    with pytest.raises(ArtifactExistsError, match="overwrite=True"), write_artifact(uri, "adapter", "rl"):
        pass
    store = S3Store()
    evil = b"\xff" * len(PAYLOAD["weights.bin"])  # same size; keeps the right sha256 metadata
    good = store.head(f"{uri}/weights.bin")["Metadata"]["sha256"]
    store.client.put_object(Bucket=s3_bucket, Key="r/rl/adapter/weights.bin", Body=evil, Metadata={"sha256": good})
    shutil.rmtree(artifact_cache_dir(uri))
    with pytest.raises(ArtifactError, match=r"corrupt: weights.bin fails its sha256 check; re-run the rl stage"):
        open_artifact(uri)
    assert not artifact_cache_dir(uri).exists()  # a bad download never becomes the cache
    with write_artifact(uri, "adapter", "rl", overwrite=True) as art:
        (art.path / "adapter_model.safetensors").write_bytes(b"new")
    assert sorted(open_artifact(uri, kind="adapter").manifest["files"]) == ["adapter_model.safetensors"]
    assert not store.exists(f"{uri}/weights.bin")


@pytest.mark.s3
def test_s3_missing_bucket_fails_before_the_work(s3):
    with (
        pytest.raises(NoSuchBucketError, match="quarl s3 mb no-bucket-here"),
        write_artifact("s3://no-bucket-here/r/rl/model", "model", "rl"),
    ):
        pytest.fail("the block must not run")
