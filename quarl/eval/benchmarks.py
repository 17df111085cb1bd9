"""Benchmarks: a :class:`BenchmarkConfig` -> the problems, gold answers and rendered prompts.

Records are read with the data stage's public readers, so a benchmark's
problems are mapped and its answers normalized exactly as training data is
(``quarl.data.load_source``: GSM8K's ``#### n``, MATH's ``\\boxed{}``/level,
custom field names, local/S3/hub paths with the hub's offline error). The
built-in held-out split comes from a data-prep artifact (``read_split``) or,
without one, from running data-prep's own code with its defaults into a
temporary directory -- so "held out" means exactly the rows the default RL run
never trains on, not a look-alike sample from another seed.

Prompts are rendered with the model's tokenizer: ``qerl`` sends QeRL's
instruction as the system message through the chat template (QeRL's own eval),
falling back to the plain-text suffix for tokenizers without a chat template;
``chat`` requires one; ``plain`` is the bare problem; ``dataset`` reuses the
prompt a data-prep artifact stored. Prompts are tokenized with
``add_special_tokens=False`` (the chat template already carries its markers),
the convention of :mod:`quarl.data.templates`.
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass, field
from typing import Any

from quarl.eval.config import BenchmarkConfig

__all__ = ["Benchmark", "EvalError", "EvalProblem", "load_benchmark", "render_prompts"]

log = logging.getLogger(__name__)


class EvalError(ValueError):
    """Bad evaluation input (benchmark, data, model, adapter); the message names the fix."""


@dataclass
class EvalProblem:
    id: str
    problem: str
    answer: str  # normalized gold answer
    prompt: str = ""  # rendered text fed to the model
    source: str = ""
    difficulty: int | None = None


@dataclass
class Benchmark:
    name: str
    problems: list[EvalProblem]
    config: BenchmarkConfig
    info: dict[str, Any] = field(default_factory=dict)  # where the rows came from, what was dropped

    def __len__(self) -> int:
        return len(self.problems)


def _difficulty(v) -> int | None:
    try:
        if v is None or math.isnan(float(v)):  # None / NaN
            return None
        return int(v)
    except (TypeError, ValueError):  # pd.NA and anything else that is not a level
        return None


def _from_dataset(cfg: BenchmarkConfig) -> tuple[list[EvalProblem], dict]:
    from quarl.artifacts import ArtifactError
    from quarl.data import read_split

    info: dict[str, Any] = {}
    if cfg.path:
        try:
            df = read_split(cfg.path, cfg.split)
        except (ArtifactError, ValueError, OSError) as e:
            raise EvalError(
                f"benchmark {cfg.name}: cannot read split {cfg.split!r} of data-prep artifact {cfg.path}: {e}. "
                "source=dataset expects the output of `quarl data-prep`; for a plain jsonl/parquet file use "
                "source=custom (or a known name such as gsm8k)"
            ) from e
        info["origin"] = f"data-prep artifact {cfg.path} ({cfg.split} split)"
    else:
        from quarl.data import DataPrepConfig, SourceConfig, run_data_prep

        dp = DataPrepConfig(
            sources=[SourceConfig(name="synthetic", num_samples=cfg.generated_samples)],
            seed=cfg.generated_seed,
            split={"eval_size": cfg.generated_eval_size},
            validation={"enabled": False},
        )
        with tempfile.TemporaryDirectory(prefix="quarl-eval-heldout-") as tmp:
            run_data_prep(dp, output_uri=f"{tmp}/dataset")
            df = read_split(f"{tmp}/dataset", cfg.split)
        info["origin"] = (
            f"built-in generator, {cfg.split} split of data-prep defaults (num_samples={cfg.generated_samples}, "
            f"seed={cfg.generated_seed}, eval_size={cfg.generated_eval_size})"
        )
    rows = df.to_dict("records")
    probs = [
        EvalProblem(id=str(r["id"]), problem=str(r["problem"]), answer=str(r["answer"]), prompt=str(r["prompt"]),
                    source=str(r["source"]), difficulty=_difficulty(r.get("difficulty")))
        for r in rows
    ]  # fmt: skip
    return probs, info


def _from_source(cfg: BenchmarkConfig) -> tuple[list[EvalProblem], dict]:
    from quarl.data import SourceConfig, SourceError, load_source, make_id

    try:
        src = SourceConfig(
            name=cfg.source,
            path=cfg.path,
            hf_subset=cfg.hf_subset,
            hf_split=cfg.hf_split,
            fields=dict(cfg.fields),
            split="eval",
        )
        raw, counts = load_source(src)
    except (SourceError, ValueError, OSError) as e:
        raise EvalError(f"benchmark {cfg.name}: {e}") from e
    probs, no_answer = [], 0
    for r in raw:
        if not r.answer.strip():
            no_answer += 1  # cannot be scored; counted, not silently kept as always-wrong
            continue
        probs.append(
            EvalProblem(
                id=make_id(r.source, r.problem),
                problem=r.problem,
                answer=r.answer,
                source=r.source,
                difficulty=r.difficulty,
            )
        )
    info = {"origin": f"{cfg.source} records from {cfg.path}", "read": counts.get("read", len(raw))}
    if no_answer:
        log.warning("benchmark %s: %d record(s) without a reference answer skipped", cfg.name, no_answer)
        info["skipped_no_answer"] = no_answer
    return probs, info


def _renderer(cfg: BenchmarkConfig, tokenizer):
    """problem -> prompt text for the configured template."""
    from quarl.data import PromptTemplate, TemplateError

    if cfg.template == "dataset":
        return None
    has_chat = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    tok = tokenizer if (cfg.template == "chat" or (cfg.template == "qerl" and has_chat)) else None
    try:
        tpl = PromptTemplate(cfg.template, tokenizer=tok, instruction=cfg.instruction)
    except TemplateError as e:
        raise EvalError(f"benchmark {cfg.name}: {e}") from e
    return lambda problem: tpl.render(problem)[0]


def load_benchmark(cfg: BenchmarkConfig) -> Benchmark:
    """Read and cap one benchmark (no model needed, so bad data fails before a model loads);
    raises :class:`EvalError` on bad input. Prompts are rendered by :func:`render_prompts`."""
    if cfg.source == "dataset":
        probs, info = _from_dataset(cfg)
    else:
        probs, info = _from_source(cfg)
    if not probs:
        raise EvalError(
            f"benchmark {cfg.name} has no problems with a reference answer ({info.get('origin', cfg.path)}); "
            "check the path, split and field names (fields={problem: ..., answer: ...})"
        )
    info["available"] = len(probs)
    if cfg.max_problems is not None and len(probs) > cfg.max_problems:
        probs = probs[: cfg.max_problems]
    info["template"] = cfg.template
    return Benchmark(name=cfg.name, problems=probs, config=cfg, info=info)


def render_prompts(bench: Benchmark, tokenizer) -> Benchmark:
    """Fill every problem's ``prompt`` with the benchmark's template and the model's tokenizer."""
    render = _renderer(bench.config, tokenizer)
    if render is not None:
        for p in bench.problems:
            p.prompt = render(p.problem)
    return bench
