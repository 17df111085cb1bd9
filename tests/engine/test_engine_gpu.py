"""FastGenerator on CUDA: CUDA-graph decode equals HF generate, graphs see in-place weight updates
and re-capture after weight replacement, quantized + LoRA rollouts match the trainer's forward,
torch.compile'd steps agree, packed LoRA adapters follow optimizer steps under graphs, and an
uncapturable layer falls back to eager decoding."""

from __future__ import annotations

import warnings

import pytest
import torch

from quarl.engine import GREEDY_TOP_P, FastGenerator, make_generator
from quarl.engine.rollout import SamplingParams
from tests.engine.conftest import PAD, VOCAB, full_forward_logprobs, hf_greedy, make_model, prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def greedy(T: int, stop=None) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=T, stop_token_ids=stop or [])


def _lora_model(fmt: str, dtype, kind="qwen2"):
    from quarl.quant import quantize_model

    model = make_model(kind, device="cuda", dtype=dtype)
    quantize_model(model, {"default": fmt, "lora": {"r": 4, "alpha": 8.0}})
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.copy_(torch.randn(p.shape) * 0.05)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_cuda_graph_greedy_equals_hf_generate(kind):
    model = make_model(kind, device="cuda")  # fp32: exact token agreement is meaningful
    rows = prompts()
    free = hf_greedy(model, rows, 20)
    stop = int(free[1, 6])
    eng = FastGenerator(model, PAD, kv_block=8, sync_every=4)  # several kv buckets -> several graphs
    roll = eng.generate(rows, greedy(20, [stop]), n=1)
    assert eng.graph_error is None and eng.last_stats["graph_captures"] >= 3
    assert torch.equal(roll.completion_ids, hf_greedy(model, rows, 20, eos=[stop]))
    torch.testing.assert_close(roll.logprobs, full_forward_logprobs(model, roll), atol=1e-4, rtol=0)


def test_warmup_captures_every_graph_a_call_needs():
    model = make_model("qwen2", device="cuda")
    rows = prompts((9, 4, 6))
    eng = FastGenerator(model, PAD, kv_block=8)
    n = eng.warmup(len(rows), max(map(len, rows)), 30)
    assert n == 4 and eng.cache_bytes > 0  # kv lengths 10..38 -> buckets 16, 24, 32, 40
    roll = eng.generate(rows, greedy(30), n=1)
    assert eng.last_stats["graph_captures"] == 0
    assert torch.equal(roll.completion_ids, hf_greedy(model, rows, 30))


def test_recapture_after_a_freed_cache_skips_the_warm_up_and_keeps_the_tokens():
    """keep_cache=False (the RL trainer's default) frees the cache after each call, so the next call re-captures its
    graphs; for shapes captured before that skips the eager warm-up steps and replays each new graph once for its
    step's outputs -- the tokens (and log-probs) are the first call's, and those of an engine that keeps its cache."""
    model = make_model("qwen2", device="cuda")
    rows = prompts()
    want = FastGenerator(model, PAD, kv_block=8).generate(rows, greedy(20), n=1)
    eng = FastGenerator(model, PAD, kv_block=8, keep_cache=False)
    first = eng.generate(rows, greedy(20), n=1)
    n = eng.last_stats["graph_captures"]
    assert n >= 3 and eng.last_stats["warmup_s"] > 0 and eng._state is None
    again = eng.generate(rows, greedy(20), n=1)
    assert eng.last_stats["graph_captures"] == n and eng.last_stats["warmup_s"] == 0.0
    for r in (first, again):
        assert torch.equal(r.completion_ids, want.completion_ids)
        torch.testing.assert_close(r.logprobs, want.logprobs, atol=1e-6, rtol=0)


