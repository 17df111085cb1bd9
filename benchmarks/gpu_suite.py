"""Every GPU test of the repository, file by file, across as many device calls as it takes.

    PYTHONPATH=.:kernels python benchmarks/gpu_suite.py --out DIR [--budget-s 520] [--done a.py,b.py] [--files ...]

The GPU tests (``@pytest.mark.gpu``, 20 files) do not fit one device call (a call may run 600 s; the kernel tests
alone took more than 330 s in session 21). This runs the files one ``pytest`` each, in a fixed order, and stops
starting files once ``--budget-s`` is spent; ``--done`` lists the files an earlier call finished, so the next call
goes on from there. A file is given what is left of the budget as its timeout: one that runs out is reported as
``timeout`` (its log shows how far it got). Writes ``DIR/suite.json`` (per file: rc, outcome counts, seconds) and
``DIR/<file>.log``, and prints one line a file plus the ``--done`` list for the next call.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_test_files() -> list[str]:
    """Test files that carry the ``gpu`` marker, sorted."""
    out = []
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        if "pytest.mark.gpu" in p.read_text():
            out.append(str(p.relative_to(ROOT)))
    return out


def counts(log: str) -> dict[str, int]:
    """pytest's summary line ("3 passed, 1 skipped in 2.0s") -> {"passed": 3, "skipped": 1}."""
    tail = log.strip().splitlines()[-1] if log.strip() else ""
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)",
                                             tail)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--done", default="", help="comma-separated files an earlier call finished")
    ap.add_argument("--files", default="", help="comma-separated files instead of every GPU test file")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    files = args.files.split(",") if args.files else gpu_test_files()
    done = {f for f in args.done.split(",") if f}
    t0 = time.monotonic()
    rows = []
    for f in files:
        if f in done:
            continue
        left = args.budget_s - (time.monotonic() - t0)
        if left < 30:
            break
        start = time.monotonic()
        log_path = Path(args.out) / (f.replace("/", "__") + ".log")
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-m", "gpu", "-p",
                                     "no:cacheprovider", f], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=left, check=False).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        text = log_path.read_text()
        row = {"file": f, "rc": rc, "seconds": round(time.monotonic() - start, 1), **counts(text)}
        rows.append(row)
        if rc != "timeout":  # finished, failures included (they are reported, not re-run)
            done.add(f)
        print(f"{f}: rc={rc} {row['seconds']} s {counts(text)}", flush=True)
        for line in text.splitlines():
            if line.startswith(("FAILED", "ERROR", "E ")):
                print("   ", line[:300], flush=True)
    remaining = [f for f in files if f not in done]
    with open(Path(args.out) / "suite.json", "w") as fh:
        json.dump({"rows": rows, "done": sorted(done), "remaining": remaining}, fh, indent=1)
    print(f"done ({len(done)} of {len(files)} files): {','.join(sorted(done))}")
    print(f"remaining: {','.join(remaining) or '-'}")


if __name__ == "__main__":
    main()
