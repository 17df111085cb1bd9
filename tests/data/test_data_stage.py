"""The data_prep stage end to end (embedded default, GSM8K, mixed sources), its
failure path, and the ``quarl data-prep`` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import quarl
from quarl.artifacts import ArtifactExistsError, open_artifact
from quarl.config import load_config
from quarl.data import (
    QERL_INSTRUCTION,
    SCHEMA,
    DataPrepConfig,
    DataValidationError,
    PromptTemplate,
    failed_report_uri,
    make_id,
    read_dataset,
    run_data_prep,
)
from quarl.data.filters import normalize_text, process_rows
from quarl.data.sources import RawProblem
from tests.data_paths import GSM8K_DIR


def small_default(**over) -> DataPrepConfig:
    return load_config(DataPrepConfig, None, ["sources=[{name: synthetic, num_samples: 300}]", *over.get("sets", [])])


def test_embedded_default_end_to_end(tmp_path):
    out = tmp_path / "data"
    res = run_data_prep(small_default(), output_uri=str(out))
    assert res["validation"] == "passed"
    art = open_artifact(str(out), kind="dataset")
    assert art.stage == "data_prep" and art.manifest["rows"] == res["rows"]
    assert art.manifest["inputs"] == ["builtin:synthetic?n=300&seed=0"]
    assert art.config["sources"][0]["num_samples"] == 300
    assert set(art.manifest["files"]) == {
        "train.parquet", "eval.parquet", "summary.json", "summary.md", "validation.json", "validation.md",
    }  # fmt: skip
    assert pq.read_schema(art.file("train.parquet")).equals(SCHEMA, check_metadata=False)

    data = read_dataset(str(out))
    train, ev = data["train"], data["eval"]
    assert len(train) == res["rows"]["train"] and len(ev) == res["rows"]["eval"]
    assert len(ev) == round(0.05 * (len(train) + len(ev)))  # the default eval fraction
    assert set(train["id"]).isdisjoint(ev["id"])
    row = train.iloc[0]
    assert row["id"] == make_id("synthetic", row["problem"])
    assert row["prompt"] == f"{row['problem']}\n\n{QERL_INSTRUCTION}"
    assert json.loads(row["messages"])[1] == {"role": "user", "content": row["problem"]}

    summary = json.loads(art.file("summary.json").read_text())
    assert summary["splits"]["train"]["rows"] == len(train)
    assert summary["splits"]["train"]["by_source"] == {"synthetic": len(train)}
    assert sum(summary["splits"]["train"]["difficulty_histogram"].values()) == len(train)
    assert summary["splits"]["train"]["prompt_chars"]["max"] == train["prompt"].str.len().max()
    assert "| train |" in art.file("summary.md").read_text()
    assert json.loads(art.file("validation.json").read_text())["success"] is True

    # Deterministic: the same config gives the same rows in the same order.
    again = run_data_prep(small_default(), output_uri=str(tmp_path / "again"))
    assert again["rows"] == res["rows"]
    assert read_dataset(str(tmp_path / "again"))["train"].equals(train)
    # A complete artifact is not replaced without overwrite.
    with pytest.raises(ArtifactExistsError):
        run_data_prep(small_default(), output_uri=str(out))
    run_data_prep(small_default(sets=["seed=1"]), output_uri=str(out), overwrite=True)
    assert not read_dataset(str(out))["train"].equals(train)


def test_mixed_sources_dedup_prefers_eval_and_fixed_eval_disables_auto_split(tmp_path):
    shared = "Natalia sold 48 clips in April and half as many in May. How many in total?"
    train_f = tmp_path / "train.jsonl"
    train_f.write_text(
        json.dumps({"question": shared, "answer": "#### 72"}) + "\n"
        + json.dumps({"question": "Unique train question?", "answer": "#### 5"}) + "\n"
    )  # fmt: skip
    eval_f = tmp_path / "test.jsonl"
    # The same problem re-typed (case/whitespace) in the eval file.
    eval_f.write_text(json.dumps({"question": "  natalia sold 48 clips in April and half as many in May.  How many"
                                              " in total", "answer": "#### 72"}) + "\n")  # fmt: skip
    cfg = load_config(
        DataPrepConfig,
        None,
        [
            f"sources=[{{name: synthetic, num_samples: 40}}, gsm8k:{train_f}, {{name: gsm8k, path: {eval_f}, split: eval}}]",
            "validation.min_train_rows=1",
        ],
    )
    res = run_data_prep(cfg, output_uri=str(tmp_path / "out"))
    data = read_dataset(str(tmp_path / "out"))
    assert res["dropped"]["duplicate"] == 1
    assert len(data["eval"]) == 1 and data["eval"]["source"].tolist() == ["gsm8k"]  # only the fixed eval set
    assert normalize_text(shared) == normalize_text(data["eval"]["problem"].iloc[0])
    assert sorted(data["train"]["source"].value_counts().to_dict().items()) == [("gsm8k", 1), ("synthetic", 40)]
    assert res["sources"].keys() == {"synthetic", "gsm8k", "gsm8k#2"}


def test_process_rows_filters(toy_tokenizer):
    toy_template = PromptTemplate("qerl", tokenizer=toy_tokenizer())
    raw = [
        RawProblem("short one", "1", None, 1, "custom"),
        RawProblem("x " * 40, "2", None, 1, "custom"),  # 80 chars: over max_problem_chars
        RawProblem("long answer", "9" * 30, None, 1, "custom"),
        RawProblem("no answer", "", None, 1, "custom"),
        RawProblem("junk answer", "\\frac{", None, 1, "custom"),
        RawProblem(" ".join(["w"] * 30), "3", None, 1, "custom"),  # many tokens
        RawProblem("Short one", "1", None, 1, "custom"),  # normalized duplicate of the first
    ] + [RawProblem(f"filler {i}", str(i), None, 2, "custom") for i in range(10)]
    cfg = load_config(
        DataPrepConfig,
        None,
        [
            "sources=[synthetic]",
            "tokenizer=toy",
            "filters.max_problem_chars=70",
            "filters.max_answer_chars=20",
            "filters.max_prompt_tokens=50",
            "split.eval_size=2",
            "split.max_train_samples=5",
        ],
    )
    rows, drops = process_rows([("auto", raw)], cfg, toy_template)
    assert drops == {
        "answer_empty": 1,
        "answer_too_long": 1,
        "answer_unparseable": 1,
        "duplicate": 1,
        "problem_too_long": 1,
        "prompt_too_many_tokens": 1,
        "train_over_max_samples": 4,
    }
    assert [r.split for r in rows].count("eval") == 2 and [r.split for r in rows].count("train") == 5


def test_validation_failure_leaves_a_report_and_no_dataset(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(json.dumps({"problem": f"p{i}", "answer": str(i)}) + "\n" for i in range(20))
        + json.dumps({"problem": "the bad one", "answer": "hello world"}) + "\n"
    )  # fmt: skip
    cfg = load_config(DataPrepConfig, None, [f"sources=[custom:{bad}]", "filters.drop_unparseable_answers=false"])
    out = tmp_path / "run" / "data_prep" / "dataset"
    with pytest.raises(DataValidationError) as ei:
        run_data_prep(cfg, output_uri=str(out))
    bad_id = make_id("custom", "the bad one")
    assert bad_id in str(ei.value) and "answer_parses" in str(ei.value)
    assert ei.value.report_uri == failed_report_uri(str(out)) == str(out) + "-validation-failed"
    assert not out.exists()  # nothing half-written at the output URI
    rep = open_artifact(ei.value.report_uri, kind="report")
    assert rep.manifest["validation"] == "failed"
    report = json.loads(rep.file("validation.json").read_text())
    failed = [r for r in report["results"] if not r["success"]]
    assert [(r["column"], r["failing_ids"]) for r in failed] == [("answer_parses", [bad_id])]
    assert f"`{bad_id}`" in rep.file("validation.md").read_text()


def test_stage_to_s3_and_failed_report_on_s3(s3, s3_bucket):
    uri = f"s3://{s3_bucket}/run-1/data_prep/dataset"
    res = run_data_prep(small_default(), output_uri=uri)
    data = read_dataset(uri)
    assert len(data["train"]) == res["rows"]["train"] and len(data["eval"]) == res["rows"]["eval"]
    bad = load_config(DataPrepConfig, None, ["sources=[{name: synthetic, num_samples: 20}]",
                                             "validation.min_train_rows=1000"])  # fmt: skip
    with pytest.raises(DataValidationError) as ei:
        run_data_prep(bad, output_uri=f"s3://{s3_bucket}/run-2/data_prep/dataset")
    assert ei.value.report_uri == f"s3://{s3_bucket}/run-2/data_prep/dataset-validation-failed"
    rep = open_artifact(ei.value.report_uri, kind="report")
    assert "expect_table_row_count_to_be_between" in rep.file("validation.md").read_text()
    assert not s3.store().exists(f"s3://{s3_bucket}/run-2/data_prep/dataset/")


RECIPES = Path(quarl.__file__).parent / "recipes" / "data"


def test_data_recipes_load():
    names = sorted(p.name for p in RECIPES.glob("*.yaml"))
    assert names == ["bigmath-l345.yaml", "bigmath-l45.yaml", "default.yaml", "gsm8k.yaml"]
    cfgs = {n: load_config(DataPrepConfig, RECIPES / n) for n in names}
    assert [(s.name, s.split, s.hf_split) for s in cfgs["gsm8k.yaml"].sources] == [
        ("gsm8k", "train", "train"),
        ("gsm8k", "eval", "test"),
    ]
    assert cfgs["bigmath-l345.yaml"].sources[0].hf_subset == "level_3_4_5"
    assert cfgs["bigmath-l45.yaml"].sources[0].hf_subset == "level_4_5"
    assert all(c.filters.max_problem_chars == 1024 for c in cfgs.values())  # QeRL's prompt-length filter
    assert cfgs["default.yaml"] == DataPrepConfig()  # the recipe spells out the defaults


@pytest.mark.skipif(not (GSM8K_DIR / "train.jsonl").exists(), reason=f"GSM8K not present at {GSM8K_DIR} (set QUARL_GSM8K_DIR)")
def test_gsm8k_recipe_end_to_end_on_local_files(tmp_path):
    local = (
        f"sources=[{{name: gsm8k, path: {GSM8K_DIR / 'train.jsonl'}, split: train}},"
        f" {{name: gsm8k, path: {GSM8K_DIR / 'test.jsonl'}, split: eval}}]"
    )
    cfg = load_config(DataPrepConfig, RECIPES / "gsm8k.yaml", [local])
    res = run_data_prep(cfg, output_uri=str(tmp_path / "gsm8k"))
    data = read_dataset(str(tmp_path / "gsm8k"))
    assert res["rows"] == {"train": len(data["train"]), "eval": len(data["eval"])}
    assert len(data["eval"]) == 1319  # GSM8K test, whole
    assert len(data["train"]) >= 7400  # train minus rare duplicates of test problems
    first = data["eval"].iloc[0]
    assert first["answer"] == "18" and "Janet" in first["problem"]
    assert set(data["train"]["problem"]).isdisjoint(data["eval"]["problem"])


# ------------------------------------------------------------------ CLI


def test_cli_data_prep(tmp_path):
    from quarl.cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli-out"
    result = runner.invoke(
        app,
        ["data-prep", "--set", "sources=[{name: synthetic, num_samples: 120, min_difficulty: 4}]",
         "--set", "split.eval_size=10", "--output", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout[result.stdout.index("{") :])
    assert payload["rows"] == {"train": 110, "eval": 10}
    data = read_dataset(str(out))
    assert set(data["train"]["difficulty"]) | set(data["eval"]["difficulty"]) == {4, 5}

    # Expected failures are one "error:" line and exit status 1.
    again = runner.invoke(app, ["data-prep", "--set", "sources=[synthetic]", "--output", str(out)])
    assert again.exit_code == 1 and "already holds a complete dataset" in again.output
    bad = runner.invoke(app, ["data-prep", "--set", "filters.dedupe=exact", "--output", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "did you mean 'filters.dedup'" in bad.output
    printed = runner.invoke(app, ["data-prep", "--print-config", "--set", "sources=[gsm8k:/d/t.jsonl]", "-o", "x"])
    assert printed.exit_code == 0 and "path: /d/t.jsonl" in printed.stdout
