"""Row-level processing between loading and validation.

Order (each step counts what it drops; the counts land in summary.json):

1. **assign** each source's rows to ``train``/``eval``/``auto`` (its ``split``);
2. **dedup** across all sources, eval-assigned rows first so a problem that is
   both in a fixed eval set and a training source stays in eval only:
   ``exact`` keys on the problem text, ``normalized`` on NFKC + casefold +
   whitespace folding (catches re-typed copies across datasets);
3. **length**: problem chars, answer chars;
4. **answers**: empty reference answers, and (``drop_unparseable_answers``)
   answers math-verify cannot parse — each distinct answer parsed once under
   the reward time limit;
5. **render** the template; drop prompts over ``max_prompt_tokens``;
6. **split** the ``auto`` rows with a seeded shuffle (eval_size; all to train
   when a source is a fixed eval set), then cap train/eval at max_*_samples.

Deterministic for a given config and input: the only randomness is
``random.Random`` seeded from ``cfg.seed``.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from quarl.data.config import DataPrepConfig
from quarl.data.schema import make_id
from quarl.data.sources import RawProblem
from quarl.data.templates import PromptTemplate
from quarl.rewards.accuracy import parses
from quarl.rewards.timelimit import score_items

__all__ = ["Row", "answers_parse", "normalize_text", "process_rows"]

ANSWER_PARSE_TIMEOUT_S = 5.0


@dataclass
class Row:
    id: str
    problem: str
    prompt: str
    messages: str
    answer: str
    solution: str | None
    source: str
    difficulty: int | None
    split: str  # train | eval (auto before splitting)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_WS = re.compile(r"\s+")
_SPACE_AROUND = re.compile(r" ?([^\w\s]) ?")


def normalize_text(s: str) -> str:
    """Key for near-duplicate detection: NFKC, casefold, whitespace runs folded,
    spaces around symbols dropped, trailing sentence punctuation stripped.

    Symbols themselves are kept: ``3 × 4`` and ``3 ÷ 4`` are different problems.
    """
    t = _WS.sub(" ", unicodedata.normalize("NFKC", s).casefold()).strip()
    t = _SPACE_AROUND.sub(r"\1", t)
    return t.rstrip(".?!:; ")


def _answer_parses(answer: str) -> float:  # module level: runs in the scorer process off the main thread
    return 1.0 if parses(answer) else 0.0


# Parse results by answer string: the filter step and validation ask about the
# same answers, and parsing costs ~1 ms each (sympy), so a 250k-row BigMath
# would otherwise pay minutes twice. Bounded: cleared when it grows past 1M.
_PARSE_CACHE: dict[str, bool] = {}


def answers_parse(answers: list[str], timeout_s: float = ANSWER_PARSE_TIMEOUT_S) -> dict[str, bool]:
    """``{answer: math-verify parses it}`` for each distinct non-empty answer."""
    distinct = {a for a in answers if isinstance(a, str) and a.strip()}
    todo = sorted(a for a in distinct if a not in _PARSE_CACHE)
    if todo:
        if len(_PARSE_CACHE) + len(todo) > 1_000_000:
            _PARSE_CACHE.clear()
        ok = score_items(_answer_parses, [(a,) for a in todo], timeout_s, "auto")
        _PARSE_CACHE.update({a: bool(v) for a, v in zip(todo, ok)})
    return {a: _PARSE_CACHE[a] for a in distinct}


def process_rows(
    sources: list[tuple[str, list[RawProblem]]],
    cfg: DataPrepConfig,
    template: PromptTemplate,
) -> tuple[list[Row], dict]:
    """Dedup, filter, render and split. ``sources`` is ``[(assign, rows)]`` in
    config order, ``assign`` in auto/train/eval. Returns ``(rows, drop_counts)``."""
    f = cfg.filters
    drops: Counter = Counter()

    # 1-2. assign + dedup (eval-assigned sources first)
    order = sorted(range(len(sources)), key=lambda i: 0 if sources[i][0] == "eval" else 1)
    seen: set[str] = set()
    staged: list[tuple[str, RawProblem]] = []
    for i in order:
        assign, rows = sources[i]
        for r in rows:
            if f.dedup != "none":
                key = r.problem if f.dedup == "exact" else normalize_text(r.problem)
                if key in seen:
                    drops["duplicate"] += 1
                    continue
                seen.add(key)
            staged.append((assign, r))

    # 3. lengths
    kept: list[tuple[str, RawProblem]] = []
    for assign, r in staged:
        n = len(r.problem.strip())
        if n < max(1, f.min_problem_chars):
            drops["problem_too_short"] += 1
        elif f.max_problem_chars is not None and n > f.max_problem_chars:
            drops["problem_too_long"] += 1
        elif not r.answer.strip():
            drops["answer_empty"] += 1
        elif f.max_answer_chars is not None and len(r.answer) > f.max_answer_chars:
            drops["answer_too_long"] += 1
        else:
            kept.append((assign, r))

    # 4. parseable answers
    if f.drop_unparseable_answers and kept:
        ok = answers_parse([r.answer for _, r in kept])
        before = len(kept)
        kept = [(a, r) for a, r in kept if ok.get(r.answer, False)]
        drops["answer_unparseable"] += before - len(kept)

    # 5. render + token limit
    rows: list[Row] = []
    for assign, r in kept:
        prompt, messages = template.render(r.problem)
        rows.append(
            Row(id=make_id(r.source, r.problem), problem=r.problem, prompt=prompt, messages=messages,
                answer=r.answer, solution=r.solution, source=r.source, difficulty=r.difficulty, split=assign)
        )  # fmt: skip
    if f.max_prompt_tokens is not None and rows:
        lens = template.count_tokens([r.prompt for r in rows])
        before = len(rows)
        rows = [r for r, n in zip(rows, lens) if n <= f.max_prompt_tokens]
        drops["prompt_too_many_tokens"] += before - len(rows)

    # 6. split + caps
    rng = random.Random(cfg.seed)
    auto = [r for r in rows if r.split == "auto"]
    rng.shuffle(auto)
    has_fixed_eval = any(assign == "eval" for assign, _ in sources)
    k = 0 if has_fixed_eval else cfg.split.eval_rows(len(auto))
    for i, r in enumerate(auto):
        r.split = "eval" if i < k else "train"
    train = [r for r in rows if r.split == "train"]
    evals = [r for r in rows if r.split == "eval"]
    rng.shuffle(train)  # mixed sources interleave; RL samplers may reshuffle anyway
    for name, part, cap in (("train", train, cfg.split.max_train_samples), ("eval", evals, cfg.split.max_eval_samples)):
        if cap is not None and len(part) > cap:
            drops[f"{name}_over_max_samples"] += len(part) - cap
            del part[cap:]
    return train + evals, {k: v for k, v in sorted(drops.items()) if v}
