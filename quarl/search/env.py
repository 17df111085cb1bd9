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
* the return of every episode is R of its whole recipe; ``reward.mode`` only
  decides *when* it is paid (how credit reaches each step):

  - ``"episode"``: 0 until the last step, then R (one measurement per episode);
  - ``"shaped"`` (default): step ``t`` pays ``est(t, a_t) - price * (bits -
    budget) * params_t / total``: the single-unit reward estimate from the
    sensitivity table (R of "only unit t in that format") less the Lagrange
    price of the bits it takes beyond its share of the budget (the price at
    which every unit's own best priced choice meets the budget; 0 without a
    budget). The last step pays ``R - the sum paid so far``. This is
    potential-based shaping (Ng, Harada & Russell 1999; the potential is the
    sum paid so far, 0 at the start and the end), so the return and the
    optimal policy are unchanged, but a step's own choice, and what its bits
    cost the units after it, shows in its own reward: the agent need not
    discover from 30-120 steps of one scalar which choice cost what. The
    measured reward still decides (the last step carries every interaction
    the single-unit estimates miss). One measurement per episode;
  - ``"step"``: every step measures the partial recipe (undecided units
    unchanged) and pays ``R_t - R_{t-1}`` (``R_0 = 0``); exact per-step
    credit, but a measurement per step;
* budget (``avg_bits <= budget_bits``) is enforced by the action mask: a format
  is allowed only if the remaining units can still meet the budget in their
  cheapest format, so every episode that follows the mask is feasible. A
  masked action passed to ``step`` raises. A budget below the cheapest recipe
  fails at construction;
* observation (float vector, :meth:`obs_dim` long), scaled so that it reads
  alike on any model, format set or reward weights. The state: progress
  ``t/n``, log2 size and size relative to the average unit, average bits so
  far / 16, the bits per remaining weight the budget still allows (0 = the
  cheapest format's bits, 1 = the dearest's), budget slack / 16, first/last
  step flags, the running KL and loss gap (measured in step mode; else the
  sum of the single-unit sensitivities of the choices so far), the unit's kind
  (one-hot). Then per format (:meth:`action_feature_dim` each, so the agent
  can score every format with one shared head): the unit's single-unit KL in
  it, its shaped reward relative to the unit's best format (in units of the
  typical best-worst gap), its bits (0 = cheapest, 1 = dearest), the fraction
  of units given it so far, whether the previous unit got it, and its one-hot
  index. The sensitivity terms are 0 without a sensitivity table.
