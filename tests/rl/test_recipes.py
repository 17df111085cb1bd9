"""Every RL recipe loads, resolves, and carries QeRL Table 4's numbers."""

from pathlib import Path

import pytest

import quarl
from quarl.config import load_config
from quarl.rl.config import RLConfig

RECIPES = Path(quarl.__file__).parent / "recipes" / "rl"


def _load(name: str) -> RLConfig:
    return load_config(RLConfig, RECIPES / name).resolved()


def test_all_recipes_resolve():
    names = sorted(p.name for p in RECIPES.glob("*.yaml"))
    assert {"qerl-gsm8k-grpo-3b.yaml", "qerl-gsm8k-grpo-7b.yaml", "qerl-bigmath-dapo-7b.yaml",
            "qerl-bigmath-dapo-14b.yaml", "qerl-bigmath-dapo-32b.yaml", "smollm2-cpu.yaml"} <= set(names)
    for n in names:
        _load(n)


@pytest.mark.parametrize("name", ["qerl-gsm8k-grpo-3b.yaml", "qerl-gsm8k-grpo-7b.yaml"])
def test_gsm8k_grpo_table4(name):
    c = _load(name)
    assert c.algo.algo == "grpo" and c.rollout.group_size == 8 and c.algo.updates_per_rollout == 4
    assert c.rollout.group_size * c.train.prompts_per_step == 128  # training batch size 128
    assert c.rollout.max_new_tokens == 4096 and c.rollout.temperature == 1.0
    assert (c.algo.eps_low, c.algo.eps_high, c.algo.beta) == (0.2, 0.28, 0.0)
    assert (c.aqn.sigma_start, c.aqn.sigma_end, c.aqn.num_stages) == (1e-2, 5e-4, 10)
    assert (c.optim.optimizer, c.optim.lr) == ("adamw8bit", 1e-5)
    assert c.policy.format == "nvfp4" and c.policy.lora_r == 32


@pytest.mark.parametrize("name,gc", [("qerl-bigmath-dapo-7b.yaml", False), ("qerl-bigmath-dapo-14b.yaml", True),
                                     ("qerl-bigmath-dapo-32b.yaml", True)])
def test_bigmath_dapo_table4(name, gc):
    c = _load(name)
    assert c.algo.algo == "dapo" and c.rollout.group_size == 16 and c.algo.updates_per_rollout == 1
    assert c.rollout.group_size * c.train.prompts_per_step == 128
    assert c.rollout.max_new_tokens == 8192
    assert c.algo.loss_agg == "token" and c.algo.dynamic_sampling and c.algo.overlong == "filter"
    assert (c.algo.eps_low, c.algo.eps_high, c.algo.beta) == (0.2, 0.28, 0.0)
    assert (c.aqn.sigma_start, c.aqn.sigma_end) == (1e-2, 5e-4)
    assert c.policy.gradient_checkpointing is gc


def test_defaults_are_qerl_gsm8k():
    c = RLConfig().resolved()
    assert (c.optim.lr, c.optim.optimizer, c.rollout.group_size, c.algo.updates_per_rollout) == (1e-5, "adamw8bit", 8, 4)
    assert (c.aqn.sigma_start, c.aqn.sigma_end, c.aqn.num_stages, c.aqn.schedule) == (1e-2, 5e-4, 10, "exponential")
    d = load_config(RLConfig, None, ["algo.algo=dapo", "algo.eps_high=null"]).resolved()
    assert d.algo.eps_high == 0.28 and d.algo.loss_agg == "token"
    g = load_config(RLConfig, None, ["algo.eps_high=null"]).resolved()
    assert g.algo.eps_high == 0.2 and g.algo.loss_agg == "sequence" and not g.algo.dynamic_sampling


def test_bad_settings_are_named():
    for override, key in [("policy.mode=full", "policy.format"), ("rollout.group_size=1", "group_size"),
                          ("algo.overlong=cut", "algo.overlong"), ("aqn.schedule=step", "aqn.schedule"),
                          ("optim.optimizer=sgd", "optim.optimizer")]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            load_config(RLConfig, None, [override]).resolved()
