"""The RL stage (QeRL-style): GRPO and DAPO on a quantized base with LoRA and AQN.

    run_rl(cfg: RLConfig, *, model_uri, data_uri, output_uri, init_adapter_uri=None) -> dict

Modules, one concept each (generation -- Generator, HFGenerator, Rollout -- is quarl.engine.rollout; policy
building, optimizer, LR schedule, checkpoints and metrics logging are shared in quarl.train):
    config      RLConfig (defaults = QeRL Table 4) and its per-algorithm resolution
    losses      group advantages, clipped surrogate (GRPO/DAPO), k3 KL, overlong penalty
    aqn         Adaptive Quantization Noise: schedule and rollout-only norm noise
    logprobs    trainer-side log-probs/entropy and the rollout/trainer mismatch
    sampling    resumable prompt order, DAPO dynamic sampling
    trainer     the flat training loop
    report      summary numbers, markdown/HTML report with SVG curves
    stage       run_rl: artifacts in, one artifact out
"""

from quarl.engine.rollout import Generator, HFGenerator, Rollout, SamplingParams
from quarl.rl.aqn import AQN, AQNConfig, sigma_at
from quarl.rl.config import AlgoConfig, OptimConfig, PolicyConfig, RLConfig, RolloutConfig, TrainConfig
from quarl.rl.losses import group_advantages, kl_k3, overlong_penalty, policy_loss
from quarl.rl.stage import run_rl
from quarl.rl.trainer import RLDivergedError, RLTrainer

__all__ = [
    "AQN", "AQNConfig", "AlgoConfig", "Generator", "HFGenerator", "OptimConfig", "PolicyConfig", "RLConfig",
    "RLDivergedError", "RLTrainer", "Rollout", "RolloutConfig", "SamplingParams", "TrainConfig",
    "group_advantages", "kl_k3", "overlong_penalty", "policy_loss", "run_rl", "sigma_at",
]
