"""benchmarks/decode_attn.py --dry-run: the CPU smoke mode (Triton interpreter, tiny shapes) runs the SDPA and
kernel paths, checks the kernel against fp32 SDPA, and writes the table and the JSON (times are meaningless).
Skipped without Triton / with NumPy >= 2.3, as the interpreter tests (CPU CI has no Triton)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or tuple(map(int, np.__version__.split(".")[:2])) >= (2, 3),
    reason="needs Triton and NumPy < 2.3 for the Triton interpreter",
)
def test_dry_run_writes_table_and_json(tmp_path):
    out = tmp_path / "decode_attn.json"
    path = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *sys.path])
    env = dict(os.environ, PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "benchmarks" / "decode_attn.py"), "--dry-run",
                        "--models", "7b", "--batch", "1", "2", "--lengths", "200", "--sweep", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| model | B | L | splits |" in r.stdout
    data = json.loads(out.read_text())
    assert data["dry_run"] and [row["batch"] for row in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert "error" not in row and row["max_abs_err"] <= 1e-2 and row["splits"] == 2 and row["launches"] == 2
        assert row["kernel_us"] > 0 and row["sdpa_us"] > 0 and row["best"]["us"] > 0
        assert {(s.get("block_n"), s.get("num_warps")) for s in row["sweep"]} >= {(32, 4), (64, 8), (128, 4)}
