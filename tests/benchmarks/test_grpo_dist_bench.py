"""benchmarks/grpo_dist_gpu.py in one CPU process (no torchrun): the 1-GPU phase and the big-shape step run on
tiny shapes, results and table are written, and a short budget skips a part and says so (seconds). The
two-process path is the CPU dry run in the script's docstring and is what tests/train covers."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("grpo_dist_gpu", ROOT / "benchmarks" / "grpo_dist_gpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

TINY = ["--device", "cpu", "--shape", "tiny", "--big-shape", "tiny", "--prompts", "2", "--group", "4",
        "--prompt-len", "8", "--new-tokens", "4", "--micro-batch", "4", "--big-new-tokens", "4"]


def test_one_process_dry_run_writes_results_and_table(tmp_path, capsys):
    bench.main([*TINY, "--budget-s", "600", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    data = json.loads((tmp_path / "out" / "grpo_dist.json").read_text())
    assert data["world_size"] == 1 and data["phases"]["done"]
    one = data["phases"]["1gpu"]["per_rank"][0]
    assert [s["step"] for s in one["steps"]] == [0, 1] and one["steps"][-1]["throughput/tokens_per_s"] > 0
    assert data["phases"]["70b"]["per_rank"][0]["trainable_params"] > 0
    assert "| 1gpu (rank 0) | 1 |" in capsys.readouterr().out


def test_a_short_budget_skips_the_big_shape(tmp_path):
    bench.main([*TINY, "--parts", "70b", "--budget-s", "1", "--min-70b-s", "30", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "grpo_dist.json").read_text())
    assert "budget" in data["phases"]["70b"]["skipped"]
    assert "70B-shaped step: budget" in (tmp_path / "grpo_dist.md").read_text()
