"""A real model: SmolLM2-135M-Instruct (the embedded default) on a handful of GSM8K test problems.

Skips when the GSM8K copy is absent. Checks that the pipeline produces what a person expects from
a real instruct model -- text in English, answers the extractor finds, greedy determinism --
not a score (135M parameters: near zero on GSM8K is the honest expectation)."""

from __future__ import annotations

import json

import pytest

from tests.data_paths import GSM8K_DIR

GSM8K_TEST = GSM8K_DIR / "test.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason=f"GSM8K test split not found at {GSM8K_TEST}")
def test_smollm2_on_gsm8k(tmp_path):
    from quarl.artifacts import open_artifact
    from quarl.config import load_config
    from quarl.eval import EvalConfig, run_eval

    cfg = load_config(EvalConfig, None, [
        "benchmarks=[{name: gsm8k, max_problems: 3}]", "sampling.greedy=true", "sampling.max_new_tokens=64",
        "dtype=bfloat16", "cpu_threads=1", "quant=nvfp4",
    ])  # fmt: skip
    res = run_eval(cfg, model_uri="default", data_uris={"gsm8k": str(GSM8K_TEST)}, output_uri=str(tmp_path / "o"),
                   progress=False)  # fmt: skip
    g = res["benchmarks"]["gsm8k"]
    assert g["problems"] == 3 and 0.0 <= g["accuracy"] <= 1.0
    art = open_artifact(str(tmp_path / "o"), kind="metrics")
    samples = [json.loads(x) for x in (art.path / "samples.jsonl").read_text().splitlines()]
    assert [s["gold"] for s in samples] == ["18", "3", "70000"]  # the first three test answers
    text = " ".join(s["completion"] for s in samples)
    assert sum(c.isascii() and c.isalpha() for c in text) > 0.5 * len(text)  # an instruct model writes English
    assert sum(s["extracted_answer"] is not None for s in samples) >= 2  # and states numbers we can extract
    m = json.loads((art.path / "metrics.json").read_text())
    assert m["model"]["quantization"] == "rtn" and m["model"]["dtype"] == "bfloat16"
