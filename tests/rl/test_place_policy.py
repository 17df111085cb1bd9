"""place_policy: the trainer moves a pre-quantized model to its device and dtype without
touching the packed tensors (Module.to(dtype) would cast NVFP4's FP8 block scales and FP32
global scale, changing the weights and taking the GPU kernels out of play)."""

import copy

import torch

from quarl.quant import QuantLinear, quantize_model
from quarl.train.policy import place_policy
from tests.rl.conftest import small_tiny_model


def test_place_policy_keeps_packed_tensors_and_casts_the_rest():
    model, _ = small_tiny_model("qwen2")
    quantize_model(model, {"default": "nvfp4"})
    q = model.model.layers[0].self_attn.q_proj
    before = {n: t.clone() for n, t in q.named_buffers()}
    w_ref = q.dequantized_weight(torch.float32)

    plain = copy.deepcopy(model).to(dtype=torch.bfloat16)  # QuantLinear._apply protects them in Module.to too
    nq = plain.model.layers[0].self_attn.q_proj
    assert nq.weight_scale.dtype == torch.float8_e4m3fn and nq.weight_global_scale.dtype == torch.float32

    place_policy(model, torch.device("cpu"), torch.bfloat16)
    for n, t in q.named_buffers():
        assert t.dtype == before[n].dtype, n  # uint8 codes, float8_e4m3fn scales, float32 global scale
        assert torch.equal(
            t.view(torch.uint8) if t.element_size() == 1 else t,
            before[n].view(torch.uint8) if t.element_size() == 1 else before[n],
        ), n
    assert torch.equal(q.dequantized_weight(torch.float32), w_ref)  # the base weight did not move
    assert q.bias.dtype == torch.bfloat16 and q.compute_dtype == torch.bfloat16
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.bfloat16
    assert all(m.compute_dtype == torch.bfloat16 for m in model.modules() if isinstance(m, QuantLinear))


def test_place_policy_casts_a_high_precision_base():
    model, _ = small_tiny_model("llama")
    quantize_model(model, {"default": "bf16"})  # frozen high-precision QuantLinear: its `weight` is cast
    place_policy(model, torch.device("cpu"), torch.bfloat16)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
