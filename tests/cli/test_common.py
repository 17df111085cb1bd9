"""Every stage command shares one body (``quarl.cli.common.run_stage``): ``--print-config`` alone prints the stage's
resolved defaults -- no model, data or output named (the options a run needs are checked after it) -- and a run
without them is one ``error:`` line naming what is missing, exit status 1."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from quarl.cli.main import app

# stage command -> (a top-level section or key of its config, the options a run needs)
STAGES = {
    "data-prep": ("sources", ["--output"]),
    "calibrate": ("gptq", ["--model", "--output"]),
    "distill": ("loss", ["--data", "--output"]),
    "kd-coldstart": ("loss", ["--data", "--output"]),
    "eval": ("benchmarks", ["--model", "--output"]),
    "export": ("verify", ["--model", "--output"]),
    "precision-search": ("budget_bits", ["--output"]),
    "rl": ("algo", ["--data", "--output"]),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_print_config_needs_no_model_data_or_output(stage):
    r = CliRunner().invoke(app, [stage, "--print-config"])
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load(r.output)
    assert STAGES[stage][0] in cfg, sorted(cfg)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_run_without_what_it_needs_names_it(stage):
    r = CliRunner().invoke(app, [stage])
    assert r.exit_code == 1
    needed = STAGES[stage][1]
    assert f"error: quarl {stage} needs {' and '.join(needed)}" in r.output, r.output
