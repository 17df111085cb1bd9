"""Format reward: does the completion follow ``<think>…</think><answer>…</answer>``?

This is the structure the QeRL/R1 prompt asks for (see
:data:`quarl.data.templates.QERL_INSTRUCTION`). A completion scores 1.0 when:

* it starts (after whitespace) with ``<think>`` — or, with
  ``think_in_prompt=True``, the chat template already opened the think block
  (Qwen3 / R1-style generation prompts end in ``<think>\\n``) and the
  completion must *not* open another;
* each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` occurs exactly
  once, in that order;
* only whitespace separates ``</think>`` from ``<answer>`` and follows
  ``</answer>`` (an EOS token string counts as nothing);
* the answer block is non-empty.

Otherwise 0.0. Checked with ``str.find``/``count`` in one pass: linear time,
no regex backtracking, so no time limit is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quarl.rewards.accuracy import completion_text

__all__ = ["format_reward", "is_well_formatted"]

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# Special tokens that may trail a decoded completion when skip_special_tokens=False.
_TRAILERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<|end|>", "<｜end▁of▁sentence｜>")


def is_well_formatted(text: str, *, think_in_prompt: bool = False) -> bool:
    s = text.strip()
    changed = True
    while changed:  # drop trailing EOS-like tokens
        changed = False
        for t in _TRAILERS:
            if s.endswith(t):
                s = s[: -len(t)].rstrip()
                changed = True
    counts = [s.count(t) for t in _TAGS]
    if think_in_prompt:
        if counts != [0, 1, 1, 1]:
            return False
        think_open_end = 0
    else:
        if counts != [1, 1, 1, 1] or not s.startswith("<think>"):
            return False
        think_open_end = len("<think>")
    think_close = s.find("</think>", think_open_end)
    answer_open = s.find("<answer>", think_close)
    answer_close = s.find("</answer>", answer_open)
    if not (think_open_end <= think_close < answer_open < answer_close):
        return False
    if s[think_close + len("</think>") : answer_open].strip():
        return False
    if s[answer_close + len("</answer>") :].strip():
        return False
    return bool(s[answer_open + len("<answer>") : answer_close].strip())


def format_reward(completions: Sequence[Any], *, think_in_prompt: bool = False) -> list[float]:
    """Batched format reward: 1.0 per well-formatted completion, else 0.0."""
    return [1.0 if is_well_formatted(completion_text(c), think_in_prompt=think_in_prompt) else 0.0 for c in completions]
