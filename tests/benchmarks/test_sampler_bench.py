"""benchmarks/kernels/bench_sampler.py's dry run on CPU (the kernels under the Triton interpreter): it checks the
fused and PyTorch samplers' tokens against each other at top-p 1 and at the eval recipes' top-p 0.95 and writes its
JSON and table (the timings themselves need the GPU). Skipped without Triton / with NumPy >= 2.3."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.kernels.interpreter import needs_interpreter

ROOT = Path(__file__).resolve().parents[2]


@needs_interpreter
def test_dry_run_checks_tokens_and_writes_its_report(tmp_path):
    path = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *sys.path])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "benchmarks/kernels/bench_sampler.py", "--device", "cpu", "--rows", "1,3",
                        "--vocab", "3000", "--iters", "2", "--out", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "sampler.json").read_text())["results"]
    assert [row["rows"] for row in res] == [1, 3]
    assert all(row["same_tokens"] and row["same_tokens_top_p"] for row in res)
    assert "| rows | PyTorch ops | fused |" in (tmp_path / "sampler.md").read_text()
