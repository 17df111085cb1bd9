"""``optim.dequant_cache`` on the GPU: the RL trainer holding its frozen NVFP4 base's BF16 weights through the log-prob
pass and the updates changes nothing that is computed -- the adapters after three steps are bit-equal to a run that
decodes every call -- while the kernels' dense path decodes each weight once a step instead of once a call.

The tiny model's micro-batches are ~50 tokens, below the dense path's threshold; ``QUARL_KERNELS_DENSE_MIN_M=16`` sends
them through it, as a 7B step's thousands of tokens go.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_held_base_changes_nothing_and_decodes_once_a_step(tmp_path, monkeypatch):
    from quarl_kernels import recent_weights as rw

    from quarl.quant import QuantLinear
    from quarl.rl.trainer import RLTrainer
    from quarl.train.metrics import read_metrics
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

    monkeypatch.setenv("QUARL_KERNELS_DENSE_MIN_M", "16")

    def count_decodes(cache, into):  # misses inside each log-prob + update phase (the rollout's prefill decodes too)
        phase = cache.phase

        @contextlib.contextmanager
        def counted():
            m0 = rw.stats["misses"]
            with phase():
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
    # every weight decoded once a phase when held, against at least once a forward without (a log-prob pass and two
    # updates of two micro-batches each: 2 + 2 * 2 forwards; backwards the LRU does not serve decode again)
    assert on[1] == [14] * 3 and all(n >= 6 * 14 for n in off[1]), (on[1], off[1])
    assert auto[1] == [off[1][0], 14, 14], (auto[1], off[1])
    assert [r["dequant_cache/held_gb"] * 2**30 for r in on[2]] == [base] * 3
    assert "dequant_cache/held_gb" not in off[2][0]
    # auto: the first step measures its working set, the later ones hold the whole (tiny) base
    held = [r["dequant_cache/held_gb"] * 2**30 for r in auto[2]]
    assert held == [0, base, base] and auto[2][0]["dequant_cache/working_set_gb"] > 0
    assert rw.held_bytes() == 0  # given back after each phase
