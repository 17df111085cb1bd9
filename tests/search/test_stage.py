"""run_precision_search end to end on a tiny model, its recipe into calibrate, and config validation."""

import json
import logging

import pytest
import torch
import yaml

from quarl.artifacts import open_artifact, write_artifact
from quarl.calibrate import CalibrateConfig, run_calibrate
from quarl.config import ConfigError, load_config
from quarl.search import PrecisionSearchConfig, run_precision_search

SMALL = ["formats=[nvfp4, int8-g64, bf16]", "budget_bits=8.0", "ppo.episodes=16", "ppo.episodes_per_update=8",
         "data.num_samples=2", "data.seq_len=16", "data.select_samples=1", "data.heldout_samples=1",
         "measure_entropy=true"]


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


def test_search_writes_a_recipe_that_calibrate_takes(tmp_path, data_artifact, caplog):
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
    assert s["searched"] == "PPO (selected)" and 1 < len(s["selection"]["ppo"]) <= 8  # top-8 re-measured
    chosen = max(s["selection"]["ppo"], key=lambda c: c["reward"])["assignment"]
    assert [s["formats"].index(s["assignment"][u["name"]]) for u in s["units"]] == chosen
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
    assert s["resumed_from"] is None
    # the same search again continues the finished checkpoint: said loudly, recorded, same recipe
    with caplog.at_level(logging.WARNING, logger="quarl.search"):
        again = run_precision_search(cfg, model_uri="tiny-llama", data_uri=data_artifact,
                                     output_uri=str(tmp_path / "recipe2"), progress=False)
    assert "set resume=false" in caplog.text and again["recipe"] == res["recipe"]
    s2 = json.loads((tmp_path / "recipe2" / "search.json").read_text())
    assert s2["resumed_from"] == str(tmp_path / "ck" / "ppo.pt")


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


def test_default_budget_is_uniform_nvfp4s_bits(tmp_path, data_artifact):
    """The defaults (nf4-dq / nvfp4 / int8-g64 / bf16, fused units, budget_format nvfp4): equal or fewer bits."""
    cfg = load_config(PrecisionSearchConfig, None, [
        "ppo.episodes=8", "data.num_samples=1", "data.seq_len=16", "data.select_samples=1",
        "data.heldout_samples=0", "baselines=[uniform, greedy, random]", "measure_entropy=false",
        f"checkpoint_dir={tmp_path / 'ck'}"])
    res = run_precision_search(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=str(tmp_path / "r"),
                               progress=False)
    nv = res["comparison"]["uniform nvfp4"]["avg_bits"]
    s = json.loads((tmp_path / "r" / "search.json").read_text())
    assert s["budget_bits"] == pytest.approx(nv, rel=1e-12)
    for name in ("PPO (selected)", "PPO (best episode)", "greedy (sensitivity)", "random search (best)"):
        assert res["comparison"][name]["avg_bits"] <= nv * (1 + 1e-12), name
    assert len(s["units"]) == 4 * 2  # fused: qkv, o, gate_up, down per block


class _FakeEv:
    """measure_on: reward = minus the number of units in format 0 on the selection batch (one unit's reversed)."""

    def reference_on(self, ids):
        from quarl.search.reward import Measurement

        return Measurement(loss=1.0, kl=0.0, entropy=0.0, avg_bits=16.0)

    def measure_on(self, ids, a):
        from quarl.search.reward import Measurement

        kl = 0.1 * sum(x == 0 for x in a)
        return Measurement(loss=1.0, kl=kl, entropy=0.0, avg_bits=4.0, kl_ref_quant=kl)


def test_top_k_is_distinct_and_selection_picks_the_best_on_its_batch():
    from quarl.search.config import RewardConfig
    from quarl.search.stage import _top, select

    returns = [-3.0, -1.0, -1.0, -2.0, -0.5]
    actions = [(0, 0), (0, 1), (0, 1), (1, 1), (0, 0)]
    assert _top(returns, actions, 2) == [(0, 0), (0, 1)]  # (0, 0)'s best return is -0.5; duplicates count once
    best, scored = select(_FakeEv(), torch.zeros(1, 2), _top(returns, actions, 3), RewardConfig())
    assert best == (1, 1) and len(scored) == 3  # the search batch ranked it last; the selection batch decides
    assert select(_FakeEv(), None, [(0, 0), (1, 1)], RewardConfig()) == ((0, 0), [])  # no batch: the first
