"""quarl.engine.fused on CPU: the switch, the eligibility rules, the references, and the engine's
fused wiring (residual adds carried into the next norm, unrolled SiLU MLP, one RoPE call for q and k).

On CPU the fused path is off (``DecoderRunner.fused_on()`` is False) and the engine runs the
modules' own code. To test the *wiring* without a GPU, ``fused._FORCE_OPS`` routes every eligible
call through the ``torch.ops.quarl`` custom ops, which on CPU run their references -- equal to the
HF modules bit for bit -- so the fused engine must reproduce the unfused one exactly, in fp32 and
bf16. The kernels' numerics are tested in tests/kernels (interpreter) and on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quarl.engine import GREEDY_TOP_P, DecoderRunner, FastGenerator, make_generator
from quarl.engine import fused as fz
from quarl.engine import lora as lp
from quarl.engine.rollout import SamplingParams
from tests.engine.conftest import PAD, hf_greedy, make_model, prompts, seeded_rollout

KINDS = ["llama", "qwen2", "qwen3"]


def greedy(T: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=T)


@pytest.fixture
def forced(monkeypatch):
    """Route eligible calls through the custom ops (their CPU reference) and count them."""
    from quarl_kernels import fused_ops

    calls = {"rms_norm": 0, "rope_qk": 0, "rope_qk_cache": 0, "silu_mul": 0}
    for name in calls:
        orig = getattr(fused_ops, name)

        def wrapped(*a, _orig=orig, _name=name, **kw):
            calls[_name] += 1
            return _orig(*a, **kw)

        monkeypatch.setattr(fused_ops, name, wrapped)
    monkeypatch.setattr(fz, "_FORCE_OPS", True)
    return calls


# --- the switch ------------------------------------------------------------------------------------
SWITCHES = [  # every engine switch parses through fused._switch: (resolver, variable)
    (fz.resolve, fz.ENV), (fz.resolve_decode_attn, fz.ENV_DECODE_ATTN),
    (lp.resolve, lp.ENV), (lp.resolve_epilogue, lp.EPILOGUE_ENV),
]


@pytest.mark.parametrize("resolve,env", SWITCHES, ids=[e for _, e in SWITCHES])
def test_resolve_flag_and_environment(monkeypatch, resolve, env):
    monkeypatch.delenv(env, raising=False)
    assert resolve(None) is True  # default on (each acts only where its kernels apply)
    for v, want in (("0", False), ("off", False), ("1", True), ("true", True), ("yes", True), (" TRUE ", True)):
        monkeypatch.setenv(env, v)
        assert resolve(None) is want
    monkeypatch.setenv(env, "0")
    assert resolve(True) is True  # the argument wins
    monkeypatch.setenv(env, "maybe")
    with pytest.raises(ValueError, match=f"{env}='maybe' is not understood; set it to 1"):
        resolve(None)


def test_constructor_arguments_reach_the_runner(monkeypatch):
    monkeypatch.delenv(fz.ENV, raising=False)
    model = make_model("qwen2")
    assert DecoderRunner(model).fused and not DecoderRunner(model, fused=False).fused
    assert not FastGenerator(model, PAD, fused=False).runner.fused
    assert not make_generator(model, PAD, engine="fast", fused=False).runner.fused
    monkeypatch.setenv(fz.ENV, "0")
    assert not FastGenerator(model, PAD).runner.fused
    # on CPU nothing is fused even when asked
    assert not DecoderRunner(model, fused=True).fused_on()


def test_model_keeps_apply_rope_importable():
    from quarl.engine.model import apply_rope

    assert apply_rope is fz.apply_rope


# --- eligibility -------------------------------------------------------------------------------------
def test_plain_hf_modules_are_eligible_and_anything_else_is_not():
    model = make_model("qwen3")
    layer = model.model.layers[0]
    x = torch.randn(1, 64)
    norm = layer.input_layernorm
    assert fz.norm_eligible(norm, x) and fz.norm_eligible(layer.self_attn.q_norm, torch.randn(2, 16))
    assert fz.mlp_eligible(layer.mlp)
    assert not fz.norm_eligible(norm, x.to(torch.bfloat16))  # fp32 weight under bf16 activations
    assert not fz.norm_eligible(norm, torch.randn(1, 32))  # wrong size

    handle = norm.register_forward_hook(lambda m, i, o: o)
    assert not fz.norm_eligible(norm, x)
    handle.remove()
    assert fz.norm_eligible(norm, x)

    norm.forward = lambda h: h  # an instance-level override
    assert not fz.norm_eligible(norm, x)
    del norm.forward

    class MyNorm(type(norm)):
        pass

    assert not fz.norm_eligible(MyNorm(64), x)  # a subclass is not HF's code

    mlp = layer.mlp
    mlp.act_fn = nn.GELU()
    assert not fz.mlp_eligible(mlp)
    mlp.act_fn = nn.SiLU()  # torch's own SiLU is the same function
    assert fz.mlp_eligible(mlp)


def test_ineligible_calls_are_the_module_call(forced):
    model = make_model("llama")
    layer = model.model.layers[0]
    x = torch.randn(2, 3, 64)
    layer.mlp.act_fn = nn.GELU()
    torch.testing.assert_close(fz.mlp(layer.mlp, x), layer.mlp(x), rtol=0, atol=0)
    assert forced["silu_mul"] == 0
    hook_out = []
    layer.input_layernorm.register_forward_hook(lambda m, i, o: hook_out.append(o))
    y = fz.rms_norm(layer.input_layernorm, x)
    assert forced["rms_norm"] == 0 and len(hook_out) == 1 and torch.equal(y, hook_out[0])


def test_gradients_keep_the_pytorch_path(forced):
    model = make_model("qwen2")
    norm = model.model.layers[0].input_layernorm  # weight requires grad
    x = torch.randn(2, 64, requires_grad=True)
    fz.rms_norm(norm, x).sum().backward()
    assert forced["rms_norm"] == 0 and x.grad is not None
    with torch.no_grad():
        fz.rms_norm(norm, x)
    assert forced["rms_norm"] == 1


# --- the pieces, forced through the ops -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forced_pieces_equal_the_modules(forced, dtype):
    model = make_model("qwen3", dtype=dtype)
    layer = model.model.layers[0]
    x, o = torch.randn(2, 3, 64).to(dtype), torch.randn(2, 3, 64).to(dtype)
    with torch.no_grad():
        y, h = fz.rms_norm(layer.post_attention_layernorm, o, residual=x)
        assert torch.equal(h, x + o) and torch.equal(y, layer.post_attention_layernorm(x + o))
        assert torch.equal(fz.mlp(layer.mlp, y), layer.mlp(y))
        q = torch.randn(2, 3, 4, 16).to(dtype)
        assert torch.equal(fz.rms_norm(layer.self_attn.q_norm, q), layer.self_attn.q_norm(q))
        qt, kt = q.transpose(1, 2), torch.randn(2, 3, 2, 16).to(dtype).transpose(1, 2)
        cos, sin = torch.randn(2, 3, 16).to(dtype), torch.randn(2, 3, 16).to(dtype)
        rq, rk = fz.rope_qk(qt, kt, cos, sin)
        assert torch.equal(rq, fz.apply_rope(qt, cos, sin)) and torch.equal(rk, fz.apply_rope(kt, cos, sin))
        # a decode step's RoPE with its K/V cache write: q back, rotated k and v at the slot
        v = torch.randn(2, 3, 2, 16).to(dtype).transpose(1, 2)  # [B, H_kv, L, D]
        kc, vc = torch.zeros(2, 2, 9, 16, dtype=dtype), torch.zeros(2, 2, 9, 16, dtype=dtype)
        slot = torch.tensor([4, 0, 7])
        rq2 = fz.rope_qk_cache(qt, kt, v, cos, sin, kc, vc, slot)
        assert torch.equal(rq2, rq) and torch.equal(kc[:, :, slot], rk) and torch.equal(vc[:, :, slot], v)
        assert not kc[:, :, [1, 2, 3, 5, 6, 8]].any() and not vc[:, :, [1, 2, 3, 5, 6, 8]].any()
    assert forced == {"rms_norm": 2, "rope_qk": 1, "rope_qk_cache": 1, "silu_mul": 1}


# --- the engine, forced through the ops --------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forced_engine_equals_unfused_engine(forced, kind, dtype):
    model = make_model(kind, dtype=dtype)
    rows = prompts((5, 11, 2))
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=8)
    ref = seeded_rollout(model, rows, params, pad=PAD, fused=False)
    assert sum(forced.values()) == 0
    eng = FastGenerator(model, PAD, fused=True)
    assert eng.runner.fused_on()
    out = eng.generate(rows, params, n=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.logprobs, ref.logprobs)  # bit for bit: the ops' CPU path is the reference
    L = model.config.num_hidden_layers
    steps = out.completion_ids.shape[1]  # one prefill + (steps - 1) decode steps
    norms_per_pass = 2 * L + 1 + (2 * L if kind == "qwen3" else 0)
    assert forced["rms_norm"] == steps * norms_per_pass, forced
    # the prefill rotates q and k; each decode step rotates them and writes its K/V slot in the same op
    assert forced["rope_qk"] == L and forced["rope_qk_cache"] == (steps - 1) * L, forced
    assert forced["silu_mul"] == steps * L, forced


def test_forced_engine_equals_hf_generate_and_sees_in_place_norm_noise(forced):
    model = make_model("qwen2")
    rows = prompts((6, 3))
    eng = FastGenerator(model, PAD)
    assert torch.equal(eng.generate(rows, greedy(10), n=1).completion_ids, hf_greedy(model, rows, 10))
    with torch.no_grad():  # AQN-style: the norm weights change in place between rollouts
        for layer in model.model.layers:
            w = layer.post_attention_layernorm.weight
            w.copy_(w + torch.randn_like(w) * 0.5)
    noisy = eng.generate(rows, greedy(10), n=1).completion_ids
    assert torch.equal(noisy, hf_greedy(model, rows, 10))
