"""GRPO must *learn*: a guard on the whole trainer, not on one of its pieces.

The other trainer tests check that steps run, log, resume and stop on NaN; none of
them would notice a trainer that runs perfectly and learns nothing (a sign flip in
the advantage, a loss that no longer reaches the LoRA weights, a learning rate that
is never applied, rewards scored against the wrong answers...). This test trains the
tiny random model on a toy verifiable task and requires the mean reward to rise
clearly within a bounded number of steps; a control run with ``optim.lr=0`` on the
same seed and data must *not* rise, so the test cannot pass on noise or on a reward
that drifts by itself.

Task: answer (2 new tokens) with text containing the letter "a". About 22% of the
tiny model's 2048 tokens contain an "a", so the random policy scores ~0.4 -- groups
have reward spread from the first step -- and a policy that learned the task scores
near 1. A random model has no structure linking tokens, though: its output rows are
independent, and with an RMS-normed hidden state of norm sqrt(64) and rows of norm
~0.16, no hidden state can move the logits of a random 22% of the vocabulary
together by more than ~0.1. So the model gets the one feature a pretrained model
would have -- the output rows of the "a" tokens share a direction (``PLANT``) -- and
LoRA in the blocks has to learn to point the hidden state along it.
"""

import pytest
import torch

from quarl.rl.trainer import RLTrainer
from quarl.train.metrics import read_metrics
from tests.rl.conftest import ANSWERS, PROMPTS, small_tiny_model, tiny_cfg

STEPS = 12
PLANT = 0.5  # norm of the shared "a" direction added to those tokens' (tied) embedding rows
WINDOW = 3  # steps averaged at each end of the run


class ContainsA:
    """Binary verifiable reward: 1 when the completion contains an "a"."""

    def components(self, texts, answers):
        acc = [float("a" in t) for t in texts]
        return {"accuracy": acc, "format": [0.0] * len(texts), "reward": acc}


def _plant_feature(model, tok) -> None:
    w = model.get_output_embeddings().weight  # [V, d], tied to the input embeddings
    g = torch.Generator().manual_seed(0)
    u = torch.randn(w.shape[1], generator=g)
    has_a = torch.tensor(["a" in tok.decode([i]) for i in range(w.shape[0])])
    with torch.no_grad():
        w[has_a] += PLANT * u / u.norm()


def _train(tmp_path, lr: float, *extra: str) -> list[float]:
    cfg = tiny_cfg(f"train.steps={STEPS}", "train.prompts_per_step=4", "rollout.group_size=8",
                   "rollout.max_new_tokens=2", "optim.micro_batch_size=32", f"optim.lr={lr}",
                   "optim.schedule=constant", "optim.max_grad_norm=1.0", "aqn.enabled=false",
                   "train.sample_every=0", *extra)
    model, tok = small_tiny_model()
    _plant_feature(model, tok)
    RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, tmp_path, reward_fn=ContainsA()).train()
    return [r["reward/mean"] for r in read_metrics(tmp_path / "metrics.jsonl")]


def _ends(rewards: list[float]) -> tuple[float, float]:
    return sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW


@pytest.mark.parametrize("lr", [1e-3, 0.0], ids=["learns", "lr0-control"])
def test_grpo_raises_mean_reward_on_a_toy_task(tmp_path, lr):
    first, last = _ends(_train(tmp_path, lr))
    assert 0.2 < first < 0.6, f"the task's base rate moved ({first:.2f}); re-tune it so groups have spread"
    if lr > 0:
        assert last >= first + 0.3, f"GRPO did not learn: mean reward {first:.2f} -> {last:.2f} in {STEPS} steps"
    else:  # nothing may move without updates: the rise above is the trainer's doing
        assert abs(last - first) < 0.15, f"reward moved without learning: {first:.2f} -> {last:.2f}"


@pytest.mark.parametrize("wgrad", ["1x128", "tiles"])
def test_jetrl_full_parameter_learns_with_either_wgrad_grouping(tmp_path, wgrad):
    """Full-parameter Jet-RL (every GEMM FP8, emulated on CPU) learns the same toy task, with Jet-RL's 1x128 X^T
    in the weight gradient and with the faster 128x128 X^T tiles (``precision.fp8_wgrad``)."""
    first, last = _ends(_train(tmp_path, 1e-3, "precision.mode=jetrl", "policy.mode=full",
                               f"precision.fp8_wgrad={wgrad}"))
    assert last >= first + 0.3, f"jetrl ({wgrad}) did not learn: mean reward {first:.2f} -> {last:.2f} in {STEPS} steps"
