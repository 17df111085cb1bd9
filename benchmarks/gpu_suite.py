"""Every GPU test of the repository, file by file, on one GPU across device calls or on several GPUs in one.

    PYTHONPATH=.:kernels python benchmarks/gpu_suite.py --out DIR [--budget-s 520] [--done a.py,b.py] [--files ...]
        [--gpus N] [--late a.py,b.py --after PATH]

The GPU tests (``@pytest.mark.gpu``, 25 files) do not fit one device call on one GPU (~25 min in all; a call may run
600 s). This runs the files one ``pytest`` each and stops starting files once ``--budget-s`` is spent; ``--done``
lists the files an earlier call finished, so the next call goes on from there. A file is given what is left of the
budget as its timeout: one that runs out is reported as ``timeout`` (its log shows how far it got).

``--gpus N`` runs N files at a time, each pinned to its own GPU (``CUDA_VISIBLE_DEVICES``): a worker per GPU takes
the next file from one queue ordered longest first (``EXPECTED_S``, the last measured seconds), so the whole suite
fits one call of a machine of four GPUs. ``--late`` files wait until ``--after`` exists (DeepGEMM's tests, while a
background job builds it); a worker with nothing else to run waits for it, and runs them anyway once the budget
leaves no time to wait (their DeepGEMM cases then skip, and the log says so).

Writes ``DIR/suite.json`` (per file: rc, outcome counts, seconds, GPU) and ``DIR/<file>.log``, and prints one line a
file plus the ``--done`` list for the next call; exits 1 when a file failed or was not run (``make test-gpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Seconds each file took on one H100 (session 23's suite; later files from their own phases, rounded up): the
# queue's order only -- a file not listed counts as 60 s.
EXPECTED_S = {
    "tests/kernels/test_gemv_gpu.py": 370, "tests/engine/test_engine_gpu.py": 165,
    "tests/kernels/test_blocked_gpu.py": 120, "tests/kernels/test_mixed_gemm_gpu.py": 115,
    "tests/kernels/test_epilogue_gpu.py": 80, "tests/kernels/test_wgmma_stream_gpu.py": 75,
    "tests/kernels/test_wo_gemm_gpu.py": 75, "tests/kernels/test_mma_decode_gpu.py": 70,
    "tests/kernels/test_decode_attn_gpu.py": 55, "tests/quant/test_fp8_linear.py": 55,
    "tests/kernels/test_wgmma_decode_gpu.py": 50, "tests/kernels/test_fused_gpu.py": 45,
    "tests/kernels/test_wgmma_ring_gpu.py": 35, "tests/calibrate/test_onload.py": 30,
    "tests/kernels/test_dense_gpu.py": 30, "tests/kernels/test_fp8_gemv_gpu.py": 25,
    "tests/kernels/test_token_logprob_gpu.py": 20, "tests/kernels/test_dense_fp8_gpu.py": 20,
    "tests/kernels/test_fp8_quant_gpu.py": 20, "tests/quant/formats/test_fp8.py": 10,
}


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


def longest_first(files: list[str]) -> list[str]:
    """``files`` by expected seconds, longest first (ties in the given order): the longest-processing-time rule,
    so that the last file to start on any GPU is a short one."""
    return sorted(files, key=lambda f: -EXPECTED_S.get(f, 60))


def run_file(f: str, out: str, timeout: float, gpu: int | None) -> dict:
    """One file's ``pytest`` -> its row (rc or "timeout", seconds, outcome counts); its log in ``out``."""
    start = time.monotonic()
    log_path = Path(out) / (f.replace("/", "__") + ".log")
    env = dict(os.environ) if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-m", "gpu", "-p", "no:cacheprovider",
                                 f], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                                check=False).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    text = log_path.read_text()
    row = {"file": f, "rc": rc, "seconds": round(time.monotonic() - start, 1), "gpu": gpu, **counts(text)}
    print(f"{f}: rc={rc} {row['seconds']} s gpu={gpu} {counts(text)}", flush=True)
    for line in text.splitlines():
        if line.startswith(("FAILED", "ERROR", "E ")):
            print("   ", line[:300], flush=True)
    return row


