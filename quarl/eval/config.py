"""Configuration of the evaluation stage.

Defaults are the settings the reasoning-RL papers report with (DeepSeek-R1,
QeRL, DAPO): sampling at temperature 0.6 and top-p 0.95, several samples per
problem, avg@n ("pass@1") and unbiased pass@k. ``quarl/recipes/eval/*.yaml``
hold ready set-ups (a CPU smoke run, GSM8K, the competition sets); anything is
overridable from the CLI:

    quarl eval --model default --data gsm8k=/work/shared/data/gsm8k/test.jsonl \
               --set sampling.n=1 --set sampling.greedy=true --set benchmarks[0].max_problems=100

A **benchmark** is a name, a source (how its records map to problem/answer),
a path and a prompt template. Known names carry presets (source, hub id,
split), so ``benchmarks: [gsm8k]`` or ``"gsm8k:/data/gsm8k/test.jsonl"`` is
enough:

    name      source    default path (hub; offline -> give a local path / s3://)
    gsm8k     gsm8k     hf://openai/gsm8k  subset main, split test
    math500   math      hf://HuggingFaceH4/MATH-500  split test
    aime24    custom    hf://HuggingFaceH4/aime_2024  split train (30 problems)
    aime25    custom    hf://math-ai/aime25  split test
    amc23     custom    hf://math-ai/amc23  split test
    heldout   dataset   a data-prep artifact's eval split; no path: the built-in
                        generator's held-out split exactly as the default
                        data-prep run makes it (2000 problems, seed 0, 5% held out)

Sources: ``gsm8k``, ``math``, ``custom`` and the other data-prep source names
read raw records through :func:`quarl.data.load_source` (local
jsonl/json/parquet, ``s3://``, ``hf://``) with the same field mappings and
answer normalization the training data gets; ``dataset`` reads a data-prep
artifact (``split`` picks eval/train).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from quarl.rewards import RewardConfig

__all__ = ["BENCHMARK_PRESETS", "SOURCES", "TEMPLATES", "BenchmarkConfig", "EvalConfig", "SamplingConfig"]

# name -> defaults for the benchmark's fields (applied where the user left them unset).
BENCHMARK_PRESETS: dict[str, dict[str, Any]] = {
    "gsm8k": {"source": "gsm8k", "path": "hf://openai/gsm8k", "hf_subset": "main", "hf_split": "test"},
    "math500": {"source": "math", "path": "hf://HuggingFaceH4/MATH-500", "hf_split": "test"},
    "aime24": {"source": "custom", "path": "hf://HuggingFaceH4/aime_2024", "hf_split": "train"},
    "aime25": {"source": "custom", "path": "hf://math-ai/aime25", "hf_split": "test"},
    "amc23": {"source": "custom", "path": "hf://math-ai/amc23", "hf_split": "test"},
    "heldout": {"source": "dataset"},
}
_NAME_ALIASES = {
    "math-500": "math500", "math_500": "math500", "aime2024": "aime24", "aime_2024": "aime24",
    "aime2025": "aime25", "aime_2025": "aime25", "amc2023": "amc23", "amc_2023": "amc23",
    "synthetic": "heldout", "generated": "heldout", "held-out": "heldout", "default": "heldout",
}  # fmt: skip
# Data-prep source names (quarl.data.load_source) plus "dataset" (a data-prep artifact).
SOURCES = ("gsm8k", "math", "bigmath", "deepmath", "openr1", "custom", "dataset")
# qerl/chat/plain as in quarl.data.templates; "dataset" = the prompt stored in a data-prep artifact.
TEMPLATES = ("qerl", "chat", "plain", "dataset")


def canonical_name(name: str) -> str:
    low = name.strip().lower()
    return _NAME_ALIASES.get(low, low)


@dataclass
class BenchmarkConfig:
    name: str = "heldout"
    # How records map to problem/answer (see module docstring); None: the preset's.
    source: str | None = None
    # Local file/dir/glob, s3:// URI, hf://org/name, or a data-prep artifact (source dataset).
    path: str | None = None
    template: str = "qerl"
    instruction: str | None = None  # None: QeRL's instruction (qerl/chat templates)
    hf_subset: str | None = None
    hf_split: str | None = None
    fields: dict[str, str] = field(default_factory=dict)  # raw field names: {problem: q, answer: a}
    split: str = "eval"  # source dataset: which split of the artifact
    max_problems: int | None = None  # the first N problems (file order), for quick runs
    # source dataset without a path: the generator set-up whose held-out split is evaluated.
    generated_samples: int = 2000
    generated_seed: int = 0
    generated_eval_size: float = 0.05

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("a benchmark needs a name (gsm8k, math500, aime24, aime25, amc23, heldout or your own)")
        self.name = canonical_name(self.name)
        if self.name not in BENCHMARK_PRESETS and self.source is None and not self.path:
            raise ValueError(
                f"unknown benchmark {self.name!r}: known benchmarks are {', '.join(BENCHMARK_PRESETS)}; "
                f"for your own problems give a path (name=path/to/file.jsonl) and, if needed, source and fields"
            )
        for k, v in BENCHMARK_PRESETS.get(self.name, {}).items():
            if getattr(self, k) is None:
                setattr(self, k, v)
        if self.source is None:
            self.source = "custom"
        self.source = self.source.strip().lower()
        if self.source not in SOURCES:
            raise ValueError(
                f"benchmark {self.name}: unknown source {self.source!r}; choose one of {', '.join(SOURCES)}"
            )
        if self.source == "custom" and not self.path:
            raise ValueError(
                f"benchmark {self.name}: no path; give it one (jsonl/json/parquet file, s3:// URI, hf://org/name) "
                f"or use a known name ({', '.join(BENCHMARK_PRESETS)})"
            )
        if self.template not in TEMPLATES:
            raise ValueError(f"benchmark {self.name}: template={self.template!r}; choose one of {', '.join(TEMPLATES)}")
        if self.template == "dataset" and self.source != "dataset":
            raise ValueError(f"benchmark {self.name}: template=dataset needs source=dataset (stored prompts)")
        if self.split not in ("train", "eval"):
            raise ValueError(f"benchmark {self.name}: split={self.split!r}; use eval or train")
        if self.max_problems is not None and self.max_problems < 1:
            raise ValueError(f"benchmark {self.name}: max_problems must be >= 1, got {self.max_problems}")

    @classmethod
    def parse(cls, spec: Any) -> BenchmarkConfig:
        """``BenchmarkConfig`` | mapping | ``"name"`` | ``"name=path"`` | ``"name:path"``."""
        if isinstance(spec, cls):
            return spec
        if isinstance(spec, str):
            name, path = _split_spec(spec)
            return cls(name=name, path=path)
        if isinstance(spec, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(spec) - known)
            if unknown:
                raise ValueError(f"benchmark {spec.get('name', '?')}: unknown keys {unknown}; valid: {sorted(known)}")
            return cls(**spec)
        raise ValueError(f"cannot read a benchmark from {spec!r}; use a mapping, 'name' or 'name=path'")


def _split_spec(spec: str) -> tuple[str, str | None]:
    s = spec.strip()
    if "=" in s:
        name, _, path = s.partition("=")
    elif ":" in s and not s.startswith(("s3://", "hf://", "/", ".")):
        name, _, path = s.partition(":")
    else:
        name, path = s, ""
    return name.strip(), (path.strip() or None)


@dataclass
class SamplingConfig:
    temperature: float = 0.6
    top_p: float = 0.95
    n: int = 8  # samples per problem (avg@n); 1 with greedy
    greedy: bool = False  # argmax decoding (n is forced to 1)
    max_new_tokens: int = 4096  # QeRL's GSM8K response budget; lower it for CPU runs
    batch_size: int = 32  # sequences per generation batch (prompts x samples)
    # Generation engine (quarl.engine.make_generator): auto (the CUDA-graph FastGenerator
    # for Llama/Qwen on a GPU, else the reference) | fast | reference (quarl.engine.rollout.HFGenerator).
    engine: str = "auto"
    cache: str = "static"  # KV cache of the reference engine: static (preallocated) | dynamic
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")
        if self.greedy:
            self.n = 1  # every greedy sample is the same; more would only cost time
        elif self.temperature <= 0:
            raise ValueError(
                f"sampling.temperature must be > 0 (set sampling.greedy=true for argmax), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ValueError(f"sampling.batch_size must be >= 1, got {self.batch_size}")
        if self.engine not in ("auto", "fast", "reference"):
            raise ValueError(f"sampling.engine={self.engine!r}; use auto, fast or reference")
        if self.cache not in ("static", "dynamic"):
            raise ValueError(f"sampling.cache={self.cache!r}; use static or dynamic")


@dataclass
class EvalConfig:
    # Benchmarks to run; data URIs passed to run_eval add to / fill these. Empty
    # and no data URIs: the built-in held-out split (the embedded default).
    benchmarks: list[BenchmarkConfig | str] = field(default_factory=list)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    pass_k: list[int] = field(default_factory=lambda: [1, 4, 8, 16, 32, 64])  # reported where k <= n
    # RTN-quantize the loaded model: a quarl.quant format spec (nvfp4, mxfp4,
    # nf4, int4-g128, ...) or null. A calibrated model artifact is already
    # quantized (its config.json has quantization_config) and needs none.
    quant: str | None = None
    quant_recipe: dict | None = None  # a full quarl.quant QuantRecipe; overrides `quant`
    # An rl adapter records the base it was trained on (quant_recipe.json: QeRL's NVFP4, Jet-RL's FP8).
    # With a full-precision base and neither quant nor quant_recipe set, eval rebuilds that base before
    # loading the adapter, so the policy scored is the policy trained; false scores the adapter on the
    # model as given.
    adapter_recipe: bool = True
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:1
    # torch CPU threads for the run (null: torch's default, one per core). On a
    # shared host, 1 avoids OpenMP threads spinning against other jobs: measured
    # on a loaded 2-core box, a [32, 576] x [576, 1536] GEMM took 41 ms with 2
    # threads and 1.4 ms with 1.
    cpu_threads: int | None = None
    trust_remote_code: bool = False
    reward: RewardConfig = field(default_factory=RewardConfig)
    examples_in_report: int = 3  # problems shown verbatim per benchmark in report.md/html

    # Knob names from lm-evaluation-harness / vLLM / HF generate -> (quarl's key, where the name comes from): an
    # unknown key ending in one of these gets quarl's key in its error (quarl.config._check_foreign_names).
    FOREIGN_NAMES: ClassVar[dict[str, tuple[str, str]]] = {
        "tasks": ("benchmarks", "lm-eval --tasks; quarl: benchmarks=[gsm8k, math500, ...]"),
        "limit": ("benchmarks", ("lm-eval --limit; quarl: a benchmark's max_problems, "
                                "benchmarks=[{name: gsm8k, max_problems: 100}]")),
        "max_gen_toks": ("sampling.max_new_tokens", "lm-eval gen_kwargs max_gen_toks"),
        "max_tokens": ("sampling.max_new_tokens", "vLLM SamplingParams max_tokens"),
        "num_return_sequences": ("sampling.n", "HF generate num_return_sequences (samples per problem, avg@n)"),
        "repeats": ("sampling.n", "lm-eval repeats (samples per problem, avg@n)"),
        "do_sample": ("sampling.greedy", "HF generate do_sample (do_sample=false is sampling.greedy=true)"),
        "load_in_4bit": ("quant", "bitsandbytes loading; quarl quantizes with quant=nf4 / nvfp4 / int4-g128 ..."),
        "quantization": ("quant", "vLLM quantization; quarl: quant=<format> (RTN) or a calibrated model"),
    }

    def __post_init__(self) -> None:
        if isinstance(self.benchmarks, (str, dict, BenchmarkConfig)):
            self.benchmarks = [self.benchmarks]
        self.benchmarks = [BenchmarkConfig.parse(b) for b in self.benchmarks]
        names = [b.name for b in self.benchmarks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"benchmark names must be unique; {dup} appear twice (rename one: name: gsm8k-hard)")
        if isinstance(self.sampling, dict):
            self.sampling = SamplingConfig(**self.sampling)
        if isinstance(self.reward, dict):
            self.reward = RewardConfig(**self.reward)
        if not self.pass_k or any(k < 1 for k in self.pass_k):
            raise ValueError(f"pass_k must list integers >= 1, got {self.pass_k}")
        self.pass_k = sorted(set(self.pass_k))
        if self.quant is not None and not str(self.quant).strip():
            self.quant = None
        if self.dtype not in ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"):
            raise ValueError(f"dtype={self.dtype!r}; use auto, float32, bfloat16 or float16")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1 (or null for torch's default), got {self.cpu_threads}")
        if self.examples_in_report < 0:
            raise ValueError("examples_in_report must be >= 0")
        # Checked here so `quarl compile`/`submit` reject what the pod would (syntax only: no GPU needed).
        from quarl.devices import check_device_name

        check_device_name(self.device)
        if self.quant is not None and self.quant_recipe is None:
            from quarl.quant.spec import check_format

            check_format(self.quant, "quant")
