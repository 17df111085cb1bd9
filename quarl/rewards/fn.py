"""The combined reward a trainer or evaluator calls.

    reward = accuracy_weight * accuracy + format_weight * format

``RewardConfig`` is a plain dataclass so it nests inside the RL and eval stage
configs (``--set reward.format_weight=0.1``). Defaults follow QeRL, which
trains and reports the *accuracy* reward (its "Accuracy Reward" curves); the
format term is off by default and is the usual knob for small models that
first need to learn the tag structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quarl.rewards.accuracy import DEFAULT_MAX_ANSWER_CHARS, DEFAULT_TIMEOUT_S, accuracy_reward
from quarl.rewards.format import format_reward
from quarl.rewards.timelimit import MODES

__all__ = ["RewardConfig", "RewardFn"]


@dataclass
class RewardConfig:
    accuracy_weight: float = 1.0
    format_weight: float = 0.0
    # Per-item wall-clock limit for parsing + verifying one completion (seconds).
    timeout_s: float = DEFAULT_TIMEOUT_S
    # auto | signal | process | none (see quarl.rewards.timelimit).
    timeout_mode: str = "auto"
    # Accept the last number in the text when no <answer>/\boxed/#### is found.
    fallback_last_number: bool = True
    # The generation prompt already opened <think> (Qwen3/R1 chat templates).
    think_in_prompt: bool = False
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS

    def __post_init__(self) -> None:
        if self.timeout_mode not in MODES:
            raise ValueError(f"reward.timeout_mode={self.timeout_mode!r}: expected one of {MODES}")
        if self.accuracy_weight == 0 and self.format_weight == 0:
            raise ValueError("reward: accuracy_weight and format_weight are both 0; set at least one")


class RewardFn:
    """``RewardFn(cfg)(completions, answers) -> list[float]``; ``components`` also
    returns the separate terms for logging."""

    def __init__(self, cfg: RewardConfig | None = None) -> None:
        self.cfg = cfg or RewardConfig()

    def components(self, completions: Sequence[Any], answers: Sequence[str]) -> dict[str, list[float]]:
        c = self.cfg
        n = len(completions)
        acc = (
            accuracy_reward(
                completions,
                answers,
                timeout_s=c.timeout_s,
                timeout_mode=c.timeout_mode,
                fallback_last_number=c.fallback_last_number,
                max_answer_chars=c.max_answer_chars,
            )
            if c.accuracy_weight
            else [0.0] * n
        )
        fmt = format_reward(completions, think_in_prompt=c.think_in_prompt) if c.format_weight else [0.0] * n
        total = [c.accuracy_weight * a + c.format_weight * f for a, f in zip(acc, fmt)]
        return {"accuracy": acc, "format": fmt, "reward": total}

    def __call__(self, completions: Sequence[Any], answers: Sequence[str]) -> list[float]:
        return self.components(completions, answers)["reward"]
