"""A small, readable PPO for episodic environments with discrete, masked actions.

    agent = PPO(obs_dim, n_actions, PPOConfig(...), seed=0)
    result = agent.train(env, checkpoint=path)   # episode rewards, best episode; resumes from `path`

Why hand-written: the environment is a few dozen steps of a Python object whose
every episode costs a forward pass of an LLM; RL libraries (Stable-Baselines3,
TorchRL, CleanRL) bring gym(nasium) wrappers, vectorised envs and loggers we do
not need, and none of them masks actions without an extra package
(sb3-contrib). This is the standard algorithm in ~150 lines of torch:

* actor and critic: two MLPs (obs -> 64 -> 64 -> logits / value, tanh);
  invalid actions get logit -inf (the budget mask), so they are never sampled
  and their probability is exactly 0 in the ratio;
* a batch = ``episodes_per_update`` complete episodes; advantages by GAE
  (Schulman et al. 2016), returns = advantages + values, advantages normalised
  over the batch;
* ``epochs`` passes of the clipped surrogate (Schulman et al. 2017)
  ``-min(ratio A, clip(ratio, 1-eps, 1+eps) A)`` + ``value_coef`` MSE
  - ``entropy_coef`` entropy, Adam, gradient norm clipped.

Sampling uses the agent's own ``torch.Generator``; the checkpoint holds the
networks, the optimiser, that generator's state, the episode history and the
best episode, so a run stopped after any update resumes to identical results.
The best episode (highest return) is what a search keeps.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from quarl.search.config import PPOConfig

log = logging.getLogger(__name__)


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, o))


class ActorCritic(nn.Module):
    """Actor and critic MLPs. With ``action_dim > 0`` the observation ends in ``n_actions`` blocks of
    ``action_dim`` features, one per action, and the actor scores each action with one shared head
    ``head([trunk(state), features of a])``: what it learns about one format (cheap here, sensitive there)
    carries over to the others, which a per-action output unit cannot do."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, action_dim: int = 0):
        super().__init__()
        self.k, self.d = n_actions, action_dim
        self.common = obs_dim - n_actions * action_dim
        if self.common < 0:
            raise ValueError(f"obs_dim {obs_dim} < {n_actions} actions x {action_dim} action features")
        if action_dim:
            self.trunk = nn.Sequential(nn.Linear(self.common, hidden), nn.Tanh())
            self.actor = _mlp(hidden + action_dim, hidden, 1)
        else:
            self.actor = _mlp(obs_dim, hidden, n_actions)
        self.critic = _mlp(obs_dim, hidden, 1)
        with torch.no_grad():  # a near-uniform first policy (CleanRL's small last layer)
            self.actor[-1].weight.mul_(0.01)
            self.actor[-1].bias.zero_()

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.d:
            return self.actor(obs)  # [T, A]
        h = self.trunk(obs[:, : self.common])  # [T, H]
        feats = obs[:, self.common:].reshape(len(obs), self.k, self.d)  # [T, A, d]
        return self.actor(torch.cat([h[:, None].expand(-1, self.k, -1), feats], -1)).squeeze(-1)  # [T, A]

    def dist(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.distributions.Categorical:
        logits = self.logits(obs).masked_fill(~mask, float("-inf"))  # [T, A]
        return torch.distributions.Categorical(logits=logits)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)  # [T]


def gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Generalised advantage estimates of one finished episode (the value after the last step is 0)."""
    adv, last = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        nxt = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] + gamma * nxt - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


@dataclass
class TrainResult:
    episode_returns: list[float] = field(default_factory=list)
    episode_actions: list[tuple] = field(default_factory=list)  # every episode's assignment (top-k selection)
    best_return: float = float("-inf")
    best_actions: tuple = ()
    best_info: dict = field(default_factory=dict)
    updates: int = 0


class PPO:
    def __init__(self, obs_dim: int, n_actions: int, cfg: PPOConfig, seed: int = 0, action_dim: int = 0):
        self.cfg = cfg
        torch.manual_seed(seed)  # network init
        self.net = ActorCritic(obs_dim, n_actions, cfg.hidden, action_dim)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.gen = torch.Generator().manual_seed(seed)
        self.result = TrainResult()

    # -------------------------------------------------------------- rollout
    @torch.no_grad()
    def run_episode(self, env, greedy: bool = False):
        obs, mask = env.reset()
        traj = {"obs": [], "mask": [], "act": [], "logp": [], "val": [], "rew": []}
        done, info = False, {}
        while not done:
            d = self.net.dist(obs[None], mask[None])
            a = int(d.probs.argmax(-1)) if greedy else int(torch.multinomial(d.probs[0], 1, generator=self.gen))
            for k, v in (("obs", obs), ("mask", mask), ("act", a), ("logp", float(d.log_prob(torch.tensor([a])))),
                         ("val", float(self.net.value(obs[None])))):
                traj[k].append(v)
            obs, mask, r, done, info = env.step(a)
            traj["rew"].append(float(r))
        return traj, info

    # --------------------------------------------------------------- update
    def reward_scale(self, trajs: list[dict]) -> float:
        """1 / the standard deviation of every episode return so far (with this batch's), when
        ``normalize_rewards``: the critic's targets then have unit scale whatever the reward weights."""
        if not self.cfg.normalize_rewards:
            return 1.0
        rets = self.result.episode_returns  # this batch's returns are already appended
        if len(rets) < 2:
            return 1.0
        std = float(torch.tensor(rets).std())
        return 1.0 / std if std > 1e-8 else 1.0

    def entropy_coef(self, update: int, n_updates: int) -> float:
        """Linear from ``entropy_coef`` at the first update to ``entropy_final`` at the last."""
        c = self.cfg
        frac = update / max(n_updates - 1, 1)
        return c.entropy_coef + frac * (c.entropy_final - c.entropy_coef)

    def update(self, trajs: list[dict], entropy_coef: float | None = None) -> dict:
        c = self.cfg
        ent_coef = c.entropy_coef if entropy_coef is None else entropy_coef
        scale = self.reward_scale(trajs)
        adv, ret = [], []
        for tr in trajs:
            a = gae([r * scale for r in tr["rew"]], tr["val"], c.gamma, c.gae_lambda)
            adv += a
            ret += [x + v for x, v in zip(a, tr["val"], strict=True)]
        obs = torch.stack([o for tr in trajs for o in tr["obs"]])  # [T, obs_dim]
        mask = torch.stack([m for tr in trajs for m in tr["mask"]])  # [T, A]
        act = torch.tensor([x for tr in trajs for x in tr["act"]])  # [T]
        old_logp = torch.tensor([x for tr in trajs for x in tr["logp"]])
        adv_t, ret_t = torch.tensor(adv), torch.tensor(ret)
        adv_t = (adv_t - adv_t.mean()) / (adv_t.std(unbiased=False) + 1e-8)
        stats = {}
        n = len(act)
        for _ in range(c.epochs):
            perm = torch.randperm(n, generator=self.gen)
            for idx in perm.chunk(min(c.minibatches, n)):
                d = self.net.dist(obs[idx], mask[idx])
                ratio = (d.log_prob(act[idx]) - old_logp[idx]).exp()
                a_mb = adv_t[idx]
                pg = -torch.min(ratio * a_mb, ratio.clamp(1 - c.clip, 1 + c.clip) * a_mb).mean()
                v_loss = (self.net.value(obs[idx]) - ret_t[idx]).pow(2).mean()
                ent = d.entropy().mean()
                loss = pg + c.value_coef * v_loss - ent_coef * ent
                self.opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), c.max_grad_norm)
                self.opt.step()
                stats = {"pg_loss": float(pg.detach()), "v_loss": float(v_loss.detach()),
                         "entropy": float(ent.detach()), "reward_scale": scale}
        return stats

    # ---------------------------------------------------------------- train
    def train(self, env, checkpoint: str | Path | None = None, progress: bool = True,
              stop_after_updates: int | None = None) -> TrainResult:
        """Train for ``cfg.episodes`` episodes (resuming from ``checkpoint`` if it exists)."""
        c = self.cfg
        if checkpoint is not None and Path(checkpoint).is_file():
            self.load(checkpoint)
            log.info("ppo: resumed from %s at episode %d", checkpoint, len(self.result.episode_returns))
        res = self.result
        n_updates = -(-c.episodes // c.episodes_per_update)
        bar = tqdm(total=c.episodes, initial=len(res.episode_returns), desc="precision_search: PPO",
                   disable=not progress)
        done_here = 0
        while len(res.episode_returns) < c.episodes and res.updates < n_updates:
            if stop_after_updates is not None and done_here >= stop_after_updates:
                break
            n = min(c.episodes_per_update, c.episodes - len(res.episode_returns))
            trajs = []
            for _ in range(n):
                tr, info = self.run_episode(env)
                ret = sum(tr["rew"])
                res.episode_returns.append(ret)
                res.episode_actions.append(tuple(tr["act"]))
                if ret > res.best_return:
                    res.best_return, res.best_actions = ret, tuple(tr["act"])
                    res.best_info = {k: v for k, v in info.items() if k != "assignment"}
                trajs.append(tr)
                bar.update()
            stats = self.update(trajs, self.entropy_coef(res.updates, n_updates))
            res.updates += 1
            done_here += 1
            recent = res.episode_returns[-n:]
            bar.set_postfix(mean=f"{sum(recent) / n:.4f}", best=f"{res.best_return:.4f}", ent=f"{stats['entropy']:.2f}")
            if checkpoint is not None and c.checkpoint_every and res.updates % c.checkpoint_every == 0:
                self.save(checkpoint)
        bar.close()
        return res

    # ----------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        r = self.result
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state(),
                "result": {"episode_returns": r.episode_returns, "episode_actions": r.episode_actions,
                           "best_return": r.best_return,
                           "best_actions": r.best_actions, "best_info": r.best_info, "updates": r.updates}}

    def save(self, path: str | Path) -> None:
        """Atomic: write a temporary file, then rename it over the old checkpoint."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def load(self, path: str | Path) -> None:
        st = torch.load(path, weights_only=False)
        self.net.load_state_dict(st["net"])
        self.opt.load_state_dict(st["opt"])
        self.gen.set_state(st["gen"])
        self.result = TrainResult(**st["result"])
