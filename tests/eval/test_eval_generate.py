"""Eval sampling on the RL rollout engine: greedy == transformers' greedy, batching and
ordering, stop tokens, seeding."""

from __future__ import annotations

import pytest
import torch

from quarl.engine.rollout import Rollout
from quarl.eval.config import SamplingConfig
from quarl.eval.generate import GREEDY_TEMPERATURE, GREEDY_TOP_P, sample_completions, stop_token_ids

PROMPTS = [
    "What is 2 + 3?",
    "A train travels 60 km in 1 hour. How far does it go in 3 hours at the same speed?",
    "Compute 7 * 8.",
    "Ava has 12 marbles and gives away a third of them. How many are left?",
    "Hi",
]


@pytest.fixture(scope="module")
def tiny():
    """tiny-llama with its matrices perturbed: the freshly initialised model repeats one token
    greedily, which would make "same text as transformers" a weak check."""
    from quarl.models import load_model

    model, tok = load_model("tiny-llama")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model, tok


def test_greedy_matches_transformers_generate(tiny):
    model, tok = tiny
    cfg = SamplingConfig(greedy=True, max_new_tokens=6, batch_size=3)
    ours, stats = sample_completions(model, tok, PROMPTS, cfg, progress=False)
    assert stats["generated_tokens"] == sum(c.tokens for g in ours for c in g)
    for prompt, group in zip(PROMPTS, ours):
        assert len(group) == 1
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                                 pad_token_id=tok.pad_token_id)  # fmt: skip
        ref_text = tok.decode(ref[0, ids.shape[1] :], skip_special_tokens=True)
        assert group[0].text == ref_text, prompt
        assert len(set(ref[0, ids.shape[1] :].tolist())) > 2  # a varied sequence, not one token repeated


def test_greedy_limit_is_one_hot_on_the_argmax():
    from quarl.eval.generate import sampling_params

    other = sampling_params(SamplingConfig(greedy=True), [2], reference=False)
    assert (other.temperature, other.top_p) == (1.0, GREEDY_TOP_P)  # nucleus of one token on any engine
    p = sampling_params(SamplingConfig(greedy=True), [2])
    assert p.top_p == 1.0 and p.temperature == GREEDY_TEMPERATURE
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 1000, generator=g) * 4
    logits[:, 7] = logits.max(dim=1).values + 2e-6  # a near-tie at float32 resolution still resolves to the max
    probs = (logits / p.temperature).softmax(dim=-1)
    assert probs.eq(0).logical_or(probs.eq(1)).all() and probs.sum(dim=1).eq(1).all()
    assert torch.multinomial(probs, 1, generator=g).squeeze(1).equal(logits.argmax(dim=1))
    from quarl.engine.rollout import top_p_filter

    kept = torch.isfinite(top_p_filter(logits, GREEDY_TOP_P))
    assert kept.sum(dim=1).eq(1).all() and kept.float().argmax(dim=1).equal(logits.argmax(dim=1))


class _EchoEngine:
    """A Generator that 'answers' each prompt with its own first token, n times, and records batches."""

    def __init__(self):
        self.batches = []

    def generate(self, prompts, params, n, generator=None):
        self.batches.append([len(p) for p in prompts])
        rows = [p for p in prompts for _ in range(n)]
        N = len(rows)
        comp = torch.tensor([[r[0], 5] for r in rows])  # [N, 2]
        mask = torch.tensor([[1, 1 if i % 2 else 0] for i in range(N)])  # odd rows 2 tokens, even rows 1
        return Rollout(prompt_ids=torch.zeros(N, 1, dtype=torch.long), prompt_mask=torch.ones(N, 1, dtype=torch.long),
                       completion_ids=comp, completion_mask=mask, logprobs=torch.zeros(N, 2),
                       truncated=torch.zeros(N, dtype=torch.bool))  # fmt: skip


def test_batches_longest_first_and_restores_order(tiny):
    _, tok = tiny
    engine = _EchoEngine()
    cfg = SamplingConfig(n=2, batch_size=4, max_new_tokens=2)
    out, _ = sample_completions(None, tok, PROMPTS, cfg, generator=engine, progress=False)
    lens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    assert [len(b) for b in engine.batches] == [2, 2, 1]  # batch_size 4 sequences = 2 prompts x n=2
    flat = [x for b in engine.batches for x in b]
    assert flat == sorted(lens, reverse=True)
    for prompt, group in zip(PROMPTS, out):
        first = tok.decode([tok(prompt, add_special_tokens=False)["input_ids"][0]])
        assert group[0].text == first  # row 0 of the group: one token
        assert [c.tokens for c in group] == [1, 2]


def test_stops_at_stop_token_and_marks_truncation(tiny):
    model, tok = tiny
    cfg = SamplingConfig(greedy=True, max_new_tokens=5)
    free, _ = sample_completions(model, tok, PROMPTS[:1], cfg, progress=False)
    assert free[0][0].tokens == 5 and free[0][0].truncated
    ids = tok(PROMPTS[0], add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=5,
                             pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()  # fmt: skip
    stop = ref[2]
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [old, stop]
    try:
        assert stop in stop_token_ids(tok, model)
        stopped, _ = sample_completions(model, tok, PROMPTS[:1], cfg, progress=False)
    finally:
        model.generation_config.eos_token_id = old
    c = stopped[0][0]
    assert not c.truncated and c.tokens == ref.index(stop) + 1  # the stop token is counted, then nothing
    assert c.text == tok.decode(ref[: ref.index(stop) + 1], skip_special_tokens=True)


def test_sampling_is_seeded(tiny):
    model, tok = tiny
    cfg = SamplingConfig(n=3, max_new_tokens=4, temperature=1.0, top_p=1.0)
    a, _ = sample_completions(model, tok, PROMPTS[:2], cfg, progress=False)
    b, _ = sample_completions(model, tok, PROMPTS[:2], cfg, progress=False)
    c, _ = sample_completions(
        model,
        tok,
        PROMPTS[:2],
        SamplingConfig(n=3, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=1),
        progress=False,
    )
    texts = lambda r: [[x.text for x in g] for g in r]
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    assert all(len(g) == 3 for g in a)
    assert len({x.text for x in a[0]}) > 1  # three samples of one prompt differ at temperature 1


def test_empty_inputs_rejected(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="no prompts"):
        sample_completions(model, tok, [], SamplingConfig(max_new_tokens=2), progress=False)
    with pytest.raises(ValueError, match="tokenize to nothing"):
        sample_completions(model, tok, ["ok", ""], SamplingConfig(max_new_tokens=2), progress=False)


def test_both_greedy_conventions_decode_the_same(tiny):
    """T -> 0 (reference engine) and top_p -> 0 (what any other engine gets) pick the same tokens."""
    from quarl.engine.rollout import HFGenerator

    model, tok = tiny

    class Wrapped:  # not an HFGenerator: sample_completions sends it the top_p -> 0 form
        def __init__(self):
            self.inner, self.seen = HFGenerator(model, tok.pad_token_id), []

        def generate(self, prompts, params, n, generator=None):
            self.seen.append((params.temperature, params.top_p))
            return self.inner.generate(prompts, params, n, generator)

    cfg = SamplingConfig(greedy=True, max_new_tokens=6, batch_size=2)
    w = Wrapped()
    a, _ = sample_completions(model, tok, PROMPTS, cfg, generator=w, progress=False)
    b, _ = sample_completions(model, tok, PROMPTS, cfg, progress=False)
    assert set(w.seen) == {(1.0, GREEDY_TOP_P)}
    assert [g[0].text for g in a] == [g[0].text for g in b]
