"""PPO: GAE by hand, learning a toy environment whose optimum is known, exact resume from a checkpoint."""

import pytest
import torch

from quarl.search.config import PPOConfig
from quarl.search.ppo import PPO, gae


class MatchEnv:
    """T steps, k actions; step t pays 1 at the end for each action equal to TARGET[t] (optimum = T).

    The observation is the one-hot step index, so the optimal policy is a lookup the agent must learn;
    a uniformly random policy scores about T/k. Action k-1 is masked at steps 1 and 4 (where it is not the
    target), to exercise masking.
    """

    TARGET = (2, 0, 1, 2, 1, 0)

    def __init__(self, k: int = 3):
        self.k, self.n = k, len(self.TARGET)

    def obs_dim(self):
        return self.n

    def reset(self):
        self.t, self.hits = 0, 0
        return self._obs(), self._mask()

    def _obs(self):
        return torch.nn.functional.one_hot(torch.tensor(min(self.t, self.n - 1)), self.n).float()

    def _mask(self):
        m = torch.ones(self.k, dtype=torch.bool)
        if self.t in (1, 4):
            m[self.k - 1] = False
        return m

    def step(self, a):
        assert self._mask()[a], "PPO sampled a masked action"
        self.hits += int(a == self.TARGET[self.t])
        self.t += 1
        done = self.t == self.n
        info = {"assignment": ()} if done else {}
        return self._obs(), self._mask(), float(self.hits) if done else 0.0, done, info


def test_gae_matches_hand_computation():
    # rewards (0, 0, 1), values (0.5, 0.2, 0.4), gamma 0.9, lambda 0.8
    d2 = 1 - 0.4
    d1 = 0 + 0.9 * 0.4 - 0.2
    d0 = 0 + 0.9 * 0.2 - 0.5
    a2 = d2
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    assert gae([0, 0, 1], [0.5, 0.2, 0.4], 0.9, 0.8) == pytest.approx([a0, a1, a2])


def test_ppo_learns_the_known_optimum():
    env = MatchEnv()
    cfg = PPOConfig(episodes=480, episodes_per_update=16, epochs=4, lr=1e-2, entropy_coef=0.0, checkpoint_every=0,
                    gae_lambda=0.95)  # the reward comes at the end only: credit must travel the whole episode
    agent = PPO(env.obs_dim(), env.k, cfg, seed=0)
    res = agent.train(env, progress=False)
    first, last = res.episode_returns[:32], res.episode_returns[-32:]
    assert sum(first) / 32 < 3.5  # it starts near random (6/3 = 2, a little more with the mask)
    assert sum(last) / 32 > 5.5  # and ends near the optimum 6
    traj, _ = agent.run_episode(env, greedy=True)
    assert tuple(traj["act"]) == MatchEnv.TARGET
    assert res.best_return == 6 and res.best_actions == MatchEnv.TARGET


def test_resume_from_checkpoint_is_exact(tmp_path):
    env = MatchEnv()
    cfg = PPOConfig(episodes=64, episodes_per_update=16, lr=1e-2)
    straight_agent = PPO(env.obs_dim(), env.k, cfg, seed=3)
    straight = straight_agent.train(env, progress=False)
    ck = tmp_path / "ppo.pt"
    PPO(env.obs_dim(), env.k, cfg, seed=3).train(env, checkpoint=ck, progress=False, stop_after_updates=2)
    assert ck.is_file()
    resumed_agent = PPO(env.obs_dim(), env.k, cfg, seed=99)  # the checkpoint, not the seed, decides
    resumed = resumed_agent.train(env, checkpoint=ck, progress=False)
    assert resumed.episode_returns == straight.episode_returns
    assert resumed.best_actions == straight.best_actions and resumed.updates == 4
    # the next updates are the same updates: identical weights and optimiser moments at the end
    a, b = straight_agent.state_dict(), resumed_agent.state_dict()
    for k, v in a["net"].items():
        assert torch.equal(v, b["net"][k]), k
    for s, r in zip(a["opt"]["state"].values(), b["opt"]["state"].values(), strict=True):
        assert all(torch.equal(s[k], r[k]) for k in s)


def test_shared_head_scores_each_action_from_its_own_features():
    from quarl.search.ppo import ActorCritic

    net = ActorCritic(obs_dim=5 + 3 * 4, n_actions=3, hidden=16, action_dim=4)
    obs = torch.randn(7, 5 + 3 * 4)
    perm = [2, 0, 1]
    blocks = obs[:, 5:].view(7, 3, 4)
    swapped = torch.cat([obs[:, :5], blocks[:, perm].reshape(7, 12)], 1)
    assert torch.allclose(net.logits(swapped), net.logits(obs)[:, perm], atol=1e-6)  # permuting blocks permutes logits
    mask = torch.tensor([[True, False, True]] * 7)
    assert (net.dist(obs, mask).probs[:, 1] == 0).all()
    with pytest.raises(ValueError, match="action features"):
        ActorCritic(obs_dim=5, n_actions=3, action_dim=4)


def test_entropy_bonus_decays_linearly():
    agent = PPO(4, 2, PPOConfig(entropy_coef=0.02, entropy_final=0.0), seed=0)
    assert [agent.entropy_coef(u, 5) for u in range(5)] == pytest.approx([0.02, 0.015, 0.01, 0.005, 0.0])
