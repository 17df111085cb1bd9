"""Baselines the searched recipe is compared with.

* ``uniform(f)``: every unit in format ``f`` (no budget check: it is reported
  at its own average bits, which is what "equal average bits" compares);
* ``greedy``: the per-layer sensitivity ranking (HAWQ/"bit allocation by
  sensitivity" style). Every unit starts in its highest-bit format; while the
  average is over the budget, take the single move "unit u one format down
  (next fewer bits)" with the smallest increase of single-unit KL per bit
  saved, as measured by the sensitivity table (each unit quantized alone).
  Measures only its final recipe (the table's evaluations are its cost);
* ``random``: ``n`` episodes of uniformly random *allowed* actions (the same
  budget mask the agent sees), keeping the best return: random search with
  the same number of evaluations as the agent.
"""

from __future__ import annotations

import torch

from quarl.search.reward import Measurement


def uniform(n_units: int, f: int) -> tuple[int, ...]:
    return (f,) * n_units


def greedy(bits: list[list[float]], params: list[int], sens: list[list[Measurement]],
           budget_bits: float | None) -> tuple[int, ...]:
    """Lower the precision of the least sensitive unit per bit saved until the average fits the budget."""
    n = len(bits)
    order = [sorted(range(len(row)), key=lambda f: -row[f]) for row in bits]  # formats by bits, high first
    level = [0] * n  # position in order[u]
    total = float(sum(params))

    def avg() -> float:
        return sum(bits[u][order[u][level[u]]] * params[u] for u in range(n)) / total

    if budget_bits is None:  # nothing to trade: the lowest-KL single-unit choice everywhere
        return tuple(min(range(len(bits[u])), key=lambda f: sens[u][f].kl) for u in range(n))
    while avg() > budget_bits + 1e-9:
        best, best_cost = None, float("inf")
        for u in range(n):
            if level[u] + 1 >= len(order[u]):
                continue
            f0, f1 = order[u][level[u]], order[u][level[u] + 1]
            saved = (bits[u][f0] - bits[u][f1]) * params[u]
            if saved <= 0:
                continue
            cost = (sens[u][f1].kl - sens[u][f0].kl) / saved
            if cost < best_cost:
                best, best_cost = u, cost
        if best is None:
            raise ValueError(f"greedy: cannot reach {budget_bits} bits with these formats")
        level[best] += 1
    return tuple(order[u][level[u]] for u in range(n))


def random_search(env, episodes: int, seed: int = 0, progress: bool = True) -> dict:
    """Uniformly random allowed actions for ``episodes`` episodes; the best return and its assignment."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    best = {"return": float("-inf"), "assignment": None, "returns": []}
    for _ in tqdm(range(episodes), desc="precision_search: random", disable=not progress):
        _, mask = env.reset()
        done, ret, info = False, 0.0, {}
        while not done:
            allowed = mask.nonzero().flatten()
            a = int(allowed[torch.randint(len(allowed), (1,), generator=gen)])
            _, mask, r, done, info = env.step(a)
            ret += r
        best["returns"].append(ret)
        if ret > best["return"]:
            best["return"], best["assignment"] = ret, info["assignment"]
    return best
