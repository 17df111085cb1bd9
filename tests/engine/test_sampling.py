"""On-device sampling: the nucleus equals the reference engine's and a brute-force one, draws
follow the (truncated) distribution, greedy is the argmax, log-probs are pre-truncation."""

from __future__ import annotations

import textwrap

import pytest
import torch

from quarl.engine.rollout import top_p_filter
from quarl.engine.sampling import GREEDY_TOP_P, check_generator, gumbel_noise, sample, top_p_mask
from tests.kernels.interpreter import needs_interpreter, run_interpreted


def _brute_force_nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    """Smallest most-likely-first prefix whose mass reaches top_p (one row, python loop)."""
    kept, mass = set(), 0.0
    for i in sorted(range(len(probs)), key=lambda j: -float(probs[j])):
        if mass >= top_p:
            break
        kept.add(i)
        mass += float(probs[i])
    return kept


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_top_p_mask_keeps_exactly_the_nucleus(top_p):
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0)) * 2
    masked = top_p_mask(logits, top_p)
    torch.testing.assert_close(masked, top_p_filter(logits, top_p))  # same rule as the reference engine
    for row in range(logits.shape[0]):
        kept = set(torch.isfinite(masked[row]).nonzero().flatten().tolist())
        assert kept == _brute_force_nucleus(logits[row].softmax(-1), top_p)
        assert (masked[row][list(kept)] == logits[row][list(kept)]).all()  # kept logits untouched


def test_top_p_one_is_the_identity():
    logits = torch.randn(2, 10)
    assert top_p_mask(logits, 1.0) is logits


