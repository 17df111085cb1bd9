"""Storage: local paths and ``s3://`` URIs behind one small API.

    S3Settings.from_env()            AWS_* variables (+ QUARL_S3_ENDPOINT)
    S3Store(settings)                upload_dir / download_dir / upload_file / download_file /
                                     list / exists / ensure_bucket / delete_prefix (sha256-checked)
    is_s3(uri), split_s3(uri)        URI helpers
    SeaweedFS(data_dir)              a local S3 server on loopback for dev and tests

Every failure is a ``StorageError`` subclass naming the bucket/key/endpoint and the fix.
"""

from quarl.storage.errors import (
    AccessDeniedError,
    ChecksumMismatchError,
    CredentialsError,
    EndpointUnreachableError,
    InvalidURIError,
    NoSuchBucketError,
    NoSuchKeyError,
    SeaweedFSError,
    StorageError,
)
from quarl.storage.s3 import S3Object, S3Settings, S3Store, sha256_file
from quarl.storage.seaweedfs import SeaweedFS, find_weed
from quarl.storage.uri import is_s3, join_uri, local_path, s3_uri, split_s3

__all__ = [
    "AccessDeniedError",
    "ChecksumMismatchError",
    "CredentialsError",
    "EndpointUnreachableError",
    "InvalidURIError",
    "NoSuchBucketError",
    "NoSuchKeyError",
    "S3Object",
    "S3Settings",
    "S3Store",
    "SeaweedFS",
    "SeaweedFSError",
    "StorageError",
    "find_weed",
    "is_s3",
    "join_uri",
    "local_path",
    "s3_uri",
    "sha256_file",
    "split_s3",
]
