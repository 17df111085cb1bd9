"""The engine's decode-attention switch (``QUARL_ENGINE_DECODE_ATTN`` / ``decode_attn=``) on CPU.

Three layers, as ``test_fused.py`` tests the other fused kernels:

* the switch: flag and environment, constructor arguments reaching the runner, which calls are
  eligible (D 64 / 128, one dtype, bool ``valid [B, L]``, no gradient) and that anything else is
  *exactly* the SDPA call the engine made before;
* the wiring, with ``fused._FORCE_OPS`` routing eligible calls through ``torch.ops.quarl`` on CPU,
  where the attention op runs its reference (SDPA): the engine calls it once per layer per decode
  step (never in prefill), and its tokens and log-probs equal the unswitched engine's bit for bit;
  with the switch off it is never called;
* the kernel itself in the engine (needs Triton and NumPy < 2.3; skipped in CPU CI): under
  ``TRITON_INTERPRET=1``, with the CPU seam ``fused_ops._ATTN_ON_CPU``, the decode step runs the
  flash-decoding Triton kernel for real on a bf16 tiny model with 64-dim heads and G = 7 (Qwen2.5-7B's
  group). Teacher-forced logits (prompts long enough for two splits, kv-length buckets with unwritten
  slots past the write column, as on the GPU) with the switch on stay as close to an fp32 copy of the
  model as the SDPA engine's do, and within 0.05 of the SDPA engine's (measured: 0.004); greedy
  generation (short prompts: one split, one launch) gives the same tokens, log-probs within 0.05
  (a row may only diverge at a near-tie of the fp32 logits: bf16 noise, not the kernel). Prefill is
  not compared bit for bit: CPU bf16 matmuls here differed by an ulp between runs once in ~10.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from quarl.engine import DecoderRunner, FastGenerator, make_generator
from quarl.engine import fused as fz
from quarl.engine.rollout import SamplingParams
from tests.engine.conftest import PAD, VOCAB, prompts, seeded_rollout
from tests.kernels.interpreter import needs_interpreter, run_interpreted

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["llama", "qwen2", "qwen3"]


def attn_model(kind: str = "qwen2", dtype=torch.float32, head_dim: int = 64, heads: int = 14, kv_heads: int = 2,
               seed: int = 0):
    """A seeded tiny ``kind`` model whose heads the kernel takes (D 64) with G = heads / kv_heads."""
    from transformers import AutoModelForCausalLM

    from quarl.models import tiny_config

    cfg = tiny_config(kind, vocab_size=VOCAB)
    cfg.tie_word_embeddings = False
    cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads = head_dim, heads, kv_heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


@pytest.fixture
def counted(monkeypatch):
    """Force eligible calls through the custom ops (CPU: their references) and count attention calls."""
    from quarl_kernels import fused_ops

    calls = {"decode_attention": 0}
    orig = fused_ops.decode_attention

    def wrapped(*a, **kw):
        calls["decode_attention"] += 1
        return orig(*a, **kw)

    monkeypatch.setattr(fused_ops, "decode_attention", wrapped)
    monkeypatch.setattr(fz, "_FORCE_OPS", True)
    return calls


# --- the switch ---------------------------------------------------------------------------------
# (the environment variable itself: tests/engine/test_fused.py, with the other engine switches)
def test_constructor_arguments_reach_the_runner(monkeypatch):
    monkeypatch.delenv(fz.ENV_DECODE_ATTN, raising=False)
    model = attn_model()
    assert DecoderRunner(model).decode_attn and not DecoderRunner(model, decode_attn=False).decode_attn
    assert not FastGenerator(model, PAD, decode_attn=False).runner.decode_attn
    assert not make_generator(model, PAD, engine="fast", decode_attn=False).runner.decode_attn
    monkeypatch.setenv(fz.ENV_DECODE_ATTN, "0")
    assert not FastGenerator(model, PAD).runner.decode_attn
    assert FastGenerator(model, PAD).runner.fused  # the other kernels keep their own switch
    monkeypatch.setenv(fz.ENV_DECODE_ATTN, "bad")
    with pytest.raises(ValueError, match="QUARL_ENGINE_DECODE_ATTN"):
        DecoderRunner(model)


# --- eligibility ------------------------------------------------------------------------------------
def _attn_inputs(B=2, HK=2, G=7, D=64, L=9, S=16, dtype=torch.float32):
    q = torch.randn(B, HK, G, D).to(dtype)
    kc, vc = torch.randn(B, HK, S, D).to(dtype), torch.randn(B, HK, S, D).to(dtype)
    valid = torch.rand(B, S) > 0.3
    valid[:, L - 1] = True
    return q, kc[:, :, :L], vc[:, :, :L], valid[:, :L]


def test_eligibility_rules():
    q, k, v, valid = _attn_inputs()
    assert fz.attn_eligible(q, k, v, valid)
    assert fz.attn_eligible(*_attn_inputs(D=128, G=1))
    assert not fz.attn_eligible(*_attn_inputs(D=16))  # the tiny test models' heads
    assert not fz.attn_eligible(*_attn_inputs(D=80))
    assert not fz.attn_eligible(q.to(torch.bfloat16), k, v, valid)  # mixed dtypes
    assert not fz.attn_eligible(q, k, v, valid.float())  # an additive mask is not the engine's
    assert not fz.attn_eligible(q, k, v, valid[:, :-1])  # [B, L] only


def test_ineligible_calls_are_exactly_the_sdpa_call(counted):
    q, k, v, valid = _attn_inputs()
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=0.125)
    assert torch.equal(fz.decode_attention(q, k, v, valid, 0.125, fused=False), sdpa)
    assert counted["decode_attention"] == 0
    q16, k16, v16, valid16 = _attn_inputs(D=16)
    fz.decode_attention(q16, k16, v16, valid16, 0.25)
    assert counted["decode_attention"] == 0
    qg = q.clone().requires_grad_(True)  # a gradient keeps PyTorch (the op has no autograd)
    fz.decode_attention(qg, k, v, valid, 0.125).sum().backward()
    assert counted["decode_attention"] == 0 and qg.grad is not None
    with torch.no_grad():
        assert torch.equal(fz.decode_attention(q, k, v, valid, 0.125), sdpa)  # the op's CPU path: the reference
    assert counted["decode_attention"] == 1


def test_not_forced_cpu_keeps_sdpa(monkeypatch):
    monkeypatch.setattr(fz, "_FORCE_OPS", False)
    q, k, v, valid = _attn_inputs(dtype=torch.bfloat16)
    assert not DecoderRunner(attn_model()).fused_on()  # CPU: nothing fused, so neither is attention
    assert torch.equal(fz.decode_attention(q, k, v, valid, 0.125),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=0.125))


# --- the engine, forced through the op (its CPU reference) -----------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forced_engine_calls_the_op_per_decode_layer(counted, kind, dtype):
    model = attn_model(kind, dtype=dtype)
    rows = prompts((5, 11, 2))
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=6)
    ref = seeded_rollout(model, rows, params, pad=PAD, fused=False)
    assert counted["decode_attention"] == 0
    out_off = seeded_rollout(model, rows, params, pad=PAD, fused=True, decode_attn=False)
    assert counted["decode_attention"] == 0 and torch.equal(out_off.completion_ids, ref.completion_ids)
    out = seeded_rollout(model, rows, params, pad=PAD, fused=True)
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.logprobs, ref.logprobs)  # bit for bit: the op's CPU path is the SDPA reference
    decode_steps = out.completion_ids.shape[1] - 1  # the first token comes from prefill
    assert counted["decode_attention"] == decode_steps * model.config.num_hidden_layers


# --- the Triton kernel in the engine, under the interpreter -------------------------------------------
INTERPRETER_SCRIPT = textwrap.dedent("""
    import torch
    from quarl_kernels import decode_attn, fused_ops

    from quarl.engine import DecoderRunner, FastGenerator, GREEDY_TOP_P
    from quarl.engine import fused as fz
    from quarl.engine.rollout import SamplingParams
    from tests.engine.conftest import PAD, prompts, teacher_forced_logits
    from tests.engine.test_decode_attn import attn_model

    fz._FORCE_OPS = True  # the CPU engine routes eligible calls through torch.ops.quarl
    fused_ops._ATTN_ON_CPU = True  # and the attention op launches the Triton kernel (interpreted)
    launched = {"n": 0, "splits": set()}
    orig = decode_attn.launches

    def counting(*a, **kw):
        o, todo = orig(*a, **kw)
        launched["n"] += 1
        launched["splits"].add(todo[0].grid[1])
        return o, todo

    decode_attn.launches = counting

    forced_logits = teacher_forced_logits  # no_grad, as the generator runs it (a gradient would keep SDPA)

    rows = prompts((70, 5, 200, 33), seed=1)  # P = 200: two 128-slot tiles -> two splits
    for kind in ("qwen2", "qwen3"):
        model = attn_model(kind, dtype=torch.bfloat16)
        ref32 = attn_model(kind, dtype=torch.float32)
        cont = torch.randint(3, 2048, (len(rows), 6), generator=torch.Generator().manual_seed(2))
        n0 = launched["n"]
        on = forced_logits(DecoderRunner(model, fused=True), rows, cont)
        assert launched["n"] - n0 == 5 * model.config.num_hidden_layers, launched  # every decode layer
        off = forced_logits(DecoderRunner(model, fused=True, decode_attn=False), rows, cont)
        assert launched["n"] - n0 == 5 * model.config.num_hidden_layers
        exact = forced_logits(DecoderRunner(ref32, fused=False), rows, cont)
        d_on, d_off = (on - exact).abs().max().item(), (off - exact).abs().max().item()
        d_sw = (on - off).abs().max().item()
        print(kind, f"|on - off| {d_sw:.4f}  |on - fp32| {d_on:.4f}  |off - fp32| {d_off:.4f}")
        assert d_sw <= 0.05 and d_on <= 1.5 * d_off + 0.01, (d_sw, d_on, d_off)

        greedy = SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=8)
        short = prompts((5, 11, 2))  # one tile: the one-launch path
        a = FastGenerator(model, PAD).generate(short, greedy, n=1)
        b = FastGenerator(model, PAD, decode_attn=False).generate(short, greedy, n=1)
        ex = forced_logits(DecoderRunner(ref32, fused=False), short, b.completion_ids)  # fp32, on b's tokens
        for i in range(len(short)):  # equal tokens, or a first difference at a near-tie of the fp32 logits
            diff = (a.completion_ids[i] != b.completion_ids[i]).nonzero()
            if len(diff):
                t, ta, tb = int(diff[0]), a.completion_ids[i, diff[0]], b.completion_ids[i, diff[0]]
                assert (ex[i, t, ta] - ex[i, t, tb]).abs().item() <= 2 * d_off, (kind, i, t)
                print(kind, "row", i, "diverges at a near-tie, step", t)
            else:
                torch.testing.assert_close(a.logprobs[i], b.logprobs[i], atol=0.05, rtol=0)
    assert launched["splits"] >= {1, 2}, launched
    print("OK")
""")


@needs_interpreter
def test_engine_with_the_kernel_under_triton_interpreter():
    run_interpreted(INTERPRETER_SCRIPT)
