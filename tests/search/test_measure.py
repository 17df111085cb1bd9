"""ModelEvaluator on a tiny model: the block-by-block replay equals a full forward; units and recipes."""

import pytest
import torch

from quarl.models import load_model
from quarl.quant import quantize_model
from quarl.search.measure import ModelEvaluator, build_units, to_recipe

FORMATS = ["nvfp4", "int8-g64", "bf16"]
EXCLUDE = ["lm_head", "*embed_tokens*"]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


@pytest.mark.parametrize("granularity,per_block", [("block", 1), ("group", 2), ("fused", 4), ("linear", 7)])
def test_units_partition_the_linears(tiny, granularity, per_block):
    model, _ = tiny
    units = build_units(model, EXCLUDE, granularity)
    n_blocks = len(model.model.layers)
    assert len(units) == per_block * n_blocks
    names = [n for u in units for n in u.linears]
    assert len(names) == len(set(names)) == 7 * n_blocks
    assert [u.block for u in units] == sorted(u.block for u in units)  # forward order


def test_cached_replay_matches_full_forward_and_quantize_model(tiny):
    model, _ = tiny
    units = build_units(model, EXCLUDE, "group")
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    ev = ModelEvaluator(model, units, FORMATS, ids, progress=False, max_cached=3)  # tiny LRU: evictions happen
    assert ev.measure((None,) * len(units)).kl == pytest.approx(0.0, abs=1e-6)
    a = tuple(i % 3 for i in range(len(units)))
    m = ev.measure(a)
    b = (0,) + a[1:]  # shares no prefix with a -> replays from the embeddings
    ev.measure(b)
    assert ev.measure(a) is m  # memoised
    full = ev.measure_on(ids, a)  # full forward passes, no cache
    assert m.loss == pytest.approx(full.loss, rel=1e-5) and m.kl == pytest.approx(full.kl, rel=1e-4, abs=1e-7)
    assert m.entropy == pytest.approx(full.entropy, rel=1e-5)
    # ... and equals the same recipe applied by quarl.quant.quantize_model (the recipe calibrate would plan)
    ev.restore()
    recipe = to_recipe(units, FORMATS, a, EXCLUDE, model=model)
    import copy

    q = copy.deepcopy(model)
    quantize_model(q, recipe)
    with torch.no_grad():
        lr = model(input_ids=ids).logits.log_softmax(-1)
        lq = q(input_ids=ids).logits.log_softmax(-1)
    kl = float((lq.exp() * (lq - lr)).sum(-1).mean())
    assert kl == pytest.approx(m.kl, rel=1e-3, abs=1e-7)
    bits = m.avg_bits
    assert 4.5 < bits < 16


def test_recipe_names_every_choice(tiny):
    model, _ = tiny
    units = build_units(model, EXCLUDE, "block")
    a = (1,) + (0,) * (len(units) - 1)
    r = to_recipe(units, FORMATS, a, EXCLUDE, model=model)  # model=: planned and checked per linear
    default = "nvfp4" if len(units) > 2 else r["default"]
    assert r["default"] == default
    assert r["overrides"] == [{"pattern": u.pattern, "format": FORMATS[f]} for u, f in zip(units, a, strict=True)
                              if FORMATS[f] != default]
    assert r["exclude"] == EXCLUDE


def test_fused_units_are_the_shards_an_engine_fuses(tiny):
    model, _ = tiny
    units = build_units(model, EXCLUDE, "fused")
    assert [u.kind for u in units[:4]] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert units[0].linears == tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    # the recipe's regex pattern selects exactly the unit's linears; to_recipe(model=) plans and checks each
    a = tuple(i % 2 for i in range(len(units)))
    r = to_recipe(units, FORMATS, a, EXCLUDE, model=model)
    assert {o["pattern"] for o in r["overrides"]} == {units[i].pattern for i in range(len(units)) if a[i] == 1}
    assert units[0].pattern.startswith("re:") and units[1].pattern == "model.layers.0.self_attn.o_proj"


def test_measure_on_scores_another_batch_against_its_own_reference(tiny):
    model, _ = tiny
    units = build_units(model, EXCLUDE, "block")
    gen = torch.Generator().manual_seed(1)
    ids, other = (torch.randint(0, 1000, (2, 16), generator=gen) for _ in range(2))
    ev = ModelEvaluator(model, units, FORMATS, ids, progress=False)
    ref = ev.reference_on(other)
    with torch.no_grad():
        logits = model(input_ids=other).logits.log_softmax(-1)
    assert ref.loss == pytest.approx(float(-logits[:, :-1].gather(-1, other[:, 1:, None]).mean()), rel=1e-5)
    assert ev.measure_on(other, (None,) * len(units)).kl_ref_quant == pytest.approx(0.0, abs=1e-6)
    assert ev.measure_on(other, (0,) * len(units)).kl_ref_quant > 0
