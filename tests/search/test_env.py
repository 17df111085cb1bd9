"""PrecisionEnv: step semantics, shaped and step-mode telescoping, the bit price, budget enforcement; baselines."""

import pytest
import torch

from quarl.search import baselines
from quarl.search.config import RewardConfig
from quarl.search.env import BudgetError, PrecisionEnv, sensitivity_table
from quarl.search.reward import reward

FORMATS = ["int4", "int8", "bf16"]


def test_episode_walks_units_and_rewards_at_the_end(table_ev):
    w = RewardConfig(mode="episode")
    env = PrecisionEnv(table_ev, FORMATS, w)
    obs, mask = env.reset()
    assert obs.shape == (env.obs_dim(),) and mask.all()
    rewards = []
    for t, a in enumerate([0, 1, 2, 0]):
        obs, mask, r, done, info = env.step(a)
        assert obs.shape == (env.obs_dim(),)
        rewards.append(r)
        assert done == (t == 3)
    assert rewards[:3] == [0.0, 0.0, 0.0]  # episode mode: one measurement, at the last unit
    assert info["assignment"] == (0, 1, 2, 0)
    assert table_ev.calls == [(0, 1, 2, 0)]
    assert rewards[3] == pytest.approx(reward(table_ev.measure((0, 1, 2, 0)), table_ev.ref, w))
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(0)
    env.reset()
    assert env.t == 0 and env.assignment == []


def test_step_mode_measures_every_prefix_and_telescopes(table_ev):
    w = RewardConfig(mode="step", w_ent=0.2, w_mem=0.05)
    env = PrecisionEnv(table_ev, FORMATS, w)
    env.reset()
    total = 0.0
    for a in [1, 0, 1, 2]:
        _, _, r, _done, info = env.step(a)
        total += r
    assert table_ev.calls == [(1, None, None, None), (1, 0, None, None), (1, 0, 1, None), (1, 0, 1, 2)]
    assert total == pytest.approx(info["R"])
    assert info["R"] == pytest.approx(reward(table_ev.measure((1, 0, 1, 2)), table_ev.ref, w))


def test_budget_mask_keeps_every_episode_feasible(table_ev):
    env = PrecisionEnv(table_ev, FORMATS, RewardConfig(mode="episode"), budget_bits=6.0)  # 4 units: at most one at 8 bits + ...
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        _, mask = env.reset()
        done = False
        while not done:
            allowed = mask.nonzero().flatten()
            a = int(allowed[torch.randint(len(allowed), (1,), generator=gen)])
            _, mask, _, done, info = env.step(a)
        m = table_ev.measure(info["assignment"])
        assert m.avg_bits <= 6.0 + 1e-9
    # 6 bits over 4 equal units leaves room for two 8-bit units; after two, only 4 bits remain allowed
    env.reset()
    env.step(1)
    assert env.mask().tolist() == [True, True, False]
    env.step(1)
    assert env.mask().tolist() == [True, False, False]
    with pytest.raises(BudgetError, match="breaks the budget"):
        env.step(2)


def test_unreachable_budget_fails_at_construction(table_ev):
    with pytest.raises(BudgetError, match="below the cheapest recipe"):
        PrecisionEnv(table_ev, FORMATS, RewardConfig(mode="episode"), budget_bits=3.0)


def test_greedy_spends_bits_on_the_sensitive_unit(table_ev):
    sens = sensitivity_table(table_ev, FORMATS, progress=False)
    a = baselines.greedy(table_ev.bits, table_ev.params, [[m.kl for m in r] for r in sens], budget_bits=6.0)
    assert table_ev.measure(a).avg_bits <= 6.0
    assert a == (0, 1, 1, 0)  # room for two 8-bit units: the two that lose most at 4 bits keep 8 bits


def test_random_search_respects_budget_and_counts_episodes(table_ev):
    env = PrecisionEnv(table_ev, FORMATS, RewardConfig(mode="episode"), budget_bits=6.0)
    res = baselines.random_search(env, episodes=20, seed=0, progress=False)
    assert len(res["returns"]) == 20 and res["return"] == max(res["returns"])
    assert table_ev.measure(res["assignment"]).avg_bits <= 6.0


