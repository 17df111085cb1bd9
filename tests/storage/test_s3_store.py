"""S3Store against a real SeaweedFS on loopback (fixtures in tests/conftest.py)."""

from __future__ import annotations

import hashlib
import os
import socket
import time

import pytest

from quarl.storage import (
    ChecksumMismatchError,
    CredentialsError,
    EndpointUnreachableError,
    NoSuchBucketError,
    NoSuchKeyError,
    S3Settings,
    S3Store,
)


def _tree(root):
    files = {
        "config.json": b'{"a": 1}',
        "weights/model-00001.safetensors": os.urandom(200_000),
        "weights/empty.bin": b"",
        "deep/er/x.txt": "ünïcode\n".encode(),
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


@pytest.mark.s3
def test_dir_round_trip_with_checksums(s3_bucket, tmp_path):
    store = S3Store()  # from the environment the `s3` fixture set
    files = _tree(tmp_path / "src")
    uri = f"s3://{s3_bucket}/runs/r1/rl/model"
    sums = store.upload_dir(tmp_path / "src", uri)
    assert sums == {rel: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for rel, d in files.items()}
    # the checksum travels with the object, so any reader can verify it
    head = store.head(f"{uri}/weights/model-00001.safetensors")
    assert head["Metadata"]["sha256"] == sums["weights/model-00001.safetensors"]["sha256"]

    got = store.download_dir(uri + "/", tmp_path / "dst")
    assert got == {rel: len(d) for rel, d in files.items()}
    for rel, data in files.items():
        assert (tmp_path / "dst" / rel).read_bytes() == data
    assert not list((tmp_path / "dst").rglob("*.part"))


@pytest.mark.s3
def test_multipart_file_round_trip(s3, s3_bucket, tmp_path):
    store = s3.store(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    data = os.urandom((6 << 20) + 123)  # two parts: the ETag is no longer an MD5, our sha256 still checks
    (tmp_path / "big.bin").write_bytes(data)
    digest = store.upload_file(tmp_path / "big.bin", f"s3://{s3_bucket}/big.bin")
    assert digest == hashlib.sha256(data).hexdigest()
    assert "-" in store.head(f"s3://{s3_bucket}/big.bin")["ETag"]  # really was multipart
    store.download_file(f"s3://{s3_bucket}/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == data


@pytest.mark.s3
def test_corrupt_object_is_detected_and_not_kept(s3_bucket, tmp_path):
    store = S3Store()
    (tmp_path / "f.bin").write_bytes(b"good bytes")
    uri = f"s3://{s3_bucket}/f.bin"
    good = store.upload_file(tmp_path / "f.bin", uri)
    # replace the content behind the checksum's back (same size, same metadata)
    store.client.put_object(Bucket=s3_bucket, Key="f.bin", Body=b"evil bytes", Metadata={"sha256": good})
    with pytest.raises(ChecksumMismatchError, match=f"{uri}: expected sha256 {good}"):
        store.download_file(uri, tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists() and not list(tmp_path.glob(".*part"))
    with pytest.raises(ChecksumMismatchError):
        store.get_bytes(uri)


@pytest.mark.s3
def test_list_exists_delete_respect_prefix_boundaries(s3_bucket):
    store = S3Store()
    for key in ("a/1.txt", "a/sub/2.txt", "ab/3.txt", "a"):
        store.put_bytes(key.encode(), f"s3://{s3_bucket}/{key}")
    b = f"s3://{s3_bucket}"
    assert store.list(f"{b}/a") == [f"{b}/a", f"{b}/a/1.txt", f"{b}/a/sub/2.txt"]  # not ab/3.txt
    assert store.list(f"{b}/a/") == [f"{b}/a/1.txt", f"{b}/a/sub/2.txt"]
    assert [o.size for o in store.list_objects(f"{b}/a/")] == [7, 11]
    assert store.exists(f"{b}/a/1.txt") and store.exists(f"{b}/a/sub") and store.exists(f"{b}/ab")
    assert not store.exists(f"{b}/a/2.txt") and not store.exists(f"{b}/zz")
    assert store.get_bytes(f"{b}/a/sub/2.txt") == b"a/sub/2.txt"
    assert store.delete_prefix(f"{b}/a") == 3
    assert store.list(b) == [f"{b}/ab/3.txt"]


@pytest.mark.s3
def test_ensure_bucket_is_idempotent(s3):
    store = S3Store()
    assert store.ensure_bucket("fresh-bucket-x1") is True
    assert store.ensure_bucket("fresh-bucket-x1") is False
    assert "fresh-bucket-x1" in store.list_buckets()


@pytest.mark.s3
def test_missing_bucket_names_bucket_endpoint_and_fix(s3, tmp_path):
    store = S3Store()
    (tmp_path / "f").write_text("x")
    calls = [
        lambda: store.list("s3://no-such-bucket/x"),
        lambda: store.exists("s3://no-such-bucket/x"),
        lambda: store.upload_file(tmp_path / "f", "s3://no-such-bucket/f"),  # no silent auto-create
        lambda: store.download_file("s3://no-such-bucket/f", tmp_path / "g"),
    ]
    for call in calls:
        with pytest.raises(NoSuchBucketError) as e:
            call()
        msg = str(e.value)
        assert "'no-such-bucket' does not exist at " + s3.endpoint in msg and "quarl s3 mb no-such-bucket" in msg


@pytest.mark.s3
def test_missing_key(s3_bucket, tmp_path):
    store = S3Store()
    with pytest.raises(NoSuchKeyError, match=f"s3://{s3_bucket}/nope.txt does not exist"):
        store.download_file(f"s3://{s3_bucket}/nope.txt", tmp_path / "x")
    with pytest.raises(FileNotFoundError):  # callers may treat s3 and local files alike
        store.get_bytes(f"s3://{s3_bucket}/nope.txt")
    with pytest.raises(NoSuchKeyError, match="does not exist"):
        store.download_dir(f"s3://{s3_bucket}/empty/prefix", tmp_path / "d")


@pytest.mark.s3
def test_bad_credentials_say_which_variables_and_hide_the_secret(s3, s3_bucket):
    wrong_secret = S3Store(s3.settings(secret_access_key="definitely-wrong-secret"))
    with pytest.raises(CredentialsError) as e:
        wrong_secret.list(f"s3://{s3_bucket}/x")
    assert "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in str(e.value) and "SignatureDoesNotMatch" in str(e.value)
    assert "definitely-wrong-secret" not in str(e.value) and s3.secret_key not in str(e.value)
    with pytest.raises(CredentialsError, match="InvalidAccessKeyId"):
        S3Store(s3.settings(access_key_id="nobody")).list(f"s3://{s3_bucket}/x")


def test_unreachable_endpoint_fails_fast_and_says_how_to_start_one():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    store = S3Store(S3Settings(endpoint_url=endpoint, access_key_id="k", secret_access_key="s", max_attempts=2))
    t0 = time.monotonic()
    with pytest.raises(EndpointUnreachableError) as e:
        store.exists("s3://some-bucket/x")
    assert time.monotonic() - t0 < 5
    assert f"cannot reach the S3 endpoint {endpoint}" in str(e.value) and "quarl s3 serve" in str(e.value)
