"""benchmarks/gemv_split_step.py on CPU: its settings parse into labelled environment switches (the defaults as
``label=``), malformed ones stop the run naming the form, and a tiny model's dry run writes its table."""

import json

import pytest

from tests.benchmarks.bench_module import load_bench

bench = load_bench("gemv_split_step.py", "gemv_split_step")


def test_settings_parse_into_labelled_switches():
    got = bench.parse_settings(" rule= ; gu3=QUARL_KERNELS_GEMV_SPLIT=27648x5120:3,7168x5120:2|QUARL_KERNELS_PDL=0 ")
    assert got == {"rule": {}, "gu3": {"QUARL_KERNELS_GEMV_SPLIT": "27648x5120:3,7168x5120:2", "QUARL_KERNELS_PDL": "0"}}
    for bad, match in (("rule", "label=NAME=VALUE"), ("=X=1", "label=NAME=VALUE"), ("a=X", "NAME=VALUE"),
                       ("a=;a=", "twice"), (" ; ", "no setting")):
        with pytest.raises(SystemExit, match=match):
            bench.parse_settings(bad)


def test_dry_run_on_cpu_writes_each_setting_each_round(tmp_path):
    assert bench.main(["--device", "cpu", "--model", "tiny", "--steps", "2", "--rounds", "2", "--prompt", "16",
                       "--settings", "rule=;nopdl=QUARL_KERNELS_PDL=0", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gemv_split_step.json").read_text())
    assert [len(res["ms"][k]) for k in ("rule", "nopdl")] == [2, 2] and all(v > 0 for v in res["ms"]["rule"])
    assert len(res["warm_ms"]) == 1  # the throwaway first engine
    md = (tmp_path / "gemv_split_step.md").read_text()
    assert "| rule | `(defaults)` |" in md and "| nopdl | `QUARL_KERNELS_PDL=0` |" in md and "1.000" in md