def test_draws_follow_the_truncated_distribution():
    # one row, 6 tokens; top_p = 0.7 keeps tokens 0, 1, 2 (mass before token 2 is 0.6 < 0.7)
    probs = torch.tensor([0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
    logits = probs.log()[None].expand(20000, 6).contiguous()
    gen = torch.Generator().manual_seed(0)
    tok, lp = sample(logits, 1.0, 0.7, gen)
    counts = torch.bincount(tok, minlength=6).float() / tok.numel()
    assert counts[3:].sum() == 0  # nothing outside the nucleus
    expected = torch.tensor([0.4, 0.2, 0.15]) / 0.75
    torch.testing.assert_close(counts[:3], expected, atol=0.015, rtol=0)  # ~5 sigma at n = 20000
    # log-probs are of the full tempered distribution, not the renormalised nucleus
    torch.testing.assert_close(lp, probs.log()[tok], atol=1e-6, rtol=0)


def test_temperature_scales_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    T = 0.5
    logits = probs.log()[None].expand(20000, 3).contiguous()
    tok, lp = sample(logits, T, 1.0, torch.Generator().manual_seed(1))
    tempered = (probs.log() / T).softmax(-1)
    counts = torch.bincount(tok, minlength=3).float() / tok.numel()
    torch.testing.assert_close(counts, tempered, atol=0.015, rtol=0)
    torch.testing.assert_close(lp, tempered.log()[tok], atol=1e-5, rtol=0)


def test_greedy_is_the_argmax_and_ignores_the_generator():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(3))
    tok, lp = sample(logits, 1.0, GREEDY_TOP_P / 2)
    assert torch.equal(tok, logits.argmax(-1))
    torch.testing.assert_close(lp, logits.log_softmax(-1).max(-1).values)
    # the eval stage's greedy spelling (top_p = 1e-9) takes the same path
    assert torch.equal(sample(logits, 1.0, 1e-9, torch.Generator().manual_seed(9))[0], tok)


def test_seeded_draws_are_reproducible():
    logits = torch.randn(4, 100)
    a = sample(logits, 1.0, 0.9, torch.Generator().manual_seed(11))[0]
    b = sample(logits, 1.0, 0.9, torch.Generator().manual_seed(11))[0]
    c = sample(logits, 1.0, 0.9, torch.Generator().manual_seed(12))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_gumbel_noise_is_finite():
    g = gumbel_noise((1000, 100), "cpu", torch.Generator().manual_seed(0))
    assert torch.isfinite(g).all()
    assert abs(float(g.mean()) - 0.5772) < 0.02  # Euler-Mascheroni constant


def test_bad_arguments():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample(torch.zeros(1, 3), 0.0, 1.0)
    check_generator(torch.Generator(), torch.device("cpu"))
    with pytest.raises(ValueError, match="torch.Generator is on cpu but the model runs on cuda"):
        check_generator(torch.Generator(), torch.device("cuda", 0))


FUSED_SCRIPT = textwrap.dedent("""
    import os
    import torch
    from quarl.engine import sampling

    os.environ["QUARL_ENGINE_FUSED_SAMPLE"] = "1"
    sampling._FORCE_KERNEL = True  # the Triton sampler on CPU logits, under the interpreter
    g = torch.Generator().manual_seed(0)
    for rows, vocab, compact in ((1, 3000, False), (6, 5000, False), (4, 2500, True)):
        logits = torch.randn(rows, vocab, generator=g) * 3
        kw = dict(rows_of=torch.tensor([5, 0, 2, 3])[:rows], all_rows=7) if compact else {}
        for top_p in (1.0, sampling.GREEDY_TOP_P / 2):
            ga, gb = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
            tok, lp = sampling.sample(logits, 1.0, top_p, ga, fused=True, **kw)
            rtok, rlp = sampling.sample(logits, 1.0, top_p, gb, fused=False, **kw)
            assert torch.equal(tok, rtok), (rows, vocab, top_p, tok, rtok)
            assert (lp - rlp).abs().max().item() < 1e-5
            assert torch.equal(ga.get_state(), gb.get_state())  # the same draw: the stream goes on alike
    # top-p < 1: the nucleus kernel, the sort's nucleus on these (untied) logits -- the same draws
    for kw in ({}, dict(rows_of=torch.tensor([5, 0, 2, 3])[:logits.shape[0]], all_rows=7)):
        ga, gb = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        a, b = sampling.sample(logits, 1.0, 0.9, ga, fused=True, **kw), sampling.sample(logits, 1.0, 0.9, gb, **kw)
        assert torch.equal(a[0], b[0]) and (a[1] - b[1]).abs().max().item() < 1e-5
        assert torch.equal(ga.get_state(), gb.get_state())
    print("OK")
""")


@needs_interpreter
def test_fused_sampler_draws_what_the_pytorch_path_draws():
    """``sample(fused=True)`` (the Triton kernels, here under the interpreter) gives the tokens of the PyTorch path
    from the same generator, log-probs to fp32 rounding, and leaves the generator where that path leaves it."""
    run_interpreted(FUSED_SCRIPT)


def test_fused_flag_is_ignored_on_cpu_logits():
    logits = torch.randn(3, 50)
    a = sample(logits, 0.8, 1.0, torch.Generator().manual_seed(2), fused=True)
    b = sample(logits, 0.8, 1.0, torch.Generator().manual_seed(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_fused_sampler_is_on_by_default(monkeypatch):
    from quarl.engine import sampling

    kernels = (object(), object())  # stands for the imported kernel modules (CPU CI has no Triton)
    monkeypatch.setattr(sampling, "_KERNEL", kernels)
    monkeypatch.delenv(sampling.FUSED_ENV, raising=False)
    assert sampling.fused_sampler() is kernels
    monkeypatch.setenv(sampling.FUSED_ENV, "auto")
    assert sampling.fused_sampler() is kernels
    monkeypatch.setenv(sampling.FUSED_ENV, "0")
    assert sampling.fused_sampler() is None
    monkeypatch.setenv(sampling.FUSED_ENV, "maybe")
    with pytest.raises(ValueError, match="QUARL_ENGINE_FUSED_SAMPLE"):
        sampling.fused_sampler()


ENGINE_SCRIPT = textwrap.dedent("""
    import os
    import torch
    from quarl.engine import FastGenerator, fused as fz, sampling
    from quarl.engine.rollout import SamplingParams
    from quarl_kernels import nucleus, sampler
    from tests.engine.conftest import PAD, VOCAB, make_model, prompts

    fz._FORCE_OPS = True  # the engine's fused wiring on CPU (the ops run their references)
    sampling._FORCE_KERNEL = True  # and the Triton sampler under the interpreter
    calls = []

    def counted(fn, rows_at):  # record each launch's rows_of (None: the full batch)
        return lambda *a, **k: calls.append(k.get("rows_of", a[rows_at] if len(a) > rows_at else None)) or fn(*a, **k)

    sampler.gumbel_sample = counted(sampler.gumbel_sample, 3)
    nucleus.nucleus_sample = counted(nucleus.nucleus_sample, 4)
    model = make_model("qwen2")
    rows = prompts((4, 9, 6))
    stop = list(range(3, 3 + VOCAB // 12))  # rows end at scattered lengths: the batch compacts (rows_of)
    for top_p in (1.0, 0.9):
        params = SamplingParams(temperature=1.0, top_p=top_p, max_new_tokens=30, stop_token_ids=stop)
        out = {}
        for flag in ("1", "0"):
            os.environ["QUARL_ENGINE_FUSED_SAMPLE"] = flag
            eng = FastGenerator(model, PAD, sync_every=2)
            n_before = len(calls)
            out[flag] = eng.generate(rows, params, n=4, generator=torch.Generator().manual_seed(3))
            assert eng.last_stats.get("compactions", 0) >= 1, eng.last_stats
            ran = calls[n_before:]
            if flag == "1":  # every step through the kernels, some on a compacted batch (rows_of given)
                assert len(ran) >= 10 and any(r is not None for r in ran), len(ran)
            else:
                assert not ran
        a, b = out["1"], out["0"]
        for f in ("completion_ids", "completion_mask", "truncated"):
            assert torch.equal(getattr(a, f), getattr(b, f)), (top_p, f)
        assert (a.logprobs - b.logprobs).abs().max().item() < 1e-5
        print("top_p", top_p, "steps", len(calls))
    print("OK")
""")


@needs_interpreter
def test_engine_rollout_is_the_same_with_the_fused_sampler():
    """A compacting FastGenerator rollout (the sampler's ``rows_of`` path) with the Triton sampler (under the
    interpreter), at top-p 1 and 0.9 (the nucleus kernel), is the rollout of PyTorch's sampler from the same seed."""
    run_interpreted(ENGINE_SCRIPT)


@pytest.fixture
def no_kernels(monkeypatch):
    """``quarl_kernels`` cannot be imported, and the sampler has not tried yet."""
    import builtins

    from quarl.engine import sampling

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name.startswith("quarl_kernels"):
            raise ImportError("no quarl_kernels here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(sampling, "_KERNEL", None)
    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_fused_sampler_without_its_kernels_warns_once_and_falls_back(monkeypatch, no_kernels):
    from quarl.engine import sampling

    monkeypatch.setenv(sampling.FUSED_ENV, "1")
    with pytest.warns(UserWarning, match="QUARL_ENGINE_FUSED_SAMPLE=1 but quarl_kernels' sampler does not import"):
        assert sampling.fused_sampler() is None
    assert sampling.fused_sampler() is None  # decided once: no second warning, PyTorch's path


def test_fused_sampler_by_default_without_its_kernels_falls_back_silently(monkeypatch, no_kernels):
    import warnings

    from quarl.engine import sampling

    monkeypatch.delenv(sampling.FUSED_ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default asked for nothing by name: no warning
        assert sampling.fused_sampler() is None
