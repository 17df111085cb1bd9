"""Map each source's raw records to ``(problem, answer, solution, difficulty)``.

    source     default hub id (path: None)                   raw fields -> ours
    ---------  --------------------------------------------  ---------------------------------------------
    synthetic  (built in, quarl.data.generator)               -
    gsm8k      openai/gsm8k, subset "main"                    question; answer "...#### n" -> solution, n
    math       HuggingFaceH4/MATH-500                         problem; answer or last \\boxed{} of solution;
                                                              level "Level 3" | 3 -> 3 (MATH and MATH-500)
    bigmath    open-r1/Big-Math-RL-Verified-Processed,         problem|prompt; answer|solution (open-r1 renamed
               subset "level_3_4_5"                            answer -> solution); level|difficulty (below)
    deepmath   zwhe99/DeepMath-103K                           question; final_answer; difficulty (1-10 float,
                                                              floored); r1_solution_1
    openr1     open-r1/OpenR1-Math-220k, subset "default"     problem; answer; solution; (no difficulty)
    custom     (path required)                                first present of problem/question/prompt/...,
                                                              answer/final_answer/solution/..., difficulty/level

``fields`` in the source config overrides any of these names.

BigMath difficulty: open-r1's processed set derives levels 1-5 from
``llama8b_solve_rate`` quintiles (level 5 = lowest solve rate) over the whole
set, and ships level ranges as subsets (``level_3_4_5``, ``level_4_5``, ...)
without a level column. So: a ``level``/``difficulty`` column is used when
present; a single-level subset (``hf_subset: level_4``) gives that level; with
``levels_from_solve_rate: true`` the quintiles are recomputed over the loaded
rows (identical to open-r1's levels when the full ``all`` subset is loaded);
otherwise the difficulty is unknown — select levels by loading the subset
(QeRL: ``level_3_4_5`` for 7B/14B, ``level_4_5`` for 32B).

Reference answers are normalized by :func:`normalize_answer`: math delimiters,
a wrapping ``\\boxed{}``, thousands separators and currency signs go; the
mathematical content stays as written (``0.5`` stays ``0.5``).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

from quarl.data.config import SourceConfig
from quarl.data.generator import generate_problems
from quarl.data.readers import SourceError, read_records
from quarl.rewards.extract import extract_boxed, extract_hash, match_braces, strip_thousands

__all__ = ["HUB_DEFAULTS", "RawProblem", "load_source", "normalize_answer", "parse_level"]


@dataclass
class RawProblem:
    problem: str
    answer: str
    solution: str | None
    difficulty: int | None
    source: str


HUB_DEFAULTS: dict[str, tuple[str, str | None]] = {
    "gsm8k": ("openai/gsm8k", "main"),
    "math": ("HuggingFaceH4/MATH-500", None),
    "bigmath": ("open-r1/Big-Math-RL-Verified-Processed", "level_3_4_5"),
    "deepmath": ("zwhe99/DeepMath-103K", None),
    "openr1": ("open-r1/OpenR1-Math-220k", "default"),
}

# Candidate raw field names per schema field, first present wins.
_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "gsm8k": {"problem": ("question",), "answer": ("answer",), "difficulty": (), "solution": ()},
    "math": {"problem": ("problem",), "answer": ("answer",), "difficulty": ("level",), "solution": ("solution",)},
    "bigmath": {"problem": ("problem", "prompt"), "answer": ("answer", "solution"),
                "difficulty": ("level", "difficulty"), "solution": ()},
    "deepmath": {"problem": ("question", "problem"), "answer": ("final_answer", "answer"),
                 "difficulty": ("difficulty",), "solution": ("r1_solution_1",)},
    "openr1": {"problem": ("problem",), "answer": ("answer",), "difficulty": (), "solution": ("solution",)},
    "custom": {"problem": ("problem", "question", "prompt", "query", "input", "instruction"),
               "answer": ("answer", "final_answer", "gold", "target", "solution", "output"),
               "difficulty": ("difficulty", "level"), "solution": ("solution", "rationale", "explanation")},
}  # fmt: skip

_MATH_DELIMS = re.compile(r"^\$\$?(.*?)\$?\$$|^\\\((.*)\\\)$|^\\\[(.*)\\\]$", re.DOTALL)
_PLAIN_NUMBER = re.compile(r"^[-+]?\$?\s*[\d,]*\.?\d+\s*$")


def normalize_answer(raw) -> str:
    """Reference answer -> the string we store (``""`` when there is none)."""
    if raw is None:
        return ""
    if isinstance(raw, bool):
        return str(raw)
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        return str(int(raw)) if raw.is_integer() else repr(raw)
    s = str(raw).strip()
    for _ in range(3):  # peel nested wrappers: $\boxed{...}$
        before = s
        m = _MATH_DELIMS.match(s)
        if m:
            s = next(g for g in m.groups() if g is not None).strip()
        if s.startswith(("\\boxed{", "\\fbox{")) and match_braces(s, s.index("{")) == len(s):
            s = s[s.index("{") + 1 : -1].strip()  # the whole answer is one box
        if s == before:
            break
    s = s.replace("\u2212", "-").replace("\\!", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.rstrip(".").strip()
    if _PLAIN_NUMBER.match(s):  # "1,000", "$18", "+5": a bare number, written canonically
        s = strip_thousands(s).replace("$", "").replace(" ", "").lstrip("+")
    return s


def parse_level(v) -> int | None:
    """``"Level 3"`` / ``3`` / ``3.5`` / ``"3"`` -> int (floored); unknown -> None."""
    if v is None:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return None if isinstance(v, float) and math.isnan(v) else math.floor(v)
    m = re.search(r"-?\d+(?:\.\d+)?", str(v))
    return math.floor(float(m.group(0))) if m else None


def _text(v) -> str | None:
    """A field value as text; chat-style lists yield the last user message."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and v and all(isinstance(m, dict) for m in v):
        users = [m.get("content", "") for m in v if m.get("role", "user") == "user"]
        return str(users[-1] if users else v[-1].get("content", ""))
    return str(v)


