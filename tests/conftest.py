"""Suite-wide fixtures. S3 tests run against a real SeaweedFS on loopback.

    s3_server  (session)  One ``quarl.storage.SeaweedFS``, started on first use (~3-4 s) and
                          stopped at the end of the session. ``.endpoint``, ``.env()``,
                          ``.settings(**overrides)``, ``.store(**overrides)``. Does NOT touch
                          os.environ: use it from module/session-scoped fixtures.
    s3         (function) The same server, with its AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
                          AWS_ENDPOINT_URL / QUARL_S3_ENDPOINT / AWS_REGION set in os.environ for
                          the duration of the test, so ``S3Store()``, ``open_artifact("s3://...")``,
                          plain boto3 and subprocesses all reach it. Yields the SeaweedFS object.
    s3_bucket  (function) Name of a fresh, empty bucket on that server (uses ``s3``, so the
                          environment is set too), e.g. ``uri = f"s3://{s3_bucket}/run-1/rl/model"``.

Tests using these are marked ``s3`` automatically (``pytest -m "not s3"`` skips them); if the
``weed`` binary is missing they skip with the install hint instead of failing.
"""

from __future__ import annotations

import uuid

import pytest

_NOTES: list[str] = []


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    from quarl.storage import SeaweedFS, SeaweedFSError, find_weed

    try:
        find_weed()
    except SeaweedFSError as e:
        pytest.skip(str(e))
    # stop_timeout: the data dir is thrown away, so skip weed's 15 s filer drain.
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), stop_timeout=1.0)
    server.start()
    _NOTES.append(f"SeaweedFS for s3 tests: {server.endpoint}, started in {server.startup_seconds:.1f} s")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "QUARL_S3_ADDRESSING_STYLE", "QUARL_S3_MAX_ATTEMPTS"):
        monkeypatch.delenv(k, raising=False)
    return s3_server


@pytest.fixture
def s3_bucket(s3):
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.store().ensure_bucket(name)
    return name


def pytest_collection_modifyitems(items):
    for item in items:
        if {"s3", "s3_bucket", "s3_server"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)


def pytest_terminal_summary(terminalreporter):
    for note in _NOTES:
        terminalreporter.write_line(note)
