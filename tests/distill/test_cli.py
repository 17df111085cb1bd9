"""``quarl distill`` / ``quarl kd-coldstart``: the config each prints is its own stage's, and a missing
input is one ``error:`` line (exit 1) before any model is loaded."""

import yaml
from typer.testing import CliRunner

from quarl.cli.main import app


def test_print_config_shows_each_stages_defaults():
    runner = CliRunner()
    qad = runner.invoke(app, ["distill", "--print-config"])
    kd = runner.invoke(app, ["kd-coldstart", "--print-config", "--set", "optim.lr=3e-5"])
    assert qad.exit_code == 0 and kd.exit_code == 0, (qad.output, kd.output)
    qad_cfg, kd_cfg = yaml.safe_load(qad.output), yaml.safe_load(kd.output)
    assert qad_cfg["loss"]["objective"] == "forward_kl"
    assert kd_cfg["optim"]["lr"] == 3e-5
    assert qad_cfg != kd_cfg  # kd_coldstart carries Reasoning-QAT's defaults, not QAD's


def test_missing_data_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(app, ["distill", "--output", str(tmp_path / "out")])
    assert r.exit_code == 1 and "needs --data" in r.output
    r = CliRunner().invoke(app, ["kd-coldstart", "--data", str(tmp_path), "--output", str(tmp_path / "o"),
                                 "--set", "loss.objective=kl"])
    assert r.exit_code == 1 and "loss.objective must be one of" in r.output
