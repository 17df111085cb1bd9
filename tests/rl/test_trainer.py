"""The RL loop on the tiny random model: it learns something, resumes exactly, stops on NaN."""

import json

import pytest
import torch

from quarl.rl.trainer import RLDivergedError, RLTrainer
from quarl.train.checkpoint import CheckpointManager
from quarl.train.metrics import read_metrics
from quarl.train.optim import lr_at
from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

VOLATILE = ("time/", "throughput/", "memory/", "rollout/tokens_per_s", "engine/capture_s", "engine/warmup_s",
            "engine/graph_captures")


def _trainer(cfg, out, reward=None):
    model, tok = small_tiny_model()
    return RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, out, reward_fn=reward or ParityReward())


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_grpo_steps_update_only_lora_and_log_everything(tmp_path):
    tr = _trainer(tiny_cfg("algo.updates_per_rollout=2"), tmp_path)
    base = {n: p.detach().clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    base_bufs = {n: b.clone() for n, b in tr.model.named_buffers()}
    lora = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    summary = tr.train()
    assert summary["end_step"] == 3 and summary["optimizer"] == "adamw"
    now = dict(tr.model.named_parameters())
    assert all(torch.equal(now[n], v) for n, v in base.items())  # frozen base and norms untouched (AQN restored)
    assert all(torch.equal(b, base_bufs[n]) for n, b in tr.model.named_buffers() if n in base_bufs)
    assert any(not torch.equal(now[n], v) for n, v in lora.items())  # LoRA moved
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("reward/mean", "reward/std", "reward/accuracy", "policy/entropy", "response/length_mean",
                "policy/clip_fraction", "grad_norm", "aqn/sigma", "time/rollout_s", "time/logprob_s",
                "time/update_s", "rollout/tokens_per_s", "memory/peak_gb", "mismatch/abs_logprob_diff",
                "mismatch/kl", "lr", "loss"):
        assert key in rows[-1], key
    assert [r["aqn/sigma"] for r in rows] == pytest.approx([0.0, 1e-2, 5e-4])  # 3 stages over 3 steps
    assert rows[0]["mismatch/abs_logprob_diff"] < 1e-4  # stage 0: no noise, rollout == trainer
    assert rows[1]["mismatch/abs_logprob_diff"] > rows[0]["mismatch/abs_logprob_diff"]  # noise only in the rollout
    assert (tmp_path / "tensorboard").is_dir() and (tmp_path / "samples.jsonl").exists()
    ckpt = tmp_path / "checkpoints" / "step-000003"
    assert (ckpt / "adapter" / "adapter_config.json").exists()
    assert json.loads((ckpt / "state.json").read_text())["sampler"] == {"epoch": 0, "position": 6, "n": 6, "seed": 2025}


def test_resume_is_identical_to_a_straight_run(tmp_path):
    cfg = tiny_cfg("algo.updates_per_rollout=2")
    straight = _trainer(cfg, tmp_path / "a")
    straight.train()

    first = _trainer(cfg, tmp_path / "b")
    first.train(stop_after=2)
    assert (tmp_path / "b" / "checkpoints" / "step-000002" / "state.json").exists()
    resumed = _trainer(cfg, tmp_path / "b")  # a fresh process would rebuild everything like this
    summary = resumed.train()
    assert summary["start_step"] == 2

    pa = dict(straight.model.named_parameters())
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p, pa[n]), n
    ra, rb = read_metrics(tmp_path / "a" / "metrics.jsonl"), read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert _stable(ra) == _stable(rb)


def test_dapo_dynamic_sampling_and_overlong_filter(tmp_path):
    cfg = tiny_cfg("algo.algo=dapo", "algo.updates_per_rollout=1", "train.steps=2", "rollout.max_new_tokens=4")
    assert cfg.resolved().algo.loss_agg == "token" and cfg.resolved().algo.dynamic_sampling
    tr = _trainer(cfg, tmp_path)
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    for r in rows:
        assert 1 <= r["sampling/rounds"] <= 3
        assert r["sampling/groups_kept"] <= 2
        # on-policy: ratio exactly 1
        if r["update/skipped"] == 0.0:
            assert r["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    # 4 new tokens and an EOS that a random model never picks: every answer truncated -> all masked out
    assert all(r["response/truncated_fraction"] == 1.0 for r in rows)
    assert all(r["update/skipped"] == 1.0 for r in rows)


def test_nan_reward_stops_with_last_checkpoint_intact(tmp_path):
    class NaNAtSecondStep(ParityReward):
        def components(self, texts, answers):
            out = super().components(texts, answers)
            if self.calls == 2:
                out["reward"] = [float("nan")] * len(texts)
            return out

    tr = _trainer(tiny_cfg("train.checkpoint_every=1"), tmp_path, NaNAtSecondStep())
    with pytest.raises(RLDivergedError, match="NaN/Inf rewards.*step-000001"):
        tr.train()
    mgr = CheckpointManager(tmp_path / "checkpoints")
    assert mgr.latest().name == "step-000001"
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0]


