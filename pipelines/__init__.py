"""quarl's Kubeflow pipelines: one DAG per recipe (quarl/recipes/pipelines/<name>.yaml).

    from quarl_pipelines import PIPELINES, build
    pipeline = build("qerl")                 # GraphComponent with the recipe's run form
    PIPELINES["qad"].missing_stages()       # ["distill"] until that stage lands

Compiled copies live in pipelines/compiled/<name>.yaml (``quarl compile --all``);
tests/pipeline checks they are up to date.
"""

from __future__ import annotations

from pathlib import Path

from quarl_pipelines._builder import PipelineDef, Step
from quarl_pipelines.jetrl import JETRL
from quarl_pipelines.precision_search import PRECISION_SEARCH
from quarl_pipelines.qad import QAD
from quarl_pipelines.qerl import QERL
from quarl_pipelines.reasoning_qat import REASONING_QAT

PIPELINES: dict[str, PipelineDef] = {p.name: p for p in (QERL, JETRL, QAD, REASONING_QAT, PRECISION_SEARCH)}
COMPILED_DIR = Path(__file__).resolve().parent / "compiled"

__all__ = ["COMPILED_DIR", "PIPELINES", "PipelineDef", "Step", "build", "get_pipeline"]


def get_pipeline(name: str) -> PipelineDef:
    if name not in PIPELINES:
        raise KeyError(f"unknown pipeline {name!r}; pipelines: {', '.join(PIPELINES)}")
    return PIPELINES[name]


def build(recipe, profile: str | None = None, overrides: list[str] | tuple[str, ...] = ()):
    """The KFP pipeline for a recipe (name, path or Recipe)."""
    from quarl.pipeline.recipes import Recipe, load_recipe

    r = recipe if isinstance(recipe, Recipe) else load_recipe(recipe, profile=profile, overrides=overrides)
    return get_pipeline(r.pipeline).build(r)
