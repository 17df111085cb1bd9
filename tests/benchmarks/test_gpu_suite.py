"""benchmarks/gpu_suite.py's scheduler: every file once, one GPU each at a time, late files after their signal."""

from __future__ import annotations

import threading
import time

from benchmarks import gpu_suite


def _recorder(seconds: float = 0.01):
    """A fake ``run``: sleeps, records (file, gpu, start, end), and checks no GPU runs two files at once."""
    log, busy, lock = [], set(), threading.Lock()

    def run(f, timeout, gpu):
        with lock:
            assert gpu not in busy, f"GPU {gpu} given {f} while busy"
            busy.add(gpu)
        start = time.monotonic()
        time.sleep(seconds)
        with lock:
            busy.discard(gpu)
            log.append((f, gpu, start, time.monotonic()))
        return {"file": f, "rc": 0, "seconds": seconds, "gpu": gpu, "passed": 1}

    return run, log


def test_longest_first_puts_the_long_files_first_and_unknown_ones_at_60_s():
    files = ["tests/quant/formats/test_fp8.py", "tests/new_gpu.py", "tests/kernels/test_gemv_gpu.py"]
    assert gpu_suite.longest_first(files) == ["tests/kernels/test_gemv_gpu.py", "tests/new_gpu.py",
                                              "tests/quant/formats/test_fp8.py"]


def test_four_gpus_run_every_file_once_and_report_in_the_given_order():
    files = [f"f{i}.py" for i in range(11)]
    run, log = _recorder()
    rows = gpu_suite.schedule(files, 4, 60.0, run)
    assert [r["file"] for r in rows] == files
    assert sorted(f for f, *_ in log) == sorted(files)
    assert {g for _, g, *_ in log} <= {0, 1, 2, 3} and len({g for _, g, *_ in log}) > 1


def test_one_gpu_pins_none_and_runs_in_order():
    run, log = _recorder(0.0)
    gpu_suite.schedule(["a.py", "b.py", "c.py"], 1, 60.0, run)
    assert [(f, g) for f, g, *_ in log] == [("a.py", None), ("b.py", None), ("c.py", None)]


def test_late_files_wait_for_ready_while_others_run():
    flag = threading.Event()
    run0, log = _recorder(0.05)

    def run(f, timeout, gpu):
        row = run0(f, timeout, gpu)
        if f == "b.py":
            flag.set()  # the "build" finishes when b.py does
        return row

    gpu_suite.schedule(["late.py", "a.py", "b.py"], 2, 1000.0, run, late=frozenset({"late.py"}), ready=flag.is_set,
                       poll_s=0.01)
    starts = {f: s for f, _, s, _ in log}
    ends = {f: e for f, _, _, e in log}
    assert starts["late.py"] >= ends["b.py"]  # held back although it came first


def test_late_files_run_anyway_when_the_budget_leaves_no_time_to_wait():
    now = [0.0]

    def run(f, timeout, gpu):
        now[0] += 25.0  # each file takes 25 s of the fake clock
        return {"file": f, "rc": 0, "seconds": 25.0, "gpu": gpu}

    rows = gpu_suite.schedule(["late.py", "a.py"], 1, 110.0, run, late=frozenset({"late.py"}), ready=lambda: False,
                              clock=lambda: now[0], poll_s=0.0)
    # a.py first (late.py held); at t=25, 85 s are left: less than late.py's expected 60 s + 30, so it runs unready
    assert [r["file"] for r in rows] == ["late.py", "a.py"] and now[0] == 50.0


def test_no_file_starts_in_the_budget_s_last_30_s():
    now = [0.0]

    def run(f, timeout, gpu):
        now[0] += 40.0
        return {"file": f, "rc": 0, "seconds": 40.0, "gpu": gpu, "timeout_given": timeout}

    rows = gpu_suite.schedule(["a.py", "b.py", "c.py"], 1, 100.0, run, clock=lambda: now[0])
    assert [r["file"] for r in rows] == ["a.py", "b.py"]  # c.py would start with 20 s left
    assert [r["timeout_given"] for r in rows] == [100.0, 60.0]  # each gets what is left of the budget


def test_counts_reads_pytests_summary_line():
    assert gpu_suite.counts("x\n3 passed, 1 skipped, 2 failed in 2.0s") == {"passed": 3, "skipped": 1, "failed": 2}


def test_exit_code_fails_on_a_failure_or_a_file_not_run():
    ok = {"file": "a.py", "rc": 0}
    assert gpu_suite.exit_code([ok], []) == 0
    assert gpu_suite.exit_code([ok, {"file": "b.py", "rc": 1}], []) == 1
    assert gpu_suite.exit_code([ok, {"file": "b.py", "rc": "timeout"}], ["b.py"]) == 1
    assert gpu_suite.exit_code([ok], ["c.py"]) == 1
