"""Baselines the searched recipe is compared with.

* ``uniform(f)``: every unit in format ``f`` (no budget check: it is reported
  at its own average bits, which is what "equal average bits" compares);
* ``greedy``: the per-layer sensitivity ranking (HAWQ/"bit allocation by
  sensitivity" style). Every unit starts in its highest-bit format; while the
  average is over the budget, take the single move "unit u to a format with
  fewer bits" with the smallest increase of cost per bit saved, as measured by
  the sensitivity table (each unit quantized alone; the cost is minus the
  single-unit reward estimate, the agent's objective).
  Measures only its final recipe (the table's evaluations are its cost);
* ``random``: ``n`` episodes of uniformly random *allowed* actions (the same
  budget mask the agent sees), keeping the best return: random search with
  the same number of evaluations as the agent.
"""

from __future__ import annotations

import torch


def uniform(n_units: int, f: int) -> tuple[int, ...]:
    return (f,) * n_units


def greedy(bits: list[list[float]], params: list[int], cost: list[list[float]],
           budget_bits: float | None) -> tuple[int, ...]:
    """Lower the precision of the unit that loses least per bit saved until the average fits the budget.

    ``cost[u][f]``: how much worse unit u alone in format f makes the model (lower is better; the search
    passes minus the single-unit reward estimate, so greedy optimises the agent's objective).
    """
    n = len(bits)
    cur = [max(range(len(row)), key=lambda f: (row[f], -cost[u][f])) for u, row in enumerate(bits)]  # most bits
    total = float(sum(params))

    def avg() -> float:
        return sum(bits[u][cur[u]] * params[u] for u in range(n)) / total

    if budget_bits is None:  # nothing to trade: the lowest-cost single-unit choice everywhere
        return tuple(min(range(len(bits[u])), key=lambda f: cost[u][f]) for u in range(n))
    while avg() > budget_bits + 1e-9:
        best, best_cost = None, float("inf")
        for u in range(n):
            for f in range(len(bits[u])):  # any format with fewer bits (formats of equal bits are no move)
                saved = (bits[u][cur[u]] - bits[u][f]) * params[u]
                if saved <= 0:
                    continue
                c = (cost[u][f] - cost[u][cur[u]]) / saved
                if c < best_cost:
                    best, best_cost = (u, f), c
        if best is None:
            raise ValueError(f"greedy: cannot reach {budget_bits} bits with these formats")
        cur[best[0]] = best[1]
    return tuple(cur)


def random_search(env, episodes: int, seed: int = 0, progress: bool = True) -> dict:
    """Uniformly random allowed actions for ``episodes`` episodes; the best return and its assignment."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    best = {"return": float("-inf"), "assignment": None, "returns": [], "assignments": []}
    for _ in tqdm(range(episodes), desc="precision_search: random", disable=not progress):
        _, mask = env.reset()
        done, ret, info = False, 0.0, {}
        while not done:
            allowed = mask.nonzero().flatten()
            a = int(allowed[torch.randint(len(allowed), (1,), generator=gen)])
            _, mask, r, done, info = env.step(a)
            ret += r
        best["returns"].append(ret)
        best["assignments"].append(info["assignment"])
        if ret > best["return"]:
            best["return"], best["assignment"] = ret, info["assignment"]
    return best
