"""The reference rollout engine: cache variants agree, log-probs match the trainer's, EOS stops rows,
left padding does not change the numbers, top-p keeps the nucleus."""

import math

import pytest
import torch

from quarl.engine.rollout import HFGenerator, Rollout, SamplingParams, left_pad, top_p_filter
from quarl.rl.logprobs import completion_logprobs, mismatch
from tests.rl.conftest import PROMPTS, small_tiny_model


@pytest.fixture(scope="module")
def tiny():
    return small_tiny_model()


def _prompts(tok):
    # different lengths, so left padding is exercised
    return [tok(PROMPTS[1], add_special_tokens=False)["input_ids"], tok("7 =", add_special_tokens=False)["input_ids"]]


def test_static_and_dynamic_cache_sample_the_same(tiny):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=10, stop_token_ids=[tok.eos_token_id])
    out = {}
    for cache in ("static", "dynamic"):
        out[cache] = HFGenerator(model, tok.pad_token_id, cache=cache).generate(
            _prompts(tok), params, n=3, generator=torch.Generator().manual_seed(3))
    a, b = out["static"], out["dynamic"]
    assert a.completion_ids.shape == (6, 10)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    # groups are consecutive: rows 0-2 answer prompt 0, rows 3-5 prompt 1
    assert torch.equal(a.prompt_ids[0], a.prompt_ids[2]) and not torch.equal(a.prompt_ids[0], a.prompt_ids[3])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_trainer_logprobs(tiny, temperature):
    model, tok = tiny
    params = SamplingParams(temperature=temperature, max_new_tokens=12, stop_token_ids=[tok.eos_token_id])
    r = HFGenerator(model, tok.pad_token_id).generate(_prompts(tok), params, n=2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp, ent = completion_logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1], temperature,
                                      with_entropy=True)
    mm = mismatch(r.logprobs, lp, r.completion_mask)
    assert mm["mismatch/max_abs_logprob_diff"] < 1e-4
    assert mm["mismatch/kl"] < 1e-8
    # entropy of a near-uniform random model over 2048 tokens is close to log(2048)
    assert 0 < float(ent[r.completion_mask.bool()].mean()) <= math.log(2048) + 1e-4


def test_left_padding_does_not_change_logprobs(tiny):
    model, tok = tiny
    ids = tok(PROMPTS[2], add_special_tokens=False)["input_ids"] + [40, 41, 42]
    alone = torch.tensor([ids])
    padded, mask = left_pad([ids, ids + [43] * 5], tok.pad_token_id)
    with torch.no_grad():
        a, _ = completion_logprobs(model, alone, torch.ones_like(alone), 3)
        b, _ = completion_logprobs(model, padded[:1], mask[:1], 3)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_stops_at_eos_and_marks_truncation(tiny):
    model, tok = tiny
    prompts = _prompts(tok)[:1]
    base = SamplingParams(temperature=1e-3, max_new_tokens=5, stop_token_ids=[tok.eos_token_id])
    gen = HFGenerator(model, tok.pad_token_id)
    r = gen.generate(prompts, base, n=2, generator=torch.Generator().manual_seed(0))
    assert r.truncated.all() and (r.lengths == 5).all()  # a random model does not say EOS
    first = int(r.completion_ids[0, 0])  # near-greedy: declare the first token a stop token
    stop = SamplingParams(temperature=1e-3, max_new_tokens=5, stop_token_ids=[first])
    s = gen.generate(prompts, stop, n=2, generator=torch.Generator().manual_seed(0))
    assert s.completion_ids.shape[1] == 1  # every row stopped: the loop ends early
    assert s.lengths.tolist() == [1, 1] and not s.truncated.any()
    assert s.completion_ids[:, 0].tolist() == [first, first]


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.isfinite(top_p_filter(logits, 0.6)).tolist() == [[True, True, False]]
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0).validate()


def test_rollout_cat_repads():
    def r(P, T, v):
        return Rollout(torch.full((1, P), v), torch.ones(1, P, dtype=torch.long), torch.full((1, T), v),
                       torch.ones(1, T, dtype=torch.long), torch.full((1, T), -1.0), torch.tensor([False]), pad_id=0)

    c = Rollout.cat([r(2, 3, 5), r(4, 1, 6)])
    assert c.prompt_ids.tolist() == [[0, 0, 5, 5], [6, 6, 6, 6]]  # prompts left-padded
    assert c.completion_ids.tolist() == [[5, 5, 5], [6, 0, 0]]  # completions right-padded
    assert c.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert c.logprobs.tolist() == [[-1, -1, -1], [-1, 0, 0]]
    assert c.select([1]).lengths.tolist() == [1]
