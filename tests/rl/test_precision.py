"""Precision flows (bf16 / fp8-rollout / jetrl), rollout importance sampling and the mismatch metrics."""

import math

import pytest
import torch

from quarl.quant import QuantLinear
from quarl.quant.fp8_linear import fp8_linear
from quarl.rl.config import RLConfig
from quarl.rl.logprobs import mismatch
from quarl.rl.losses import policy_loss
from quarl.rl.precision import Precision, PrecisionConfig, fp8_cast_rollout
from quarl.rl.trainer import RLTrainer
from quarl.train.metrics import read_metrics
from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg


def _lp(*vals):
    return torch.tensor([list(vals)], dtype=torch.float32)


def test_is_weights_token_truncate_and_mask():
    train, roll = _lp(0.0, math.log(3.0), math.log(0.25), 0.0), torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    tis = Precision(PrecisionConfig(rollout_is_threshold=2.0)).is_weights(train, roll, mask)
    torch.testing.assert_close(tis, torch.tensor([[1.0, 2.0, 0.25, 1.0]]))  # capped at 2, low weights kept
    mis = Precision(PrecisionConfig(rollout_is_threshold=2.0, rollout_is_mode="mask")).is_weights(train, roll, mask)
    torch.testing.assert_close(mis, torch.tensor([[1.0, 0.0, 0.0, 1.0]]))  # outside [1/2, 2] -> 0
    assert Precision(PrecisionConfig()).is_weights(train, roll, mask) is None  # no threshold: no correction
    assert Precision(PrecisionConfig(rollout_is_threshold=2.0, rollout_is=False)).is_weights(train, roll, mask) is None
    m = Precision(PrecisionConfig(rollout_is_threshold=2.0, rollout_is=False)).is_metrics(train, roll, mask)
    assert m["mismatch/rollout_is_max"] == pytest.approx(3.0) and m["mismatch/rollout_is_truncated_fraction"] == \
        pytest.approx(1 / 3)


def test_is_weights_sequence_level():
    train = torch.tensor([[0.1, 0.2, 0.0], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # row 0's padding must not count
    p = Precision(PrecisionConfig(rollout_is_threshold=2.0, rollout_is_level="sequence", rollout_is_mode="mask"))
    w = p.is_weights(train, torch.zeros(2, 3), mask)
    torch.testing.assert_close(w[0], torch.full((3,), math.exp(0.3)))  # the product over the answer
    assert (w[1] == 0).all()  # exp(1.5) = 4.5 > 2: the whole answer is masked
    tr = Precision(PrecisionConfig(rollout_is_threshold=2.0, rollout_is_level="sequence"))
    torch.testing.assert_close(tr.is_weights(train, torch.zeros(2, 3), mask)[1], torch.full((3,), 2.0))


def test_weights_scale_the_policy_gradient_term_only():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    w = torch.tensor([[2.0, 0.0]])
    out = policy_loss(logp, logp.detach(), adv, mask, weights=w, aggregation="token")
    out.loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.0]]))  # -w * A / n_tokens


def test_mismatch_reports_the_fraction_outside_half_to_two():
    roll = torch.zeros(1, 4)
    train = _lp(0.0, math.log(2.5), math.log(0.4), math.log(1.5))
    m = mismatch(roll, train, torch.ones(1, 4))
    assert m["mismatch/ratio_outside_0.5_2"] == pytest.approx(0.5)
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(math.log(2.5))


def test_config_modes_set_the_policy_and_reject_contradictions():
    from quarl.config import load_config

    c = load_config(RLConfig, None, ["precision.mode=jetrl"]).resolved()
    assert c.policy.format == "fp8-block" and c.policy.quant_recipe == {"default": "fp8-block", "act_quant": "fp8-1x128"}
    c = load_config(RLConfig, None, ["precision.mode=jetrl", "policy.mode=full"]).resolved()
    assert c.policy.quant_recipe["mode"] == "qat"
    assert load_config(RLConfig, None, ["precision.mode=fp8-rollout"]).resolved().policy.format == "bf16"
    assert c.resolved() == c  # idempotent (the trainer resolves again)
    with pytest.raises(ValueError, match="precision.mode=jetrl trains with policy.format=fp8-block"):
        load_config(RLConfig, None, ["precision.mode=jetrl", "policy.format=nf4"]).resolved()
    with pytest.raises(ValueError, match="rollout_is_threshold must be > 1"):
        PrecisionConfig(rollout_is_threshold=0.5)
    with pytest.raises(ValueError, match="precision.mode must be one of"):
        PrecisionConfig(mode="fp4")


