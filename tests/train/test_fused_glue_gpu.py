"""quarl.train.fused_glue on the GPU with inductor (the kernels a stage runs): a BF16 Qwen2 model and the rl stage's
full-parameter Jet-RL model (FP8 projections) compute what the eager model does, forward and backward, within bf16
rounding (a fused kernel rounds once where the eager ops round after each)."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _model(jetrl: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=256, intermediate_size=640, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=1000, num_hidden_layers=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    if jetrl:
        from quarl.quant import quantize_model
        from quarl.rl.precision import _jetrl_recipe

        quantize_model(m, _jetrl_recipe("full", "1x128"))
    return m


@pytest.mark.parametrize("jetrl", [False, True])
def test_inductor_glue_matches_eager(jetrl):
    from transformers.models.qwen2 import modeling_qwen2

    from quarl.train.fused_glue import compile_glue

    original = modeling_qwen2.apply_rotary_pos_emb
    a, b = _model(jetrl), _model(jetrl)
    ids = torch.randint(0, 1000, (4, 64), device="cuda")
    try:
        report = compile_glue(b)
        assert report["backend"] == "inductor" and report["rms_norms"] == 5 and report["swiglu_mlps"] == 2
        outs = []
        for m in (a, b):
            logits = m(input_ids=ids).logits.float()  # [4, 64, V]
            F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
            outs.append(logits)
        assert (outs[0] - outs[1]).abs().max() < 0.05 * outs[0].abs().max()
        for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            if p.grad is None:
                assert q.grad is None, name
                continue
            cos = F.cosine_similarity(p.grad.float().flatten(), q.grad.float().flatten(), 0)
            assert cos > 0.995, (name, cos.item())
    finally:
        modeling_qwen2.apply_rotary_pos_emb = original


def test_the_engine_rolls_out_a_glue_patched_model_with_its_own_kernels():
    """The trainer's compiled glue must not take the rollout engine's fused no-grad kernels away: a bf16 model's
    greedy rollout is the same tokens and log-probs before and after compile_glue, and the engine never calls the
    compiled functions (their call counters stay at zero)."""
    from transformers.models.qwen2 import modeling_qwen2

    from quarl.engine import FastGenerator
    from quarl.train import fused_glue
    from tests.engine.conftest import PAD, make_model, prompts
    from tests.engine.test_engine_gpu import greedy

    original = modeling_qwen2.apply_rotary_pos_emb
    model = make_model("qwen2", device="cuda", dtype=torch.bfloat16)
    rows = prompts()
    before = FastGenerator(model, PAD, kv_block=8).generate(rows, greedy(16), n=1)
    try:
        fused_glue.compile_glue(model)
        calls = {"n": 0}
        fns = model.model.layers[0].mlp._glue_fns
        for name in ("rms_norm", "silu_mul"):
            f = getattr(fns, name)
            setattr(fns, name, lambda *a, _f=f, **kw: (calls.__setitem__("n", calls["n"] + 1), _f(*a, **kw))[1])
        after = FastGenerator(model, PAD, kv_block=8).generate(rows, greedy(16), n=1)
        assert calls["n"] == 0
        assert torch.equal(after.completion_ids, before.completion_ids)
        torch.testing.assert_close(after.logprobs, before.logprobs, atol=0, rtol=0)
    finally:
        modeling_qwen2.apply_rotary_pos_emb = original
        fused_glue._compiled.cache_clear()  # the counters above wrapped the shared functions


def test_the_engine_rolls_out_a_stacked_jetrl_model(monkeypatch):
    """A full-parameter Jet-RL model under the compiled glue runs its q / k / v as one FP8 GEMM (quarl.quant.fp8_stack)
    in the trainer's forwards; the rollout engine's CUDA-graph decode reads the same stacked tiles through each
    weight's own cache and never records their refresh. Greedy rollouts with the stack on and off are the same tokens
    (the stacked forward is the separate projections' bits), before and after a fused optimizer step, and the tiles
    after the step are the fresh quantization of the new weights."""
    from transformers.models.qwen2 import modeling_qwen2

    from quarl.engine import FastGenerator
    from quarl.quant.fp8_linear import _master_tiles, quantize_weight_padded
    from quarl.quant.fp8_stack import FP8StackFunction
    from quarl.train import fused_glue
    from tests.engine.conftest import PAD, prompts
    from tests.engine.test_engine_gpu import greedy

    original = modeling_qwen2.apply_rotary_pos_emb
    rows = [[t % 1000 for t in r] for r in prompts()]
    calls = []
    apply = FP8StackFunction.apply
    monkeypatch.setattr(FP8StackFunction, "apply", lambda *a: calls.append(1) or apply(*a))

    def rollouts():
        out = []
        for stack in ("1", "0"):
            monkeypatch.setenv("QUARL_FP8_STACK", stack)
            out.append(FastGenerator(model, PAD, kv_block=8).generate(rows, greedy(12), n=1).completion_ids)
        return out

    try:
        model = _model(jetrl=True)
        assert fused_glue.compile_glue(model)["fp8_qkv_stacks"] == 2
        on, off = rollouts()
        assert torch.equal(on, off)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        ids = torch.randint(0, 1000, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        monkeypatch.setenv("QUARL_FP8_STACK", "1")
        n = len(calls)
        logits = model(input_ids=ids).logits
        F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
        assert len(calls) > n  # the training forward ran stacked
        opt.step()
        on2, off2 = rollouts()
        assert torch.equal(on2, off2)
        for m in model.model.layers[0].self_attn.q_proj, model.model.layers[0].self_attn.v_proj:
            q, s = _master_tiles(m.weight)
            rq, rs = quantize_weight_padded(m.weight.detach().clone())
            assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    finally:
        modeling_qwen2.apply_rotary_pos_emb = original


def test_the_engine_shares_one_fp8_quantization_per_projection_group_in_its_graphs(monkeypatch):
    """The rollout engine's CUDA-graph decode of a Jet-RL model quantizes q / k / v's input once and gate / up's once
    (``fp8_linear.shared_input``, session 29; the operands captured once and read by each GEMV): the same tokens and
    log-probs as with every projection quantizing on its own (``QUARL_FP8_MEMO=0``), at 4 and 8 rows."""
    from quarl.engine import FastGenerator
    from quarl.engine.rollout import SamplingParams
    from tests.engine.conftest import PAD, prompts

    model = _model(jetrl=True)
    rows = [[t % 1000 for t in r] for r in prompts()]
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=16)
    for n in (1, 2):
        out = {}
        for memo in ("1", "0"):
            monkeypatch.setenv("QUARL_FP8_MEMO", memo)
            gen = torch.Generator(device="cuda").manual_seed(3)
            roll = FastGenerator(model, PAD, kv_block=8).generate(rows, params, n=n, generator=gen)
            out[memo] = roll
        assert torch.equal(out["1"].completion_ids, out["0"].completion_ids), n
        assert torch.equal(out["1"].logprobs, out["0"].logprobs), n
