"""``quarl s3``: a local S3 store for development, and two small bucket tools.

    quarl s3 serve [--dir D] [--port 8333] [--bucket quarl]   # SeaweedFS on loopback until Ctrl-C
    source ~/.cache/quarl/seaweedfs/env.sh                    # the AWS_* variables it wrote
    quarl s3 mb quarl-runs                                    # create a bucket (no-op if it exists)
    quarl s3 ls [s3://bucket/prefix]                          # buckets, or objects with sizes

``serve`` writes the credentials to ``<dir>/env.sh`` (mode 0600) instead of
printing the secret, so terminal logs and CI output never hold it. A reused
``--dir`` keeps its data, its secret and (with the same ``--port``) its ports.
"""

from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

s3_app = typer.Typer(help="Local S3 store (SeaweedFS) and bucket tools.", no_args_is_help=True)


def _fail(e: Exception) -> typer.Exit:
    typer.echo(f"error: {e}", err=True)
    return typer.Exit(1)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


@s3_app.command("serve")
def serve(
    data_dir: Annotated[
        Path | None, typer.Option("--dir", help="data directory (default: $QUARL_CACHE/seaweedfs)")
    ] = None,
    port: Annotated[int, typer.Option(help="S3 port; the next 7 ports go to weed's other services")] = 8333,
    bucket: Annotated[
        list[str] | None, typer.Option(help="bucket to create on start, repeatable (default: quarl)")
    ] = None,
) -> None:
    """Run SeaweedFS with an S3 gateway on 127.0.0.1 until interrupted."""
    from quarl.artifacts import cache_root
    from quarl.storage import SeaweedFS, StorageError

    data_dir = data_dir or cache_root() / "seaweedfs"
    bucket = ["quarl"] if bucket is None else bucket
    server = SeaweedFS(data_dir, s3_port=port, buckets=tuple(bucket), stop_timeout=5.0)
    try:
        server.start()
    except StorageError as e:
        raise _fail(e) from e
    env_file = server.data_dir / "env.sh"
    env_file.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in server.env().items()))
    env_file.chmod(0o600)
    typer.echo(f"SeaweedFS S3 ready at {server.endpoint} in {server.startup_seconds:.1f} s (data: {server.data_dir})")
    typer.echo(f"buckets: {', '.join(bucket) or '(none)'}; log: {server.log_path}")
    typer.echo(f"credentials: source {shlex.quote(str(env_file))}")
    typer.echo("Ctrl-C stops it.")
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(0.5)
        typer.echo(f"error: weed exited unexpectedly; last log lines:\n{server.log_tail()}", err=True)
        raise typer.Exit(1)
    except KeyboardInterrupt:
        typer.echo("stopping SeaweedFS ...")
    finally:
        server.stop()


@s3_app.command("mb")
def mb(bucket: Annotated[str, typer.Argument(help="bucket name, with or without s3://")]) -> None:
    """Create a bucket at the configured endpoint (AWS_ENDPOINT_URL / QUARL_S3_ENDPOINT)."""
    from quarl.storage import S3Store, StorageError

    name = bucket.removeprefix("s3://").strip("/")
    try:
        created = S3Store().ensure_bucket(name)
    except StorageError as e:
        raise _fail(e) from e
    typer.echo(f"{'created' if created else 'exists'}: s3://{name}")


@s3_app.command("ls")
def ls(uri: Annotated[str | None, typer.Argument(help="s3://bucket[/prefix]; omit to list buckets")] = None) -> None:
    """List buckets, or the objects (size and URI) under an s3:// prefix."""
    from quarl.storage import S3Store, StorageError

    try:
        store = S3Store()
        if not uri:
            for name in store.list_buckets():
                typer.echo(f"s3://{name}")
            return
        for o in store.list_objects(uri):
            typer.echo(f"{o.size:>12}  {o.uri}")
    except StorageError as e:
        raise _fail(e) from e


def register(app: typer.Typer) -> None:
    app.add_typer(s3_app, name="s3")
