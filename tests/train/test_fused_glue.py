"""quarl.train.fused_glue on CPU: the functions are transformers' math, the patch reaches every RMSNorm, SwiGLU MLP
and the family's RoPE, and a patched model computes what the eager one does, forward and backward (compiled with
the cheap ``aot_eager`` backend here: the autograd graph torch.compile builds, without inductor's C++ build; the
inductor kernels are checked on the GPU, tests/train/test_fused_glue_gpu.py)."""

import re

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from quarl.train import fused_glue
from quarl.train.fused_glue import compile_glue, rms_norm, rope, rope_by_tokens, silu_mul


@pytest.fixture(autouse=True)
def _transformers_rope_restored():
    """compile_glue patches a family's module-level RoPE process-wide: every test here leaves transformers' own."""
    import importlib

    from quarl.train.fused_glue import FAMILIES

    mods = [importlib.import_module(f"transformers.models.{f}.modeling_{f}") for f in (*FAMILIES, "gemma")]
    saved = {m: m.apply_rotary_pos_emb for m in mods}
    yield
    for m, f in saved.items():
        m.apply_rotary_pos_emb = f


def _pair(cls, cfg, dtype=torch.float32):
    torch.manual_seed(0)
    a = cls(cfg).to(dtype)
    b = cls(cfg).to(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


def _qwen2():
    return Qwen2Config(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=97, num_hidden_layers=2, tie_word_embeddings=False)


def test_functions_are_transformers_math():
    from transformers.models.qwen2 import modeling_qwen2 as m

    torch.manual_seed(0)
    norm = m.Qwen2RMSNorm(64, eps=1e-6)
    norm.weight.data.normal_()
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    assert torch.equal(rms_norm(x, norm.weight.to(torch.bfloat16), 1e-6), norm.to(torch.bfloat16)(x))
    g, u = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    assert torch.equal(silu_mul(g, u), torch.nn.functional.silu(g) * u)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
    cos, sin = torch.randn(2, 6, 16), torch.randn(2, 6, 16)
    for ours, theirs in zip(rope(q, k, cos, sin), m.apply_rotary_pos_emb(q, k, cos, sin), strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_rope_by_tokens_keeps_the_projections_memory_order(backend):
    """The installed RoPE (:func:`rope_by_tokens`, session 35): transformers' values and gradients, and -- its point --
    q's output and q's gradient in the token-major order the projection wrote ([B, T, H, D] memory), so neither SDPA
    (cuDNN lays its output and gradients out like q) nor the projection's ``view`` backward copies a layer's q / k. The
    head-major function returns q's gradient [B, H, T, D]-contiguous: the copy it made on an H100 at 7B width."""
    from transformers.models.qwen2 import modeling_qwen2 as m

    from quarl.train.fused_glue import _compiled

    torch.manual_seed(1)
    b, t, hq, hk, d = 2, 6, 4, 2, 16
    xq = torch.randn(b, t, hq * d, requires_grad=True)  # the projections' outputs, token-major
    xk = torch.randn(b, t, hk * d, requires_grad=True)
    cos, sin = torch.randn(b, t, d), torch.randn(b, t, d)
    gq = torch.randn(b, t, hq, d).transpose(1, 2)  # SDPA's gradients, in q's (token-major) memory order
    gk = torch.randn(b, t, hk, d).transpose(1, 2)
    heads = lambda x, h: x.view(b, t, h, d).transpose(1, 2)  # transformers' q / k: [B, H, T, D] views
    core = {} if backend == "eager" else {"core": _compiled(backend).rope}
    ours = rope_by_tokens(heads(xq, hq), heads(xk, hk), cos, sin, **core)
    gx_ours = torch.autograd.grad(ours, (xq, xk), (gq, gk))
    theirs = m.apply_rotary_pos_emb(heads(xq, hq), heads(xk, hk), cos, sin)
    gx_theirs = torch.autograd.grad(theirs, (xq, xk), (gq, gk))
    for a, c in zip((*ours, *gx_ours), (*theirs, *gx_theirs), strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-6)
    assert ours[0].transpose(1, 2).is_contiguous() and ours[1].transpose(1, 2).is_contiguous()
    # the gradient reaching the projections: token-major, so their view's backward is a view too
    qt = heads(xq, hq).detach().requires_grad_()
    grad_heads = torch.autograd.grad(rope_by_tokens(qt, heads(xk, hk), cos, sin, **core)[0], qt, gq)[0]
    assert grad_heads.transpose(1, 2).is_contiguous()
    old = torch.autograd.grad(rope(qt, heads(xk, hk).detach(), cos, sin)[0], qt, gq)[0]
    assert not old.transpose(1, 2).is_contiguous()  # what the head-major function gave (the copy it cost)
    # another layout (cos [T, D] broadcast, or unsqueeze_dim=2) is transformers' function as it was
    q4 = torch.randn(b, t, hq, d)
    k4 = torch.randn(b, t, hk, d)
    for a, c in zip(rope_by_tokens(q4, k4, cos, sin, 2), m.apply_rotary_pos_emb(q4, k4, cos, sin, 2), strict=True):
        assert torch.equal(a, c)


def _family_model(family: str):
    import transformers

    from quarl.train.fused_glue import FAMILIES

    assert family in (*FAMILIES, "gemma")
    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma"}[family]
    cfg = getattr(transformers, f"{prefix}Config")(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
        num_hidden_layers=2, head_dim=16, tie_word_embeddings=False, hidden_act="silu")
    return _pair(getattr(transformers, f"{prefix}ForCausalLM"), cfg)


@pytest.mark.parametrize("family,norms", [("qwen2", 5), ("llama", 5), ("mistral", 5), ("qwen3", 9)])
def test_patched_model_matches_eager_forward_and_backward(family, norms):
    """Every family in FAMILIES: transformers' own model and the patched one, forward and backward (Qwen3 has a q
    and a k norm per layer besides the two)."""
    import importlib

    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    original = mod.apply_rotary_pos_emb
    a, b = _family_model(family)
    ids = torch.randint(0, 97, (2, 12))
    la = a(input_ids=ids).logits
    la.square().mean().backward()
    report = compile_glue(b, backend="aot_eager")
    assert report["rms_norms"] == norms and report["swiglu_mlps"] == 2  # 1 MLP per layer
    assert report["rope_modules"] == [mod.__name__] and mod.apply_rotary_pos_emb is not original
    assert all("forward" in m.__dict__ for m in b.modules() if type(m).__name__.endswith(("RMSNorm", "MLP")))
    for n in (12, 9):  # a second sequence length (RL's batches change shape) still runs
        b.zero_grad()
        lb = b(input_ids=ids[:, :n]).logits
        lb.square().mean().backward()
        if n == 12:
            torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-5)
            for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    again = compile_glue(b, backend="aot_eager")  # idempotent: the RoPE patch is not wrapped twice
    assert again["rms_norms"] == norms and getattr(mod.apply_rotary_pos_emb, "_quarl_glue", None) == "aot_eager"


def test_a_family_with_other_math_is_left_alone():
    """Gemma's RMSNorm scales by (1 + weight): a name match would compute something else. It is not patched; asked
    for explicitly, the knob says why; auto leaves it eager."""
    from transformers.models.gemma import modeling_gemma

    from quarl.train.fused_glue import apply_compile_glue

    original = modeling_gemma.apply_rotary_pos_emb
    _, b = _family_model("gemma")
    with pytest.raises(ValueError, match="of a family it knows .*set policy.compile_glue=false"):
        compile_glue(b, backend="aot_eager")
    assert apply_compile_glue(b, "auto", "cuda", "policy.compile_glue") is None
    assert modeling_gemma.apply_rotary_pos_emb is original
    assert all("forward" not in m.__dict__ for m in b.modules())


def test_a_model_without_the_layout_is_refused_with_the_key():
    with pytest.raises(ValueError, match=r"student.compile_glue=true: no RMSNorm.*set student.compile_glue=false"):
        compile_glue(torch.nn.Sequential(torch.nn.Linear(4, 4)), key="student.compile_glue", backend="aot_eager")


def test_compiled_once_per_backend():
    assert fused_glue._compiled("aot_eager") is fused_glue._compiled("aot_eager")


def test_the_knob_auto_true_false(monkeypatch):
    from quarl.train.fused_glue import apply_compile_glue

    _, b = _pair(Qwen2ForCausalLM, _qwen2())
    assert apply_compile_glue(b, "auto", "cpu", "policy.compile_glue") is None  # eager on CPU
    assert apply_compile_glue(b, "false", "cuda", "policy.compile_glue") is None
    assert all("forward" not in m.__dict__ for m in b.modules())
    with pytest.raises(ValueError, match=re.escape("policy.compile_glue must be one of auto, true, false; got 'yes'")):
        apply_compile_glue(b, "yes", "cpu", "policy.compile_glue")
    # auto on CUDA: a layout it does not know stays eager instead of failing the stage; true says why it cannot
    assert apply_compile_glue(torch.nn.Linear(4, 4), "auto", "cuda", "policy.compile_glue") is None
    with pytest.raises(ValueError, match="policy.compile_glue=true: no RMSNorm"):
        apply_compile_glue(torch.nn.Linear(4, 4), "true", "cpu", "policy.compile_glue")


@pytest.mark.parametrize("value", ["maybe", "on"])
def test_configs_reject_a_bad_setting_when_built(value):
    from quarl.config import load_config
    from quarl.distill.config import DistillConfig
    from quarl.rl.config import RLConfig

    with pytest.raises(ValueError, match=re.escape("policy.compile_glue must be one of auto, true, false; got")):
        load_config(RLConfig, None, [f"policy.compile_glue={value}"])
    with pytest.raises(ValueError, match=re.escape("student.compile_glue must be one of auto, true, false; got")):
        load_config(DistillConfig, None, [f"student.compile_glue={value}"])


def test_rl_trainer_compiles_the_glue_when_asked(tmp_path, monkeypatch):
    """policy.compile_glue=true on CPU: the trainer reports what it patched and trains; the aot_eager backend
    stands in for inductor (the same autograd graph, no C++ build)."""
    from transformers.models.llama import modeling_llama

    from quarl.rl.trainer import RLTrainer
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

    original = modeling_llama.apply_rotary_pos_emb
    monkeypatch.setattr(fused_glue, "BACKEND", "aot_eager")
    try:
        model, tok = small_tiny_model()
        cfg = tiny_cfg("policy.compile_glue=true", "train.steps=2")
        t = RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, tmp_path, reward_fn=ParityReward())
        report = t.policy_report["compile_glue"]
        assert report["rms_norms"] > 0 and report["swiglu_mlps"] > 0 and report["rope_modules"]
        before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
        assert t.train()["end_step"] == 2
        assert any(not torch.equal(p, before[n]) for n, p in t.model.named_parameters() if p.requires_grad)
    finally:
        modeling_llama.apply_rotary_pos_emb = original