def test_graphs_follow_in_place_updates_and_recapture_on_replacement():
    model = make_model("llama", device="cuda")
    rows = prompts((6, 3))
    eng = FastGenerator(model, PAD)
    base = eng.generate(rows, greedy(12), n=1).completion_ids
    assert torch.equal(base, hf_greedy(model, rows, 12))
    n_graphs = len(eng._graphs)
    norm = model.model.layers[0].input_layernorm.weight
    with torch.no_grad():  # in place, as AQN and the optimizer do: same graphs, new numbers
        norm.add_(torch.randn_like(norm) * 0.5)
    noisy = eng.generate(rows, greedy(12), n=1).completion_ids
    assert len(eng._graphs) == n_graphs and eng.last_stats["graph_captures"] == 0
    assert torch.equal(noisy, hf_greedy(model, rows, 12)) and not torch.equal(noisy, base)
    with torch.no_grad():  # a replaced tensor: the fingerprint changes and the graphs are re-captured
        model.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(model.model.layers[1].mlp.up_proj.weight * 3)
    again = eng.generate(rows, greedy(12), n=1).completion_ids
    assert eng.last_stats["graph_captures"] > 0
    assert torch.equal(again, hf_greedy(model, rows, 12))


def test_bf16_nvfp4_lora_rollout_matches_trainer_forward():
    from quarl.quant import dispatch

    model = _lora_model("nvfp4", torch.bfloat16)
    rows = prompts((7, 12, 3, 9))
    eng = make_generator(model, PAD)
    assert isinstance(eng, FastGenerator)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)
    roll = eng.generate(rows, params, n=2, generator=torch.Generator("cuda").manual_seed(0))
    x = torch.zeros(1, 1, 64, device="cuda", dtype=torch.bfloat16)
    q = model.model.layers[0].self_attn.q_proj
    print("kernel for bf16 nvfp4:", getattr(dispatch.select(x, q), "name", None), "graph_error:", eng.graph_error)
    ref = full_forward_logprobs(model, roll)
    diff = (roll.logprobs - ref).abs()[roll.completion_mask.bool()]
    assert float(diff.max()) < 0.15 and float(diff.mean()) < 0.02, (diff.max(), diff.mean())
    again = eng.generate(rows, params, n=2, generator=torch.Generator("cuda").manual_seed(0))
    assert torch.equal(again.completion_ids, roll.completion_ids)
    with pytest.raises(ValueError, match="torch.Generator is on cpu"):
        eng.generate(rows, params, n=1, generator=torch.Generator().manual_seed(0))


def test_compaction_under_graphs_keeps_the_rollout():
    """Finished rows leave the batch (graph batches 32 -> 16 -> ...): fp32, the same tokens as without compaction;
    NVFP4 + LoRA in bf16, log-probs that still match the trainer's forward."""
    rows = prompts((5, 11, 2, 8, 6, 9, 3, 7))
    stop = list(range(3, 3 + VOCAB // 12))  # ~8 % of the vocabulary: rows end at scattered lengths
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=40, stop_token_ids=stop)
    model = make_model("qwen2", device="cuda")
    on = FastGenerator(model, PAD, kv_block=8, sync_every=2, compact=True)
    off = FastGenerator(model, PAD, kv_block=8, sync_every=2, compact=False)
    a = on.generate(rows, params, n=4, generator=torch.Generator("cuda").manual_seed(3))
    b = off.generate(rows, params, n=4, generator=torch.Generator("cuda").manual_seed(3))
    assert on.graph_error is None and on.last_stats["compactions"] >= 2, on.last_stats
    assert len(set(a.lengths.tolist())) >= 4
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.truncated, b.truncated)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    lora = _lora_model("nvfp4", torch.bfloat16)
    eng = FastGenerator(lora, PAD, kv_block=8, sync_every=2)
    roll = eng.generate(rows, params, n=4, generator=torch.Generator("cuda").manual_seed(3))
    assert eng.last_stats["compactions"] >= 1, eng.last_stats
    diff = (roll.logprobs - full_forward_logprobs(lora, roll)).abs()[roll.completion_mask.bool()]
    assert float(diff.max()) < 0.15 and float(diff.mean()) < 0.02, (diff.max(), diff.mean())


