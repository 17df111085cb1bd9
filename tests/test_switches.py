"""quarl/switches.py: the one list of QUARL_* environment variables equals what the code reads, and a misspelt or
removed switch stops the ``quarl`` command with the closest known names instead of being ignored."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quarl.cli.main import app
from quarl.switches import NOT_SWITCHES, SWITCHES, UnknownSwitchError, check_environment, unknown_switches

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"QUARL_[A-Z0-9_]*[A-Z0-9]")


def _names_in_code() -> set[str]:
    """Every QUARL_* string in the Python sources, but this test's own misspellings and the list itself."""
    found = set()
    for top in ("quarl", "kernels", "components", "pipelines", "benchmarks", "tests"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name in ("test_switches.py", "switches.py") or ".venv" in path.parts:
                continue
            found |= set(NAME.findall(path.read_text(encoding="utf-8", errors="ignore")))
    return found


def test_the_list_is_what_the_code_reads():
    code = _names_in_code() - NOT_SWITCHES
    assert not code - set(SWITCHES), f"read by the code but not in quarl/switches.py: {sorted(code - set(SWITCHES))}"
    assert not set(SWITCHES) - code, f"in quarl/switches.py but read nowhere: {sorted(set(SWITCHES) - code)}"
    assert all(SWITCHES.values()), "every switch says what it sets"


def test_known_switches_pass_and_other_variables_are_ignored():
    env = {"QUARL_KERNELS_PDL": "0", "QUARL_CACHE": "/tmp/c", "PATH": "/bin", "QUARLX": "1"}
    assert unknown_switches(env) == []
    check_environment(env)  # no error


def test_a_misspelt_switch_is_named_with_the_closest_known_ones():
    with pytest.raises(UnknownSwitchError, match=r"QUARL_KERNEL_PDL \(did you mean QUARL_KERNELS_PDL"):
        check_environment({"QUARL_KERNEL_PDL": "0", "QUARL_ENGINE_FUSED": "0"})
    with pytest.raises(UnknownSwitchError, match=r"switches in the environment: .*QUARL_KERNELS_PDL_PREFETCH.*"
                                                 r"QUARL_ZZZ. quarl would ignore them: fix the name, or unset it"):
        check_environment({"QUARL_ZZZ": "1", "QUARL_KERNELS_PDL_PREFETCH": "0"})  # a removed switch, and noise


def test_the_command_stops_before_running(monkeypatch):
    monkeypatch.setenv("QUARL_ENGINE_FUSE", "0")
    res = CliRunner().invoke(app, ["compile", "qerl"])
    assert res.exit_code == 2
    assert "QUARL_ENGINE_FUSE (did you mean QUARL_ENGINE_FUSED" in res.output


def test_compute_switches_are_the_kernel_engine_fp8_ones():
    from quarl.switches import COMPUTE_SWITCHES, SWITCHES, compute_switches

    assert COMPUTE_SWITCHES <= set(SWITCHES)
    assert {"QUARL_KERNELS_DENSE_FP8", "QUARL_ENGINE_FUSED", "QUARL_FP8_GEMM", "QUARL_LOGPROB_KERNEL"} <= COMPUTE_SWITCHES
    assert not COMPUTE_SWITCHES & {"QUARL_KFP_TOKEN", "QUARL_S3_ENDPOINT", "QUARL_STAGE_CONFIG", "QUARL_CACHE",
                                   "QUARL_GSM8K", "QUARL_BENCH_NO_CT"}
    env = {"QUARL_KFP_TOKEN": "t", "QUARL_KERNELS_PDL": "0", "QUARL_FP8_GEMM": "deepgemm", "PATH": "/bin"}
    assert compute_switches(env) == {"QUARL_FP8_GEMM": "deepgemm", "QUARL_KERNELS_PDL": "0"}
