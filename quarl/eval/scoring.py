"""Scoring: completions -> per-sample verdicts -> one benchmark's metrics.

Verdicts use the RL reward's own functions (``quarl.rewards``): the answer is
extracted in the same precedence (``<answer>`` tag > ``\\boxed{}`` > ``####`` >
last number) and compared with math-verify under the same per-item time
limit, so an eval accuracy and a training accuracy reward mean the same thing.
The format rate is the ``<think>…</think><answer>…</answer>`` check of the
format reward.

Metrics per benchmark (all over problems, each problem weighted equally):

    accuracy          avg@n = mean_p c_p / n  (the papers' "pass@1" with sampling)
    accuracy_stderr   standard error of that mean across problems (sample std / sqrt(P))
    pass_at_k         unbiased pass@k (Chen et al. 2021) for every configured k <= n, and k = n
    format_rate       fraction of samples in the <think>/<answer> format
    answer_found_rate fraction of samples from which an answer could be extracted
    extraction        how answers were found: answer_tag / boxed / hash / last_number / none
    response_tokens   mean / median / p90 / max generated tokens (stop token included)
    truncation_rate   fraction of samples that hit max_new_tokens
    by_difficulty     problems and accuracy per difficulty level, where the source has levels

The standard error is there so two runs (BF16 vs NVFP4) can be compared
honestly: on 100 problems a 3-point gap is within noise.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from quarl.eval.benchmarks import Benchmark
from quarl.eval.generate import Completion
from quarl.eval.passk import avg_at_n, mean_pass_at_k
from quarl.rewards import RewardConfig, accuracy_reward, extract_answer, format_reward

__all__ = ["SampleResult", "benchmark_metrics", "score_samples"]


@dataclass
class SampleResult:
    benchmark: str
    problem_id: str
    sample: int  # index among the problem's n samples
    problem: str
    prompt: str
    completion: str
    extracted_answer: str | None
    extraction_method: str
    gold: str
    correct: bool
    formatted: bool
    length_tokens: int
    truncated: bool
    difficulty: int | None

    def to_json(self) -> dict:
        return asdict(self)


def score_samples(
    bench: Benchmark, completions: list[list[Completion]], reward: RewardConfig
) -> list[list[SampleResult]]:
    """Verdicts for ``[P][n]`` completions of ``bench``'s problems, same shape."""
    if len(completions) != len(bench.problems):
        raise ValueError(f"{bench.name}: {len(completions)} completion groups for {len(bench.problems)} problems")
    flat = [(p, j, c) for p, group in zip(bench.problems, completions) for j, c in enumerate(group)]
    texts = [c.text for _, _, c in flat]
    acc = accuracy_reward(
        texts,
        [p.answer for p, _, _ in flat],
        timeout_s=reward.timeout_s,
        timeout_mode=reward.timeout_mode,
        fallback_last_number=reward.fallback_last_number,
        max_answer_chars=reward.max_answer_chars,
    )
    fmt = format_reward(texts, think_in_prompt=reward.think_in_prompt)
    out: list[list[SampleResult]] = [[] for _ in bench.problems]
    index = {id(p): i for i, p in enumerate(bench.problems)}
    for (p, j, c), a, f in zip(flat, acc, fmt):
        extracted, method = extract_answer(c.text, fallback_last_number=reward.fallback_last_number)
        out[index[id(p)]].append(SampleResult(
            benchmark=bench.name, problem_id=p.id, sample=j, problem=p.problem, prompt=p.prompt, completion=c.text,
            extracted_answer=extracted, extraction_method=method, gold=p.answer, correct=a > 0.5,
            formatted=f > 0.5, length_tokens=c.tokens, truncated=c.truncated, difficulty=p.difficulty,
        ))  # fmt: skip
    return out


def benchmark_metrics(bench: Benchmark, results: list[list[SampleResult]], pass_k: list[int]) -> dict:
    """The metrics of one benchmark (see module docstring)."""
    if not results or any(not r for r in results):
        raise ValueError(f"{bench.name}: every problem needs at least one scored sample")
    ns = [len(r) for r in results]
    n = min(ns)
    counts = [sum(s.correct for s in r) for r in results]  # c_p
    per_problem = np.array([c / k for c, k in zip(counts, ns)])  # [P]
    samples = [s for r in results for s in r]
    lengths = np.array([s.length_tokens for s in samples])
    P = len(results)
    stderr = float(per_problem.std(ddof=1) / math.sqrt(P)) if P > 1 else 0.0
    m = {
        "problems": P,
        "samples_per_problem": n,
        "samples": len(samples),
        "accuracy": avg_at_n(counts, ns),
        "accuracy_stderr": stderr,
        "pass_at_k": {str(k): mean_pass_at_k(counts, ns, k) for k in sorted({k for k in pass_k if k <= n} | {n})},
        "format_rate": float(np.mean([s.formatted for s in samples])),
        "answer_found_rate": float(np.mean([s.extracted_answer is not None for s in samples])),
        "extraction": dict(Counter(s.extraction_method for s in samples).most_common()),
        "response_tokens": {
            "mean": float(lengths.mean()),
            "median": float(np.median(lengths)),
            "p90": float(np.percentile(lengths, 90)),
            "max": int(lengths.max()),
        },
        "truncation_rate": float(np.mean([s.truncated for s in samples])),
    }
    levels = sorted({p.difficulty for p in bench.problems if p.difficulty is not None})
    if levels:
        by = {}
        for lv in levels:
            idx = [i for i, p in enumerate(bench.problems) if p.difficulty == lv]
            by[str(lv)] = {"problems": len(idx), "accuracy": float(np.mean(per_problem[idx]))}
        m["by_difficulty"] = by
    return m
