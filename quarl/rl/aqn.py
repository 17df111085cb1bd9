"""Adaptive Quantization Noise (AQN), QeRL Sec. 3.3 (Huang et al. 2025, arXiv:2510.11696).

What it is. A quantized base has a *static* quantization error ``Q(W) - W``, which
QeRL shows acts as exploration noise in RL. AQN makes it dynamic: for each rollout a
fresh channel-wise Gaussian vector ``Z ~ N(0, sigma^2 I)`` of size ``d`` (the hidden
size) is added to the weight of the RMSNorm that feeds the quantized projections
(paper Eq. 10): ``w_noise = w + Z``. Because ``RMSNorm_noise(x) = (Z / w + 1) * RMSNorm(x)``
(Eq. 11), this equals *multiplicative* row noise on every weight that reads that
norm's output (Eq. 12): q/k/v share the noise of ``input_layernorm`` and gate/up
share the noise of ``post_attention_layernorm`` (Fig. 6). No extra parameters, no
change to the NVFP4 x BF16 kernels.

Where and when (decisions, with the source they follow):

* **Targets**: ``input_layernorm`` and ``post_attention_layernorm`` of every block,
  as the paper's Fig. 6 and Sec. 3.3 say. (The public release's
  ``noise_scheduler.py`` adds noise to *every* Llama/Qwen2 RMSNorm, the final norm
  included; ``targets`` can be widened to reproduce that.)
* **Additive on the norm weight**: ``module.weight.add_(noise)`` in the release,
  ``w + Z`` in Eq. 10. Noise is drawn in float32 and cast to the weight dtype.
* **Rollout only**: Algorithm 1 line 9 perturbs the *old* (sampling) policy,
  ``pi_old <- pi_theta + N(0, sigma^2)``; the release adds the noise to the vLLM
  engine's copy only, so the trainer's log-prob and update forwards see the clean
  norms. Here rollout and trainer share one module, so :meth:`AQN.perturb` is a
  context manager: it snapshots the clean weights, sets ``w = clean + Z`` for the
  rollout and restores ``clean`` on exit -- noise never accumulates across steps
  and never reaches the gradient. (The snapshot is taken at entry, so it also works
  when the norms are trainable, as in the full-parameter baseline.)
* **Schedule** (Eq. 8, Algorithm 1, release code): the run is divided into ``K``
  equal stages, ``stage = step * K // total_steps`` (0-based step). Stage 0 adds no
  noise (only the quantization noise acts). Stages ``k = 1 .. K-1`` use
  ``sigma_start * (sigma_end / sigma_start) ** ((k - 1) / (K - 2))``: the release's
  ``sigma_trend`` has ``K - 1`` values with exactly this exponent, so the last stage
  reaches ``sigma_end`` (Appendix F: "by the final stage (K-1) sigma transitions to
  sigma_end"). Eq. 8 as printed divides by ``K - 1`` and never quite reaches
  ``sigma_end``; we follow the code. Linear, cosine and logarithmic decays (Fig. 15)
  use the same ``t = (k - 1) / (K - 2)`` in [0, 1].
* **Defaults**: Table 4, ``sigma_start = 1e-2``, ``sigma_end = 5e-4``, ``K = 10``.
  (Sec. 4.1's "5e-2 to 5e-4" contradicts Table 4 and App. G's "we initialize the
  noise standard deviation to 1e-2"; the release scripts use 1e-2 -> 1e-4.)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from torch import nn

SCHEDULES = ("exponential", "linear", "cosine", "logarithmic")
DEFAULT_TARGETS = ("input_layernorm", "post_attention_layernorm")


@dataclass
class AQNConfig:
    enabled: bool = True
    sigma_start: float = 1e-2
    sigma_end: float = 5e-4
    num_stages: int = 10
    schedule: str = "exponential"
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))

    def __post_init__(self) -> None:
        self.validate()  # at construction: a bad schedule fails `quarl compile`, not the GPU pod

    def validate(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"aqn.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.num_stages < 3:
            raise ValueError(f"aqn.num_stages must be >= 3 (stage 0 is noise-free and the decay needs two "
                             f"noisy stages), got {self.num_stages}")
        if not (self.sigma_start > 0 and self.sigma_end > 0):
            raise ValueError(f"aqn sigmas must be > 0, got start={self.sigma_start} end={self.sigma_end}")


def stage_of(step: int, total_steps: int, num_stages: int) -> int:
    """0-based ``step`` of ``total_steps`` -> stage in ``[0, num_stages - 1]``."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    return min(max(step, 0) * num_stages // total_steps, num_stages - 1)


