"""Running a kernel check under Triton's interpreter (``TRITON_INTERPRET=1``: Triton on CPU tensors).

The interpreter tests build a script, run it in a fresh process with the interpreter switched on
(the switch is read when Triton is imported, so it cannot be flipped inside the test process) and
expect it to print ``OK`` last. The interpreter needs NumPy < 2.3 (it breaks on 2.3's dtype
changes); CI's CPU image has no Triton at all, so there these tests skip.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (CPU CI has none)")
needs_interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or tuple(map(int, np.__version__.split(".")[:2])) >= (2, 3),
    reason="needs Triton and NumPy < 2.3 for the Triton interpreter",
)


def run_interpreted(script: str, timeout: int = 300) -> str:
    """Run ``script`` with ``TRITON_INTERPRET=1`` from the repository root; assert it ends with ``OK``."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *sys.path])  # keep where numpy/triton came from
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True, text=True,
                       timeout=timeout, check=False, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr[-3000:]
    return r.stdout


def expect_value_errors(cases) -> None:
    """Each ``(call, text)``: ``call()`` raises a ValueError whose message holds ``text`` -- the interpreted scripts'
    bad-input checks (they import this from the repository root)."""
    for call, text in cases:
        with pytest.raises(ValueError, match=re.escape(text)):
            call()