def test_packed_lora_under_graphs_sees_optimizer_steps():
    """fp32 adapter (the trainer's) under bf16 activations, CUDA graphs: the packed adapters match
    the trainer's forward like the module path does, and an in-place update between calls is seen
    by the same graphs (the pack is refreshed, not re-captured)."""
    model = _lora_model("nvfp4", torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.float()
    rows = prompts((7, 12, 3, 9))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)
    eng = FastGenerator(model, PAD)
    roll = eng.generate(rows, params, n=1, generator=torch.Generator("cuda").manual_seed(0))
    assert eng.runner._lora and eng.graph_error is None
    diff = (roll.logprobs - full_forward_logprobs(model, roll)).abs()[roll.completion_mask.bool()]
    assert float(diff.max()) < 0.15 and float(diff.mean()) < 0.02, (diff.max(), diff.mean())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lora_B"):
                p.mul_(-2.0)
    n_graphs = len(eng._graphs)
    again = eng.generate(rows, params, n=1, generator=torch.Generator("cuda").manual_seed(0))
    assert len(eng._graphs) == n_graphs and eng.last_stats["graph_captures"] == 0
    diff = (again.logprobs - full_forward_logprobs(model, again)).abs()[again.completion_mask.bool()]
    assert float(diff.max()) < 0.15 and float(diff.mean()) < 0.02, (diff.max(), diff.mean())


def test_lora_epilogue_matches_addmm_under_graphs(monkeypatch):
    """The B GEMM and bias in the base kernel's last pass (default) vs the addmm path
    (``QUARL_ENGINE_LORA_EPILOGUE=0``): same sampled tokens almost everywhere, log-probs that
    match the trainer's forward equally well, and the fused route taken under the graphs."""
    from quarl_kernels import registration

    model = _lora_model("nvfp4", torch.bfloat16)
    rows = prompts((7, 12, 3, 9))
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)
    calls = []
    real = registration.forward_epilogue

    def counting(x, layer, a, b, scaling, gate=None):
        calls.append(a is not None)
        return real(x, layer, a, b, scaling, gate=gate)

    from quarl.quant import dispatch

    dispatch.load_kernels()
    for ks in dispatch._KERNELS.values():
        for k in ks:
            monkeypatch.setattr(k, "epilogue", counting)
    on = FastGenerator(model, PAD)
    fused = on.generate(rows, params, n=1, generator=torch.Generator("cuda").manual_seed(0))
    assert on.graph_error is None and sum(calls) >= 7 * len(model.model.layers), "the fused route was not taken"
    monkeypatch.setenv("QUARL_ENGINE_LORA_EPILOGUE", "0")
    calls.clear()
    plain = FastGenerator(model, PAD).generate(rows, params, n=1, generator=torch.Generator("cuda").manual_seed(0))
    assert sum(calls) == 0
    mask = fused.completion_mask.bool()
    same = (fused.completion_ids == plain.completion_ids)[mask].float().mean()
    assert same > 0.5, same  # sampling at temperature 1 may flip on a 1-ulp difference and then diverge
    for roll in (fused, plain):
        diff = (roll.logprobs - full_forward_logprobs(model, roll)).abs()[roll.completion_mask.bool()]
        assert float(diff.max()) < 0.15 and float(diff.mean()) < 0.02, (diff.max(), diff.mean())


def test_compiled_step_agrees():
    model = make_model("qwen3", device="cuda")
    rows = prompts((5, 9))
    eager = FastGenerator(model, PAD).generate(rows, greedy(6), n=1)
    comp = FastGenerator(model, PAD, compile=True).generate(rows, greedy(6), n=1)
    assert torch.equal(comp.completion_ids, eager.completion_ids)
    torch.testing.assert_close(comp.logprobs, eager.logprobs, atol=1e-4, rtol=0)