def test_fp8_cast_rollout_runs_the_merged_weight_in_fp8_and_restores():
    torch.manual_seed(0)
    from quarl.quant import LoRAConfig

    lin = torch.nn.Linear(192, 96, bias=True)
    q = QuantLinear.from_linear(lin, None, lora=LoRAConfig(r=4, alpha=8))
    with torch.no_grad():
        q.lora_B.normal_()
    model = torch.nn.Sequential(q)
    x = torch.randn(5, 192)
    before = model(x)
    with torch.no_grad(), fp8_cast_rollout(model):
        y = model(x)
    w_eff = (lin.weight + q.lora_delta()).detach()
    torch.testing.assert_close(y, fp8_linear(x, w_eff, lin.bias.detach()), rtol=1e-5, atol=1e-5)
    assert 0 < (y - before).norm() / before.norm() < 0.06
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # the BF16 module is back


def _run(tmp_path, *extra):
    model, tok = small_tiny_model()
    cfg = tiny_cfg("algo.updates_per_rollout=1", "aqn.enabled=false", "train.steps=2", *extra)
    tr = RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, tmp_path, reward_fn=ParityReward())
    tr.train()
    return tr, read_metrics(tmp_path / "metrics.jsonl")


def test_modes_mismatch_ordering_on_the_tiny_model(tmp_path):
    """bf16: rollout == trainer; fp8-rollout: a clear gap; jetrl: the same FP8 flow on both sides."""
    _, bf16 = _run(tmp_path / "bf16", "precision.mode=bf16")
    _, cast = _run(tmp_path / "cast", "precision.mode=fp8-rollout", "precision.rollout_is_threshold=2.0")
    jet, unified = _run(tmp_path / "jet", "precision.mode=jetrl")
    gap = {name: max(r["mismatch/abs_logprob_diff"] for r in rows)
           for name, rows in (("bf16", bf16), ("cast", cast), ("jet", unified))}
    assert gap["bf16"] < 1e-5 and gap["cast"] > 1e-3 and gap["jet"] < gap["cast"] / 10, gap
    assert "mismatch/rollout_is_mean" in cast[0] and "mismatch/ratio_outside_0.5_2" in unified[0]
    assert all(m.fp8_flow for m in jet.model.modules() if isinstance(m, QuantLinear))


def test_jetrl_full_parameter_trains_master_weights(tmp_path):
    tr, rows = _run(tmp_path, "precision.mode=jetrl", "policy.mode=full")
    qls = [m for m in tr.model.modules() if isinstance(m, QuantLinear)]
    assert qls and all(m.mode == "qat" and m.fp8_flow and m.weight.requires_grad for m in qls)
    assert tr.policy_report["format"] == "fp8-block (qat)" and rows[-1]["grad_norm"] > 0


def test_jetrl_full_parameter_forward_follows_a_fused_optimizer(tmp_path, monkeypatch):
    """torch's fused AdamW -- like bitsandbytes' 8-bit AdamW, the stage's default optimizer on CUDA -- writes the master
    weights without moving their version counter; the FP8 tiles the policy runs on after training must still be those
    of its current weights (session 26: they were the first step's)."""
    import quarl.rl.trainer as trainer_mod
    from quarl.quant.fp8_linear import _master_tiles, quantize_weight_padded

    def fused(params, cfg, device):
        return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                                 fused=True), "adamw"

    monkeypatch.setattr(trainer_mod, "make_optimizer", fused)
    tr, _ = _run(tmp_path, "precision.mode=jetrl", "policy.mode=full", "train.steps=3", "optim.lr=1e-2")
    qls = [m for m in tr.model.modules() if isinstance(m, QuantLinear)]
    assert qls and all(getattr(m.weight, "_quarl_fp8", None) is not None for m in qls)  # the FP8 flow ran on them
    for m in qls:
        q, s = _master_tiles(m.weight)
        rq, rs = quantize_weight_padded(m.weight.detach().clone())
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)


def test_fp8_wgrad_tiles_reaches_the_master_weights(tmp_path):
    """``precision.fp8_wgrad=tiles`` (full-parameter jetrl) is written into the recipe and every QuantLinear's
    FP8 linear; it is refused where there is no FP8 weight gradient."""
    from quarl.config import load_config

    c = load_config(RLConfig, None, ["precision.mode=jetrl", "policy.mode=full", "precision.fp8_wgrad=tiles"]).resolved()
    assert c.policy.quant_recipe["fp8_wgrad"] == "tiles" and c.resolved() == c
    lora = load_config(RLConfig, None, ["precision.mode=jetrl", "precision.fp8_wgrad=tiles"]).resolved()
    assert "fp8_wgrad" not in lora.policy.quant_recipe  # a frozen FP8 base has no WGrad
    with pytest.raises(ValueError, match="fp8_wgrad=tiles applies to precision.mode=jetrl"):
        PrecisionConfig(mode="bf16", fp8_wgrad="tiles")
    with pytest.raises(ValueError, match="fp8_wgrad must be one of"):
        PrecisionConfig(mode="jetrl", fp8_wgrad="128x1")
    tr, rows = _run(tmp_path, "precision.mode=jetrl", "policy.mode=full", "precision.fp8_wgrad=tiles")
    qls = [m for m in tr.model.modules() if isinstance(m, QuantLinear)]
    assert qls and all(m.fp8_wgrad == "tiles" and m.fp8_flow for m in qls) and rows[-1]["grad_norm"] > 0


