"""FastGenerator on CPU against the references: HF generate (greedy, token for token), a full
forward (log-probs), the reference HFGenerator (same Rollout), quantized + LoRA models, AQN-style
in-place norm noise, RoPE scaling variants, length bucketing, seeded sampling."""

from __future__ import annotations

import pytest
import torch

from quarl.engine import GREEDY_TOP_P, EngineError, FastGenerator, make_generator, memory
from quarl.engine.rollout import HFGenerator, SamplingParams
from tests.engine.conftest import PAD, full_forward_logprobs, hf_greedy, lora_model, make_model, prompts

KINDS = ["llama", "qwen2", "qwen3"]


def greedy(max_new_tokens: int, stop: list[int] | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=max_new_tokens, stop_token_ids=stop or []
    )


def _stop_token_midway(model, rows, T=14) -> int:
    """A token that greedy decoding emits mid-sequence in some row, so EOS stops rows at different steps."""
    free = hf_greedy(model, rows, T)
    return int(free[1, T // 3])


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_hf_generate_left_padded(kind):
    model = make_model(kind)
    rows = prompts()
    stop = _stop_token_midway(model, rows)
    ref = hf_greedy(model, rows, 14, eos=[stop])
    roll = FastGenerator(model, PAD).generate(rows, greedy(14, [stop]), n=1)
    assert torch.equal(roll.completion_ids, ref), (roll.completion_ids, ref)
    # the stop token is kept, masked as generated, and rows after it are padding
    lengths = roll.lengths.tolist()
    assert min(lengths) < roll.completion_ids.shape[1], "the test needs at least one row that stops early"
    for i, n in enumerate(lengths):
        if n < roll.completion_ids.shape[1]:
            assert roll.completion_ids[i, n - 1] == stop and not roll.truncated[i]
            assert (roll.completion_ids[i, n:] == PAD).all() and (roll.logprobs[i, n:] == 0).all()
    # prompts come back left-padded
    assert roll.prompt_mask[2].tolist() == [0] * 9 + [1] * 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_full_forward(kind, temperature):
    model = make_model(kind)
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=10)
    roll = FastGenerator(model, PAD).generate(prompts((4, 9)), params, n=3, generator=torch.Generator().manual_seed(1))
    assert roll.completion_ids.shape == (6, 10)
    ref = full_forward_logprobs(model, roll, temperature)
    torch.testing.assert_close(roll.logprobs, ref, atol=2e-5, rtol=0)
    assert (roll.logprobs[roll.completion_mask.bool()] < 0).all()


def test_same_rollout_as_reference_generator():
    """Greedy: FastGenerator and HFGenerator return identical Rollouts (ids, masks, truncation, log-probs)."""
    model = make_model("qwen3")
    rows = prompts((3, 7, 5))
    stop = _stop_token_midway(model, rows, 12)
    params = greedy(12, [stop])
    a = FastGenerator(model, PAD).generate(rows, params, n=2)
    b = HFGenerator(model, PAD).generate(rows, params, n=2)
    for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
        assert getattr(a, f).dtype == getattr(b, f).dtype, f
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantized_lora_model_equals_hf_generate(fmt):
    model = lora_model("qwen2", fmt=fmt)
    rows = prompts((6, 2, 9))
    ref = hf_greedy(model, rows, 10)
    roll = FastGenerator(model, PAD).generate(rows, greedy(10), n=1)
    assert torch.equal(roll.completion_ids, ref)
    torch.testing.assert_close(roll.logprobs, full_forward_logprobs(model, roll), atol=2e-5, rtol=0)
    # the LoRA branch is live in the engine: zeroing it changes the greedy answer
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.zero_()
    assert not torch.equal(FastGenerator(model, PAD).generate(rows, greedy(10), n=1).completion_ids, ref)


def test_in_place_norm_noise_is_seen_by_a_reused_engine():
    """AQN copies noise into the norm weights in place; an engine reusing its cache must see it."""
    from quarl.rl.aqn import AQN, AQNConfig

    model = make_model("llama")
    eng = FastGenerator(model, PAD)
    rows = prompts((5, 8))
    clean = eng.generate(rows, greedy(10), n=1).completion_ids
    aqn = AQN(model, AQNConfig(sigma_start=0.5, sigma_end=0.5), total_steps=10)
    with aqn.perturb(5, torch.Generator().manual_seed(0)) as sigma:
        assert sigma > 0
        noisy = eng.generate(rows, greedy(10), n=1).completion_ids
        assert torch.equal(noisy, hf_greedy(model, rows, 10))
    assert not torch.equal(noisy, clean)
    assert torch.equal(eng.generate(rows, greedy(10), n=1).completion_ids, clean)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_type": "dynamic", "factor": 2.0},
    ],
)
def test_rope_scaling_variants_equal_hf_generate(rope):
    model = make_model("llama", rope=rope)
    rows = prompts((4, 10))
    assert torch.equal(
        FastGenerator(model, PAD).generate(rows, greedy(12), n=1).completion_ids, hf_greedy(model, rows, 12)
    )


