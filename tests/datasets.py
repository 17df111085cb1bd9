"""A small ``quarl data-prep`` artifact of built-in synthetic problems, for stage tests."""

from __future__ import annotations

from pathlib import Path


def synthetic_dataset(out: Path, num_samples: int = 24, eval_size: int = 4) -> str:
    """Write the artifact to ``out`` and return its URI (seconds: no model, no network)."""
    from quarl.config import load_config
    from quarl.data import DataPrepConfig, run_data_prep

    cfg = load_config(DataPrepConfig, None, [f"sources=[{{name: synthetic, num_samples: {num_samples}}}]",
                                             f"split.eval_size={eval_size}"])
    run_data_prep(cfg, output_uri=str(out))
    return str(out)