def sigma_for_stage(stage: int, cfg: AQNConfig) -> float:
    """Noise std of a stage: 0 in stage 0, then ``sigma_start`` -> ``sigma_end`` over stages 1..K-1."""
    if stage <= 0:
        return 0.0
    t = min(stage - 1, cfg.num_stages - 2) / (cfg.num_stages - 2)  # in [0, 1]
    s0, s1 = cfg.sigma_start, cfg.sigma_end
    if cfg.schedule == "exponential":
        return s0 * (s1 / s0) ** t
    if cfg.schedule == "linear":
        return s0 + (s1 - s0) * t
    if cfg.schedule == "cosine":
        return s1 + (s0 - s1) * 0.5 * (1.0 + math.cos(math.pi * t))
    if cfg.schedule == "logarithmic":  # falls fast early, flattens late (Fig. 15)
        return s0 - (s0 - s1) * math.log1p(9.0 * t) / math.log(10.0)
    raise ValueError(f"unknown AQN schedule {cfg.schedule!r}; use one of {SCHEDULES}")


def sigma_at(step: int, total_steps: int, cfg: AQNConfig) -> float:
    if not cfg.enabled:
        return 0.0
    return sigma_for_stage(stage_of(step, total_steps, cfg.num_stages), cfg)


def noise_targets(model: nn.Module, targets: list[str] | tuple[str, ...]) -> dict[str, nn.Module]:
    """Norm modules whose attribute name is one of ``targets`` and that own a 1-D ``weight``."""
    found = {}
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        w = getattr(mod, "weight", None)
        if leaf in targets and isinstance(w, torch.Tensor) and w.dim() == 1:
            found[name] = mod
    return found


class AQN:
    """Applies the scheduled noise to a model's norms for the duration of a rollout."""

    def __init__(self, model: nn.Module, cfg: AQNConfig, total_steps: int):
        cfg.validate()
        self.cfg, self.total_steps = cfg, total_steps
        self.modules = noise_targets(model, cfg.targets) if cfg.enabled else {}
        if cfg.enabled and not self.modules:
            raise ValueError(f"AQN found no norm modules named {cfg.targets} in the model; set aqn.targets to the "
                             f"names of the RMSNorms that feed the attention and MLP projections, or aqn.enabled=false")

    def sigma(self, step: int) -> float:
        return sigma_at(step, self.total_steps, self.cfg)

    def stage(self, step: int) -> int:
        return stage_of(step, self.total_steps, self.cfg.num_stages)

    @contextlib.contextmanager
    def perturb(self, step: int, generator: torch.Generator | None = None):
        """``with aqn.perturb(step, gen): rollout(...)`` -- noisy norms inside, clean ones after.

        Noise is drawn on the CPU from ``generator`` (so a run is reproducible and
        resumable whatever the device) and then moved to each weight's device.
        Yields the sigma used.
        """
        sigma = self.sigma(step)
        if sigma == 0.0 or not self.modules:
            yield sigma
            return
        clean: dict[str, torch.Tensor] = {}
        try:
            with torch.no_grad():
                for name, mod in self.modules.items():
                    w = mod.weight
                    clean[name] = w.detach().clone()
                    z = torch.randn(w.shape, generator=generator, dtype=torch.float32) * sigma  # [d]
                    w.copy_((clean[name].float() + z.to(w.device)).to(w.dtype))
            yield sigma
        finally:
            with torch.no_grad():
                for name, w0 in clean.items():
                    self.modules[name].weight.copy_(w0)
