"""Each term of R on hand-picked measurements."""

import pytest

from quarl.search.config import RewardConfig
from quarl.search.reward import Measurement, average_bits, mem_save, reward, reward_terms

REF = Measurement(loss=2.0, kl=0.0, entropy=1.5, avg_bits=16.0)
Q = Measurement(loss=2.3, kl=0.2, entropy=1.7, avg_bits=4.0, kl_ref_quant=0.25)


@pytest.mark.parametrize("term,weights,expected", [
    ("perf", {"w_perf": 2.0, "w_kl": 0, "w_ent": 0, "w_mem": 0}, 2.0 * (2.0 - 2.3)),
    ("kl", {"w_perf": 0, "w_kl": 3.0, "w_ent": 0, "w_mem": 0}, -3.0 * 0.25),  # KL(ref || quant), the default
    ("kl", {"w_perf": 0, "w_kl": 3.0, "w_ent": 0, "w_mem": 0, "kl": "quant_ref"}, -3.0 * 0.2),
    ("ent", {"w_perf": 0, "w_kl": 0, "w_ent": 0.5, "w_mem": 0}, 0.5 * (1.7 - 1.5)),
    ("mem", {"w_perf": 0, "w_kl": 0, "w_ent": 0, "w_mem": 0.1}, 0.1 * (1 - 4.0 / 16)),
])
def test_each_term_alone(term, weights, expected):
    w = RewardConfig(**weights)
    terms = reward_terms(Q, REF, w)
    assert terms[term] == pytest.approx(expected)
    assert all(v == 0 for k, v in terms.items() if k != term)
    assert reward(Q, REF, w) == pytest.approx(expected)


def test_terms_sum_and_reference_scores_zero():
    w = RewardConfig(w_perf=1.0, w_kl=1.0, w_ent=0.3, w_mem=0.05)
    assert reward(Q, REF, w) == pytest.approx(sum(reward_terms(Q, REF, w).values()))
    assert reward(REF, REF, w) == pytest.approx(0.0)  # BF16 = the reference: R = 0 (MemSave 0)


def test_memory_accounting():
    assert mem_save(16.0) == 0.0 and mem_save(4.5) == pytest.approx(1 - 4.5 / 16)
    assert average_bits([4.0, 16.0], [300, 100]) == pytest.approx(7.0)


def test_negative_weight_rejected():
    with pytest.raises(ValueError, match="w_kl must be >= 0"):
        RewardConfig(w_kl=-1.0)
