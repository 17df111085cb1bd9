"""FastGenerator's row handling on CPU -- compaction (finished rows leave the batch: the same rollout as without it
and as HF generate, the switch, when it happens) and one prefill per prompt for its n samples."""

from __future__ import annotations

import pytest
import torch

from quarl.engine import GREEDY_TOP_P, FastGenerator
from quarl.engine.generator import COMPACT_ENV, COMPACT_MIN_GRAPH_BATCH, SHARE_PREFILL_ENV, move_rows
from quarl.engine.rollout import SamplingParams
from tests.engine.conftest import PAD, VOCAB, full_forward_logprobs, hf_greedy, make_model, prompts

FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")


def _early_stops(model, rows, T: int, k: int) -> list[int]:
    """Tokens greedy decoding emits early in the first ``k`` rows: those rows stop within a few steps."""
    free = hf_greedy(model, rows, T)
    return sorted({int(free[i, 1]) for i in range(k)})


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_with_compaction_equals_hf_generate(kind):
    model = make_model(kind)
    rows = prompts((5, 11, 2, 8, 6, 9, 3, 7))
    stop = _early_stops(model, rows, 24, 5)
    params = SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=24, stop_token_ids=stop)
    eng = FastGenerator(model, PAD, sync_every=2)
    roll = eng.generate(rows, params, n=1)
    assert eng.last_stats.get("compactions", 0) >= 1, roll.lengths
    assert roll.lengths.max() > 6, "the test needs rows that go on after the compaction"
    assert torch.equal(roll.completion_ids, hf_greedy(model, rows, 24, eos=stop))
    torch.testing.assert_close(roll.logprobs, full_forward_logprobs(model, roll), atol=2e-5, rtol=0)


def test_sampled_rollout_is_the_same_with_and_without_compaction():
    model = make_model("qwen2")
    rows = prompts((4, 9, 6))
    stop = list(range(3, 3 + VOCAB // 12))  # ~8 % of the vocabulary: rows end at scattered lengths
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=40, stop_token_ids=stop)
    on = FastGenerator(model, PAD, sync_every=2, compact=True)
    off = FastGenerator(model, PAD, sync_every=2, compact=False)
    a = on.generate(rows, params, n=4, generator=torch.Generator().manual_seed(3))
    b = off.generate(rows, params, n=4, generator=torch.Generator().manual_seed(3))
    assert on.last_stats["compactions"] >= 2 and "compactions" not in off.last_stats
    assert len(set(a.lengths.tolist())) >= 4  # scattered lengths
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.logprobs, full_forward_logprobs(model, a), atol=2e-5, rtol=0)


def test_compaction_waits_until_the_rows_left_fit_half_the_batch():
    eng = FastGenerator(make_model("llama"), PAD)
    assert eng._smaller_batch(left=5, n=8, graphs=False) is None  # 5 rows: not half of 8
    assert eng._smaller_batch(left=4, n=8, graphs=False) == 4
    assert eng._smaller_batch(left=1, n=2, graphs=False) == 1  # eager: no capture to pay, down to one row
    assert eng._smaller_batch(left=9, n=24, graphs=True) == 16  # graph batches: 24 rows run as 32, 9 as 16
    assert eng._smaller_batch(left=17, n=24, graphs=True) is None  # 32 -> 32: nothing to gain
    # graph batches stop at COMPACT_MIN_GRAPH_BATCH (each new shape is a capture)
    assert eng._smaller_batch(left=1, n=64, graphs=True) == COMPACT_MIN_GRAPH_BATCH
    assert eng._smaller_batch(left=1, n=COMPACT_MIN_GRAPH_BATCH, graphs=True) is None
    assert eng._smaller_batch(left=1, n=4, graphs=True) is None  # a batch already below it stays


def test_the_prefill_switch(monkeypatch):
    model = make_model("llama")
    monkeypatch.setenv(SHARE_PREFILL_ENV, "0")
    assert not FastGenerator(model, PAD).share_prefill
    assert FastGenerator(model, PAD, share_prefill=True).share_prefill
    monkeypatch.delenv(SHARE_PREFILL_ENV)
    assert FastGenerator(model, PAD).share_prefill
    monkeypatch.setenv(SHARE_PREFILL_ENV, "maybe")
    with pytest.raises(ValueError, match=SHARE_PREFILL_ENV):
        FastGenerator(model, PAD)


def test_the_switch(monkeypatch):
    model = make_model("llama")
    monkeypatch.setenv(COMPACT_ENV, "0")
    assert not FastGenerator(model, PAD).compact
    assert FastGenerator(model, PAD, compact=True).compact
    monkeypatch.setenv(COMPACT_ENV, "1")
    assert FastGenerator(model, PAD).compact
    monkeypatch.setenv(COMPACT_ENV, "sometimes")
    with pytest.raises(ValueError, match=COMPACT_ENV):
        FastGenerator(model, PAD)


def test_a_prompt_is_prefilled_once_for_its_samples():
    """``n`` samples of a prompt share one prefill: the same rollout as prefilling every row, and HF generate's
    tokens; rows that only look alike (a prompt repeated but not adjacent) are prefilled on their own."""
    model = make_model("qwen3")
    rows = prompts((5, 9, 3))
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12)
    shared = FastGenerator(model, PAD)
    each = FastGenerator(model, PAD, share_prefill=False)
    a = shared.generate(rows, params, n=4, generator=torch.Generator().manual_seed(5))
    b = each.generate(rows, params, n=4, generator=torch.Generator().manual_seed(5))
    assert shared.last_stats["prefilled_rows"] == 3 and each.last_stats["prefilled_rows"] == 12
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.logprobs, full_forward_logprobs(model, a, 0.8), atol=2e-5, rtol=0)
    greedy = SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=10)
    alternating = [rows[0], rows[1], rows[0], rows[0]]
    roll = shared.generate(alternating, greedy, n=1)
    assert shared.last_stats["prefilled_rows"] == 3  # rows 2 and 3 are one run; row 0 is apart
    assert torch.equal(roll.completion_ids, hf_greedy(model, alternating, 10))


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_move_rows_in_place_equals_a_gather(chunk):
    """Rows moving down (compaction: keep[j] >= j) and up (a shared prefill: src[j] <= j), chunk by chunk in place,
    give what one out-of-place gather gives."""
    g = torch.Generator().manual_seed(chunk)
    cache = torch.randn(13, 2, 9, 4, generator=g)
    flags = torch.randn(13, 9, generator=g) > 0
    for src in (torch.tensor([0, 2, 3, 7, 8, 11, 12]),  # compaction: the rows kept, in order
                torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4])):  # runs of samples copying their first row
        ref_c, ref_f = cache.clone(), flags.clone()
        ref_c[:len(src), :, :5] = cache[src, :, :5]
        ref_f[:len(src)] = flags[src]
        c, f = cache.clone(), flags.clone()
        move_rows([c], src, 5, chunk=chunk)
        move_rows([f], src, chunk=chunk)
        assert torch.equal(c, ref_c) and torch.equal(f, ref_f)
    with pytest.raises(ValueError, match="only down"):
        move_rows([cache.clone()], torch.tensor([1, 0]))
