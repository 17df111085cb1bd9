"""A tiny autotuner for the weight-only kernels' configs (``wo_gemm``'s routes): each candidate is timed once per
key and the winner kept, in memory and on disk.

Why on disk: a candidate costs one Triton compile and a timing, so a tuned config is worth keeping across processes
-- in a JSON file keyed by GPU name and Triton version (a config tuned on one device or compiler is never reused on
another). ``QUARL_KERNELS_CACHE`` names the file (default ``~/.cache/quarl/kernel_configs.json``; ``""`` or ``off``
keeps it in memory only); it is written atomically, and an unreadable one is ignored with a warning (re-tuned).
Tuning is off unless asked (``tune=True`` or ``QUARL_KERNELS_TUNE=1``): the measured defaults serve, and nothing is
timed inside a CUDA-graph capture.
"""

from __future__ import annotations

import json
import os
import warnings

import torch

_CHOICE: dict[tuple, object] = {}  # (kind, *key) -> the chosen config
_DISK: dict[str, str] | None = None


def _cache_path() -> str | None:
    raw = os.environ.get("QUARL_KERNELS_CACHE")
    if raw is not None and raw.strip().lower() in ("", "off", "0", "none"):
        return None
    return raw or os.path.join(os.path.expanduser("~"), ".cache", "quarl", "kernel_configs.json")


def _triton_version() -> str:
    try:  # imported here, not with the module: the package imports on CPU-only installs (and this is tested there)
        import triton
    except ImportError:
        return "none"
    return triton.__version__


def _disk_key(full: tuple) -> str:
    dev = full[-1] if isinstance(full[-1], int) else 0
    name = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else "cpu"
    return "|".join([name, _triton_version(), *map(str, full[:-1])])


def _disk_load() -> dict[str, str]:
    global _DISK
    if _DISK is None:
        _DISK = {}
        path = _cache_path()
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    _DISK = {str(k): str(v) for k, v in json.load(f).items()}
            except (OSError, ValueError) as e:  # a corrupt cache must not stop a run: re-tune
                warnings.warn(f"ignoring unreadable kernel config cache {path} ({e}); delete it to silence this",
                              stacklevel=3)
    return _DISK


def _disk_store(key: str, cfg) -> None:
    disk = _disk_load()
    disk[key] = str(cfg)
    path = _cache_path()
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(disk, f, indent=1, sort_keys=True)
        os.replace(tmp, path)  # atomic: concurrent writers never leave a torn file
    except OSError as e:
        warnings.warn(f"could not write kernel config cache {path} ({e}); set QUARL_KERNELS_CACHE to a writable "
                      f"file or 'off'", stacklevel=3)


def _tuning_enabled(tune: bool | None) -> bool:
    if tune is not None:
        return tune
    return os.environ.get("QUARL_KERNELS_TUNE", "0") == "1"


def _time_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps



def choose(kind: str, key: tuple, candidates: tuple, run, tune: bool | None, default):
    """The config for ``(kind, *key)``: the one chosen before in this process; else ``default`` unless tuning is on;
    else the one tuned before on this GPU and Triton version (the disk cache); else the fastest of ``candidates``
    timed through ``run(config)`` now (``default`` during a CUDA-graph capture), remembered in memory and on disk.
    ``key``'s last element is the device index (the disk key names that GPU)."""
    full = (kind,) + key
    cfg = _CHOICE.get(full)
    if cfg is not None:
        return cfg
    if not _tuning_enabled(tune):
        return default
    dkey = _disk_key(full)
    saved = _disk_load().get(dkey)
    hit = next((c for c in candidates if str(c) == saved), None)
    if hit is not None:  # tuned before on this GPU and Triton version
        _CHOICE[full] = hit
        return hit
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():  # no timing inside a graph capture
        return default
    best = min(candidates, key=lambda c: _time_ms(lambda: run(c)))
    _CHOICE[full] = best
    _disk_store(dkey, best)
    return best



__all__ = ["choose"]
