"""run_precision_search end to end on a tiny model, its recipe into calibrate, and config validation."""

import json

import pytest
import yaml

from quarl.artifacts import open_artifact, write_artifact
from quarl.calibrate import CalibrateConfig, run_calibrate
from quarl.config import ConfigError, load_config
from quarl.search import PrecisionSearchConfig, run_precision_search

SMALL = ["formats=[nvfp4, int8-g64, bf16]", "budget_bits=8.0", "ppo.episodes=16", "ppo.episodes_per_update=8",
         "data.num_samples=2", "data.seq_len=16", "data.heldout_samples=1", "measure_entropy=true"]


@pytest.fixture(scope="module")
def data_artifact(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"Tom has {i} apples and buys {i + 7} more. How many?", "answer": str(2 * i + 7),
             "solution": f"{i} + {i + 7} = {2 * i + 7}"} for i in range(40)]
    uri = tmp_path_factory.mktemp("data") / "dataset"
    with write_artifact(uri, "dataset", "data_prep") as art:
        pq.write_table(pa.Table.from_pylist(rows[:30]), art.path / "train.parquet")
        pq.write_table(pa.Table.from_pylist(rows[30:]), art.path / "eval.parquet")
    return str(uri)


def test_search_writes_a_recipe_that_calibrate_takes(tmp_path, data_artifact):
    cfg = load_config(PrecisionSearchConfig, None, [*SMALL, f"checkpoint_dir={tmp_path / 'ck'}"])
    out = tmp_path / "recipe"
    res = run_precision_search(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=str(out),
                               progress=False)
    art = open_artifact(str(out), kind="recipe")
    for f in ("recipe.yaml", "search.json", "report.md", "reward_curve.png", "formats.png"):
        assert (art.path / f).is_file(), f
    assert (tmp_path / "ck" / "ppo.pt").is_file()
    s = json.loads((art.path / "search.json").read_text())
    names = {r["name"] for r in s["comparison"]}
    assert {"uniform nvfp4", "uniform int8-g64", "greedy (sensitivity)", "random search (best)",
            "PPO (best episode)"} <= names
    assert len(s["ppo"]["episode_returns"]) == 16 == len(s["random"]["episode_returns"])
    assert res["searched"]["avg_bits"] <= 8.0 + 1e-9
    assert all("heldout" in r for r in s["comparison"])
    # the recipe round-trips into calibrate: every linear gets the format the search chose for its unit
    ccfg = load_config(CalibrateConfig, None, ["method=rtn", "data.num_samples=2", "data.seq_len=16",
                                               "eval.num_samples=1"])
    m = run_calibrate(ccfg, model_uri="tiny-llama", data_uri=data_artifact, recipe_uri=str(out),
                      output_uri=str(tmp_path / "model"), progress=False)
    got = {r["name"]: r["format"] for r in m["layers"]}
    for u in s["units"]:
        want = s["assignment"][u["name"]]
        for name, fmt in got.items():
            if name.startswith(u["name"] + "."):
                assert fmt == want, (name, fmt, want)
    assert yaml.safe_load((art.path / "recipe.yaml").read_text()) == res["recipe"]


def test_gptq_recovery_and_step_rewards_run(tmp_path, data_artifact):
    cfg = load_config(PrecisionSearchConfig, None, [
        *SMALL, "method=gptq", "recovery_steps=1", "reward.mode=step", "granularity=group", "ppo.episodes=4",
        "ppo.episodes_per_update=4", "baselines=[uniform]", "sensitivity=false", "data.heldout_samples=0",
        "resume=false",
        f"checkpoint_dir={tmp_path / 'ck'}"])
    res = run_precision_search(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=str(tmp_path / "r"),
                               progress=False)
    assert set(res["comparison"]) == {"uniform nvfp4", "uniform int8-g64", "PPO (selected)", "PPO (best episode)",
                                      "PPO policy (argmax)"}
    assert res["comparison"]["uniform int8-g64"]["kl"] < res["comparison"]["uniform nvfp4"]["kl"]


@pytest.mark.parametrize("override,match", [
    ("formats=[nvfp4, nf5]", "unknown format spec"),
    ("formats=[nvfp4, NVFP4]", "lists a format twice"),
    ("budget_bits=-1", "budget_bits must be > 0"),
    ("reward.w_ent=0.5", "needs measure_entropy"),
    ("ppo.clip=1.5", "ppo.clip must be in"),
    ("baselines=[uniform, grid]", "unknown baselines"),
    ("sensitivity=false", "reward.mode=shaped pays each step its estimate from the sensitivity table"),
    ("reward.mode=episode", "greedy baseline ranks units by the sensitivity table"),
    ("reward.kl=ref", "reward.kl.*allowed: 'quant_ref', 'ref_quant'"),
    ("select_top=0", "select_top must be >= 1"),
    ("granularity=head", "granularity.*allowed: 'block', 'group', 'fused', 'linear'"),
])
def test_config_errors_name_the_fix(override, match):
    extra = {"w_ent": ["measure_entropy=false"], "reward.mode=episode": ["sensitivity=false"]}
    extra = next((v for k, v in extra.items() if k in override), [])
    with pytest.raises(ConfigError, match=match):
        load_config(PrecisionSearchConfig, None, [override, *extra])
