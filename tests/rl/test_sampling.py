"""Prompt order is deterministic and resumable; DAPO dynamic sampling keeps informative groups."""

import pytest
import torch

from quarl.engine.rollout import Rollout
from quarl.rl.sampling import PromptSampler, ScoredBatch, dynamic_sample


def test_prompt_sampler_is_deterministic_and_resumable():
    a = PromptSampler(5, seed=1)
    seq = [a.next(3) for _ in range(4)]  # 12 prompts: crosses two epoch boundaries
    flat = [i for s in seq for i in s]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))  # each epoch a permutation
    assert flat[:5] != flat[5:10]  # a new order per epoch
    b = PromptSampler(5, seed=1)
    b.next(3)
    b.next(3)
    c = PromptSampler(5, seed=1)
    c.load_state_dict(b.state_dict())
    assert [c.next(3), c.next(3)] == seq[2:]
    with pytest.raises(ValueError, match="same dataset"):
        PromptSampler(6, seed=1).load_state_dict(b.state_dict())


def _batch(rewards: list[float], tag: int) -> ScoredBatch:
    n = len(rewards)
    ro = Rollout(torch.full((n, 2), tag), torch.ones(n, 2, dtype=torch.long), torch.full((n, 1), tag),
                 torch.ones(n, 1, dtype=torch.long), torch.zeros(n, 1), torch.zeros(n, dtype=torch.bool))
    r = torch.tensor(rewards)
    return ScoredBatch(ro, r, r.clone(), torch.zeros(n), [tag] * n, [f"t{tag}"] * n)


def test_dynamic_sampling_refills_until_target():
    # G = 2, want 3 groups; draws give (flat, good), (good, flat), (good, good)
    draws = iter([_batch([1, 1, 0, 1], 0), _batch([1, 0, 0, 0], 1), _batch([0, 1, 1, 0], 2)])
    kept, drawn, st = dynamic_sample(lambda: next(draws), group_size=2, target_groups=3, max_rounds=5)
    assert st == {"sampling/rounds": 3, "sampling/groups_drawn": 6, "sampling/groups_kept": 3,
                  "sampling/kept_fraction": 0.5, "sampling/shortfall": 0}
    assert kept.rewards.tolist() == [0, 1, 1, 0, 0, 1]  # draw 0 group 1, draw 1 group 0, draw 2 group 0
    assert kept.prompt_index == [0, 0, 1, 1, 2, 2]
    assert len(drawn) == 12  # every sample, for honest reward metrics


def test_dynamic_sampling_gives_up_after_max_rounds():
    calls = []

    def draw():
        calls.append(1)
        return _batch([0, 0, 1, 1], len(calls))

    kept, drawn, st = dynamic_sample(draw, group_size=2, target_groups=2, max_rounds=3)
    assert kept is None and len(calls) == 3 and st["sampling/shortfall"] == 2
    assert len(drawn) == 12
