"""Storage errors: each names what failed (bucket, key, endpoint) and the fix.

A stage that dies in a Kubeflow pod leaves only its log behind, so an S3 failure
must be readable there without a debugger: the message says which endpoint was
contacted, which bucket/key was wanted, and the one command or variable that
fixes the common cause. botocore's own exceptions are chained as ``__cause__``
for the rare case that needs the raw response. Secrets never appear in messages.
"""

from __future__ import annotations

START_LOCAL_HINT = (
    "start a local store with `quarl s3 serve` and `source` the env file it names, "
    "or point AWS_ENDPOINT_URL (or QUARL_S3_ENDPOINT) at a reachable S3 endpoint"
)


class StorageError(RuntimeError):
    """Base class of every error raised by ``quarl.storage``."""


class NoSuchBucketError(StorageError):
    def __init__(self, bucket: str, endpoint: str):
        self.bucket, self.endpoint = bucket, endpoint
        super().__init__(
            f"bucket {bucket!r} does not exist at {endpoint}; create it with `quarl s3 mb {bucket}` "
            f"(or `aws s3 mb s3://{bucket}`), or fix the bucket name in the URI"
        )


class NoSuchKeyError(StorageError, FileNotFoundError):
    """A missing object. Also a ``FileNotFoundError`` so callers can treat s3 and local alike."""

    def __init__(self, bucket: str, key: str, endpoint: str):
        self.bucket, self.key, self.endpoint = bucket, key, endpoint
        StorageError.__init__(
            self, f"s3://{bucket}/{key} does not exist at {endpoint}; check the URI, or re-run the stage that writes it"
        )

    def __str__(self) -> str:  # FileNotFoundError would otherwise format errno/filename
        return self.args[0]


class CredentialsError(StorageError):
    def __init__(self, endpoint: str, detail: str, missing: bool = False):
        self.endpoint = endpoint
        what = "no S3 credentials were found" if missing else f"S3 at {endpoint} rejected the credentials"
        super().__init__(
            f"{what} ({detail}); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            "(for the local store: `source` the env file `quarl s3 serve` wrote)"
        )


class AccessDeniedError(StorageError):
    def __init__(self, what: str, endpoint: str):
        self.endpoint = endpoint
        super().__init__(
            f"access denied to {what} at {endpoint}; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and that "
            "this identity may read/write the bucket"
        )


class EndpointUnreachableError(StorageError):
    def __init__(self, endpoint: str, detail: str = ""):
        self.endpoint = endpoint
        extra = f" ({detail})" if detail else ""
        super().__init__(f"cannot reach the S3 endpoint {endpoint}{extra}; {START_LOCAL_HINT}")


class ChecksumMismatchError(StorageError):
    def __init__(self, what: str, expected: str, actual: str):
        self.expected, self.actual = expected, actual
        super().__init__(
            f"checksum mismatch for {what}: expected sha256 {expected}, got {actual}; the copy is corrupt or "
            "was modified after upload — retry, and if it persists re-run the stage that wrote it"
        )


class InvalidURIError(StorageError, ValueError):
    def __str__(self) -> str:
        return self.args[0]


class SeaweedFSError(StorageError):
    """The local SeaweedFS server could not be found, started, or stopped."""
