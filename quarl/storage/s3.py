"""S3 access for artifacts: whole-directory upload/download with sha256 checks.

Design:
- Settings come from the standard AWS variables (so the same pod spec works with
  boto3, the aws CLI and quarl), plus ``QUARL_S3_ENDPOINT`` as an alias for the
  endpoint. With a custom endpoint (SeaweedFS, MinIO, Ceph) path-style
  addressing is used, because those servers do not serve ``bucket.host`` names.
  Without credentials in the environment boto3's default chain applies (IRSA,
  instance profiles), so nothing here assumes static keys.
- Integrity: every uploaded object carries its sha256 as user metadata
  (``x-amz-meta-sha256``), computed locally before upload. ``download_dir``
  re-hashes each file after download and compares, so a truncated or altered
  object is caught even through multipart transfers, whose ETag is not an MD5.
  Objects written by other tools (no metadata) are checked by size only.
- Retries: botocore "standard" retry mode (exponential backoff with jitter,
  retries throttling, 5xx and connection errors) with ``max_attempts`` from
  ``QUARL_S3_MAX_ATTEMPTS`` (default 5). Files move in parallel through a small
  thread pool; boto3 clients are thread-safe, and large files additionally use
  boto3's multipart transfer.
- Errors: botocore exceptions are translated into ``StorageError`` subclasses
  that name the bucket/key/endpoint and the fix (see ``errors.py``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from quarl.storage.errors import (
    AccessDeniedError,
    ChecksumMismatchError,
    CredentialsError,
    EndpointUnreachableError,
    NoSuchBucketError,
    NoSuchKeyError,
    StorageError,
)
from quarl.storage.uri import check_bucket_name, s3_uri, split_s3

log = logging.getLogger(__name__)

SHA256_META = "sha256"  # stored as x-amz-meta-sha256
_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class S3Settings:
    """Where and how to talk to S3. Secrets are excluded from ``repr`` so a logged settings object leaks nothing."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    addressing_style: str = "path"  # "path" for SeaweedFS/MinIO; "auto"/"virtual" for AWS
    max_attempts: int = 5
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    max_concurrency: int = 8  # files in flight at once in upload_dir/download_dir
    multipart_threshold: int = 64 << 20
    multipart_chunksize: int = 16 << 20

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides) -> S3Settings:
        """Read AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL (or
        QUARL_S3_ENDPOINT), AWS_REGION (or AWS_DEFAULT_REGION; default us-east-1), and the tuning knobs
        QUARL_S3_ADDRESSING_STYLE / QUARL_S3_MAX_ATTEMPTS. Keyword overrides win."""
        e = os.environ if env is None else env
        endpoint = e.get("AWS_ENDPOINT_URL") or e.get("QUARL_S3_ENDPOINT") or None
        style = e.get("QUARL_S3_ADDRESSING_STYLE") or ("path" if endpoint else "auto")
        kw = {
            "endpoint_url": endpoint,
            "access_key_id": e.get("AWS_ACCESS_KEY_ID") or None,
            "secret_access_key": e.get("AWS_SECRET_ACCESS_KEY") or None,
            "session_token": e.get("AWS_SESSION_TOKEN") or None,
            "region": e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or "us-east-1",
            "addressing_style": style,
        }
        if e.get("QUARL_S3_MAX_ATTEMPTS"):
            kw["max_attempts"] = int(e["QUARL_S3_MAX_ATTEMPTS"])
        kw.update(overrides)
        return cls(**kw)

    @property
    def endpoint_display(self) -> str:
        return self.endpoint_url or f"AWS S3 ({self.region})"

    def with_(self, **changes) -> S3Settings:
        return replace(self, **changes)


@dataclass(frozen=True)
class S3Object:
    uri: str
    key: str
    size: int


@functools.lru_cache(maxsize=32)
def _client_for(s: S3Settings, pid: int):
    """One boto3 client per (settings, process): creating one parses botocore's JSON models (~0.2 s), and
    clients are thread-safe but not fork-safe, hence the pid in the key."""
    import boto3
    from botocore.config import Config

    cfg = Config(
        region_name=s.region,
        s3={"addressing_style": s.addressing_style},
        retries={"mode": "standard", "max_attempts": s.max_attempts},
        connect_timeout=s.connect_timeout,
        read_timeout=s.read_timeout,
        max_pool_connections=max(10, 2 * s.max_concurrency),
        # Our own sha256 covers integrity end to end; the newer CRC defaults are not
        # implemented by every S3-compatible server, so only send them when required.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=s.endpoint_url,
        aws_access_key_id=s.access_key_id,
        aws_secret_access_key=s.secret_access_key,
        aws_session_token=s.session_token,
        config=cfg,
    )