def test_uncapturable_layers_fall_back_to_eager():
    """fp32 NVFP4 has no kernel; its reference dequantize checks the global scale on the host."""
    model = _lora_model("nvfp4", torch.float32)
    rows = prompts((4, 8))
    eng = FastGenerator(model, PAD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        roll = eng.generate(rows, greedy(10), n=1)
    if eng.graph_error is None:
        pytest.skip("this layer's compute path was capturable (a kernel applied); nothing to fall back from")
    assert any("decoding eagerly" in str(w.message) for w in caught)
    assert torch.equal(roll.completion_ids, hf_greedy(model, rows, 10))
    assert torch.equal(eng.generate(rows, greedy(10), n=1).completion_ids, roll.completion_ids)


@pytest.mark.parametrize("fmt", ["nf4", "nf4-dq", "int8-g64"])
def test_reference_path_formats_capture_in_cuda_graphs(fmt):
    """Formats without a GPU kernel decode through their reference dequantization; it must stay on the
    device (NF4's code tables were copied from the host on every call, so capture failed and a
    searched recipe with NF4 layers decoded eagerly, 20x slower: RESULTS "Precision search ... (GPU)")."""
    from quarl.quant import quantize_model

    model = make_model("qwen2", device="cuda", dtype=torch.bfloat16)
    quantize_model(model, {"default": fmt})
    rows = prompts()
    eng = FastGenerator(model, PAD, kv_block=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the eager fallback warns
        roll = eng.generate(rows, greedy(12), n=1)
    assert eng.graph_error is None and eng.last_stats["graph_captures"] >= 1
    assert roll.completion_ids.shape == (len(rows), 12)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 64, 128])
def test_seeded_rollout_of_a_7b_shaped_model_is_reproducible(batch, monkeypatch):
    """The rollout GRPO runs (Qwen2.5-7B shape, NVFP4 + LoRA r32, one row -- the GEMV --, 64 rows -- the ring's 64-row
    tile -- and 128 -- its wide tiles --, 512 tokens) sampled twice with one seed on
    one engine (graph replays), once on a fresh engine (a new capture) and once on a fresh engine without
    programmatic dependent launch (``QUARL_KERNELS_PDL=0``: every kernel starts after the one before has ended): the
    same tokens and log-probs. The first TMA-ring kernel broke this only at this scale (tokens diverged after 7-57
    steps; a 4-layer, 128-token rollout and 400 launches of the kernel alone were bit-identical): its next decode
    rewrote the A registers of a wgmma in flight (RESULTS "Issue 17, session 14"); a chained kernel that read its
    input before its wait would break it the same way. ~1.5 min on an H100."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from quarl.quant import quantize_model

    cfg = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                      num_key_value_heads=4, vocab_size=152064, max_position_embeddings=4096, rope_theta=1e6,
                      tie_word_embeddings=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.to_empty(device="cuda")
    g = torch.Generator("cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and not name.endswith("bias"):
                p.fill_(1.0)  # RMSNorm weights
            else:
                p.normal_(0.0, 0.02, generator=g)
        with torch.device("cuda"):
            model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    model.eval().requires_grad_(False)
    quantize_model(model, {"default": "nvfp4", "lora": {"r": 32, "alpha": 64.0}})
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, cfg.vocab_size, (256,), generator=gen).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=512)
    outs = []
    eng = FastGenerator(model, PAD)
    for _ in range(2):  # graph replays
        outs.append(eng.generate(rows, params, 1, torch.Generator("cuda").manual_seed(7)))
    eng.release()
    eng = FastGenerator(model, PAD)  # a new capture
    outs.append(eng.generate(rows, params, 1, torch.Generator("cuda").manual_seed(7)))
    eng.release()
    monkeypatch.setenv("QUARL_KERNELS_PDL", "0")  # plain launches (read when the graphs are captured)
    eng = FastGenerator(model, PAD)
    outs.append(eng.generate(rows, params, 1, torch.Generator("cuda").manual_seed(7)))
    eng.release()
    for o in outs[1:]:
        assert torch.equal(o.completion_ids, outs[0].completion_ids)
        assert torch.equal(o.logprobs, outs[0].logprobs)
