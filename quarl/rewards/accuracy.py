"""Accuracy reward: is the completion's final answer equal to the reference?

Equality is mathematical, not textual: ``1,000`` = ``1000``, ``0.5`` =
``\\frac{1}{2}``, ``$18`` = ``18`` = ``18.0``, ``\\dfrac{7}{12}`` = ``7/12``.
We use math-verify (HF's verifier behind open-r1 and QeRL's reward): it parses
both sides to sympy and compares numerically and symbolically.

Pipeline per item (all under one time limit, see :mod:`.timelimit`):

    completion --extract_answer--> candidate string (tag > boxed > #### > last number)
    candidate  --parse_math------> [sympy expr, string]    (empty list: unparseable)
    answer     --parse_math------> [sympy expr, string]    (cached: G completions share one answer)
    verify(gold, pred) -> bool -> 1.0 / 0.0

``parse_math`` feeds LaTeX-looking text to math-verify inside ``$…$`` (bare
``\\frac{\\sqrt{3}}{2}`` is not recognised without delimiters) and plain text
as is (wrapping ``18 dollars`` in ``$`` would make it the product of symbols
d·o·l·l·a·r·s). Candidates longer than ``max_answer_chars`` score 0 without
being parsed: a final answer is short, and this bounds the work per item
before any time limit is needed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from quarl.rewards.extract import extract_answer
from quarl.rewards.timelimit import score_items

log = logging.getLogger(__name__)

__all__ = ["accuracy_reward", "answers_match", "completion_text", "parse_math", "parses", "score_one"]

DEFAULT_TIMEOUT_S = 5.0  # math-verify's own default per operation
DEFAULT_MAX_ANSWER_CHARS = 1000


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; ours is on, so hush it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


@functools.lru_cache(maxsize=1)
def _mv():
    import math_verify  # imported lazily: pulls in sympy (~1 s)

    return math_verify


def _looks_latex(s: str) -> bool:
    return "\\" in s or "{" in s or "^" in s or "_" in s


def parse_math(text: str) -> list:
    """math-verify parse of a short answer string; ``[]`` when unparseable.

    No time limit of its own: call under :func:`quarl.rewards.timelimit.time_limit`
    (or via :func:`accuracy_reward`) when the input is untrusted.
    """
    mv = _mv()
    s = text.strip().replace("\u2212", "-").replace("\\$", "").replace("\\%", "%")
    s = s.rstrip(".").strip()
    if not s:
        return []
    if _looks_latex(s) and "$" not in s:
        parsed = mv.parse(f"${s}$", parsing_timeout=None)
        if parsed:
            return parsed
    return mv.parse(s, parsing_timeout=None)


def parses(text: str) -> bool:
    """True when math-verify turns ``text`` into a math object (not just its
    string fallback, which ``parse`` returns for anything that looks like LaTeX)."""
    return any(not isinstance(x, str) for x in parse_math(text))


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> tuple:
    return tuple(parse_math(answer))


def answers_match(candidate: str, answer: str) -> bool:
    """True when the candidate answer equals the reference mathematically."""
    gold = list(_parse_gold(answer))
    if not gold:
        return False
    pred = parse_math(candidate)
    if not pred:
        return False
    return bool(_mv().verify(gold, pred, timeout_seconds=None))


def completion_text(completion: Any) -> str:
    """Accept a plain string or TRL-style chat output (list of messages, or one
    message dict): the text is the last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)) and completion:
        return completion_text(completion[-1])
    return "" if completion is None else str(completion)


def score_one(
    completion: str,
    answer: str,
    fallback_last_number: bool = True,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
) -> float:
    """1.0 if ``completion``'s final answer equals ``answer``, else 0.0 (no time limit)."""
    candidate, _ = extract_answer(completion, fallback_last_number=fallback_last_number)
    if candidate is None or len(candidate) > max_answer_chars:
        return 0.0
    return 1.0 if answers_match(candidate, answer) else 0.0


def accuracy_reward(
    completions: Sequence[Any],
    answers: Sequence[str],
    *,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    timeout_mode: str = "auto",
    fallback_last_number: bool = True,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
) -> list[float]:
    """Batched accuracy reward: ``[1.0 | 0.0]`` per (completion, answer) pair.

    Never raises on bad completions: parse errors and items over ``timeout_s``
    score 0.0. ``timeout_mode``: see :mod:`quarl.rewards.timelimit`.
    """
    if len(completions) != len(answers):
        raise ValueError(
            f"accuracy_reward got {len(completions)} completions but {len(answers)} answers; "
            "repeat each answer once per completion (e.g. G times for a GRPO group)"
        )
    items = [(completion_text(c), str(a), fallback_last_number, max_answer_chars) for c, a in zip(completions, answers)]
    return score_items(score_one, items, timeout_s, timeout_mode)