def schedule(files: list[str], gpus: int, budget_s: float, run: Callable[[str, float, int | None], dict], *,
             late: frozenset[str] = frozenset(), ready: Callable[[], bool] = lambda: True,
             poll_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> list[dict]:
    """Run ``files`` in the given order on ``gpus`` workers (``gpus`` 1: one after another, no GPU pinned), each
    ``run(file, timeout, gpu)``; no file starts with less than 30 s of the budget left. A ``late`` file is taken only
    once ``ready()`` -- or once the budget leaves no more time to wait than the file is expected to take."""
    t0 = clock()
    queue = list(files)
    rows: list[dict] = []
    lock = threading.Lock()

    def take() -> str | None:
        """The next file this worker may start now, None when none is left; waits while only late ones remain."""
        while True:
            with lock:
                left = budget_s - (clock() - t0)
                if not queue or left < 30:
                    return None
                can_wait = left - 30 > EXPECTED_S.get(queue[0], 60)
                for i, f in enumerate(queue):
                    if f not in late or ready() or not can_wait:
                        return queue.pop(i)
            time.sleep(poll_s)

    def worker(gpu: int | None) -> None:
        while (f := take()) is not None:
            row = run(f, budget_s - (clock() - t0), gpu)
            with lock:
                rows.append(row)

    if gpus <= 1:
        worker(None)
    else:
        threads = [threading.Thread(target=worker, args=(g,)) for g in range(gpus)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    order = {f: i for i, f in enumerate(files)}
    return sorted(rows, key=lambda r: order[r["file"]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--done", default="", help="comma-separated files an earlier call finished")
    ap.add_argument("--files", default="", help="comma-separated files instead of every GPU test file")
    ap.add_argument("--gpus", type=int, default=1, help="files run at a time, one GPU each")
    ap.add_argument("--late", default="", help="comma-separated files that wait for --after")
    ap.add_argument("--after", default="", help="a path whose existence releases the --late files")
    args = ap.parse_args()
    if args.gpus < 1:
        raise SystemExit("gpu_suite: --gpus must be >= 1 (`make test-gpu` counts `nvidia-smi -L`, which listed no GPU "
                         "here): run it on a GPU machine, or pass GPUS=N")
    os.makedirs(args.out, exist_ok=True)
    files = args.files.split(",") if args.files else gpu_test_files()
    done = {f for f in args.done.split(",") if f}
    late = frozenset(f for f in args.late.split(",") if f)
    if late and not args.after:
        raise SystemExit("--late needs --after PATH: the file whose existence releases them (e.g. DeepGEMM's build)")
    todo = [f for f in files if f not in done]
    if args.gpus > 1:
        todo = longest_first(todo)
    rows = schedule(todo, args.gpus, args.budget_s, lambda f, timeout, gpu: run_file(f, args.out, timeout, gpu),
                    late=late, ready=lambda: bool(args.after) and os.path.exists(args.after))
    done |= {r["file"] for r in rows if r["rc"] != "timeout"}  # finished, failures included (reported, not re-run)
    remaining = [f for f in files if f not in done]
    with open(Path(args.out) / "suite.json", "w") as fh:
        json.dump({"rows": rows, "done": sorted(done), "remaining": remaining}, fh, indent=1)
    total = {k: sum(r.get(k, 0) for r in rows) for k in ("passed", "failed", "skipped", "error", "errors")}
    print(f"totals: {total}")
    print(f"done ({len(done)} of {len(files)} files): {','.join(sorted(done))}")
    print(f"remaining: {','.join(remaining) or '-'}")
    return exit_code(rows, remaining)


def exit_code(rows: list[dict], remaining: list[str]) -> int:
    """0 when every file ran and passed (pytest's rc 0), else 1: what `make test-gpu` hands a CI job."""
    return 0 if not remaining and all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
