"""Great Expectations validation: every kind of bad row is caught, by id."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from quarl.data import DataPrepConfig, DataValidationError, validate_rows
from quarl.data.config import FilterConfig, ValidationConfig


def good_rows(n_train: int = 10, n_eval: int = 3) -> list[dict]:
    rows = []
    for i in range(n_train + n_eval):
        rows.append(
            {"id": f"id{i:03d}", "problem": f"What is {i} + 1?", "prompt": f"What is {i} + 1? Think.",
             "messages": "[]", "answer": str(i + 1), "solution": None, "source": "synthetic",
             "difficulty": 1 + i % 5, "split": "train" if i < n_train else "eval"}
        )  # fmt: skip
    return rows


def cfg(**validation) -> DataPrepConfig:
    return DataPrepConfig(
        filters=FilterConfig(max_problem_chars=100, max_answer_chars=20),
        validation=ValidationConfig(min_train_rows=5, min_eval_rows=1, max_prompt_chars=200, **validation),
    )


def failures(report) -> dict[tuple[str, str | None], list[str]]:
    return {(r["expectation"], r.get("column")): r.get("failing_ids", []) for r in report.failures}


def test_good_rows_pass():
    rep = validate_rows(pd.DataFrame(good_rows()), cfg())
    assert rep.success, rep.to_markdown()
    assert rep.row_counts == {"train": 10, "eval": 3}
    assert len(rep.results) >= 15


@pytest.mark.parametrize(
    "mutate, expectation, column, ids",
    [
        (lambda r: r[2].update(prompt=""), "expect_column_values_to_match_regex", "prompt", ["id002"]),
        (lambda r: r[4].update(prompt="   \n "), "expect_column_values_to_match_regex", "prompt", ["id004"]),
        (lambda r: r[3].update(problem=None), "expect_column_values_to_not_be_null", "problem", ["id003"]),
        (lambda r: r[1].update(answer=""), "expect_column_values_to_match_regex", "answer", ["id001"]),
        (lambda r: r[5].update(id="id006"), "expect_column_values_to_be_unique", "id", ["id006", "id006"]),
        (lambda r: r[7].update(answer="\\frac{"), "expect_column_values_to_be_in_set", "answer_parses", ["id007"]),
        (lambda r: r[8].update(answer="hello world"), "expect_column_values_to_be_in_set", "answer_parses",
         ["id008"]),
        (lambda r: r[0].update(problem="x" * 101), "expect_column_value_lengths_to_be_between", "problem", ["id000"]),
        (lambda r: r[9].update(answer="1" * 21), "expect_column_value_lengths_to_be_between", "answer", ["id009"]),
        (lambda r: r[6].update(prompt="p" * 201), "expect_column_value_lengths_to_be_between", "prompt", ["id006"]),
        (lambda r: r[6].update(split="test"), "expect_column_values_to_be_in_set", "split", ["id006"]),
    ],
)  # fmt: skip
def test_each_bad_row_is_caught_by_id(mutate, expectation, column, ids):
    rows = good_rows()
    mutate(rows)
    rep = validate_rows(pd.DataFrame(rows), cfg())
    assert not rep.success
    got = failures(rep)
    assert got.get((expectation, column)) == ids, got
    # The markdown report names the failing expectation and the row ids.
    md = rep.to_markdown()
    assert "FAILED" in md and expectation in md and all(f"`{i}`" in md for i in ids)
    assert json.loads(rep.to_json())["n_failed"] == len(rep.failures)


def test_tiny_split_fails_row_count():
    rep = validate_rows(pd.DataFrame(good_rows(n_train=3, n_eval=0)), cfg())
    got = {(r["batch"], r["expectation"]): r for r in rep.failures}
    assert got[("train", "expect_table_row_count_to_be_between")]["observed_value"] == 3
    assert got[("eval", "expect_table_row_count_to_be_between")]["observed_value"] == 0
    err = DataValidationError(rep, report_uri="/x-validation-failed")
    assert "expect_table_row_count_to_be_between(train) observed 3" in str(err)
    assert "/x-validation-failed" in str(err)


def test_report_caps_failing_ids():
    rows = good_rows(n_train=30)
    for r in rows:
        r["answer"] = "???"
    rep = validate_rows(pd.DataFrame(rows), cfg(max_ids_in_report=4))
    r = next(x for x in rep.failures if x.get("column") == "answer_parses")
    assert r["unexpected_count"] == 33 and len(r["failing_ids"]) == 4
    assert "(and 29 more)" in rep.to_markdown()