def test_the_rollout_engine_still_runs_its_own_kernels_on_a_patched_model():
    """The engine's no-grad fused kernels stand in for a module running transformers' own forward; a module whose
    forward compile_glue bound is the same math, so it stays eligible (a rollout must not lose its kernels to the
    trainer's compiled glue) -- while any other instance-level forward still is not."""
    from quarl.engine import fused

    _, b = _pair(Qwen2ForCausalLM, _qwen2(), torch.bfloat16)
    layer = b.model.layers[0]
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert fused.norm_eligible(layer.input_layernorm, x) and fused.mlp_eligible(layer.mlp)
    compile_glue(b, backend="aot_eager")
    assert fused.norm_eligible(layer.input_layernorm, x) and fused.mlp_eligible(layer.mlp)
    layer.mlp.forward = lambda h: h  # someone else's override: the module is called as a module
    assert not fused.mlp_eligible(layer.mlp)


def test_a_deep_copy_runs_on_its_own_weights():
    """The rl stage copies the patched policy (its reference model, the rollout replica): each copy's forwards are
    bound to the copy, so changing the policy's weights leaves the copy's outputs alone."""
    import copy

    _, b = _pair(Qwen2ForCausalLM, _qwen2())
    compile_glue(b, backend="aot_eager")
    ref = copy.deepcopy(b)
    norm, mlp = ref.model.layers[0].input_layernorm, ref.model.layers[0].mlp
    assert norm.forward.__self__ is norm and mlp.forward.__self__ is mlp
    ids = torch.randint(0, 97, (1, 6))
    before = ref(input_ids=ids).logits
    with torch.no_grad():
        b.model.layers[0].input_layernorm.weight.mul_(2)
        b.model.layers[0].mlp.up_proj.weight.mul_(2)
    assert torch.equal(ref(input_ids=ids).logits, before)
    assert not torch.allclose(b(input_ids=ids).logits, before)


def test_past_the_recompile_limit_a_variant_runs_eager_instead_of_failing():
    """A stage process sees few variants of each function (grad mode, requires_grad, static vs dynamic shapes); one
    that sees more than dynamo's limit must go on, eagerly, not stop the run."""
    import torch._dynamo

    torch._dynamo.reset()
    fused_glue._compiled.cache_clear()
    fns = fused_glue._compiled("aot_eager")
    w = torch.randn(8)
    with torch._dynamo.config.patch(recompile_limit=1):
        for shape in [(8,), (2, 8), (2, 3, 8), (1, 2, 3, 8)]:  # a new rank each call: a recompile each
            x = torch.randn(shape)
            torch.testing.assert_close(fns.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    torch._dynamo.reset()
    fused_glue._compiled.cache_clear()
