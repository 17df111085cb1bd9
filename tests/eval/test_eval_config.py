"""EvalConfig / BenchmarkConfig: presets, specs, validation, YAML + --set overrides."""

from __future__ import annotations

import pytest

from quarl.config import ConfigError, config_to_dict, load_config
from quarl.eval.config import BENCHMARK_PRESETS, BenchmarkConfig, EvalConfig, SamplingConfig


def test_defaults_are_the_papers_sampling():
    s = SamplingConfig()
    assert (s.temperature, s.top_p, s.greedy) == (0.6, 0.95, False)
    assert s.n > 1
    assert EvalConfig().benchmarks == []


def test_presets_fill_unset_fields_only():
    b = BenchmarkConfig(name="GSM8K")
    assert (b.name, b.source, b.path, b.hf_subset, b.hf_split) == (
        "gsm8k",
        "gsm8k",
        "hf://openai/gsm8k",
        "main",
        "test",
    )
    b = BenchmarkConfig(name="gsm8k", path="/data/test.jsonl")
    assert b.path == "/data/test.jsonl" and b.source == "gsm8k"
    assert BenchmarkConfig(name="MATH-500").source == "math"
    assert BenchmarkConfig(name="aime_2024").name == "aime24"
    assert BenchmarkConfig(name="synthetic").source == "dataset"
    assert set(BENCHMARK_PRESETS) >= {"gsm8k", "math500", "aime24", "aime25", "amc23", "heldout"}


@pytest.mark.parametrize(
    "spec,name,path",
    [("gsm8k", "gsm8k", "hf://openai/gsm8k"), ("gsm8k=/x/test.jsonl", "gsm8k", "/x/test.jsonl"),
     ("math500:s3://b/k.parquet", "math500", "s3://b/k.parquet"), ("mine=s3://b/p.jsonl", "mine", "s3://b/p.jsonl")],
)  # fmt: skip
def test_string_specs(spec, name, path):
    b = BenchmarkConfig.parse(spec)
    assert (b.name, b.path) == (name, path)


def test_unknown_benchmark_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'.*known benchmarks are gsm8k"):
        BenchmarkConfig(name="gsm9k")
    with pytest.raises(ConfigError, match="unknown benchmark 'nope'"):
        load_config(EvalConfig, None, ["benchmarks=[nope]"])


@pytest.mark.parametrize(
    "kw,match",
    [({"name": "x", "source": "custom"}, "no path"), ({"name": "gsm8k", "template": "fancy"}, "template"),
     ({"name": "gsm8k", "source": "tsv"}, "unknown source"), ({"name": "gsm8k", "max_problems": 0}, "max_problems"),
     ({"name": "gsm8k", "template": "dataset"}, "needs source=dataset"), ({"name": "heldout", "split": "dev"}, "split")],
)  # fmt: skip
def test_bad_benchmark_fields(kw, match):
    with pytest.raises(ValueError, match=match):
        BenchmarkConfig(**kw)


def test_sampling_validation_and_greedy():
    assert SamplingConfig(greedy=True, n=8).n == 1
    assert SamplingConfig(greedy=True, temperature=0).n == 1  # temperature is unused with greedy
    for kw, match in [
        ({"temperature": 0}, "greedy=true"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "sampling.n"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"cache": "paged"}, "cache"),
    ]:
        with pytest.raises(ValueError, match=match):
            SamplingConfig(**kw)


def test_overrides_and_round_trip(tmp_path):
    cfg = load_config(EvalConfig, None, [
        "benchmarks=[gsm8k=/d/test.jsonl, {name: heldout, max_problems: 5}]", "sampling.n=4",
        "sampling.max_new_tokens=64", "quant=nvfp4", "pass_k=[8, 1, 4, 4]",
    ])  # fmt: skip
    assert [b.name for b in cfg.benchmarks] == ["gsm8k", "heldout"]
    assert cfg.benchmarks[1].max_problems == 5 and cfg.sampling.n == 4 and cfg.quant == "nvfp4"
    assert cfg.pass_k == [1, 4, 8]
    p = tmp_path / "eval.yaml"
    import yaml

    p.write_text(yaml.safe_dump(config_to_dict(cfg)))
    assert load_config(EvalConfig, p) == cfg


def test_duplicate_names_and_bad_fields():
    with pytest.raises(ConfigError, match="unique"):
        load_config(EvalConfig, None, ["benchmarks=[gsm8k, GSM8K]"])
    with pytest.raises(ConfigError, match="did you mean 'sampling.top_p'"):
        load_config(EvalConfig, None, ["sampling.topp=0.9"])
    with pytest.raises(ConfigError, match="dtype"):
        load_config(EvalConfig, None, ["dtype=int8"])


def test_recipes_load():
    from pathlib import Path

    import quarl

    recipes = sorted((Path(quarl.__file__).parent / "recipes" / "eval").glob("*.yaml"))
    assert len(recipes) >= 4
    for p in recipes:
        cfg = load_config(EvalConfig, p)
        assert cfg.benchmarks, p.name
