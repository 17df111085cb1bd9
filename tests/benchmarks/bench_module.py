"""Import a benchmark script (``benchmarks/<file>.py``, not a package) as a module for its CPU tests."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_bench(file: str, name: str):
    """``benchmarks/<file>`` as module ``name``; ``benchmarks/`` goes on ``sys.path`` for the script's own imports."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
