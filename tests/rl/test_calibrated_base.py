"""RL starts from a calibrated (compressed-tensors) checkpoint, as in the QeRL DAG
(calibrate -> rl): the checkpoint's packed weights are kept and LoRA is attached."""

import torch

from quarl.models import load_model
from quarl.quant import QuantLinear, quantize_model
from quarl.quant.checkpoint import save_quantized
from quarl.rl.config import PolicyConfig
from quarl.train.policy import build_policy


def test_build_policy_on_a_calibrated_checkpoint_keeps_weights_and_adds_lora(tmp_path):
    model, tok = load_model("tiny-llama")
    quantize_model(model, {"default": "nvfp4"})
    save_quantized(model, tok, tmp_path / "ckpt")
    ids = torch.randint(0, 1000, (1, 8))
    with torch.no_grad():
        ref = model(ids).logits

    loaded, _ = load_model(tmp_path / "ckpt")  # load_model routes compressed-tensors to quarl's reader
    q = loaded.model.layers[0].self_attn.q_proj
    assert isinstance(q, QuantLinear) and q.format_name == "nvfp4"
    packed = q.weight_packed.clone()
    rep = build_policy(loaded, PolicyConfig(mode="lora", format="nvfp4", lora_r=4, lora_alpha=8))
    assert rep["format"] == "calibrated checkpoint" and rep["trainable_params"] > 0
    assert torch.equal(q.weight_packed, packed)  # not re-quantized
    assert q.lora_A.requires_grad and q.lora_A.abs().sum() > 0  # A initialized, B zero: a no-op adapter
    trainable = [n for n, p in loaded.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ref, atol=1e-4, rtol=1e-4)
    loaded(ids).logits.sum().backward()
    assert q.lora_B.grad is not None and q.lora_B.grad.abs().sum() > 0


def test_a_calibrated_base_in_another_format_is_labelled_with_the_format_used(caplog):
    from quarl.rl.config import RLConfig
    from quarl.rl.stage import _policy_format

    model, _ = load_model("tiny-llama")
    quantize_model(model, {"default": "int4-g32"})  # what calibrate produced
    cfg = RLConfig(policy=PolicyConfig(format="nvfp4"))  # what rl was asked for
    with caplog.at_level("WARNING"):
        assert _policy_format(model, cfg) == "int4-g32"
    assert "arrived quantized as int4-g32 but policy.format=nvfp4" in caplog.text
    caplog.clear()
    assert _policy_format(model, RLConfig(policy=PolicyConfig(format="int4-g32"))) == "int4-g32"
    assert not caplog.text  # no warning when they agree