def _pick(rec: dict, names: Iterable[str]) -> tuple[str | None, object]:
    for n in names:
        if n in rec and rec[n] is not None:
            return n, rec[n]
    return None, None


def _quintile_levels(rates: list[float | None]) -> list[int | None]:
    """open-r1's BigMath levels: quintile bins of the solve rate, 5 = hardest."""
    vals = sorted(r for r in rates if r is not None and not (isinstance(r, float) and math.isnan(r)))
    if len(vals) < 5:
        return [None] * len(rates)
    # Bin edges at the 20/40/60/80th percentiles (linear interpolation, as pandas.qcut).
    edges = []
    for q in (0.2, 0.4, 0.6, 0.8):
        pos = q * (len(vals) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(vals) - 1)
        edges.append(vals[lo] + (vals[hi] - vals[lo]) * (pos - lo))
    out: list[int | None] = []
    for r in rates:
        if r is None or (isinstance(r, float) and math.isnan(r)):
            out.append(None)
            continue
        bin_i = sum(r > e for e in edges)  # 0 = lowest solve rate
        out.append(5 - bin_i)
    return out


def _map_records(cfg: SourceConfig, records: list[dict]) -> list[RawProblem]:
    names = {k: ((cfg.fields[k],) if k in cfg.fields else v) for k, v in _FIELDS[cfg.name].items()}
    if records:
        keys = set().union(*(r.keys() for r in records[:50]))
        if not any(n in keys for n in names["problem"]):
            raise SourceError(
                f"source {cfg.name} ({cfg.path}): no problem field among {list(names['problem'])}; "
                f"the records have {sorted(keys)}. Set fields={{problem: <name>, answer: <name>}} on the source"
            )
        if not any(n in keys for n in names["answer"]) and cfg.name != "math":
            raise SourceError(
                f"source {cfg.name} ({cfg.path}): no answer field among {list(names['answer'])}; "
                f"the records have {sorted(keys)}. Set fields={{answer: <name>}} on the source"
            )
    out: list[RawProblem] = []
    for rec in records:
        _, problem = _pick(rec, names["problem"])
        ans_field, answer = _pick(rec, names["answer"])
        _, difficulty = _pick(rec, names["difficulty"])
        _, solution = _pick(rec, names["solution"])
        problem = (_text(problem) or "").strip()
        solution = _text(solution)
        if cfg.name == "gsm8k" and "answer" not in cfg.fields:
            full = _text(answer) or ""
            answer = extract_hash(full)
            solution = full.split("####")[0].strip() or None
        elif cfg.name == "math" and (answer is None or str(answer).strip() == "") and solution:
            answer = extract_boxed(solution)
        elif cfg.name == "bigmath" and ans_field == "solution":
            solution = None  # open-r1's "solution" column is the answer, not a worked solution
        out.append(
            RawProblem(
                problem=problem,
                answer=normalize_answer(answer),
                solution=solution,
                difficulty=parse_level(difficulty),
                source=cfg.name,
            )
        )
    if cfg.name == "bigmath" and records and all(p.difficulty is None for p in out):
        if cfg.levels_from_solve_rate:
            levels = _quintile_levels([r.get("llama8b_solve_rate") for r in records])
        else:  # a single-level subset ("level_4") still tells us the level
            m = re.fullmatch(r"level_(\d)", cfg.hf_subset or "")
            levels = [int(m.group(1)) if m else None] * len(out)
        for p, lv in zip(out, levels):
            p.difficulty = lv
    return out


