"""Device and dtype names from configs (``auto``, ``cuda:1``, ``bf16`` ...) -> torch objects.

One place for what every stage config accepts, so ``device: auto`` and ``dtype: bf16``
mean the same thing in calibrate, rl and eval. ``auto`` picks CUDA when present, and
bf16 there (fp32 on CPU, where bf16 matmuls are not faster and only lose precision).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip


def resolve_device(name: str, *, key: str = "device", error: type[Exception] = ValueError) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise error(f"{key}={name!r} is not a device name; use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise error(f"{key}={name} but CUDA is not available; use {key}=cpu or auto")
    return dev


def check_device_name(name: str, *, key: str = "device") -> None:
    """Syntax only (a config is validated where it is written, maybe on a machine without the GPU)."""
    if name == "auto":
        return
    try:
        torch.device(name)
    except RuntimeError:
        raise ValueError(f"{key}={name!r} is not a device name; use cpu, cuda, cuda:N or auto") from None


def check_dtype_name(name: str, *, key: str = "dtype", auto: bool = True) -> None:
    if not (name in DTYPES or (auto and name == "auto")):
        raise ValueError(f"{key}={name!r} is not a dtype; use one of {', '.join(DTYPES)}{' or auto' if auto else ''}")


def resolve_dtype(name: str, device: torch.device, *, key: str = "dtype",
                  error: type[Exception] = ValueError) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise error(f"{key}={name!r} is not a dtype; use one of {', '.join(DTYPES)} or auto") from None


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """torch's intra-op CPU threads set to ``n`` inside the block and restored after; ``n <= 0`` keeps them.

    On a shared host, OpenMP threads spin against other jobs: the local qad DAG's RTN calibrate step
    measured 177 CPU-seconds with 2 threads on a loaded 2-core machine and 20 with 1."""
    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
