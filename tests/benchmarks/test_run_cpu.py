"""benchmarks/run_cpu.py (``make bench``): every named benchmark's script exists, ``--list`` names them all, an
unknown name is refused with the choices, and the quick default runs and reports its exit status."""

from pathlib import Path

import pytest

from benchmarks import run_cpu

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_names_a_script_that_exists():
    for name, b in run_cpu.BENCHES.items():
        script = b.args[0] if b.args[0] != "-m" else b.args[1].replace(".", "/") + ".py"
        assert (ROOT / script).is_file(), (name, script)
    assert set(run_cpu.QUICK) <= set(run_cpu.BENCHES)


def test_list_and_unknown_names(capsys):
    assert run_cpu.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in run_cpu.BENCHES)
    with pytest.raises(SystemExit, match="unknown benchmark.*nope.*choose from op-overhead"):
        run_cpu.main(["nope"])


def test_a_failing_benchmark_fails_the_run(monkeypatch):
    monkeypatch.setitem(run_cpu.BENCHES, "fails", run_cpu.Bench(("-c", "raise SystemExit(3)"), "x", "0 s", "nothing"))
    assert run_cpu.main(["fails"]) == 1