@pytest.mark.parametrize("extra", [(), ("policy.gradient_checkpointing=true",)], ids=["plain", "checkpointing"])
def test_jetrl_full_parameter_with_compiled_glue_runs_the_fused_mlp(tmp_path, monkeypatch, extra):
    """precision.mode=jetrl, policy.mode=full, policy.compile_glue=true: every MLP runs as one FP8SwiGLUFunction
    (SwiGLU's backward inside the quantizers) in the rollout's log-probs and the updates, also recomputed under
    gradient checkpointing, and on CPU the run is the three FP8 linears' run, step for step (QUARL_FP8_SWIGLU=0: the
    same metrics, the same weights)."""
    from transformers.models.llama import modeling_llama

    from quarl.quant.fp8_swiglu import FP8SwiGLUFunction
    from quarl.train import fused_glue

    monkeypatch.setattr(fused_glue, "BACKEND", "aot_eager")  # inductor's graph without its C++ build
    rope = modeling_llama.apply_rotary_pos_emb
    calls = []
    apply = FP8SwiGLUFunction.apply
    monkeypatch.setattr(FP8SwiGLUFunction, "apply", lambda *a: calls.append(torch.is_grad_enabled()) or apply(*a))
    try:
        args = ("precision.mode=jetrl", "policy.mode=full", "policy.compile_glue=true", *extra)
        fused, rows = _run(tmp_path / "fused", *args)
        assert True in calls and False in calls  # training forwards and no-grad log-prob passes
        n = len(calls)
        monkeypatch.setenv("QUARL_FP8_SWIGLU", "0")
        plain, rows0 = _run(tmp_path / "plain", *args)
        assert len(calls) == n  # not called with the switch off
    finally:
        modeling_llama.apply_rotary_pos_emb = rope
    keys = ("loss", "grad_norm", "reward/mean", "mismatch/abs_logprob_diff", "policy/entropy")
    assert all(k in r for r in rows for k in keys)
    assert [[r.get(k) for k in keys] for r in rows] == [[r.get(k) for k in keys] for r in rows0]
    for (name, p), q in zip(fused.model.named_parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_jetrl_full_parameter_with_compiled_glue_stacks_qkv(tmp_path, monkeypatch):
    """A model whose q / k / v widths are multiples of 128 (a Qwen2 of hidden 256, k / v 128 wide): with
    policy.compile_glue every attention's q / k / v run as one FP8StackFunction in the no-grad log-prob passes and the
    updates (the report counts them), and the run follows the three FP8 linears' (QUARL_FP8_STACK=0) within the input
    gradient's rounding: the same rewards, losses and weights to a few parts in a thousand."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen2 import modeling_qwen2

    from quarl.models.tiny import tiny_config
    from quarl.quant.fp8_stack import FP8StackFunction
    from quarl.train import fused_glue

    monkeypatch.setattr(fused_glue, "BACKEND", "aot_eager")
    _, tok = small_tiny_model()
    cfg = tiny_config("qwen2", vocab_size=2048, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    cfg.hidden_size, cfg.intermediate_size, cfg.head_dim = 256, 256, 64

    def run(out):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        c = tiny_cfg("algo.updates_per_rollout=1", "aqn.enabled=false", "train.steps=2", "precision.mode=jetrl",
                     "policy.mode=full", "policy.compile_glue=true")
        tr = RLTrainer(c, model, tok, PROMPTS, ANSWERS, out, reward_fn=ParityReward())
        tr.train()
        return tr, read_metrics(out / "metrics.jsonl")

    rope = modeling_qwen2.apply_rotary_pos_emb
    calls = []
    apply = FP8StackFunction.apply
    monkeypatch.setattr(FP8StackFunction, "apply", lambda *a: calls.append(torch.is_grad_enabled()) or apply(*a))
    try:
        stacked, rows = run(tmp_path / "stack")
        assert stacked.policy_report["compile_glue"]["fp8_qkv_stacks"] == 2
        assert True in calls and False in calls
        n = len(calls)
        monkeypatch.setenv("QUARL_FP8_STACK", "0")
        plain, rows0 = run(tmp_path / "plain")
        assert len(calls) == n
    finally:
        modeling_qwen2.apply_rotary_pos_emb = rope
    assert [r["reward/mean"] for r in rows] == [r["reward/mean"] for r in rows0]
    for r, r0 in zip(rows, rows0, strict=True):
        assert r["loss"] == pytest.approx(r0["loss"], rel=1e-2, abs=1e-4)
    for (name, p), q in zip(stacked.model.named_parameters(), plain.model.parameters(), strict=True):
        assert ((p.float() - q.float()).norm() / q.float().norm()).item() < 5e-3, name
