"""Benchmark loading: local files in each source's shape, data-prep artifacts, the generated
held-out split, prompt rendering, and the errors for bad inputs."""

from __future__ import annotations

import json

import pytest

from quarl.eval.benchmarks import EvalError, load_benchmark, render_prompts
from quarl.eval.config import BenchmarkConfig


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    from quarl.models import load_model

    return load_model("tiny-llama")[1]


def test_gsm8k_shape_extracts_hash_answers(tmp_path):
    path = _jsonl(tmp_path / "test.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "A shirt costs $1,200 after tax. Price?", "answer": "so\n#### 1,200"},
    ])  # fmt: skip
    b = load_benchmark(BenchmarkConfig(name="gsm8k", path=path))
    assert [p.answer for p in b.problems] == ["7", "1200"]
    assert b.problems[0].problem.startswith("Tom has") and b.problems[0].source == "gsm8k"
    assert len({p.id for p in b.problems}) == 2 and all(len(p.id) == 16 for p in b.problems)
    assert b.info["available"] == 2


def test_math_and_custom_shapes(tmp_path):
    math_path = _jsonl(tmp_path / "math500.jsonl", [
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "solution": "... $\\boxed{\\dfrac{3}{4}}$", "level": "Level 2"},
    ])  # fmt: skip
    b = load_benchmark(BenchmarkConfig(name="math500", path=math_path))
    assert b.problems[0].answer == "\\frac{3}{4}" and b.problems[0].difficulty == 2
    aime = _jsonl(tmp_path / "aime.jsonl", [{"problem": f"P{i}", "answer": 100 + i} for i in range(5)])
    b = load_benchmark(BenchmarkConfig(name="aime24", path=aime, max_problems=3))
    assert [p.answer for p in b.problems] == ["100", "101", "102"] and b.info["available"] == 5
    own = _jsonl(tmp_path / "own.jsonl", [{"q": "1+1?", "gold": "2"}])
    b = load_benchmark(
        BenchmarkConfig(name="own", source="custom", path=own, fields={"problem": "q", "answer": "gold"})
    )
    assert (b.problems[0].problem, b.problems[0].answer) == ("1+1?", "2")


def test_records_without_answers_are_skipped_and_counted(tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": ""}])
    b = load_benchmark(BenchmarkConfig(name="x", source="custom", path=path))
    assert len(b) == 1 and b.info["skipped_no_answer"] == 1


def test_generated_heldout_is_data_preps_eval_split(tmp_path):
    from quarl.data import DataPrepConfig, read_split, run_data_prep

    run_data_prep(DataPrepConfig(validation={"enabled": False}), output_uri=str(tmp_path / "ds"))
    expected = read_split(str(tmp_path / "ds"), "eval")
    b = load_benchmark(BenchmarkConfig(name="heldout"))
    assert [p.id for p in b.problems] == expected["id"].tolist()
    assert [p.answer for p in b.problems] == expected["answer"].tolist()
    train_ids = set(read_split(str(tmp_path / "ds"), "train")["id"])
    assert not train_ids & {p.id for p in b.problems}  # held out for real
    # ... and the same artifact read as a dataset benchmark gives the same rows and stored prompts
    b2 = load_benchmark(BenchmarkConfig(name="heldout", path=str(tmp_path / "ds"), template="dataset", max_problems=7))
    assert [p.id for p in b2.problems] == expected["id"].tolist()[:7]
    assert [p.prompt for p in b2.problems] == expected["prompt"].tolist()[:7]
    assert {p.difficulty for p in b.problems} <= {1, 2, 3, 4, 5}


def test_render_prompts(tokenizer, tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"problem": "What is 2+3?", "answer": "5"}])
    b = render_prompts(load_benchmark(BenchmarkConfig(name="x", source="custom", path=path)), tokenizer)
    p = b.problems[0].prompt
    assert p.startswith("<|im_start|>system\n") and "<answer>" in p and p.endswith("<|im_start|>assistant\n")
    b = render_prompts(
        load_benchmark(BenchmarkConfig(name="x", source="custom", path=path, template="plain")), tokenizer
    )
    assert b.problems[0].prompt == "What is 2+3?"
    b = render_prompts(
        load_benchmark(BenchmarkConfig(name="x", source="custom", path=path, instruction="Be brief.")), tokenizer
    )
    assert "Be brief." in b.problems[0].prompt and "<answer>" not in b.problems[0].prompt
    # a tokenizer without a chat template: qerl falls back to the plain-text suffix, chat is an error
    no_chat = type("T", (), {"chat_template": None})()
    b = render_prompts(load_benchmark(BenchmarkConfig(name="x", source="custom", path=path)), no_chat)
    assert b.problems[0].prompt.startswith("What is 2+3?\n\nSolve the following")
    with pytest.raises(EvalError, match="chat template"):
        render_prompts(load_benchmark(BenchmarkConfig(name="x", source="custom", path=path, template="chat")), no_chat)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(EvalError, match=r"benchmark gsm8k: .*nope\.jsonl: no such file"):
        load_benchmark(BenchmarkConfig(name="gsm8k", path=str(tmp_path / "nope.jsonl")))


def test_empty_dataset_is_a_clear_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(EvalError, match="benchmark empty has no problems"):
        load_benchmark(BenchmarkConfig(name="empty", source="custom", path=str(tmp_path / "empty.jsonl")))
    only_blank = _jsonl(tmp_path / "blank.jsonl", [{"problem": "a", "answer": " "}])
    with pytest.raises(EvalError, match="has no problems"):
        load_benchmark(BenchmarkConfig(name="blank", source="custom", path=only_blank))


def test_wrong_fields_name_the_fix(tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"text": "a", "label": "1"}])
    with pytest.raises(EvalError, match="no problem field.*fields="):
        load_benchmark(BenchmarkConfig(name="x", source="custom", path=path))


def test_dataset_source_needs_an_artifact(tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"problem": "a", "answer": "1"}])
    with pytest.raises(EvalError, match="source=custom"):
        load_benchmark(BenchmarkConfig(name="heldout", path=path))


def test_offline_hub_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(EvalError, match="benchmark math500: cannot load hf://HuggingFaceH4/MATH-500.*local path"):
        load_benchmark(BenchmarkConfig(name="math500"))
