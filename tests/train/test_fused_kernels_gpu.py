"""Liger's fused kernels inside quarl's training models, on the GPU: the loss and every gradient agree with
transformers' eager code, for a BF16 model and for full-parameter Jet-RL (FP8 GEMMs in every projection).

Run through the device tool with liger-kernel installed; skipped where either is missing."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("liger_kernel", reason="needs liger-kernel (quarl's gpu extra)")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _qwen2(layers=2):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=512, intermediate_size=1408, num_attention_heads=8, num_key_value_heads=2,
                      vocab_size=4096, num_hidden_layers=layers, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        return Qwen2ForCausalLM(cfg).to(torch.bfloat16)


def _loss_and_grads(model, ids):
    logits = model(input_ids=ids).logits[:, :-1].float()  # [B, T-1, V]
    loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


@pytest.fixture
def restore_transformers(monkeypatch):
    """Liger replaces module-level names of transformers' qwen2 (RoPE function, norm and MLP classes): put them
    back after the test, so other tests in this process run transformers' own code."""
    from transformers.models.qwen2 import modeling_qwen2

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))


@pytest.mark.parametrize("recipe", ["bf16", "jetrl"])
def test_liger_matches_eager_loss_and_gradients(recipe, restore_transformers):
    from quarl.quant import quantize_model
    from quarl.rl.precision import _jetrl_recipe
    from quarl.train.fused_kernels import apply_liger_kernel

    ids = torch.randint(0, 4096, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = {}
    for liger in (False, True):
        model = _qwen2()
        if recipe == "jetrl":
            quantize_model(model, _jetrl_recipe("full", "1x128"))
        if liger:
            report = apply_liger_kernel(model, "cuda")
            assert report["modules"] == 3 * 2 + 1  # 2 norms + the MLP per layer, the final norm
        out[liger] = _loss_and_grads(model, ids)
    (l0, g0), (l1, g1) = out[False], out[True]
    assert abs(l0 - l1) <= 2e-3 * abs(l0), (l0, l1)
    assert g0.keys() == g1.keys()
    for n in g0:  # bf16 activations in a different kernel order: agreement to bf16 rounding, direction near-exact
        cos = F.cosine_similarity(g0[n].flatten(), g1[n].flatten(), dim=0).item()
        assert cos > 0.999, (n, cos)
        assert (g0[n] - g1[n]).norm() <= 0.05 * g0[n].norm(), n
