"""AQN: schedule values (QeRL Eq. 8 / release code), noise placement, restore, no accumulation,
and the rollout actually sampling from the noisy model."""

import math

import pytest
import torch

from quarl.engine.rollout import HFGenerator, SamplingParams
from quarl.models import load_model
from quarl.rl.aqn import AQN, AQNConfig, sigma_at, sigma_for_stage, stage_of


def _release_sigma(step, total_steps, start, end, num_stages):
    """QeRL's release (trl_trainer/noise_scheduler.get_sigma_by_step + grpo_trainer), transcribed."""
    trend = [start * (end / start) ** (i / (num_stages - 2)) for i in range(num_stages - 1)]
    step = min(step, total_steps)
    interval = int(step // (total_steps / (len(trend) + 1)))
    if interval == 0:
        return 0.0
    return trend[min(interval - 1, len(trend) - 1)]


def test_exponential_schedule_exact_values():
    cfg = AQNConfig()  # 1e-2 -> 5e-4, 10 stages
    total = 100
    assert [stage_of(s, total, 10) for s in (0, 9, 10, 55, 99, 150)] == [0, 0, 1, 5, 9, 9]
    assert sigma_at(0, total, cfg) == 0.0 and sigma_at(9, total, cfg) == 0.0  # stage 0: quantization noise only
    assert sigma_at(10, total, cfg) == pytest.approx(1e-2, rel=1e-12)
    assert sigma_at(55, total, cfg) == pytest.approx(1e-2 * math.sqrt(0.05), rel=1e-12)  # t = 4/8
    assert sigma_at(99, total, cfg) == pytest.approx(5e-4, rel=1e-12)
    for step in range(0, 130, 7):
        for total_steps in (37, 100, 640):
            assert sigma_at(step, total_steps, cfg) == pytest.approx(
                _release_sigma(step, total_steps, 1e-2, 5e-4, 10), rel=1e-12)


def test_other_schedules_at_midpoint():
    # stage 5 of 10: t = (5 - 1) / (10 - 2) = 0.5
    expect = {
        "linear": 1e-2 + (5e-4 - 1e-2) * 0.5,
        "cosine": 5e-4 + (1e-2 - 5e-4) * 0.5 * (1 + math.cos(math.pi * 0.5)),
        "logarithmic": 1e-2 - (1e-2 - 5e-4) * math.log(5.5) / math.log(10),
    }
    for name, value in expect.items():
        cfg = AQNConfig(schedule=name)
        assert sigma_for_stage(5, cfg) == pytest.approx(value, rel=1e-12)
        assert sigma_for_stage(1, cfg) == pytest.approx(1e-2, rel=1e-12)
        assert sigma_for_stage(9, cfg) == pytest.approx(5e-4, rel=1e-12)
        assert sigma_for_stage(0, cfg) == 0.0
    assert sigma_at(50, 100, AQNConfig(enabled=False)) == 0.0
    with pytest.raises(ValueError, match="schedule"):
        AQNConfig(schedule="step").validate()


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_model("tiny-llama")
    return model, tok


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_noise_only_in_listed_norms_and_restored(tiny):
    model, _ = tiny
    aqn = AQN(model, AQNConfig(), total_steps=10)
    assert sorted(aqn.modules) == sorted(
        [f"model.layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")])
    before = _snapshot(model)
    g = torch.Generator().manual_seed(0)
    with aqn.perturb(step=0, generator=g) as sigma:  # stage 0: no noise at all
        assert sigma == 0.0
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    for step in (1, 2, 3, 9):  # stages 1..9
        with aqn.perturb(step=step, generator=g) as sigma:
            assert sigma == pytest.approx(aqn.sigma(step)) and sigma > 0
            now = model.state_dict()
            for k, v in now.items():
                changed = not torch.equal(v, before[k])
                is_target = k.endswith(("input_layernorm.weight", "post_attention_layernorm.weight"))
                assert changed == is_target, k
                if is_target:  # fresh N(0, sigma^2) around the *clean* weight: no accumulation over steps
                    z = v - before[k]
                    assert z.abs().max() < 6 * sigma
                    assert 0.3 * sigma < z.std() < 3 * sigma
        after = model.state_dict()
        assert all(torch.equal(v, before[k]) for k, v in after.items())  # exactly the clean weights again


def test_restored_even_if_the_rollout_raises(tiny):
    model, _ = tiny
    aqn = AQN(model, AQNConfig(), total_steps=10)
    before = _snapshot(model)
    with pytest.raises(RuntimeError), aqn.perturb(step=5, generator=torch.Generator().manual_seed(0)):
        raise RuntimeError("rollout failed")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_rollout_sees_the_noise(tiny):
    model, tok = tiny
    aqn = AQN(model, AQNConfig(), total_steps=10)
    gen = HFGenerator(model, tok.pad_token_id, cache="dynamic")
    params = SamplingParams(max_new_tokens=6, stop_token_ids=[tok.eos_token_id])
    prompts = [tok("What is 2 + 3?")["input_ids"]]
    ids = torch.tensor(prompts)

    def run(step):
        with aqn.perturb(step=step, generator=torch.Generator().manual_seed(1)):
            with torch.no_grad():
                logits = model(ids).logits
            r = gen.generate(prompts, params, n=2, generator=torch.Generator().manual_seed(7))
        return logits, r

    clean_logits, clean = run(0)
    noisy_logits, noisy = run(1)  # sigma = 1e-2
    assert not torch.allclose(clean_logits, noisy_logits)
    # same sampling seed: any difference in the rollout's log-probs comes from the noise
    assert not torch.allclose(clean.logprobs, noisy.logprobs)
    # and once the context exits, the model is clean again
    with torch.no_grad():
        assert torch.equal(model(ids).logits, clean_logits)


def test_no_targets_is_a_clear_error(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="aqn.targets"):
        AQN(model, AQNConfig(targets=["no_such_norm"]), total_steps=10)
