"""The block-by-block loop on tiny Llama / Qwen2 / Qwen3 models, every method."""

import pytest
import torch
from torch import nn

from quarl.calibrate.gptq import HessianAccumulator, relative_error
from quarl.calibrate.sequential import calibrate_model, capture_block_inputs, decoder_blocks, run_block
from quarl.quant import QuantError, QuantLinear, QuantRecipe
from quarl.quant.model import plan_formats


def _kl(ref_logits, logits):
    lr, lq = ref_logits.log_softmax(-1), logits.log_softmax(-1)
    return float((lr.exp() * (lr - lq)).sum(-1).mean())


def test_captured_inputs_reproduce_the_model(tiny, calib_batches):
    """Running the blocks on the captured cache, then norm + head, gives the model's own logits."""
    m, _ = tiny("qwen3")
    cache = capture_block_inputs(m, calib_batches[:1])
    _, blocks = decoder_blocks(m)
    for b in blocks:
        cache = [(o, kw) for o, (_, kw) in zip(run_block(b, cache), cache)]
    with torch.no_grad():
        logits = m.lm_head(m.model.norm(cache[0][0]))
        torch.testing.assert_close(logits, m(calib_batches[0]).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kind,method",
    [
        ("llama", "rtn"),
        ("llama", "gptq"),
        ("llama", "awq"),
        ("llama", "awq+gptq"),
        ("qwen2", "awq+gptq"),
        ("qwen3", "awq+gptq"),
    ],
)
def test_every_method_quantizes_every_block_linear(tiny, calib_batches, eval_ids, kind, method):
    m, _ = tiny(kind)
    with torch.no_grad():
        ref = m(eval_ids).logits
    plan = plan_formats(m, QuantRecipe.load({"default": "nvfp4"}))
    res = calibrate_model(m, plan, calib_batches, method=method, progress=False)
    ql = {n for n, mod in m.named_modules() if isinstance(mod, QuantLinear)}
    assert ql == set(plan) and len(ql) == 14  # 2 blocks x 7 linears; lm_head stays dense
    assert isinstance(m.lm_head, nn.Linear) and not isinstance(m.lm_head, QuantLinear)
    assert [x.name for x in res.layers] and all(0 < x.rel_error < 0.05 for x in res.layers)
    if method.startswith("awq"):
        assert res.awq and all(0 <= v["alpha"] < 1 for v in res.awq.values())
        # every layer has a scaling group except o_proj: tiny models use GQA, so no v -> o pair
        assert all((x.awq_alpha is None) == x.name.endswith("o_proj") for x in res.layers)
    with torch.no_grad():
        out = m(eval_ids).logits
    assert torch.isfinite(out).all() and _kl(ref, out) < 0.01


def test_gptq_has_lower_reconstruction_error_than_rtn(tiny, calib_batches):
    errs = {}
    for method in ("rtn", "gptq"):
        m, _ = tiny("llama")
        plan = plan_formats(m, QuantRecipe.load({"default": "int3-g32"}))
        res = calibrate_model(m, plan, calib_batches, method=method, progress=False)
        errs[method] = {x.name: x.rel_error for x in res.layers}
    # block 0 sees identical inputs in both runs, so the comparison is layer for layer
    for name, e in errs["gptq"].items():
        if ".layers.0." in name:
            assert e < errs["rtn"][name], name
    assert sum(errs["gptq"].values()) < 0.8 * sum(errs["rtn"].values())


def test_reported_error_is_measured_on_the_real_block_inputs(tiny, calib_batches):
    """The per-layer error equals ||WX - QX||^2/||WX||^2 recomputed from captured inputs of block 0."""
    m, _ = tiny("llama")
    cache = capture_block_inputs(m, calib_batches)
    block = m.model.layers[0]
    acc = HessianAccumulator(64)
    h = block.mlp.gate_proj.register_forward_pre_hook(lambda _m, a: acc.add(a[0]))
    run_block(block, cache)
    h.remove()
    w = block.mlp.gate_proj.weight.detach().clone()
    plan = plan_formats(m, QuantRecipe.load({"default": "int4-g32"}))
    res = calibrate_model(m, plan, calib_batches, method="gptq", progress=False)
    got = next(x for x in res.layers if x.name == "model.layers.0.mlp.gate_proj")
    q = m.model.layers[0].mlp.gate_proj.dequantized_weight(torch.float32)
    assert got.rel_error == pytest.approx(relative_error(w, q, acc.H), rel=1e-4)


def test_mixed_recipe_keeps_high_precision_layers_dense_and_shares_fused_scales(tiny, calib_batches):
    m, _ = tiny("llama")
    recipe = QuantRecipe.load(
        {
            "default": "nvfp4",
            "overrides": [
                {"pattern": "*.mlp.down_proj", "format": "int8-g32"},
                {"pattern": "re:model\\.layers\\.1\\.self_attn\\..*", "format": "bf16"},
            ],
        }
    )
    plan = plan_formats(m, recipe)
    calibrate_model(m, plan, calib_batches, method="awq+gptq", progress=False)
    l0, l1 = m.model.layers
    assert type(l1.self_attn.q_proj) is nn.Linear
    assert l0.mlp.down_proj.format_name == "int" and l0.self_attn.q_proj.format_name == "nvfp4"
    gs = [getattr(l0.self_attn, p).weight_global_scale for p in ("q_proj", "k_proj", "v_proj")]
    assert torch.equal(gs[0], gs[1]) and torch.equal(gs[1], gs[2])  # vLLM fuses q/k/v: one global scale
    assert torch.equal(l0.mlp.gate_proj.weight_global_scale, l0.mlp.up_proj.weight_global_scale)


