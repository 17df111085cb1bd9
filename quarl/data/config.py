"""Configuration of the data preparation stage.

Defaults reproduce the embedded default (the built-in generator, no download)
with QeRL's prompt and filters; ``quarl/recipes/data/*.yaml`` hold the GSM8K
and BigMath set-ups of the paper. Everything is overridable from the CLI:

    quarl data-prep --set 'sources=[gsm8k:/work/shared/data/gsm8k/train.jsonl]' \
                    --set split.eval_size=500 --output runs/data

Sources may be given as mappings (``{name: bigmath, path: s3://..., min_difficulty: 3}``)
or as ``"name"`` / ``"name:path"`` strings; both become :class:`SourceConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from quarl.data.templates import TEMPLATES

__all__ = ["SOURCE_NAMES", "DataPrepConfig", "FilterConfig", "SourceConfig", "SplitConfig", "ValidationConfig"]

# name -> what it reads (see quarl.data.sources for the field mappings).
SOURCE_NAMES = ("synthetic", "gsm8k", "math", "bigmath", "deepmath", "openr1", "custom")
_ALIASES = {"generated": "synthetic", "default": "synthetic", "math500": "math", "math-500": "math",
            "big-math": "bigmath", "openr1-math": "openr1", "jsonl": "custom", "json": "custom",
            "parquet": "custom"}  # fmt: skip


@dataclass
class SourceConfig:
    name: str = "synthetic"
    # Local file/dir/glob, s3:// URI, or hf://org/name. None: the source's hub
    # dataset (offline that fails with a clear message); unused by synthetic.
    path: str | None = None
    hf_subset: str | None = None  # hub config name, e.g. "main" (gsm8k), "level_3_4_5" (bigmath)
    hf_split: str | None = None  # hub split, default "train"
    # Where this source's rows go: "auto" = the seeded train/eval split below;
    # "train" / "eval" = all of them (e.g. GSM8K train vs test files).
    split: str = "auto"
    # Field names in the raw records, overriding the source's defaults:
    # {"problem": "...", "answer": "...", "difficulty": "...", "solution": "..."}.
    fields: dict[str, str] = field(default_factory=dict)
    # Difficulty filter in the source's own scale (MATH/BigMath/generator 1-5,
    # DeepMath 1-10). Rows without a difficulty pass unless drop_unknown_difficulty.
    min_difficulty: int | None = None
    max_difficulty: int | None = None
    drop_unknown_difficulty: bool = False
    max_samples: int | None = None  # cap on this source's rows (seeded sample), before mixing
    # bigmath without a level column: recompute open-r1's levels from the
    # llama8b_solve_rate quintiles of the loaded rows (exact for the full "all"
    # subset; relative to what is loaded otherwise).
    levels_from_solve_rate: bool = False
    # synthetic only
    num_samples: int = 2000
    seed: int | None = None  # None: the stage seed

    def __post_init__(self) -> None:
        self.name = _ALIASES.get(self.name.lower(), self.name.lower())
        if self.name not in SOURCE_NAMES:
            raise ValueError(f"unknown data source {self.name!r}; choose one of {', '.join(SOURCE_NAMES)}")
        if self.split not in ("auto", "train", "eval"):
            raise ValueError(f"source {self.name}: split={self.split!r}; use auto, train or eval")
        if self.name == "custom" and not self.path:
            raise ValueError("source custom needs a path (jsonl/json/parquet file or dir, s3:// URI, hf://org/name)")
        if (
            self.min_difficulty is not None
            and self.max_difficulty is not None
            and self.min_difficulty > self.max_difficulty
        ):
            raise ValueError(f"source {self.name}: min_difficulty {self.min_difficulty} > max {self.max_difficulty}")

    @classmethod
    def parse(cls, spec: Any) -> SourceConfig:
        """``SourceConfig`` | mapping | ``"name"`` | ``"name:path"`` -> SourceConfig."""
        if isinstance(spec, cls):
            return spec
        if isinstance(spec, str):
            name, _, path = spec.partition(":")
            return cls(name=name.strip(), path=path.strip() or None)
        if isinstance(spec, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(spec) - known)
            if unknown:
                raise ValueError(f"source {spec.get('name', '?')}: unknown keys {unknown}; valid: {sorted(known)}")
            return cls(**spec)
        raise ValueError(f"cannot read a data source from {spec!r}; use a mapping or 'name:path'")


@dataclass
class FilterConfig:
    # QeRL keeps prompts of at most 1024 characters (its BigMath/DAPO loaders).
    max_problem_chars: int | None = 1024
    min_problem_chars: int = 1
    max_answer_chars: int | None = 128
    # Token limit on the rendered prompt; needs `tokenizer` on the stage config.
    max_prompt_tokens: int | None = None
    # "exact" (identical problem text), "normalized" (case, whitespace and
    # punctuation folded) or "none". Applied across sources and splits, eval first,
    # so no eval problem leaks into train.
    dedup: str = "normalized"
    # Drop rows whose reference answer math-verify cannot parse (they can never
    # earn reward). Off: such rows reach validation and fail the stage.
    drop_unparseable_answers: bool = True

    def __post_init__(self) -> None:
        if self.dedup not in ("none", "exact", "normalized"):
            raise ValueError(f"filters.dedup={self.dedup!r}; use none, exact or normalized")


@dataclass
class SplitConfig:
    # Rows of "auto" sources held out for eval: below 1 a fraction, from 1 up a
    # row count. Only when no source is marked split: eval — with a fixed eval
    # set (e.g. GSM8K test) every auto row goes to train.
    eval_size: float = 0.05
    max_train_samples: int | None = None
    max_eval_samples: int | None = None

    def __post_init__(self) -> None:
        e = self.eval_size
        if e < 0 or (e >= 1 and float(e) != int(e)):
            raise ValueError(f"split.eval_size={e}: use a fraction in [0, 1) or a whole row count")

    def eval_rows(self, n: int) -> int:
        """How many of ``n`` auto-split rows go to eval."""
        e = self.eval_size
        k = round(n * e) if e < 1 else int(e)
        if 0 < e < 1 and k == 0 and n >= 2:  # a small source still gets one eval row
            k = 1
        return max(0, min(n, k))


@dataclass
class ValidationConfig:
    enabled: bool = True
    min_train_rows: int = 8
    min_eval_rows: int = 1
    # Hard bounds checked on the final rows (filters normally enforce tighter ones).
    max_prompt_chars: int = 32768
    # Keep at most this many failing row ids per expectation in the report.
    max_ids_in_report: int = 200


@dataclass
class DataPrepConfig:
    # Mappings or "name[:path]" strings; __post_init__ turns all into SourceConfig.
    sources: list[SourceConfig | str] = field(default_factory=lambda: [SourceConfig(name="synthetic")])
    template: str = "qerl"
    instruction: str | None = None  # None: QeRL's instruction (see quarl.data.templates)
    tokenizer: str | None = None  # model ref for chat rendering / token limits
    seed: int = 0
    filters: FilterConfig = field(default_factory=FilterConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sources, (str, dict, SourceConfig)):
            self.sources = [self.sources]
        self.sources = [SourceConfig.parse(s) for s in self.sources]
        if not self.sources:
            raise ValueError("data-prep needs at least one source (e.g. sources=[synthetic])")
        for name, cls in (("filters", FilterConfig), ("split", SplitConfig), ("validation", ValidationConfig)):
            val = getattr(self, name)
            if isinstance(val, dict):
                setattr(self, name, cls(**val))
        if self.template not in TEMPLATES:
            raise ValueError(f"template={self.template!r}; choose one of {', '.join(TEMPLATES)}")
        if self.template == "chat" and not self.tokenizer:
            raise ValueError("template=chat renders with a chat template: set tokenizer=<model ref>")
        if self.filters.max_prompt_tokens is not None and not self.tokenizer:
            raise ValueError("filters.max_prompt_tokens needs tokenizer=<model ref> to count tokens")
