"""Source loaders on small fixture files (jsonl / json / parquet) in each dataset's own layout."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quarl.data import SourceConfig, SourceError, load_source, normalize_answer, read_records
from quarl.data.sources import _quintile_levels, parse_level
from tests.data_paths import GSM8K_DIR


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ------------------------------------------------------------------ answer normalization


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("1,000", "1000"),
        ("$18", "18"),
        (" 72. ", "72"),
        ("+5", "5"),
        ("0.5", "0.5"),
        (18, "18"),
        (18.0, "18"),
        (None, ""),
        (r"$\frac{1}{2}$", r"\frac{1}{2}"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"$\boxed{5}$", "5"),
        (r"\boxed{3} and \boxed{4}", r"\boxed{3} and \boxed{4}"),  # not one box: left alone
        (r"\dfrac{7}{12}", r"\frac{7}{12}"),
        ("\u22123", "-3"),
        ("3, 4", "3, 4"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_parse_level_and_quintiles():
    assert [parse_level(v) for v in ["Level 3", 3, 4.5, "5", "Level ?", None, float("nan"), True]] == [
        3, 3, 4, 5, None, None, None, None,
    ]  # fmt: skip
    # Ten solve rates -> two per quintile, level 5 = lowest solve rate (hardest).
    assert _quintile_levels([i / 10 for i in range(10)] + [None]) == [5, 5, 4, 4, 3, 3, 2, 2, 1, 1, None]


# ------------------------------------------------------------------ per-source mappings


def test_gsm8k_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Natalia sold 48 clips ... How many?", "answer": "48/2 = <<48/2=24>>24\n#### 72"},
            {"question": "A big one?", "answer": "It costs 1,000 + 234.\n#### 1,234"},
        ],
    )
    rows, counts = load_source(SourceConfig(name="gsm8k", path=path))
    assert counts == {"read": 2, "dropped_difficulty": 0, "kept": 2}
    assert [r.answer for r in rows] == ["72", "1234"]
    assert rows[0].solution == "48/2 = <<48/2=24>>24"
    assert rows[0].problem.startswith("Natalia") and rows[0].difficulty is None and rows[0].source == "gsm8k"


def test_math_jsonl_boxed_and_levels(tmp_path):
    path = write_jsonl(
        tmp_path / "math.jsonl",
        [
            # MATH: answer only inside the solution's last \boxed{}, nested braces.
            {"problem": "Compute cos(30).", "solution": r"So it is $\boxed{\dfrac{\sqrt{3}}{2}}$.",
             "level": "Level 3", "type": "Precalculus"},
            # MATH-500: explicit answer field and integer level.
            {"problem": "What is 2+2?", "solution": r"\boxed{4}", "answer": "4", "level": 1},
            {"problem": "Unknown level", "solution": r"\boxed{\frac{1}{2}} then \boxed{7}", "level": "Level ?"},
        ],
    )  # fmt: skip
    rows, _ = load_source(SourceConfig(name="math", path=path))
    assert [(r.answer, r.difficulty) for r in rows] == [(r"\frac{\sqrt{3}}{2}", 3), ("4", 1), ("7", None)]
    # Difficulty filter: keep level >= 2, drop the unknown one too.
    rows, counts = load_source(SourceConfig(name="math", path=path, min_difficulty=2, drop_unknown_difficulty=True))
    assert [r.difficulty for r in rows] == [3] and counts["dropped_difficulty"] == 2


def test_bigmath_parquet_openr1_layout_and_solve_rate_levels(tmp_path):
    # open-r1/Big-Math-RL-Verified-Processed: problem -> "prompt", answer -> "solution", no level column.
    recs = [{"prompt": f"Problem {i}", "solution": str(i), "llama8b_solve_rate": i / 10, "source": "x"}
            for i in range(10)]  # fmt: skip
    path = write_parquet(tmp_path / "bigmath.parquet", recs)
    rows, _ = load_source(SourceConfig(name="bigmath", path=path))
    assert [r.answer for r in rows] == [str(i) for i in range(10)]
    assert all(r.solution is None for r in rows)  # open-r1's "solution" is the answer
    assert all(r.difficulty is None for r in rows)  # no level column, no single-level subset: unknown
    rows, _ = load_source(SourceConfig(name="bigmath", path=path, hf_subset="level_4"))
    assert {r.difficulty for r in rows} == {4}
    rows, _ = load_source(SourceConfig(name="bigmath", path=path, levels_from_solve_rate=True))
    assert [r.difficulty for r in rows] == [5, 5, 4, 4, 3, 3, 2, 2, 1, 1]
    # QeRL's 32B setting: levels 4-5 only.
    rows, counts = load_source(SourceConfig(name="bigmath", path=path, levels_from_solve_rate=True, min_difficulty=4))
    assert [r.problem for r in rows] == ["Problem 0", "Problem 1", "Problem 2", "Problem 3"]
    assert counts["dropped_difficulty"] == 6


def test_bigmath_original_layout_with_level(tmp_path):
    path = write_jsonl(tmp_path / "bm.jsonl", [{"problem": "P", "answer": "$5$", "level": 4}])
    rows, _ = load_source(SourceConfig(name="bigmath", path=path))
    assert (rows[0].problem, rows[0].answer, rows[0].difficulty) == ("P", "5", 4)


def test_deepmath_and_openr1(tmp_path):
    dm = write_parquet(
        tmp_path / "dm.parquet",
        [{"question": "Q1", "final_answer": r"\frac{\pi}{4}", "difficulty": 6.5, "topic": "t", "r1_solution_1": "S"}],
    )
    rows, _ = load_source(SourceConfig(name="deepmath", path=dm))
    assert (rows[0].answer, rows[0].difficulty, rows[0].solution) == (r"\frac{\pi}{4}", 6, "S")
    o1 = tmp_path / "openr1.json"
    o1.write_text(json.dumps([{"problem": "P", "solution": "long", "answer": "12", "uuid": "u"}]))
    rows, _ = load_source(SourceConfig(name="openr1", path=str(o1)))
    assert (rows[0].problem, rows[0].answer, rows[0].solution, rows[0].difficulty) == ("P", "12", "long", None)


def test_custom_fields_override_dir_and_gz(tmp_path):
    d = tmp_path / "custom"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"q": "first", "gold": "1", "lvl": "Level 2"}])
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"q": "second", "gold": "2", "lvl": 5}) + "\n")
    (d / "notes.txt").write_text("ignored")
    cfg = SourceConfig(name="custom", path=str(d), fields={"problem": "q", "answer": "gold", "difficulty": "lvl"})
    rows, _ = load_source(cfg)
    assert [(r.problem, r.answer, r.difficulty) for r in rows] == [("first", "1", 2), ("second", "2", 5)]


def test_chat_style_problem_field(tmp_path):
    path = write_jsonl(
        tmp_path / "dapo.jsonl",
        [{"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "the question"}],
          "answer": "3"}],
    )  # fmt: skip
    rows, _ = load_source(SourceConfig(name="custom", path=path))
    assert rows[0].problem == "the question"


def test_max_samples_is_seeded(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(50)])
    a, c = load_source(SourceConfig(name="gsm8k", path=path, max_samples=10), seed=1)
    b, _ = load_source(SourceConfig(name="gsm8k", path=path, max_samples=10), seed=1)
    other, _ = load_source(SourceConfig(name="gsm8k", path=path, max_samples=10), seed=2)
    assert [r.problem for r in a] == [r.problem for r in b] != [r.problem for r in other]
    assert c["dropped_max_samples"] == 40 and c["kept"] == 10


# ------------------------------------------------------------------ errors


def test_clear_errors(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "no problem field", "label": "1"}])
    with pytest.raises(SourceError, match=r"no problem field .* the records have \['label', 'text'\]"):
        load_source(SourceConfig(name="custom", path=path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2: not valid JSON"):
        read_records(str(bad))
    with pytest.raises(SourceError, match="no such file"):
        read_records(str(tmp_path / "missing.jsonl"))
    with pytest.raises(SourceError, match="unsupported file type"):
        (tmp_path / "x.csv").write_text("a,b\n")
        read_records(str(tmp_path / "x.csv"))
    with pytest.raises(ValueError, match="unknown data source"):
        SourceConfig(name="gsm9k")
    with pytest.raises(ValueError, match="needs a path"):
        SourceConfig(name="custom")


def test_hub_unreachable_says_to_pass_a_local_path():
    # In a subprocess with the hub forced offline (fast and deterministic; the real
    # offline path only adds HTTP retries before the same error).
    code = (
        "from quarl.data import read_records\n"
        "try:\n    read_records('hf://openai/gsm8k', 'main', 'train')\n"
        "except Exception as e:\n    print(type(e).__name__, '|', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    ).stdout
    assert out.startswith("SourceError |"), out
    assert "local path" in out and "s3://" in out


def test_s3_source(tmp_path, s3, s3_bucket):
    """A jsonl object and a parquet prefix read from the suite's SeaweedFS."""
    store = s3.store()
    f = tmp_path / "train.jsonl"
    write_jsonl(f, [{"question": "q1", "answer": "#### 1"}, {"question": "q2", "answer": "#### 2"}])
    store.upload_file(f, f"s3://{s3_bucket}/gsm8k/train.jsonl")
    p = tmp_path / "part.parquet"
    write_parquet(p, [{"problem": "p", "answer": "3"}])
    store.upload_file(p, f"s3://{s3_bucket}/custom/part-0.parquet")
    rows, _ = load_source(SourceConfig(name="gsm8k", path=f"s3://{s3_bucket}/gsm8k/train.jsonl"))
    assert [r.answer for r in rows] == ["1", "2"]
    rows, _ = load_source(SourceConfig(name="custom", path=f"s3://{s3_bucket}/custom"))
    assert [r.answer for r in rows] == ["3"]


# ------------------------------------------------------------------ the real GSM8K


@pytest.mark.skipif(not (GSM8K_DIR / "train.jsonl").exists(), reason=f"GSM8K not present at {GSM8K_DIR} (set QUARL_GSM8K_DIR)")
def test_real_gsm8k():
    rows, counts = load_source(SourceConfig(name="gsm8k", path=str(GSM8K_DIR / "train.jsonl")))
    assert counts["read"] == len(rows) == 7473
    assert rows[0].answer == "72" and rows[0].problem.startswith("Natalia sold clips")
    # Every GSM8K answer is a plain (possibly negative / decimal) number after normalization.
    import re

    assert all(re.fullmatch(r"-?\d+(\.\d+)?", r.answer) for r in rows), [
        r.answer for r in rows if not re.fullmatch(r"-?\d+(\.\d+)?", r.answer)
    ][:5]
    test_rows, _ = load_source(SourceConfig(name="gsm8k", path=str(GSM8K_DIR / "test.jsonl")))
    assert len(test_rows) == 1319
