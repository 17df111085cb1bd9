"""The precision-search environment: an episode walks the units in order and picks a format for each.

    env = PrecisionEnv(evaluator, formats, reward_cfg, budget_bits=4.5)
    obs, mask = env.reset()
    obs, mask, r, done, info = env.step(action)   # action: index into formats

The evaluator is anything with ``units``, ``bits[u][f]``, ``params[u]``, ``ref``
(a Measurement) and ``measure(assignment) -> Measurement`` (``ModelEvaluator``
on a real model; tests use a table).

Step semantics:

* step ``t`` assigns ``formats[action]`` to unit ``t``; the episode ends after
  the last unit, and ``info["assignment"]`` is the full assignment;
* ``reward.mode = "episode"``: reward 0 until the last step, then R of the
  whole recipe (one measurement per episode). ``"step"``: every step measures
  the partial recipe (undecided units unchanged) and returns ``R_t - R_{t-1}``
  (with ``R_0 = 0``, the unquantized model), so the return is the same R;
* budget (``avg_bits <= budget_bits``) is enforced by the action mask: a format
  is allowed only if the remaining units can still meet the budget in their
  cheapest format, so every episode that follows the mask is feasible. A
  masked action passed to ``step`` raises. A budget below the cheapest recipe
  fails at construction;
* observation (float vector, :meth:`obs_dim` long): progress ``t/n``, the
  unit's kind (one-hot), log2 size, average bits so far / 16, budget slack / 16,
  the fraction of units given each format so far, the previous action
  (one-hot), the running KL and loss gap (measured in step mode; else the sum
  of the single-unit sensitivities of the choices so far), and the current
  unit's single-unit KL for each format (0 without a sensitivity table).
"""

from __future__ import annotations

import math

import torch

from quarl.search.config import RewardConfig
from quarl.search.reward import BF16_BITS, Measurement, reward

KINDS = ("block", "self_attn", "mlp", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class BudgetError(ValueError):
    """The budget cannot be met by any recipe over the given formats."""


class PrecisionEnv:
    def __init__(self, evaluator, formats: list[str], reward_cfg: RewardConfig, budget_bits: float | None = None,
                 sensitivity: list[list[Measurement]] | None = None):
        self.ev, self.formats, self.w, self.budget = evaluator, list(formats), reward_cfg, budget_bits
        self.n, self.k = len(evaluator.units), len(formats)
        self.params = list(evaluator.params)
        self.total = float(sum(self.params))
        self.sens = sensitivity
        # cheapest possible bits*params of units t.. (suffix sums), for the mask
        cheapest = [min(row) * p for row, p in zip(evaluator.bits, self.params, strict=True)]
        self.min_tail = [sum(cheapest[t:]) for t in range(self.n + 1)]
        if budget_bits is not None and self.min_tail[0] / self.total > budget_bits + 1e-9:
            raise BudgetError(
                f"budget_bits={budget_bits} is below the cheapest recipe over {formats} "
                f"({self.min_tail[0] / self.total:.3f} bits); raise budget_bits or add a lower-bit format"
            )
        self.reset()

    # ----------------------------------------------------------------- API
    def reset(self):
        self.t, self.assignment, self.used_bits = 0, [], 0.0
        self.prev_r, self.run_kl, self.run_dloss = 0.0, 0.0, 0.0
        return self.observation(), self.mask()

    def mask(self) -> torch.Tensor:
        """[k] bool: formats allowed for the current unit under the budget."""
        if self.t >= self.n:
            return torch.zeros(self.k, dtype=torch.bool)
        if self.budget is None:
            return torch.ones(self.k, dtype=torch.bool)
        cap = self.budget * self.total + 1e-6 * self.total
        tail = self.min_tail[self.t + 1]
        bits = self.ev.bits[self.t]
        return torch.tensor([self.used_bits + b * self.params[self.t] + tail <= cap for b in bits])

    def step(self, action: int):
        if self.t >= self.n:
            raise RuntimeError("step() after the episode ended; call reset()")
        if not bool(self.mask()[action]):
            raise BudgetError(f"action {action} ({self.formats[action]}) at unit {self.t} breaks the budget "
                              f"{self.budget} bits; follow mask()")
        t = self.t
        self.assignment.append(int(action))
        self.used_bits += self.ev.bits[t][action] * self.params[t]
        self.t += 1
        done = self.t == self.n
        r, info = 0.0, {}
        if self.w.mode == "step" or done:
            m = self.ev.measure(tuple(self.assignment))
            total = reward(m, self.ev.ref, self.w)
            r = total - self.prev_r if self.w.mode == "step" else total
            self.prev_r = total
            self.run_kl, self.run_dloss = m.kl, m.loss - self.ev.ref.loss
            info = {"measurement": m, "R": total}
        elif self.sens is not None:
            s = self.sens[t][action]
            self.run_kl += s.kl
            self.run_dloss += s.loss - self.ev.ref.loss
        if done:
            info["assignment"] = tuple(self.assignment)
        return self.observation(), self.mask(), r, done, info

    # ---------------------------------------------------------- observation
    def obs_dim(self) -> int:
        return 5 + len(KINDS) + self.k + (self.k + 1) + 2 + self.k

    def observation(self) -> torch.Tensor:
        t = min(self.t, self.n - 1)
        unit = self.ev.units[t]
        kind = [float(unit.kind == k) for k in KINDS]
        done_params = sum(self.params[: self.t])
        avg = self.used_bits / done_params if done_params else 0.0
        slack = 0.0
        if self.budget is not None:
            slack = (self.budget * self.total - self.used_bits - self.min_tail[self.t]) / self.total
        hist = [self.assignment.count(f) / self.n for f in range(self.k)]
        prev = [0.0] * (self.k + 1)
        prev[self.assignment[-1] if self.assignment else self.k] = 1.0
        sens = [0.0] * self.k
        if self.sens is not None and self.t < self.n:
            sens = [math.log1p(100 * max(s.kl, 0.0)) for s in self.sens[t]]
        feats = [self.t / self.n, 1.0, math.log2(max(unit.params, 1)) / 32, avg / BF16_BITS, slack / BF16_BITS,
                 *kind, *hist, *prev, math.log1p(100 * max(self.run_kl, 0.0)), 10 * self.run_dloss, *sens]
        return torch.tensor(feats, dtype=torch.float32)  # [obs_dim]


def sensitivity_table(evaluator, formats: list[str], progress: bool = True) -> list[list[Measurement]]:
    """table[u][f]: the measurement with only unit u in format f (every other unit unchanged)."""
    from tqdm.auto import tqdm

    n = len(evaluator.units)
    table = []
    bar = tqdm(total=n * len(formats), desc="precision_search: sensitivity", disable=not progress)
    for u in range(n):
        row = []
        for f in range(len(formats)):
            a = [None] * n
            a[u] = f
            row.append(evaluator.measure(tuple(a)))
            bar.update()
        table.append(row)
    bar.close()
    return table
