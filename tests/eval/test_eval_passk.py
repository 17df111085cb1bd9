"""pass@k / avg@n against hand-computed values and the binomial definition."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from quarl.eval.passk import avg_at_n, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 2, 4, 1.0),  # n - c < k: every 4-subset holds a correct one
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 1 - 100/200; binomials ~1e58
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_definition():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 60)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10, abs=1e-12)


def test_pass_at_1_is_avg_at_n_and_monotone_in_k():
    counts, n = [0, 1, 3, 8, 8], 8
    assert mean_pass_at_k(counts, n, 1) == pytest.approx(avg_at_n(counts, n))
    assert avg_at_n(counts, n) == pytest.approx((0 + 1 / 8 + 3 / 8 + 1 + 1) / 5)
    vals = [mean_pass_at_k(counts, n, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-15 for a, b in itertools.pairwise(vals))
    assert vals[-1] == pytest.approx(4 / 5)  # pass@n: the problem has any correct sample (4 of 5)


def test_per_problem_sample_counts():
    assert mean_pass_at_k([1, 2], [2, 4], 2) == pytest.approx((1.0 + (1 - 1 / 6)) / 2)
    assert avg_at_n([1, 2], [2, 4]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "args,exc",
    [((4, 1, 5), ValueError), ((4, 5, 1), ValueError), ((4, -1, 1), ValueError), ((0, 0, 1), ValueError),
     ((4, 1, 0), ValueError), ((4.0, 1, 1), TypeError)],
)  # fmt: skip
def test_pass_at_k_rejects_bad_input(args, exc):
    with pytest.raises(exc):
        pass_at_k(*args)


def test_empty_inputs_rejected():
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 4, 1)
    with pytest.raises(ValueError, match="no problems"):
        avg_at_n([], 4)
    with pytest.raises(ValueError, match="sample counts"):
        mean_pass_at_k([1, 2], [4], 1)