def test_dynamic_rope_beyond_original_length_is_refused():
    model = make_model("llama", rope={"rope_type": "dynamic", "factor": 2.0})
    model.config.rope_parameters["original_max_position_embeddings"] = 16
    eng = FastGenerator(model, PAD)
    with pytest.raises(EngineError, match="original_max_position_embeddings=16"):
        eng.generate(prompts((10,)), greedy(10), n=1)


def test_length_buckets_keep_row_order_and_results():
    model = make_model("qwen3")
    rows = prompts((9, 2, 6, 3, 12))
    whole = FastGenerator(model, PAD).generate(rows, greedy(8), n=2)
    eng = FastGenerator(model, PAD, max_batch_size=4)
    parts = eng.generate(rows, greedy(8), n=2)
    assert eng.last_stats["batches"] == 3
    assert torch.equal(parts.completion_ids, whole.completion_ids)
    assert torch.equal(parts.prompt_ids, whole.prompt_ids) and torch.equal(parts.prompt_mask, whole.prompt_mask)
    torch.testing.assert_close(parts.logprobs, whole.logprobs, atol=2e-5, rtol=0)


@pytest.mark.parametrize("tokens", [1, 13, 24])
def test_chunked_prefill_gives_the_same_rollout(tokens):
    """max_num_batched_tokens cuts the prefill into chunks of whole rows (one row when a prompt alone is longer):
    the same tokens and log-probs as one pass over every row."""
    model = make_model("qwen2")
    rows = prompts((9, 2, 6, 3, 12))  # 10 rows left-padded to 12 tokens: chunks of 1 row (1, 13 tokens) or 2 (24)
    whole = FastGenerator(model, PAD).generate(rows, greedy(6), n=2)
    chunked = FastGenerator(model, PAD, max_num_batched_tokens=tokens).generate(rows, greedy(6), n=2)
    assert torch.equal(chunked.completion_ids, whole.completion_ids)
    torch.testing.assert_close(chunked.logprobs, whole.logprobs, atol=2e-5, rtol=0)