def _synthetic(cfg: SourceConfig, seed: int) -> list[RawProblem]:
    lo = cfg.min_difficulty if cfg.min_difficulty is not None else 1
    hi = cfg.max_difficulty if cfg.max_difficulty is not None else 5
    levels = [lv for lv in range(1, 6) if lo <= lv <= hi]
    if not levels:
        raise SourceError(f"source synthetic: no generator level in [{lo}, {hi}]; levels are 1-5")
    probs = generate_problems(cfg.num_samples, seed=cfg.seed if cfg.seed is not None else seed, levels=levels)
    return [RawProblem(p.problem, p.answer, p.solution, p.difficulty, "synthetic") for p in probs]


def load_source(cfg: SourceConfig, seed: int = 0) -> tuple[list[RawProblem], dict[str, int]]:
    """Rows of one source after its own difficulty filter and sample cap.

    Returns ``(rows, counts)`` with counts of what was read and dropped."""
    if cfg.name == "synthetic":
        rows = _synthetic(cfg, seed)
    else:
        path = cfg.path
        subset, split = cfg.hf_subset, cfg.hf_split
        if path is None:
            repo, default_subset = HUB_DEFAULTS[cfg.name]
            path, subset = f"hf://{repo}", subset or default_subset
        rows = _map_records(cfg, read_records(path, hf_subset=subset, hf_split=split))
    counts = {"read": len(rows)}
    kept = []
    dropped_difficulty = 0
    for r in rows:
        d = r.difficulty
        if d is None:
            ok = not cfg.drop_unknown_difficulty
        else:
            ok = (cfg.min_difficulty is None or d >= cfg.min_difficulty) and (
                cfg.max_difficulty is None or d <= cfg.max_difficulty
            )
        if ok:
            kept.append(r)
        else:
            dropped_difficulty += 1
    counts["dropped_difficulty"] = dropped_difficulty
    if cfg.max_samples is not None and len(kept) > cfg.max_samples:
        rng = random.Random(f"{seed}:{cfg.name}:{cfg.path}")
        idx = sorted(rng.sample(range(len(kept)), cfg.max_samples))
        counts["dropped_max_samples"] = len(kept) - cfg.max_samples
        kept = [kept[i] for i in idx]
    counts["kept"] = len(kept)
    return kept, counts
