"""Verifiable rewards for math RL: answer extraction, math-verify equivalence
under a per-item time limit, the ``<think>/<answer>`` format check, and the
weighted combination trainers call."""

from quarl.rewards.accuracy import accuracy_reward, answers_match, completion_text, parse_math
from quarl.rewards.extract import extract_answer, extract_boxed, extract_hash, extract_tag, last_number
from quarl.rewards.fn import RewardConfig, RewardFn
from quarl.rewards.format import format_reward, is_well_formatted
from quarl.rewards.timelimit import RewardTimeout, time_limit

__all__ = [
    "RewardConfig",
    "RewardFn",
    "RewardTimeout",
    "accuracy_reward",
    "answers_match",
    "completion_text",
    "extract_answer",
    "extract_boxed",
    "extract_hash",
    "extract_tag",
    "format_reward",
    "is_well_formatted",
    "last_number",
    "parse_math",
    "time_limit",
]
