"""AWQ: folding scales never changes the full-precision function; the search helps on outlier channels."""

import copy

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from quarl.calibrate.awq import ScalingGroup, fold_scales, scaling_groups, search_group
from quarl.calibrate.sequential import capture_block_inputs, run_block
from quarl.quant import QuantError, get_format, make_config


def small_model(kind: str, kv_heads: int = 2, seed: int = 0):
    kw = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 128,
    }
    if kind != "qwen2":
        kw["head_dim"] = 16
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        m = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **kw)).eval()
        for n, p in m.named_parameters():  # non-trivial norm weights and biases, so folding is really tested
            if n.endswith("norm.weight"):
                p.data.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.data.normal_(0, 0.1)
    return m


@pytest.mark.parametrize("kind,kv_heads", [("llama", 2), ("llama", 4), ("qwen2", 2), ("qwen2", 4), ("qwen3", 2)])
def test_folding_scales_leaves_the_full_precision_block_unchanged(kind, kv_heads):
    m = small_model(kind, kv_heads)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    cache = capture_block_inputs(m, [ids])
    block = m.model.layers[0]
    before = run_block(block, cache)[0]
    logits_before = m(ids).logits
    groups = scaling_groups(block)
    assert any(g.prev == "self_attn.v_proj" for g in groups) == (kv_heads == 4)  # v->o only without GQA
    g = torch.Generator().manual_seed(1)
    for grp in groups:
        k = block.get_submodule(grp.layers[0]).in_features
        fold_scales(block, grp, torch.empty(k).uniform_(0.2, 5.0, generator=g))
    after = run_block(block, cache)[0]
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m(ids).logits, logits_before, rtol=1e-4, atol=1e-4)
    # and the scales really went somewhere: the weights changed
    assert not torch.equal(
        block.self_attn.q_proj.weight, small_model(kind, kv_heads).model.layers[0].self_attn.q_proj.weight
    )


class _Toy(nn.Module):
    """norm -> lin, the smallest AWQ group (RMSNorm-like: output = x * weight)."""

    def __init__(self, k=128, n=64, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(k))
        self.lin = nn.Linear(k, n, bias=False)
        self.lin.weight.data = torch.randn(n, k, generator=g) * 0.05

    def forward(self, x):
        return self.lin(x * self.norm.weight)


@pytest.mark.parametrize("spec", ["int4-g128", "int3-g128", "nvfp4"])
@torch.no_grad()
def test_search_prefers_scaling_when_inputs_have_outlier_channels(spec):
    toy = _Toy()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 32, 128, generator=g)
    x[..., :4] *= 30  # a few salient channels, as in LLM activations
    xs = [x[:2], x[2:]]
    grp = ScalingGroup("norm", ["lin"], "", "lin")
    plan = {"lin": make_config(spec)}
    w0 = toy.lin.weight.detach().clone()
    search_group(toy, grp, xs, lambda i, xi: toy.lin(xi), plan, n_grid=20)
    assert torch.equal(toy.lin.weight, w0)  # the search restores the weights
    assert len(grp.losses) == 20
    # alpha = 0 is exactly RTN
    fmt, cfg = get_format(make_config(spec).name), make_config(spec)
    rtn = fmt.dequantize(fmt.quantize(w0, cfg))
    rtn_loss = sum(float((xi @ (w0 - rtn).t()).pow(2).sum()) for xi in xs) / sum(
        xi.shape[0] * xi.shape[1] * 64 for xi in xs
    )
    assert grp.losses[0] == pytest.approx(rtn_loss, rel=1e-4)
    assert grp.alpha > 0 and min(grp.losses) < 0.8 * grp.losses[0]
    # folding the chosen scales then quantizing reproduces the searched loss
    ref_out = [toy(xi) for xi in xs]
    fold_scales(toy, grp, grp.scales)
    wq = fmt.dequantize(fmt.quantize(toy.lin.weight.detach(), cfg))
    out = [(xi * toy.norm.weight) @ wq.t() for xi in xs]
    loss = sum(float((o - r).pow(2).sum()) for o, r in zip(out, ref_out)) / sum(r.numel() for r in ref_out)
    assert loss == pytest.approx(min(grp.losses), rel=1e-3)


def test_groups_without_quantized_layers_are_skipped_and_unknown_blocks_refused():
    toy = _Toy()
    grp = ScalingGroup("norm", ["lin"], "", "lin")
    search_group(toy, grp, [torch.randn(2, 8, 128)], lambda i, x: toy.lin(x), {"lin": None})
    assert grp.scales is None and grp.losses == []
    with pytest.raises(QuantError, match="AWQ supports Llama/Qwen2/Qwen3"):
        scaling_groups(nn.Sequential(nn.Linear(4, 4)))


def test_fused_shards_are_searched_with_their_shared_global_scale():
    m = small_model("llama")
    block = copy.deepcopy(m.model.layers[0])
    with torch.no_grad():
        block.self_attn.k_proj.weight.mul_(4)  # shards with different amax
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    cache = capture_block_inputs(m, [ids])
    grp = scaling_groups(block)[0]
    feats = []
    h = block.self_attn.q_proj.register_forward_pre_hook(lambda _m, a: feats.append(a[0]))
    run_block(block, cache)
    h.remove()
    plan = {n: make_config("nvfp4") for n in grp.layers}
    run = lambda i, x: block.self_attn(hidden_states=x, **cache[i][1])[0]
    search_group(block, grp, feats, run, plan, n_grid=4)
    assert grp.scales is not None and torch.isfinite(torch.tensor(grp.losses)).all()


@torch.no_grad()
def test_search_batches_limits_the_loss_not_the_statistics():
    toy = _Toy()
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, 16, 128, generator=g) * (1 + 10 * (i == 1)) for i in range(3)]
    plan = {"lin": make_config("int4-g128")}

    def search(x, **kw):
        grp = ScalingGroup("norm", ["lin"], "", "lin")
        return search_group(toy, grp, x, lambda i, xi: toy.lin(xi), plan, n_grid=6, **kw)

    limited, first_only, full = search(xs, search_batches=1), search(xs[:1]), search(xs)
    assert limited.losses[0] == pytest.approx(first_only.losses[0])  # alpha = 0 (RTN): loss on batch 0 only
    assert limited.losses[0] != pytest.approx(full.losses[0])
    # for alpha > 0 the scales come from all batches' statistics, not from batch 0 alone
    assert limited.losses[3] != pytest.approx(first_only.losses[3])
