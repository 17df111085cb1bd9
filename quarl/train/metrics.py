"""Per-step metrics: one JSON line per step and the same scalars in TensorBoard.

``metrics.jsonl`` is the record of truth (the report and summary are computed
from it); TensorBoard is for watching a run live. On resume, lines for steps
after the checkpoint are dropped first, so the file always describes one
consistent history (the steps the final weights actually went through).
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path

import torch


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/Inf; keep the fact visible
    return v


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


class MetricsLogger:
    def __init__(self, out_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        if self.path.exists():
            keep = [r for r in read_metrics(self.path) if resume_step is not None and r.get("step", 0) < resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"), purge_step=resume_step)
            except ImportError:  # tensorboard is a declared dependency; tolerate its absence in slim images
                self._tb = None

    def log(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


class NullLogger:
    """What ranks other than 0 log to under torchrun: nothing (rank 0 writes the one history)."""

    def log(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocations on a GPU, max resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB -> GiB
