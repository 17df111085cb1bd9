"""``quarl precision-search``: its config, a clear error without text, and a tiny search whose recipe
``quarl calibrate --recipe`` takes."""

import json

import yaml
from typer.testing import CliRunner

from quarl.cli.main import app

SMALL = ["formats=[nvfp4, int8-g64, bf16]", "budget_bits=8.0", "ppo.episodes=4", "ppo.episodes_per_update=4",
         "data.num_samples=1", "data.seq_len=16", "data.select_samples=1", "data.heldout_samples=1",
         "measure_entropy=false", "granularity=block"]


def _sets(xs):
    return [a for x in xs for a in ("--set", x)]


def test_print_config_is_the_stages():
    r = CliRunner().invoke(app, ["precision-search", "-o", "unused", "--print-config", "--set", "ppo.episodes=7"])
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load(r.output)
    assert cfg["ppo"]["episodes"] == 7 and cfg["budget_format"] == "nvfp4"


def test_no_text_and_bad_config_are_one_error_line(tmp_path):
    r = CliRunner().invoke(app, ["precision-search", "-m", "tiny-llama", "-o", str(tmp_path / "r"),
                                 *_sets(SMALL)])
    assert r.exit_code == 1 and "needs text" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["precision-search", "-o", str(tmp_path / "r"), "--set", "formats=[nf5]"])
    assert r.exit_code == 1 and "unknown format spec" in r.output


def test_search_then_calibrate_with_its_recipe(tmp_path):
    text = tmp_path / "t.jsonl"
    text.write_text("".join(json.dumps({"text": f"Tom has {i} apples and buys {i + 7} more, so {2 * i + 7}."}) + "\n"
                            for i in range(40)))
    out = tmp_path / "recipe"
    r = CliRunner().invoke(app, ["precision-search", "-m", "tiny-llama", "-o", str(out), "--no-progress",
                                 *_sets([*SMALL, f"data.path={text}", f"checkpoint_dir={tmp_path / 'ck'}"])])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["searched"]["avg_bits"] <= 8.0 + 1e-9 and "uniform nvfp4" in res["comparison"]
    assert (out / "recipe.yaml").is_file() and (tmp_path / "ck" / "ppo.pt").is_file()
    r = CliRunner().invoke(app, ["calibrate", "-m", "tiny-llama", "--recipe", str(out), "-o", str(tmp_path / "m"),
                                 "--no-progress", *_sets(["method=rtn", f"data.path={text}", "data.num_samples=2",
                                                          "data.seq_len=16", "eval.enabled=false"])])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "search.json").read_text())
    applied = json.loads((tmp_path / "m" / "quarl_quantization.json").read_text())["layers"]
    checked = 0
    for u in s["units"]:  # every linear of a unit carries the format the search chose for it (bf16: left out)
        for name, fmt in applied.items():
            if name.startswith(u["name"] + "."):
                assert fmt == s["assignment"][u["name"]], (name, fmt)
                checked += 1
    assert checked + sum(7 for u in s["units"] if s["assignment"][u["name"]] == "bf16") == 7 * len(s["units"])