class S3Store:
    """Thin, error-translating wrapper over a boto3 S3 client. ``settings`` defaults to ``S3Settings.from_env()``."""

    def __init__(self, settings: S3Settings | None = None):
        self.settings = settings or S3Settings.from_env()
        self._client = None

    def __repr__(self) -> str:
        return f"S3Store({self.settings.endpoint_display})"

    @property
    def endpoint(self) -> str:
        return self.settings.endpoint_display

    @property
    def client(self):
        if self._client is None:
            self._client = _client_for(self.settings, os.getpid())
        return self._client

    def _transfer_config(self):
        from boto3.s3.transfer import TransferConfig

        s = self.settings
        return TransferConfig(multipart_threshold=s.multipart_threshold, multipart_chunksize=s.multipart_chunksize)

    # ------------------------------------------------------------------ errors
    @contextmanager
    def _errors(self, bucket: str, key: str | None = None) -> Iterator[None]:
        """Translate botocore/boto3 exceptions raised inside the block into StorageError subclasses."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import (
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
            ReadTimeoutError,
        )

        ep = self.endpoint
        try:
            yield
        except StorageError:
            raise
        except (EndpointConnectionError, ConnectTimeoutError) as e:
            raise EndpointUnreachableError(ep, type(e).__name__) from e
        except ConnectionClosedError as e:
            raise EndpointUnreachableError(ep, "connection closed by the server") from e
        except ReadTimeoutError as e:
            raise StorageError(
                f"S3 at {ep} timed out reading s3://{bucket}/{key or ''} after {self.settings.read_timeout}s "
                f"and {self.settings.max_attempts} attempts; the server is overloaded or the network is slow — "
                "retry, or raise QUARL_S3_MAX_ATTEMPTS"
            ) from e
        except (NoCredentialsError, PartialCredentialsError) as e:
            raise CredentialsError(
                ep, f"endpoint {ep}; set both variables or configure a profile/role", missing=True
            ) from e
        except (ClientError, S3UploadFailedError) as e:
            ce = e if isinstance(e, ClientError) else e.__context__
            if not isinstance(ce, ClientError):
                raise StorageError(f"S3 transfer to s3://{bucket}/{key or ''} at {ep} failed: {e}") from e
            err = ce.response.get("Error", {})
            code, msg = str(err.get("Code", "")), err.get("Message", "")
            op = getattr(ce, "operation_name", "")
            if code == "NoSuchBucket" or (code in ("404", "NotFound") and op == "HeadBucket"):
                raise NoSuchBucketError(bucket, ep) from e
            if code in ("NoSuchKey", "404", "NotFound"):
                # A HEAD response has no body, so a missing bucket also reads as a bare 404: ask.
                if code != "NoSuchKey" and bucket != "*" and not self.bucket_exists(bucket):
                    raise NoSuchBucketError(bucket, ep) from e
                raise NoSuchKeyError(bucket, key or "", ep) from e
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
                raise CredentialsError(ep, code) from e
            if code in ("AccessDenied", "403", "Forbidden"):
                raise AccessDeniedError(s3_uri(bucket, key or ""), ep) from e
            raise StorageError(f"S3 {op or 'request'} on s3://{bucket}/{key or ''} at {ep} failed: {code} {msg}") from e

    # ----------------------------------------------------------------- buckets
    def bucket_exists(self, name: str) -> bool:
        check_bucket_name(name)
        try:
            with self._errors(name):
                self.client.head_bucket(Bucket=name)
            return True
        except NoSuchBucketError:
            return False

    def ensure_bucket(self, name: str) -> bool:
        """Create bucket ``name`` if missing; returns True if it was created."""
        if self.bucket_exists(name):
            return False
        from botocore.exceptions import ClientError

        try:
            with self._errors(name):
                kw = {}
                if self.settings.region != "us-east-1" and not self.settings.endpoint_url:
                    kw["CreateBucketConfiguration"] = {"LocationConstraint": self.settings.region}
                self.client.create_bucket(Bucket=name, **kw)
        except StorageError as e:
            c = e.__cause__
            code = c.response["Error"].get("Code") if isinstance(c, ClientError) else None
            if code == "BucketAlreadyOwnedByYou" or (code == "BucketAlreadyExists" and self.bucket_exists(name)):
                return False  # created concurrently by us
            if code == "BucketAlreadyExists":
                raise StorageError(
                    f"bucket name {name!r} is taken (by another account) at {self.endpoint}; choose another name"
                ) from c
            raise
        log.info("created bucket %s at %s", name, self.endpoint)
        return True

    def list_buckets(self) -> list[str]:
        with self._errors("*"):
            return sorted(b["Name"] for b in self.client.list_buckets().get("Buckets", []))

    # ------------------------------------------------------------------ objects
    def exists(self, uri: str) -> bool:
        """True if ``uri`` names an object, or a "directory" prefix with at least one object under it.
        A missing bucket raises NoSuchBucketError rather than answering False, so typos surface."""
        bucket, key = split_s3(uri)
        if key and not key.endswith("/"):
            try:
                with self._errors(bucket, key):
                    self.client.head_object(Bucket=bucket, Key=key)
                return True
            except NoSuchKeyError:
                pass
        prefix = key.rstrip("/") + "/" if key else ""
        with self._errors(bucket, prefix):
            r = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        return r.get("KeyCount", 0) > 0

    def list_objects(self, uri: str, recursive: bool = True) -> list[S3Object]:
        """Objects under ``uri`` treated as a directory prefix (plus the object itself if ``uri`` names one)."""
        bucket, key = split_s3(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        out: dict[str, S3Object] = {}
        kw = {"Bucket": bucket, "Prefix": prefix}
        if not recursive:
            kw["Delimiter"] = "/"
        with self._errors(bucket, prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(**kw):
                for o in page.get("Contents", []):
                    if not o["Key"].endswith("/"):  # skip directory markers
                        out[o["Key"]] = S3Object(s3_uri(bucket, o["Key"]), o["Key"], int(o["Size"]))
            if key and not key.endswith("/"):
                # The exact object named by the uri: it sorts first among keys starting with `key`.
                r = self.client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
                for o in r.get("Contents", []):
                    if o["Key"] == key:
                        out[key] = S3Object(s3_uri(bucket, key), key, int(o["Size"]))
        return [out[k] for k in sorted(out)]

    def list(self, uri: str, recursive: bool = True) -> list[str]:
        """Sorted s3:// URIs of the objects under ``uri`` (see ``list_objects`` for sizes)."""
        return [o.uri for o in self.list_objects(uri, recursive)]

    def head(self, uri: str) -> dict:
        bucket, key = split_s3(uri)
        with self._errors(bucket, key):
            return self.client.head_object(Bucket=bucket, Key=key)

    def put_bytes(self, data: bytes, uri: str, content_type: str = "application/octet-stream") -> str:
        bucket, key = split_s3(uri)
        digest = hashlib.sha256(data).hexdigest()
        with self._errors(bucket, key):
            self.client.put_object(
                Bucket=bucket, Key=key, Body=data, ContentType=content_type, Metadata={SHA256_META: digest}
            )
        return digest

    def get_bytes(self, uri: str, verify: bool = True) -> bytes:
        bucket, key = split_s3(uri)
        with self._errors(bucket, key):
            r = self.client.get_object(Bucket=bucket, Key=key)
            data = r["Body"].read()
        want = r.get("Metadata", {}).get(SHA256_META)
        if verify and want:
            got = hashlib.sha256(data).hexdigest()
            if got != want:
                raise ChecksumMismatchError(uri, want, got)
        return data

    def upload_file(self, local: str | Path, uri: str, sha256: str | None = None) -> str:
        """Upload one file with its sha256 as metadata; returns the sha256."""
        bucket, key = split_s3(uri)
        if not key or key.endswith("/"):
            raise StorageError(f"upload_file needs an object key, got {uri!r} (use upload_dir for directories)")
        digest = sha256 or sha256_file(local)
        with self._errors(bucket, key):
            self.client.upload_file(
                str(local), bucket, key, ExtraArgs={"Metadata": {SHA256_META: digest}}, Config=self._transfer_config()
            )
        return digest

    def download_file(self, uri: str, local: str | Path, verify: bool = True) -> Path:
        """Download one object to ``local`` (parents created). With ``verify``, its sha256 metadata (or, for
        objects without it, its size) is checked; a bad copy is deleted and ChecksumMismatchError raised."""
        bucket, key = split_s3(uri)
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        with self._errors(bucket, key):
            meta = self.client.head_object(Bucket=bucket, Key=key) if verify else None
            tmp = local.with_name(f".{local.name}.part")
            self.client.download_file(bucket, key, str(tmp), Config=self._transfer_config())
        if meta is not None:
            want = meta.get("Metadata", {}).get(SHA256_META)
            got = sha256_file(tmp) if want else None
            size = tmp.stat().st_size
            if (want and got != want) or size != int(meta["ContentLength"]):
                tmp.unlink(missing_ok=True)
                raise ChecksumMismatchError(uri, want or f"size {meta['ContentLength']}", got or f"size {size}")
        os.replace(tmp, local)
        return local

    # -------------------------------------------------------------- directories
    def upload_dir(
        self, local: str | Path, uri: str, exclude: tuple[str, ...] = (), checksums: dict[str, str] | None = None
    ) -> dict[str, dict]:
        """Upload every file under ``local`` to ``uri/<relative path>``; returns ``{rel: {sha256, size}}``.
        Paths in ``exclude`` (relative, posix) are skipped — e.g. a manifest the caller uploads last.
        ``checksums`` ({rel: sha256}) skips re-hashing files the caller has already hashed."""
        local = Path(local)
        if not local.is_dir():
            raise StorageError(f"upload_dir: {local} is not a directory")
        split_s3(uri)  # validate before hashing anything
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.relative_to(local).as_posix() not in exclude)
        base = uri.rstrip("/")

        def one(p: Path) -> tuple[str, dict]:
            rel = p.relative_to(local).as_posix()
            digest = self.upload_file(p, f"{base}/{rel}", sha256=(checksums or {}).get(rel))
            return rel, {"sha256": digest, "size": p.stat().st_size}

        out = dict(self._parallel(one, files))
        log.info("uploaded %d files (%d bytes) to %s", len(out), sum(v["size"] for v in out.values()), base)
        return out

    def download_dir(self, uri: str, local: str | Path, verify: bool = True) -> dict[str, int]:
        """Download every object under ``uri`` into ``local`` keeping relative paths, verifying each file's
        sha256 metadata. Returns ``{rel: size}``. Raises NoSuchKeyError if nothing is under ``uri``."""
        bucket, key = split_s3(uri)
        local = Path(local)
        prefix = key.rstrip("/") + "/" if key else ""
        objs = [o for o in self.list_objects(uri) if o.key.startswith(prefix)]
        if not objs:
            raise NoSuchKeyError(bucket, prefix, self.endpoint)
        root = local.resolve()
        pairs = []
        for o in objs:
            dest = (local / o.key[len(prefix) :]).resolve()
            if root not in dest.parents:
                raise StorageError(f"refusing to download {o.uri}: its key escapes the target directory {local}")
            pairs.append((o.uri, dest))
        self.download_files(pairs, verify=verify)
        return {o.key[len(prefix) :]: o.size for o in objs}

    def download_files(self, pairs: list[tuple[str, Path]], verify: bool = True) -> None:
        """Download ``[(uri, local_path), ...]`` in parallel (see ``download_file``)."""
        self._parallel(lambda p: self.download_file(p[0], p[1], verify=verify), pairs)

    def delete_prefix(self, uri: str) -> int:
        """Delete every object under ``uri`` (as a directory prefix, plus the exact object); returns the count."""
        bucket, _ = split_s3(uri)
        keys = [o.key for o in self.list_objects(uri)]
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = keys[i : i + 1000]
            with self._errors(bucket, batch[0]):
                r = self.client.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            if r.get("Errors"):
                e = r["Errors"][0]
                raise StorageError(
                    f"could not delete {len(r['Errors'])} objects under {uri} at {self.endpoint}, "
                    f"e.g. {e.get('Key')}: {e.get('Code')} {e.get('Message')}"
                )
        return len(keys)

    def _parallel(self, fn, items):
        if len(items) <= 1 or self.settings.max_concurrency <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(self.settings.max_concurrency, len(items))) as ex:
            return list(ex.map(fn, items))
