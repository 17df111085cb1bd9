"""Optimizer and learning-rate schedule of a trainer.

The schedule is a pure function of the step (``lr_at``), so resuming needs no
scheduler state: the checkpoint's step is enough. Moved here unchanged from
``quarl.rl.trainer`` for every trainer to share.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # the optim section of a trainer's config (today quarl.rl.config.OptimConfig)
    from quarl.rl.config import OptimConfig

log = logging.getLogger("quarl.rl.trainer")  # the logger these messages always came from

__all__ = ["lr_at", "make_optimizer"]


def make_optimizer(params: list[nn.Parameter], cfg: OptimConfig, device: torch.device):
    """-> (optimizer, name actually used)."""
    kw = {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}
    if cfg.optimizer == "adamw8bit" and device.type == "cuda":
        try:
            import bitsandbytes as bnb

            return bnb.optim.AdamW8bit(params, **kw), "adamw8bit"
        except ImportError:
            log.warning("optim.optimizer=adamw8bit but bitsandbytes is not installed; using torch AdamW")
    return torch.optim.AdamW(params, **kw), "adamw"


def lr_at(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Linear warmup over ceil(warmup_ratio * total) steps (never 0 on the first step), then cosine/constant."""
    warm = math.ceil(cfg.warmup_ratio * total_steps)
    if step < warm:
        return cfg.lr * (step + 1) / (warm + 1)
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - warm) / max(1, total_steps - warm)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