def test_batches_are_sized_by_free_memory(monkeypatch):
    """max_batch_size=None: rows whose cache does not fit the free memory go in power-of-two batches that do (the
    same rollout); a row that cannot fit alone is a clear error."""
    model = make_model("qwen2")
    rows = prompts((9, 2, 6, 3, 12))
    whole = FastGenerator(model, PAD).generate(rows, greedy(6), n=2)
    eng = FastGenerator(model, PAD)
    r = eng.runner
    need = lambda n: (r.prefill_bytes(min(10, max(1, eng.max_num_batched_tokens // 12)) * 12)
                      + memory.MEMORY_SLACK + n * r.row_bytes(18))
    monkeypatch.setattr(eng, "_free_bytes", lambda: need(5))  # 5 rows fit: batches of 4
    parts = eng.generate(rows, greedy(6), n=2)
    assert eng.last_stats["batch_rows"] == 4 and eng.last_stats["batches"] == 3
    assert torch.equal(parts.completion_ids, whole.completion_ids)
    torch.testing.assert_close(parts.logprobs, whole.logprobs, atol=2e-5, rtol=0)
    # a shorter call after it: the cache it would grow to keeps its longer length, and so does the estimate (phase h
    # of session 15: a 1-token call after a 2048-token warm-up sized its rows at the short length and ran out of memory)
    eng2 = FastGenerator(model, PAD)
    monkeypatch.setattr(eng2, "_free_bytes", lambda: need(5) - 5 * r.row_bytes(18) + 5 * r.row_bytes(12 + 160))
    eng2.generate(rows, greedy(160), n=2)
    assert eng2.last_stats["batch_rows"] == 4
    short = eng2.generate(rows, greedy(1), n=2)  # 13 slots a row, in a cache of 172: still 4 rows
    assert eng2.last_stats["batch_rows"] == 4 and torch.equal(short.completion_ids, whole.completion_ids[:, :1])
    monkeypatch.setattr(eng, "_free_bytes", lambda: need(1) - 1)
    with pytest.raises(EngineError, match="lower max_new_tokens"):
        eng.generate(rows, greedy(6), n=2)
    assert FastGenerator(model, PAD)._free_bytes() is None  # on CPU: no limit


def test_seeded_sampling_is_reproducible():
    model = make_model("qwen2")
    eng = FastGenerator(model, PAD, sync_every=3)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12)
    rows = prompts((5, 7))
    a = eng.generate(rows, params, n=4, generator=torch.Generator().manual_seed(7))
    b = eng.generate(rows, params, n=4, generator=torch.Generator().manual_seed(7))
    c = eng.generate(rows, params, n=4, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # the n samples of one prompt differ from each other (they are independent draws)
    assert len({tuple(r) for r in a.completion_ids[:4].tolist()}) > 1


def test_all_rows_stopped_ends_the_loop_early():
    model = make_model("llama")
    rows = prompts((5,))
    first = int(hf_greedy(model, rows, 1)[0, 0])
    eng = FastGenerator(model, PAD, sync_every=4)
    roll = eng.generate(rows, greedy(200, [first]), n=1)
    assert roll.completion_ids.tolist() == [[first]] and not roll.truncated[0]
    assert eng.last_stats["steps"] == 1


def test_eval_sampling_runs_on_the_engine():
    from quarl.eval.config import SamplingConfig
    from quarl.eval.generate import sample_completions
    from quarl.models import tiny_model

    model, tok = tiny_model("llama")
    cfg = SamplingConfig(greedy=True, max_new_tokens=6, n=1, batch_size=2)
    texts = ["1 + 1 =", "The capital of France is", "x"]
    ref, _ = sample_completions(model, tok, texts, cfg, progress=False)
    fast, stats = sample_completions(
        model, tok, texts, cfg, progress=False, generator=FastGenerator(model, tok.pad_token_id)
    )
    assert [c[0].text for c in fast] == [c[0].text for c in ref]
    assert stats["generated_tokens"] == sum(c[0].tokens for c in ref)


def test_make_generator_picks_the_reference_on_cpu():
    model = make_model("llama")
    assert isinstance(make_generator(model, PAD), HFGenerator)
    assert isinstance(make_generator(model, PAD, engine="fast"), FastGenerator)
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_generator(model, PAD, engine="vllm")


def test_bad_inputs_have_clear_errors():
    model = make_model("llama")
    eng = FastGenerator(model, PAD)
    with pytest.raises(ValueError, match="cuda_graphs=True needs the model on a CUDA device"):
        FastGenerator(model, PAD, cuda_graphs=True).generate(prompts((3,)), greedy(2), n=1)
    with pytest.raises(ValueError, match="no prompts"):
        eng.generate([], greedy(2), n=1)
    with pytest.raises(ValueError, match="at least one token"):
        eng.generate([[]], greedy(2), n=1)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        eng.generate(prompts((3,)), SamplingParams(temperature=0.0), n=1)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1"):
        FastGenerator(model, PAD, max_num_batched_tokens=0)

    class Other(torch.nn.Module):
        config = type("C", (), {"model_type": "gpt2"})()

    with pytest.raises(EngineError, match="model_type llama, qwen2, qwen3"):
        FastGenerator(Other(), PAD)


def test_compiled_decode_step_matches_eager():
    """compile=True traces the same step (aot_eager here: no C++ toolchain time in the unit suite)."""
    model = make_model("qwen3")
    rows = prompts((4, 7))
    eager = FastGenerator(model, PAD).generate(rows, greedy(5), n=1)
    compiled = FastGenerator(model, PAD, compile=True, compile_backend="aot_eager").generate(rows, greedy(5), n=1)
    assert torch.equal(compiled.completion_ids, eager.completion_ids)
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=1e-5, rtol=0)


def test_fp8_projections_share_one_quantization_of_their_input(monkeypatch):
    """Jet-RL's FP8 flow in the engine (session 29): q / k / v and gate / up quantize their shared input once
    (``fp8_linear.shared_input`` around each group), so a decoder layer runs the 1x128 quantizer 4 times instead of
    7 in every forward; the rollout is the same tokens and log-probs as with every projection quantizing on its own
    (``QUARL_FP8_MEMO=0``), and no quantized operand outlives the step."""
    from quarl.quant import fp8_linear as fl
    from quarl.quant import fp8_operands, quantize_model
    from quarl.rl.precision import _jetrl_recipe

    model = make_model("qwen2")
    quantize_model(model, _jetrl_recipe("full"))
    rows = prompts((5, 9))
    calls = []
    real = fl._quantize_x
    monkeypatch.setattr(fp8_operands, "_quantize_x", lambda *a: calls.append(a[0].shape) or real(*a))
    with torch.no_grad():
        shared = FastGenerator(model, PAD).generate(rows, greedy(6), n=1)
    layers = model.config.num_hidden_layers
    forwards = 1 + 5  # the prefill and the decode steps after it (the first token comes from the prefill)
    assert len(calls) == 4 * layers * forwards, len(calls)
    assert fl._X_SLOT[0] is None
    calls.clear()
    monkeypatch.setenv("QUARL_FP8_MEMO", "0")
    with torch.no_grad():
        alone = FastGenerator(model, PAD).generate(rows, greedy(6), n=1)
    assert len(calls) == 7 * layers * forwards, len(calls)
    assert torch.equal(shared.completion_ids, alone.completion_ids)
    assert torch.equal(shared.logprobs, alone.logprobs)
