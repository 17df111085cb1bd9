"""pass@k and avg@n: how the reasoning-RL papers turn n samples per problem into one number.

With ``n`` samples of a problem of which ``c`` are correct:

* **avg@n** (what DeepSeek-R1, QeRL and DAPO call "pass@1" when they sample
  with temperature 0.6 / top-p 0.95) is ``c / n``, averaged over problems. It is
  the unbiased estimate of the probability that *one* sample is right, with
  less variance than drawing a single sample per problem.
* **pass@k** is the probability that at least one of ``k`` samples is right.
  Drawing exactly ``k`` samples and checking is high-variance; Chen et al.
  (2021, "Evaluating Large Language Models Trained on Code", Sec. 2.1) give the
  unbiased estimator from ``n >= k`` samples:

      pass@k = E_problems[ 1 - C(n - c, k) / C(n, k) ]

  ``C(n - c, k) / C(n, k)`` is the chance that a random ``k``-subset of the
  ``n`` samples holds no correct one. Binomials overflow floats for realistic
  ``n`` (C(200, 100) ~ 9e58), so, as in their reference code, we use the
  product form ``prod_{i = n-c+1}^{n} (1 - k / i)``, which is exact in
  rational arithmetic and stable in floating point.

``pass@1 == avg@n`` for any ``n`` (the estimator reduces to ``c / n``), which
the tests check.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["avg_at_n", "mean_pass_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples."""
    if not (isinstance(n, (int, np.integer)) and isinstance(c, (int, np.integer)) and isinstance(k, (int, np.integer))):
        raise TypeError(f"pass_at_k needs integers, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or k < 1:
        raise ValueError(f"pass_at_k needs n >= 1 and k >= 1, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: correct count c={c} must be in [0, n={n}]")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}; sample more or lower k")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i)   (Chen et al. 2021, Fig. 3)
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def mean_pass_at_k(correct_counts: Iterable[int], n: int | Sequence[int], k: int) -> float:
    """pass@k averaged over problems; ``n`` is one sample count or one per problem."""
    cs = list(correct_counts)
    if not cs:
        raise ValueError("mean_pass_at_k: no problems")
    ns = [n] * len(cs) if isinstance(n, (int, np.integer)) else list(n)
    if len(ns) != len(cs):
        raise ValueError(f"mean_pass_at_k: {len(cs)} correct counts but {len(ns)} sample counts")
    return float(np.mean([pass_at_k(int(ni), int(ci), k) for ni, ci in zip(ns, cs)]))


def avg_at_n(correct_counts: Iterable[int], n: int | Sequence[int]) -> float:
    """Mean fraction of correct samples per problem (avg@n, the papers' "pass@1")."""
    cs = list(correct_counts)
    if not cs:
        raise ValueError("avg_at_n: no problems")
    ns = [n] * len(cs) if isinstance(n, (int, np.integer)) else list(n)
    if len(ns) != len(cs) or any(ni < 1 for ni in ns):
        raise ValueError("avg_at_n: need one sample count >= 1 per problem")
    return float(np.mean([ci / ni for ci, ni in zip(cs, ns)]))