def test_without_propagation_blocks_see_full_precision_inputs(tiny, calib_batches):
    m1, _ = tiny("llama")
    m2, _ = tiny("llama")
    plan = plan_formats(m1, QuantRecipe.load({"default": "int2-g32"}))
    r1 = calibrate_model(m1, plan, calib_batches, method="rtn", progress=False, propagate_quantized=True)
    r2 = calibrate_model(m2, plan, calib_batches, method="rtn", progress=False, propagate_quantized=False)
    e1 = {x.name: x.rel_error for x in r1.layers}
    e2 = {x.name: x.rel_error for x in r2.layers}
    assert all(e1[n] == e2[n] for n in e1 if ".layers.0." in n)  # block 0: same inputs
    assert any(e1[n] != e2[n] for n in e1 if ".layers.1." in n)  # block 1: different inputs


def test_bad_inputs_are_refused(tiny, calib_batches):
    m, _ = tiny("llama")
    with pytest.raises(QuantError, match="unknown calibration method"):
        calibrate_model(m, {}, calib_batches, method="smoothquant")
    plan = plan_formats(m, QuantRecipe.load({"default": "int4-g128"}))  # K = 64: not a multiple of 128
    with pytest.raises(QuantError, match="model.layers.0.*multiple of the block size"):
        calibrate_model(m, plan, calib_batches, method="gptq", progress=False)


def test_awq_capture_keeps_only_the_searched_batches_but_averages_all(tiny, calib_batches):
    from quarl.calibrate.awq import channel_mean_abs
    from quarl.calibrate.sequential import _capture_awq_inputs

    m, _ = tiny("llama")
    cache = capture_block_inputs(m, calib_batches)
    names = ["mlp.down_proj", "self_attn.q_proj"]
    all_feats, all_means = _capture_awq_inputs(m.model.layers[0], cache, names, keep=None)
    feats, means = _capture_awq_inputs(m.model.layers[0], cache, names, keep=1)
    assert len(all_feats["mlp.down_proj"]) == len(calib_batches) and len(feats["mlp.down_proj"]) == 1
    for n in names:
        torch.testing.assert_close(means[n], all_means[n])
        torch.testing.assert_close(means[n], channel_mean_abs(all_feats[n]))


@pytest.mark.parametrize("spec", ["nvfp4", "int3-g32"])
def test_fused_gptq_of_layers_sharing_an_input_equals_one_loop_per_layer(tiny, calib_batches, monkeypatch, spec):
    """q/k/v and gate/up see the same activations (one Hessian): their rows share one GPTQ column loop.
    That is the same GPTQ: the same codes and scales as one loop per layer, on a device of choice."""
    import quarl.calibrate.sequential as seq

    loops = []
    gptq = seq.gptq_quantize
    monkeypatch.setattr(seq, "gptq_quantize", lambda w, *a, **k: loops.append(w.shape[0]) or gptq(w, *a, **k))
    row_scaled = seq._ROW_SCALED

    def run(fuse: bool, device=None):
        m, _ = tiny("llama")
        plan = plan_formats(m, QuantRecipe.load({"default": spec}))
        monkeypatch.setattr(seq, "_ROW_SCALED", row_scaled if fuse else ())
        loops.clear()
        res = calibrate_model(m, plan, calib_batches, method="gptq", gptq={"device": device}, progress=False)
        assert len(loops) == (8 if fuse else 14)  # per block: q+k+v, o, gate+up, down -- or all 7 alone
        return {n: mod.qtensor() for n, mod in m.named_modules() if isinstance(mod, QuantLinear)}, res

    (a, ra), (b, rb), (c, _) = run(False), run(True), run(True, "cpu")
    assert a.keys() == b.keys() == c.keys() and len(a) == 14
    for n in a:
        for t in a[n].tensors:
            assert torch.equal(a[n].tensors[t], b[n].tensors[t]), (n, t)
            assert torch.equal(b[n].tensors[t], c[n].tensors[t]), (n, t)
    errs = {x.name: x.rel_error for x in ra.layers}
    assert all(x.rel_error == pytest.approx(errs[x.name], rel=1e-5) for x in rb.layers)


def test_layers_fed_the_same_tensor_share_one_hessian_with_the_same_bits(tiny, calib_batches):
    """q/k/v and gate/up get one accumulator each (skipped repeats), bit-identical to one per layer."""
    import quarl.calibrate.sequential as seq

    m, _ = tiny("qwen2")
    cache = capture_block_inputs(m, calib_batches)
    _, blocks = decoder_blocks(m)
    block = blocks[0]
    names = [n for n, mod in block.named_modules() if isinstance(mod, nn.Linear)]
    acc, _ = seq._hessians(block, cache, names)
    own = {n: HessianAccumulator(block.get_submodule(n).in_features) for n in names}
    hooks = [block.get_submodule(n).register_forward_pre_hook(lambda _m, a, n=n: own[n].add(a[0])) for n in names]
    run_block(block, cache)
    for h in hooks:
        h.remove()
    assert all(torch.equal(acc[n].H, own[n].H) and acc[n].n == own[n].n for n in names)
    assert acc["self_attn.k_proj"] is acc["self_attn.q_proj"] is acc["self_attn.v_proj"]
    assert acc["mlp.up_proj"] is acc["mlp.gate_proj"]
    assert len({id(a) for a in acc.values()}) == 4  # qkv, o, gate/up, down