def test_nan_loss_stops_before_the_optimizer_step(tmp_path):
    holder = {}

    class PoisonAtSecondStep(ParityReward):
        def components(self, texts, answers):
            if self.calls == 1:  # second rollout done: corrupt a LoRA weight so the loss is NaN
                p = dict(holder["tr"].model.named_parameters())["model.layers.1.mlp.down_proj.lora_B"]
                with torch.no_grad():
                    p.fill_(float("nan"))
            return super().components(texts, answers)

    tr = _trainer(tiny_cfg("train.checkpoint_every=1"), tmp_path, PoisonAtSecondStep())
    holder["tr"] = tr
    with pytest.raises(RLDivergedError, match="policy loss is nan.*weights were not changed"):
        tr.train()
    sd = CheckpointManager(tmp_path / "checkpoints").latest()
    from safetensors.torch import load_file

    assert sd.name == "step-000001"
    assert all(torch.isfinite(t).all() for t in load_file(str(sd / "trainable.safetensors")).values())


def test_lr_schedule():
    from quarl.rl.config import OptimConfig

    c = OptimConfig(lr=1.0, warmup_ratio=0.1, schedule="cosine")
    # 20 steps: 2 warmup steps at 1/3, 2/3, then cosine from 1 down (never 0 on the last step)
    assert [lr_at(s, 20, c) for s in (0, 1)] == pytest.approx([1 / 3, 2 / 3])
    assert lr_at(2, 20, c) == pytest.approx(1.0)
    assert lr_at(11, 20, c) == pytest.approx(0.5)
    assert 0 < lr_at(19, 20, c) < 0.01
    assert lr_at(19, 20, OptimConfig(lr=1.0, warmup_ratio=0, schedule="constant")) == 1.0


def test_full_finetuning_with_kl_to_a_frozen_reference(tmp_path):
    cfg = tiny_cfg("policy.mode=full", "policy.format=bf16", "algo.beta=0.1", "train.steps=2", "optim.lr=1e-3",
                   "algo.updates_per_rollout=1")
    tr = _trainer(cfg, tmp_path)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    assert all(p.requires_grad for p in tr.model.parameters()) and tr.ref_model is not None
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["policy/kl_ref"] == pytest.approx(0.0, abs=1e-9)  # policy == reference before any update
    assert rows[1]["policy/kl_ref"] > 0
    changed = [n for n, p in tr.model.named_parameters() if not torch.equal(p, before[n])]
    assert any("mlp" in n for n in changed) and any("layernorm" in n for n in changed)  # every weight trains
    ref = dict(tr.ref_model.named_parameters())
    assert all(torch.equal(ref[n], before[n]) for n in ref)  # the reference never moves


@pytest.mark.parametrize("fmt", ["mxfp4", "nf4", "bf16"])
def test_other_base_formats_and_lora_reference(tmp_path, fmt):
    cfg = tiny_cfg(f"policy.format={fmt}", "algo.beta=0.05", "train.steps=2", "algo.updates_per_rollout=1",
                   "policy.gradient_checkpointing=true")
    tr = _trainer(cfg, tmp_path)
    summary = tr.train()
    assert summary["policy"]["format"] == fmt
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["policy/kl_ref"] == pytest.approx(0.0, abs=1e-9)  # LoRA B starts at 0: policy == base
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


def test_resume_from_the_s3_mirror_on_a_fresh_machine(tmp_path, s3_bucket):
    remote = f"s3://{s3_bucket}/run/rl/adapter.checkpoints"
    cfg = tiny_cfg("train.steps=2")
    model, tok = small_tiny_model()
    first = RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, tmp_path / "pod1", reward_fn=ParityReward(),
                      checkpoint_remote=remote)
    first.train(stop_after=1)
    model, tok = small_tiny_model()  # a new pod: empty local disk, same remote
    second = RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, tmp_path / "pod2", reward_fn=ParityReward(),
                       checkpoint_remote=remote)
    summary = second.train()
    assert summary["start_step"] == 1 and summary["end_step"] == 2
    rows = read_metrics(tmp_path / "pod2" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]  # the history came back with the checkpoint
    assert (tmp_path / "pod2" / "checkpoints" / "step-000001" / "trainable.safetensors").exists()


