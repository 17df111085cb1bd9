"""URI helpers and S3Settings: pure functions, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from quarl.storage import InvalidURIError, S3Settings, is_s3, join_uri, local_path, s3_uri, split_s3


def test_is_s3_and_split():
    assert is_s3("s3://b-1/x") and not is_s3("/data/s3://x") and not is_s3(Path("s3:/x"))
    assert split_s3("s3://quarl-runs/a/b/") == ("quarl-runs", "a/b/")
    assert split_s3("s3://quarl-runs") == ("quarl-runs", "")
    assert split_s3("s3://quarl-runs//a") == ("quarl-runs", "a")
    assert s3_uri("bkt", "/a/b") == "s3://bkt/a/b" and s3_uri("bkt") == "s3://bkt"


@pytest.mark.parametrize(
    "uri", ["s3://", "s3://ab/x", "s3://Upper/x", "s3://under_score/x", "s3://-lead/x", "s3://a..b/x"]
)
def test_bad_bucket_names_are_rejected_before_any_request(uri):
    with pytest.raises(InvalidURIError, match="invalid S3 bucket name"):
        split_s3(uri)


def test_split_rejects_local_paths():
    with pytest.raises(InvalidURIError, match="not an s3:// URI"):
        split_s3("/tmp/x")
    with pytest.raises(ValueError):  # InvalidURIError is also a ValueError
        split_s3("bucket/key")


def test_join_and_local_path(tmp_path):
    assert join_uri("s3://b/runs/", "r1", "/rl/", "model") == "s3://b/runs/r1/rl/model"
    assert join_uri(tmp_path, "r1", "rl") == str(tmp_path / "r1" / "rl")
    assert local_path(f"file://{tmp_path}") == tmp_path
    assert local_path("~/x") == Path.home() / "x"
    with pytest.raises(InvalidURIError):
        local_path("s3://b/x")


def test_settings_from_env_and_secret_hidden():
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "super-secret-value",
        "QUARL_S3_ENDPOINT": "http://127.0.0.1:9000",
        "QUARL_S3_MAX_ATTEMPTS": "3",
    }
    s = S3Settings.from_env(env)
    assert s.endpoint_url == "http://127.0.0.1:9000" and s.addressing_style == "path"
    assert s.region == "us-east-1" and s.max_attempts == 3
    assert "super-secret-value" not in repr(s) and "AKIDEXAMPLE" in repr(s)
    # AWS_ENDPOINT_URL wins over the quarl alias; without an endpoint, AWS addressing is left to boto3.
    s2 = S3Settings.from_env({**env, "AWS_ENDPOINT_URL": "http://other:1", "AWS_REGION": "eu-west-1"})
    assert s2.endpoint_url == "http://other:1" and s2.region == "eu-west-1"
    s3 = S3Settings.from_env({"AWS_DEFAULT_REGION": "us-west-2"}, max_attempts=1)
    assert s3.endpoint_url is None and s3.addressing_style == "auto" and s3.region == "us-west-2"
    assert s3.access_key_id is None and s3.max_attempts == 1  # None -> boto3's default credential chain