"""

from __future__ import annotations

import math

import torch

from quarl.search.config import RewardConfig
from quarl.search.reward import BF16_BITS, Measurement, charged_kl, reward

KINDS = ("block", "self_attn", "mlp", "qkv_proj", "gate_up_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
        if reward_cfg.mode == "shaped" and sensitivity is None:
            raise ValueError("reward.mode=shaped pays each step its single-unit estimate from the sensitivity "
                             "table: pass sensitivity= (sensitivity: true), or use mode episode or step")
        # est[u][f]: R of "only unit u in format f" (the shaping term); exactly additive in its memory part
        self.est = None if sensitivity is None else [
            [self.unit_estimate(u, f) for f in range(self.k)] for u in range(self.n)]
        # cheapest possible bits*params of units t.. (suffix sums), for the mask
        cheapest = [min(row) * p for row, p in zip(evaluator.bits, self.params, strict=True)]
        self.min_tail = [sum(cheapest[t:]) for t in range(self.n + 1)]
        self.tail_params = [sum(self.params[t:]) for t in range(self.n + 1)]
        # feature scales, so the observation reads the same whatever the model, formats or reward weights
        flat = [b for row in evaluator.bits for b in row]
        self.bits_lo, self.bits_span = min(flat), max(max(flat) - min(flat), 1e-9)
        self.price = self._bit_price() if self.est is not None and budget_bits is not None else 0.0
        self.est_scale = 1.0
        if self.est is not None:
            spans = [max(r) - min(r) for r in self.est]
            self.est_scale = max(sum(spans) / len(spans), 1e-12)  # typical gap between a unit's best and worst
        if budget_bits is not None and self.min_tail[0] / self.total > budget_bits + 1e-9:
            raise BudgetError(
                f"budget_bits={budget_bits} is below the cheapest recipe over {formats} "
                f"({self.min_tail[0] / self.total:.3f} bits); raise budget_bits or add a lower-bit format"
            )
        self.reset()

    def unit_estimate(self, u: int, f: int) -> float:
        """The reward of unit u alone in format f: loss/KL/entropy terms measured, memory term exact."""
        m, ref, w = self.sens[u][f], self.ev.ref, self.w
        return (w.w_perf * (ref.loss - m.loss) - w.w_kl * charged_kl(m, w) + w.w_ent * (m.entropy - ref.entropy)
                + w.w_mem * (BF16_BITS - self.ev.bits[u][f]) * self.params[u] / (BF16_BITS * self.total))

    def _bit_price(self) -> float:
        """The Lagrange price of a bit: the smallest ``lam`` at which every unit's own best choice under
        ``est - lam * bits * params / total`` meets the budget (bisection; 0 if the unpriced choice does)."""
        def avg_bits(lam: float) -> float:
            pick = [max(range(self.k), key=lambda f: self.est[u][f] - lam * self.ev.bits[u][f] * p / self.total)
                    for u, p in enumerate(self.params)]
            return sum(self.ev.bits[u][f] * p for u, (f, p) in enumerate(zip(pick, self.params))) / self.total

        if avg_bits(0.0) <= self.budget:
            return 0.0
        lo, hi = 0.0, 1.0
        while avg_bits(hi) > self.budget and hi < 1e12:
            hi *= 2
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if avg_bits(mid) > self.budget else (lo, mid)
        return hi

    def shaped_step(self, u: int, f: int) -> float:
        """The shaping reward of unit u in format f: its single-unit estimate, less the price of the bits it
        takes beyond the budget's share (``price * (bits - budget) * params / total``; no budget: 0)."""
        extra = 0.0 if self.budget is None else (self.ev.bits[u][f] - self.budget) * self.params[u] / self.total
        return self.est[u][f] - self.price * extra

    # ----------------------------------------------------------------- API
    def reset(self):
        self.t, self.assignment, self.used_bits = 0, [], 0.0
        self.prev_r, self.paid, self.run_kl, self.run_dloss = 0.0, 0.0, 0.0, 0.0
        return self.observation(), self.mask()

    def mask(self) -> torch.Tensor:
        """[k] bool: formats allowed for the current unit under the budget."""
        if self.t >= self.n:
            return torch.zeros(self.k, dtype=torch.bool)
        if self.budget is None:
            return torch.ones(self.k, dtype=torch.bool)
        cap = self.budget * self.total * (1 + 1e-12)  # float slack only: "equal bits" must stay equal
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
            r = {"step": total - self.prev_r, "shaped": total - self.paid, "episode": total}[self.w.mode]
            self.prev_r = total
            self.run_kl, self.run_dloss = charged_kl(m, self.w), m.loss - self.ev.ref.loss
            info = {"measurement": m, "R": total}
        elif self.sens is not None:
            s = self.sens[t][action]
            self.run_kl += charged_kl(s, self.w)
            self.run_dloss += s.loss - self.ev.ref.loss
            if self.w.mode == "shaped":
                r = self.shaped_step(t, action)
                self.paid += r
        if done:
            info["assignment"] = tuple(self.assignment)
        return self.observation(), self.mask(), r, done, info

    # ---------------------------------------------------------- observation
    COMMON = 11 + len(KINDS)  # features of the state as a whole

    def action_feature_dim(self) -> int:
        """Features per format, the last ``k * action_feature_dim()`` entries of the observation."""
        return 5 + self.k

    def obs_dim(self) -> int:
        return self.COMMON + self.k * self.action_feature_dim()

    def observation(self) -> torch.Tensor:
        t = min(self.t, self.n - 1)
        unit = self.ev.units[t]
        kind = [float(unit.kind == k) for k in KINDS]
        done_params = sum(self.params[: self.t])
        avg = self.used_bits / done_params if done_params else 0.0
        slack, per_weight = 0.0, 1.0
        if self.budget is not None:
            slack = (self.budget * self.total - self.used_bits - self.min_tail[self.t]) / self.total
            left = self.tail_params[self.t]
            # bits per remaining weight the budget still allows, 0 = the cheapest format, 1 = the dearest
            per_weight = ((self.budget * self.total - self.used_bits) / left - self.bits_lo) / self.bits_span \
                if left else 0.0
        common = [self.t / self.n, 1.0, math.log2(max(unit.params, 1)) / 32, self.params[t] * self.n / self.total,
                  avg / BF16_BITS, per_weight, slack / BF16_BITS, float(self.t == self.n - 1),
                  float(not self.assignment), math.log1p(100 * max(self.run_kl, 0.0)), 10 * self.run_dloss, *kind]
        sens, est = [0.0] * self.k, [0.0] * self.k
        if self.sens is not None and self.t < self.n:
            sens = [math.log1p(100 * max(charged_kl(s, self.w), 0.0)) for s in self.sens[t]]
            priced = [self.shaped_step(t, f) for f in range(self.k)]
            est = [(e - max(priced)) / self.est_scale for e in priced]  # 0 = this unit's best priced format
        per_action = []
        for f in range(self.k):
            per_action += [sens[f], est[f], (self.ev.bits[t][f] - self.bits_lo) / self.bits_span,
                           self.assignment.count(f) / self.n, float(bool(self.assignment) and self.assignment[-1] == f),
                           *(float(f == g) for g in range(self.k))]
        return torch.tensor(common + per_action, dtype=torch.float32)  # [obs_dim]


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