def test_shaped_mode_pays_estimates_then_the_rest_of_R(table_ev):
    w = RewardConfig(mode="shaped", w_perf=0.5, w_mem=0.05)
    sens = sensitivity_table(table_ev, FORMATS, progress=False)
    table_ev.calls.clear()
    env = PrecisionEnv(table_ev, FORMATS, w, budget_bits=6.0, sensitivity=sens)
    env.reset()
    rewards = []
    for t, a in enumerate([1, 0, 1, 0]):
        _, _, r, _, info = env.step(a)
        rewards.append(r)
        if t < 3:
            assert r == pytest.approx(env.shaped_step(t, a))
    assert table_ev.calls == [(1, 0, 1, 0)]  # still one measurement per episode
    R = reward(table_ev.measure((1, 0, 1, 0)), table_ev.ref, w)
    assert sum(rewards) == pytest.approx(R) == pytest.approx(info["R"])  # potential-based: the return is R
    assert rewards[3] == pytest.approx(R - sum(rewards[:3]))
    # the single-unit estimate: the measured loss/KL terms of "only unit 2 in 4 bits", and the memory that unit saves
    m = sens[2][0]
    assert env.unit_estimate(2, 0) == pytest.approx(0.5 * (table_ev.ref.loss - m.loss) - m.kl_ref_quant +
                                                    0.05 * (16 - 4) * 100 / (16 * 400))


def test_bit_price_makes_each_units_own_best_choice_meet_the_budget(table_ev):
    sens = sensitivity_table(table_ev, FORMATS, progress=False)
    env = PrecisionEnv(table_ev, FORMATS, RewardConfig(), budget_bits=6.0, sensitivity=sens)
    assert env.price > 0
    own = tuple(max(range(3), key=lambda f: env.shaped_step(u, f)) for u in range(4))
    assert table_ev.measure(own).avg_bits <= 6.0 + 1e-9
    assert own == (0, 1, 1, 0)  # = greedy's: the two units that lose most at 4 bits keep 8
    free = PrecisionEnv(table_ev, FORMATS, RewardConfig(), budget_bits=None, sensitivity=sens)
    assert free.price == 0.0 and free.shaped_step(2, 2) == pytest.approx(free.unit_estimate(2, 2))


def test_shaped_mode_needs_a_sensitivity_table(table_ev):
    with pytest.raises(ValueError, match="sensitivity table"):
        PrecisionEnv(table_ev, FORMATS, RewardConfig(mode="shaped"))


def test_observation_has_per_format_blocks(table_ev):
    sens = sensitivity_table(table_ev, FORMATS, progress=False)
    env = PrecisionEnv(table_ev, FORMATS, RewardConfig(), budget_bits=6.0, sensitivity=sens)
    obs, _ = env.reset()
    d = env.action_feature_dim()
    assert obs.shape == (env.obs_dim(),) == (env.COMMON + 3 * d,)
    blocks = obs[env.COMMON:].view(3, d)
    assert blocks[:, 1].max() == 0.0  # the shaped-reward feature: 0 for the unit's best format, < 0 otherwise
    assert blocks[:, 2].tolist() == pytest.approx([0.0, 4 / 12, 1.0])  # bits: cheapest 0, dearest 1
    assert blocks[:, -3:].tolist() == torch.eye(3).tolist()  # one-hot format index


def test_greedy_moves_past_formats_of_equal_bits():
    # formats 8.6, 4.5, 4.5, 4.1 bits: a budget of 4.1 needs every unit to reach the last, past the equal pair
    bits = [[8.6, 4.5, 4.5, 4.1]] * 3
    cost = [[0.0, 0.2, 0.1, 0.15]] * 3
    assert baselines.greedy(bits, [1, 1, 1], cost, budget_bits=4.1) == (3, 3, 3)
    # with room for one unit at 8.6 (and the rest at 4.1 or 4.5), the cheapest-per-bit moves are taken
    a = baselines.greedy(bits, [1, 1, 1], [[0.0, 0.2, 0.1, 0.15], [0.0, 0.2, 0.1, 0.15], [0.0, 9, 9, 9]],
                         budget_bits=(8.6 + 4.1 + 4.1) / 3)
    assert a == (3, 3, 0)
