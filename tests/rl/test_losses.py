"""GRPO/DAPO objectives against numbers worked out by hand (math module only)."""

import math

import pytest
import torch

from quarl.rl.losses import group_advantages, informative_groups, kl_k3, overlong_penalty, policy_loss

# Two answers, three completion tokens; the second answer has two real tokens.
LOGP = [[-1.0, -2.0, -0.5], [-1.5, -0.2, 0.0]]
OLD = [[-1.2, -1.5, -0.5], [-1.0, -0.2, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -2.0]


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_group_advantages_hand_computed():
    r = _t([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 3.0])
    adv = group_advantages(r, group_size=4, eps=1e-4)
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3)
    s1 = math.sqrt(1.0 / 3.0)
    a = 0.5 / (s1 + 1e-4)
    # group 2: mean 0.75, deviations (-.75, -.75, -.75, 2.25), unbiased var (3*.5625 + 5.0625)/3 = 2.25
    s2 = 1.5
    b, c = -0.75 / (s2 + 1e-4), 2.25 / (s2 + 1e-4)
    expected = [a, -a, -a, a, b, b, b, c]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    # Dr. GRPO: centering only
    assert group_advantages(r, 4, scale=False).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -0.75, -0.75, -0.75, 2.25])


def test_equal_rewards_give_exact_zero_advantage():
    # 0.1 * 3 / 3 != 0.1 in floating point: without the explicit guard this would be ~1e-17 / 1e-4
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 0.0, 0.5, 1.0])
    adv = group_advantages(r, 3)
    assert torch.isfinite(adv).all()
    assert adv[:6].tolist() == [0.0] * 6
    assert adv[6:].tolist() == pytest.approx([-0.5 / (0.5 + 1e-4), 0.0, 0.5 / (0.5 + 1e-4)], rel=1e-6)
    assert informative_groups(r, 3).tolist() == [False, False, True]


def test_group_size_one_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.ones(5), 2)


def _hand_tokens(eps_low, eps_high):
    """Per-token -min(r*A, clip(r)*A) by hand, masked tokens omitted."""
    out = []
    for lp_row, old_row, m_row, a in zip(LOGP, OLD, MASK, ADV):
        row = []
        for lp, old, m in zip(lp_row, old_row, m_row):
            if not m:
                continue
            r = math.exp(lp - old)
            rc = min(max(r, 1 - eps_low), 1 + eps_high)
            row.append(-min(r * a, rc * a))
        out.append(row)
    return out


def test_grpo_sequence_level_loss_and_clip_fraction():
    out = policy_loss(_t(LOGP), _t(OLD), _t(ADV), _t(MASK), eps_low=0.2, eps_high=0.2, aggregation="sequence")
    rows = _hand_tokens(0.2, 0.2)
    # spelled out: seq0 = (-1.2, -exp(-0.5), -1) ; seq1 = (+1.6, +2.0)
    assert rows[0] == pytest.approx([-1.2, -math.exp(-0.5), -1.0])
    assert rows[1] == pytest.approx([1.6, 2.0])
    expected = (sum(rows[0]) / 3 + sum(rows[1]) / 2) / 2
    assert float(out.loss) == pytest.approx(expected, rel=1e-12)
    assert out.tokens == 5
    # clipped: seq0 tok0 (r=e^.2 > 1.2, A>0) and seq1 tok0 (r=e^-.5 < .8, A<0)
    assert out.clipped_tokens == 2


def test_dapo_token_level_decoupled_clip():
    out = policy_loss(_t(LOGP), _t(OLD), _t(ADV), _t(MASK), eps_low=0.2, eps_high=0.28, aggregation="token")
    # e^0.2 = 1.2214 < 1.28: no longer clipped
    expected = (-math.exp(0.2) - math.exp(-0.5) - 1.0 + 1.6 + 2.0) / 5
    assert float(out.loss) == pytest.approx(expected, rel=1e-12)
    assert out.clipped_tokens == 1
    # same numbers with symmetric clip, token-level
    sym = policy_loss(_t(LOGP), _t(OLD), _t(ADV), _t(MASK), eps_low=0.2, eps_high=0.2, aggregation="token")
    assert float(sym.loss) == pytest.approx((-1.2 - math.exp(-0.5) - 1.0 + 1.6 + 2.0) / 5, rel=1e-12)


def test_kl_k3_term():
    ref = [[-1.1, -1.9, -0.7], [-1.5, -0.4, 0.0]]
    out = policy_loss(_t(LOGP), _t(OLD), _t(ADV), _t(MASK), eps_low=0.2, eps_high=0.2, beta=0.1,
                      ref_logp=_t(ref), aggregation="token")
    kl_hand = []
    for lp_row, ref_row, m_row in zip(LOGP, ref, MASK):
        for lp, rf, m in zip(lp_row, ref_row, m_row):
            if m:
                d = rf - lp
                kl_hand.append(math.exp(d) - d - 1)
    pg = sum(sum(r) for r in _hand_tokens(0.2, 0.2))
    assert float(out.loss) == pytest.approx((pg + 0.1 * sum(kl_hand)) / 5, rel=1e-12)
    assert out.kl_sum == pytest.approx(sum(kl_hand), rel=1e-12)
    assert float(kl_k3(torch.tensor(-1.0), torch.tensor(-1.0))) == 0.0
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(_t(LOGP), _t(OLD), _t(ADV), _t(MASK), beta=0.1)


def test_on_policy_ratio_is_one_but_gradient_flows():
    logp = _t(LOGP).requires_grad_(True)
    out = policy_loss(logp, logp.detach(), _t(ADV), _t(MASK), eps_low=0.2, eps_high=0.28, aggregation="token")
    assert out.ratio_sum == 5.0  # exp(0) on every real token
    out.loss.backward()
    # d/dlogp of -r*A at r=1 is -A, divided by the 5 tokens; padding gets nothing
    expected = [-1 / 5] * 3 + [2 / 5, 2 / 5, 0.0]
    assert logp.grad.flatten().tolist() == pytest.approx(expected)


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_micro_batches_add_up_to_the_batch_loss(agg):
    torch.manual_seed(0)
    logp, old = -torch.rand(6, 5, dtype=torch.float64), -torch.rand(6, 5, dtype=torch.float64)
    mask = (torch.rand(6, 5) > 0.3).double()
    mask[:, 0] = 1
    adv = torch.randn(6, dtype=torch.float64)
    full = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, aggregation=agg).loss
    parts = sum(policy_loss(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], eps_low=0.2, eps_high=0.28,
                            aggregation=agg, num_tokens=float(mask.sum()), num_sequences=6).loss
                for i in range(0, 6, 2))
    assert float(parts) == pytest.approx(float(full), rel=1e-12)


def test_overlong_soft_penalty():
    # max 10, buffer 4: free up to 6, then linear to -1 at 10, -1 beyond
    pen = overlong_penalty(torch.tensor([5, 6, 7, 8, 10, 12]), max_len=10, buffer_len=4)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_len=10, buffer_len=0)
