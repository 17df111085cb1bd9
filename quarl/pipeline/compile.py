"""Compiled YAML: what ``make compile`` writes and what the repo commits.

    pipelines/compiled/<recipe>.yaml        one per recipe whose stages all exist (the Kubeflow upload)
    components/<stage>/component.yaml       one per component (kfp.components.load_component_from_file)

Compilation is deterministic (same code + recipe -> same bytes), which is what
lets tests/pipeline compare a fresh compile with the committed files.
"""

from __future__ import annotations

from pathlib import Path

from quarl.pipeline.recipes import Recipe, list_recipes, load_recipe
from quarl.pipeline.stages import StageUnavailableError

__all__ = ["compile_all", "compile_components", "compile_one", "components_dir"]


def components_dir() -> Path:
    import quarl_components

    return Path(quarl_components.__file__).resolve().parent


def compile_one(recipe: Recipe, out_dir: str | Path | None = None) -> Path:
    """Compile ``recipe`` (paper settings unless a profile was applied) to ``<out_dir>/<recipe>.yaml``."""
    from quarl_pipelines import COMPILED_DIR

    from quarl.pipeline.remote import compile_recipe

    return compile_recipe(recipe, Path(out_dir or COMPILED_DIR) / f"{recipe.name}.yaml")


def compile_components(root: str | Path | None = None) -> list[Path]:
    """Write ``<root>/<stage>/component.yaml`` for every component."""
    from kfp import compiler
    from quarl_components import COMPONENTS

    root = Path(root or components_dir())
    out = []
    for stage, comp in COMPONENTS.items():
        path = root / stage / "component.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(comp, str(path))
        out.append(path)
    return out


def compile_all(out_dir: str | Path | None = None, components_root: str | Path | None = None
                ) -> tuple[list[Path], dict[str, str]]:
    """Every component, and every recipe whose pipeline can be built; returns (written, {skipped: why})."""
    written = compile_components(components_root)
    skipped: dict[str, str] = {}
    for name in list_recipes():
        try:
            written.append(compile_one(load_recipe(name), out_dir))
        except StageUnavailableError as e:
            skipped[name] = str(e)
    return written, skipped
