"""Rewards: extraction, math-verify equivalence, format, time limits."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from quarl.rewards import (
    RewardConfig,
    RewardFn,
    RewardTimeout,
    accuracy_reward,
    extract_answer,
    extract_boxed,
    format_reward,
    last_number,
    time_limit,
)
from quarl.rewards.timelimit import ProcessScorer, resolve_mode

# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}} done", (r"\frac{1}{2}", "boxed")),
        (r"\boxed{a} then \boxed{\left\{x\right\}}", (r"\left\{x\right\}", "boxed")),
        (r"\fbox{7}", ("7", "boxed")),
        (r"\boxed 5", ("5", "boxed")),
        ("<think>\\boxed{3}</think><answer> 5 </answer>", ("5", "answer_tag")),
        ("<answer>3</answer> wait, no <answer>4</answer>", ("4", "answer_tag")),
        ("<think>long</think><answer>42", ("42", "answer_tag")),  # truncated generation
        ("<answer></answer> the answer is 7", (None, "answer_tag")),  # empty tag is authoritative
        ("She earns $10.\n#### 1,234\n", ("1,234", "hash")),
        ("Total: 1,000 apples, so x is -7/12.", ("-7/12", "last_number")),
        ("there are 3,4 cases", ("4", "last_number")),
        ("no digits here", (None, "none")),
        ("", (None, "none")),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_boxed_unbalanced_and_lookalike():
    assert extract_boxed(r"\boxed{1 + {2") is None
    assert extract_boxed(r"\boxedfoo{3}") is None
    assert extract_boxed(r"\boxed{\frac{\sqrt{3}}{2}}") == r"\frac{\sqrt{3}}{2}"


def test_last_number_thousands():
    assert last_number("paid 1,234,567.50 dollars") == "1234567.50"
    assert last_number("minus \u22123") == "-3"
    assert extract_answer("the answer is 12", fallback_last_number=False) == (None, "none")


# ---------------------------------------------------------------- accuracy

EQUIV = [
    ("<answer>1,000</answer>", "1000", 1.0),
    ("<answer>1000</answer>", "1,000", 1.0),
    ("<answer>0.5</answer>", r"\frac{1}{2}", 1.0),
    (r"<answer>\frac{1}{2}</answer>", "0.5", 1.0),
    (r"<answer>\dfrac{7}{12}</answer>", "7/12", 1.0),
    ("<answer>$18</answer>", "18", 1.0),
    (r"<answer>\$18</answer>", "18", 1.0),
    ("<answer>18 dollars</answer>", "18", 1.0),
    ("<answer>18.0</answer>", "18", 1.0),
    ("<answer>-3</answer>", "\u22123", 1.0),
    (r"The result is \boxed{\frac{1}{2}}.", "1/2", 1.0),
    (r"<answer>\boxed{\frac{\sqrt3}{2}}</answer>", r"\frac{\sqrt{3}}{2}", 1.0),
    ("Step 1 ... #### 72", "72", 1.0),
    ("so the total is 72 clips", "72", 1.0),
    (r"<answer>\left( 3, \frac{\pi}{2} \right)</answer>", r"(3, \frac{\pi}{2})", 1.0),
    ("<answer>17</answer>", "18", 0.0),
    ("<answer>18.5</answer>", "18", 0.0),
    ("<answer>3, 4</answer>", "3", 0.0),
    ("I cannot solve this.", "18", 0.0),
    ("", "18", 0.0),
    # The <answer> tag beats a \boxed{} in the reasoning, both ways.
    (r"<think>maybe \boxed{5}</think><answer>7</answer>", "7", 1.0),
    (r"<think>maybe \boxed{5}</think><answer>7</answer>", "5", 0.0),
    # An unparseable reference never matches (and never raises).
    ("<answer>5</answer>", "", 0.0),
]


def test_accuracy_equivalences():
    completions = [c for c, _, _ in EQUIV]
    answers = [a for _, a, _ in EQUIV]
    got = accuracy_reward(completions, answers)
    bad = [(c, a, e, g) for (c, a, e), g in zip(EQUIV, got) if g != e]
    assert not bad, bad


def test_accuracy_accepts_chat_messages_and_checks_lengths():
    msgs = [[{"role": "assistant", "content": "<answer>4</answer>"}], {"content": "#### 4"}]
    assert accuracy_reward(msgs, ["4", "4"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="repeat each answer"):
        accuracy_reward(["a", "b"], ["1"])


def test_over_long_candidate_scores_zero_without_parsing():
    long = "<answer>" + "1" * 5000 + "</answer>"
    assert accuracy_reward([long], ["1" * 5000], max_answer_chars=1000) == [0.0]


# ---------------------------------------------------------------- format


@pytest.mark.parametrize(
    "text, think_in_prompt, expected",
    [
        ("<think>a</think><answer>5</answer>", False, 1.0),
        ("  <think>\nwork\n</think>\n<answer>\n5\n</answer>\n<|im_end|>", False, 1.0),
        ("<think>a</think>\n\n<answer>5</answer>", False, 1.0),
        ("<think>a</think>stray<answer>5</answer>", False, 0.0),
        ("<think>a</think><answer>5</answer> and more", False, 0.0),
        ("<think>a</think><answer>  </answer>", False, 0.0),
        ("<answer>5</answer><think>a</think>", False, 0.0),
        ("<think>a</think><answer>5</answer><answer>6</answer>", False, 0.0),
        ("<think>a<think>b</think><answer>5</answer>", False, 0.0),
        ("no tags at all: 5", False, 0.0),
        ("text<think>a</think><answer>5</answer>", False, 0.0),
        ("reasoning</think><answer>5</answer>", True, 1.0),
        ("<think>a</think><answer>5</answer>", True, 0.0),
    ],
)
def test_format_reward(text, think_in_prompt, expected):
    assert format_reward([text], think_in_prompt=think_in_prompt) == [expected]


# ---------------------------------------------------------------- combined


def test_reward_fn_weights_and_components():
    fn = RewardFn(RewardConfig(accuracy_weight=1.0, format_weight=0.25))
    comps = ["<think>x</think><answer>3</answer>", "the answer is 3", "<think>x</think><answer>4</answer>"]
    out = fn.components(comps, ["3", "3", "3"])
    assert out["accuracy"] == [1.0, 1.0, 0.0]
    assert out["format"] == [1.0, 0.0, 1.0]
    assert out["reward"] == [1.25, 1.0, 0.25]
    assert fn(comps, ["3"] * 3) == out["reward"]
    with pytest.raises(ValueError, match="timeout_mode"):
        RewardConfig(timeout_mode="threads")
    with pytest.raises(ValueError, match="both 0"):
        RewardConfig(accuracy_weight=0, format_weight=0)


# ---------------------------------------------------------------- time limits

# Comparing 9^(9^(9^9)) with 3 makes sympy evaluate a tower of powers: without a
# limit it runs for a very long time (math-verify's own 5 s alarm is off in our calls).
PATHOLOGICAL = r"<answer>\boxed{9^{9^{9^{9}}}}</answer>"


def test_pathological_completion_is_bounded_signal_mode():
    t0 = time.monotonic()
    got = accuracy_reward([PATHOLOGICAL, "<answer>3</answer>"], ["3", "3"], timeout_s=0.5, timeout_mode="signal")
    assert got == [0.0, 1.0]
    assert time.monotonic() - t0 < 10


def test_off_main_thread_auto_uses_a_process_and_is_bounded():
    result: dict = {}

    def work():
        result["mode"] = resolve_mode("auto")
        t0 = time.monotonic()
        result["scores"] = accuracy_reward(
            [PATHOLOGICAL, r"<answer>\frac{1}{2}</answer>"], ["3", "0.5"], timeout_s=0.5, timeout_mode="auto"
        )
        result["elapsed"] = time.monotonic() - t0

    th = threading.Thread(target=work)
    th.start()
    th.join(timeout=120)
    assert not th.is_alive()
    assert result["mode"] == "process"
    assert result["scores"] == [0.0, 1.0]
    assert result["elapsed"] < 60  # includes spawning the scorer process
    with pytest.raises(ValueError, match="main thread"):
        err: list = []
        t = threading.Thread(target=lambda: err.append(_try_resolve("signal")))
        t.start()
        t.join()
        raise err[0]


def _try_resolve(mode):
    try:
        resolve_mode(mode)
    except ValueError as e:
        return e
    return None


def _sleep_item(seconds: float) -> float:  # module level: picklable for the worker
    time.sleep(seconds)
    return 1.0


def _uninterruptible_item(seconds: float) -> float:
    # Ignore SIGALRM in the worker: simulates a C call that never returns to the
    # interpreter, so only the parent's deadline (kill + restart) can end it.
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(seconds)
    return 1.0


def test_process_scorer_kills_a_stuck_worker_and_scores_the_rest():
    scorer = ProcessScorer()
    scorer.START_SLACK_S = 30.0
    scorer.CALL_SLACK_S = 0.5
    try:
        assert scorer.score(_sleep_item, [(0.0,), (5.0,)], 0.3) == [1.0, 0.0]  # signal limit in the worker
        t0 = time.monotonic()
        got = scorer.score(_uninterruptible_item, [(0.0,), (30.0,), (0.0,)], 0.3)
        assert got == [1.0, 0.0, 1.0]
        assert time.monotonic() - t0 < 45
    finally:
        scorer.close()


def test_time_limit_nests_and_restores():
    # pytest-timeout may own SIGALRM/ITIMER_REAL already: our limits must nest under it.
    handler_before = signal.getsignal(signal.SIGALRM)
    timer_before = signal.getitimer(signal.ITIMER_REAL)[0]
    t_start = time.monotonic()
    with pytest.raises(RewardTimeout), time_limit(0.2):
        time.sleep(2)
    # The inner limit finishes early and the outer one still fires afterwards.
    t0 = time.monotonic()
    with pytest.raises(RewardTimeout), time_limit(0.4):
        with time_limit(5):
            pass
        time.sleep(3)
    assert time.monotonic() - t0 < 2
    # An outer limit tighter than the inner one stays in charge.
    with pytest.raises(RewardTimeout), time_limit(0.2), time_limit(5):
        time.sleep(3)
    assert signal.getsignal(signal.SIGALRM) is handler_before
    timer_after = signal.getitimer(signal.ITIMER_REAL)[0]
    if timer_before == 0:
        assert timer_after == 0
    else:  # the outer timer kept counting down, re-armed with what was left
        elapsed = time.monotonic() - t_start
        assert timer_before - elapsed - 1 < timer_after <= timer_before