def test_bf16_policy_keeps_fp32_lora_weights(tmp_path):
    tr = _trainer(tiny_cfg("policy.dtype=bfloat16", "train.steps=1", "algo.updates_per_rollout=1"), tmp_path)
    lora = [p for n, p in tr.model.named_parameters() if p.requires_grad]
    assert lora and all(p.dtype == torch.float32 for p in lora)
    assert tr.model.model.embed_tokens.weight.dtype == torch.bfloat16
    before = [p.detach().clone() for p in lora]
    tr.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, lora))
    assert all(p.dtype == torch.float32 for p in lora)


def test_kept_dense_weights_are_given_back_after_each_update(tmp_path, monkeypatch):
    """The GPU dense path keeps one decoder layer's BF16 weights between a forward and its backward
    (``quarl_kernels.recent_weights``); the trainer gives them back after every update phase, before the next rollout
    plans its KV cache (``dispatch.release_transients``)."""
    from quarl.quant import dispatch

    calls = []
    monkeypatch.setattr(dispatch, "release_transients", lambda: calls.append(1))
    summary = _trainer(tiny_cfg(), tmp_path).train()
    assert summary["end_step"] == 3 and len(calls) == 3


def test_free_cache_false_keeps_the_fast_engine_cache_and_changes_nothing_else(tmp_path):
    """rollout.free_cache (verl's free_cache_engine): by default the fast engine frees its KV cache after each
    rollout (the update gets the memory); false keeps it (and on CUDA its graphs) for the next rollout. The run is
    the same either way: equal metrics and adapter weights."""
    runs = {}
    for free in ("true", "false"):
        tr = _trainer(tiny_cfg("rollout.engine=fast", f"rollout.free_cache={free}", "train.steps=2"),
                      tmp_path / free)
        tr.train()
        runs[free] = tr
    assert runs["true"].generator._state is None and not runs["true"].generator.keep_cache
    assert runs["false"].generator._state is not None and runs["false"].generator.keep_cache
    a, b = (read_metrics(tmp_path / f / "metrics.jsonl") for f in ("true", "false"))
    assert _stable(a) == _stable(b) and len(a) == 2
    # the engine's counters are logged per step: its decode steps cover the longest answer, a prompt's G samples
    # share one prefill
    for m in a:
        assert m["engine/steps"] >= m["response/length_max"] and m["engine/prefilled_rows"] >= 1
    G, prompts = runs["true"].cfg.rollout.group_size, runs["true"].cfg.train.prompts_per_step
    assert a[0]["engine/prefilled_rows"] <= prompts < prompts * G
    lora = {n: p for n, p in runs["true"].model.named_parameters() if p.requires_grad}
    assert all(torch.equal(p, dict(runs["false"].model.named_parameters())[n]) for n, p in lora.items())


def test_max_num_batched_tokens_reaches_the_fast_engine_and_is_validated(tmp_path):
    """rollout.max_num_batched_tokens (vLLM's knob) is the fast engine's prefill chunk; one name, one default
    (quarl.engine.rollout.DEFAULT_MAX_NUM_BATCHED_TOKENS), rejected when the config is built if it is < 1."""
    from quarl.engine.rollout import DEFAULT_MAX_NUM_BATCHED_TOKENS
    from quarl.rl.config import RolloutConfig

    assert RolloutConfig().max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS
    tr = _trainer(tiny_cfg("rollout.engine=fast", "rollout.max_num_batched_tokens=7", "train.steps=1"), tmp_path)
    assert tr.generator.max_num_batched_tokens == 7
    with pytest.raises(ValueError, match="rollout.max_num_batched_tokens must be >= 1"):
        tiny_cfg("rollout.max_num_batched_tokens=0")


def test_trims_read_once_equal_the_per_micro_batch_ones():
    """``RLTrainer._trims`` (one read for every micro-batch) gives each micro-batch the padding the per-call read
    gave: the first prompt column any of its rows uses, and its longest completion (at least 1)."""
    from types import SimpleNamespace

    from quarl.rl.trainer import RLTrainer

    pm = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    cm = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0]])
    r = SimpleNamespace(prompt_mask=pm, completion_mask=cm)
    mbs = [slice(0, 2), slice(2, 3), None, slice(3, 5)]

    def per_call(rows):
        first = int(torch.nonzero(pm[rows].sum(0) > 0)[0])
        return first, max(int(cm[rows].sum(1).max()), 1)

    assert RLTrainer._trims(r, mbs) == [per_call(slice(0, 2)), per_call(slice(2, 3)), None, per_call(slice(3, 5))]
    assert RLTrainer._trims(r, mbs) == [(1, 2), (3, 1), None, (0, 3)]
