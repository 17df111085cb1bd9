"""PPO on the precision environment itself (a table evaluator): a budgeted allocation whose optimum is known."""

import pytest

from quarl.search import baselines
from quarl.search.config import PPOConfig, RewardConfig
from quarl.search.env import PrecisionEnv, sensitivity_table
from quarl.search.ppo import PPO
from tests.search.conftest import TableEvaluator

# 10 equal units, a 4-bit and an 8-bit format; the budget (4.8 bits) buys exactly two 8-bit units, and units 2 and 6
# lose far more at 4 bits than the others: the optimum puts those two in 8 bits, every other unit in 4
KL4 = [0.010, 0.012, 0.300, 0.011, 0.009, 0.010, 0.250, 0.013, 0.010, 0.012]
OPTIMUM = (0, 0, 1, 0, 0, 0, 1, 0, 0, 0)


def _env(mode: str):
    ev = TableEvaluator([[4.0, 8.0]] * 10, [[k, 0.001] for k in KL4])
    sens = sensitivity_table(ev, ["int4", "int8"], progress=False)
    return ev, PrecisionEnv(ev, ["int4", "int8"], RewardConfig(mode=mode, w_perf=0.0, kl="quant_ref"),
                            budget_bits=4.8, sensitivity=sens)


@pytest.mark.parametrize("mode,episodes", [("shaped", 48), ("episode", 192)])
def test_ppo_finds_the_budgeted_optimum_and_beats_random(mode, episodes):
    ev, env = _env(mode)
    lam = 0.5 if mode == "shaped" else 0.95  # end-only reward: credit must travel the whole episode
    agent = PPO(env.obs_dim(), 2, PPOConfig(episodes=episodes, checkpoint_every=0, gae_lambda=lam), seed=0,
                action_dim=env.action_feature_dim())
    res = agent.train(env, progress=False)
    rand = baselines.random_search(env, episodes, seed=1, progress=False)
    k = 16
    assert sum(res.episode_returns[-k:]) / k > sum(rand["returns"]) / len(rand["returns"]) + 0.1
    assert res.best_actions == OPTIMUM
    traj, _ = agent.run_episode(env, greedy=True)
    assert tuple(traj["act"]) == OPTIMUM  # the policy itself, not only its luckiest episode
    assert ev.measure(OPTIMUM).avg_bits == pytest.approx(4.8)
