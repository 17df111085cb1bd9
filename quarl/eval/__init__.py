"""Evaluation: a model -- full precision, RTN-quantized or calibrated, with or without a
LoRA adapter -- on math benchmarks, scored the way the reasoning-RL papers report.

    run_eval(cfg: EvalConfig, *, model_uri, data_uris=None, adapter_uri=None, output_uri) -> dict
    pass_at_k(n, c, k) / mean_pass_at_k / avg_at_n          the estimators
    load_benchmark(BenchmarkConfig) -> Benchmark             GSM8K, MATH-500, AIME, AMC, held-out split
    load_eval_model(model_uri, cfg, adapter_uri)             model + tokenizer as the config says
    compare_runs([baseline_uri, other_uri, ...])             paired accuracy delta, answer agreement

See ``stage`` (flow, data URIs, artifact), ``config`` (benchmarks and defaults),
``generate`` (sampling on the RL rollout engine), ``scoring`` (metrics),
``report`` (files) and ``compare`` (paired comparison of runs).
"""

from quarl.eval.benchmarks import Benchmark, EvalError, EvalProblem, load_benchmark, render_prompts
from quarl.eval.compare import compare_markdown, compare_runs
from quarl.eval.config import BENCHMARK_PRESETS, BenchmarkConfig, EvalConfig, SamplingConfig
from quarl.eval.model import load_eval_model
from quarl.eval.passk import avg_at_n, mean_pass_at_k, pass_at_k
from quarl.eval.stage import resolve_benchmarks, run_eval

__all__ = [
    "BENCHMARK_PRESETS",
    "Benchmark",
    "BenchmarkConfig",
    "EvalConfig",
    "EvalError",
    "EvalProblem",
    "SamplingConfig",
    "avg_at_n",
    "compare_markdown",
    "compare_runs",
    "load_benchmark",
    "load_eval_model",
    "mean_pass_at_k",
    "pass_at_k",
    "render_prompts",
    "resolve_benchmarks",
    "run_eval",
]
