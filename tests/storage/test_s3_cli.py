"""`quarl s3 mb|ls` against the session SeaweedFS."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from quarl.cli.main import app


@pytest.mark.s3
def test_mb_and_ls(s3, s3_bucket):
    run = CliRunner().invoke
    r = run(app, ["s3", "mb", "s3://cli-made-bucket"])
    assert r.exit_code == 0 and "created: s3://cli-made-bucket" in r.output
    assert "exists" in run(app, ["s3", "mb", "cli-made-bucket"]).output
    assert "s3://cli-made-bucket" in run(app, ["s3", "ls"]).output
    s3.store().put_bytes(b"12345", f"s3://{s3_bucket}/p/x.txt")
    r = run(app, ["s3", "ls", f"s3://{s3_bucket}/p"])
    assert r.exit_code == 0 and r.output.split() == ["5", f"s3://{s3_bucket}/p/x.txt"]


@pytest.mark.s3
def test_ls_missing_bucket_is_one_clear_error(s3):
    r = CliRunner().invoke(app, ["s3", "ls", "s3://not-there-bucket/x"])
    assert r.exit_code == 1 and "does not exist" in r.output and "quarl s3 mb not-there-bucket" in r.output
