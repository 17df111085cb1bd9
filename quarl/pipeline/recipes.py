"""Recipes: one YAML file per pipeline, holding the papers' settings as stage configs.

    # quarl/recipes/pipelines/qerl.yaml
    pipeline: qerl                     # which DAG (quarl_pipelines.PIPELINES)
    description: ...
    reproduces: QeRL (arXiv:2510.11696) Table 4, GSM8K column
    model: Qwen/Qwen2.5-7B-Instruct    # the pipeline's `model` parameter
    s3_root: s3://quarl/runs           # where artifacts go (default)
    stages:                            # step -> its stage config (the dataclass's fields; defaults elsewhere)
      data_prep: {sources: [gsm8k], ...}
      rl: {algo: {algo: grpo}, optim: {lr: 1.0e-5}, ...}
    resources:                         # step -> quarl.pipeline.stages.Resources fields
      rl: {accelerators: 1, memory: 96Gi}
    profiles:                          # named deltas, deep-merged over the above
      local: {model: default, stages: {...tiny CPU settings...}}

``load_recipe("qerl", profile="local", overrides=["rl.train.steps=3", "model=tiny-llama"])``
validates every stage section against its config class (unknown keys fail with
the valid ones listed) and applies ``--set`` overrides:

    model=..., s3_root=...             top-level fields
    <step>.<field.sub>=value           a stage config field (value parsed as YAML)
    resources.<step>.<field>=value     a resource field

A recipe is turned into the pipeline's run form by
:meth:`quarl_pipelines._builder.PipelineDef.parameters`: typed knobs take their
value from the stage section (or the dataclass default), and every other field
the section sets goes into ``<step>_config``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from quarl.config import ConfigError, config_to_dict, get_path, set_path
from quarl.pipeline.stages import Resources, StageSpec, get_stage

__all__ = ["RECIPE_DIR", "Recipe", "RecipeError", "list_recipes", "load_recipe", "recipe_path"]

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes" / "pipelines"
_TOP = ("pipeline", "description", "reproduces", "model", "s3_root", "stages", "resources", "profiles", "notes")


class RecipeError(ConfigError):
    """A recipe file or override that does not fit its pipeline."""


def _deep_merge(base: dict, delta: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (delta or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _set_path(d: dict, keys: list[str], value: Any) -> None:
    try:
        set_path(d, keys, value)
    except ConfigError as e:
        raise RecipeError(str(e)) from None


def _del_path(d: dict, keys: list[str]) -> None:
    """Delete a dotted key and any section it leaves empty."""
    if len(keys) == 1:
        d.pop(keys[0], None)
        return
    sub = d.get(keys[0])
    if isinstance(sub, dict):
        _del_path(sub, keys[1:])
        if not sub:
            d.pop(keys[0])


def recipe_path(name: str | Path) -> Path:
    """A recipe name (``qerl``) or a path to a YAML file."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise RecipeError(f"recipe file {p} does not exist")
        return p
    cand = RECIPE_DIR / f"{name}.yaml"
    if not cand.is_file():
        raise RecipeError(f"unknown recipe {name!r}; available: {', '.join(list_recipes())} (or pass a YAML path)")
    return cand


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


@dataclass
class Recipe:
    name: str
    pipeline: str
    model: str
    s3_root: str = "s3://quarl/runs"
    description: str = ""
    reproduces: str = ""
    stages: dict[str, dict] = field(default_factory=dict)
    resources: dict[str, dict] = field(default_factory=dict)
    profiles: dict[str, dict] = field(default_factory=dict)
    profile: str | None = None
    path: Path | None = None

    # ------------------------------------------------------------ deltas

    def with_profile(self, profile: str | None) -> Recipe:
        if not profile:
            return self
        if profile not in self.profiles:
            have = ", ".join(self.profiles) or "none"
            raise RecipeError(f"recipe {self.name} has no profile {profile!r}; its profiles: {have}")
        delta = self.profiles[profile]
        unknown = set(delta) - {"model", "s3_root", "stages", "resources", "description"}
        if unknown:
            raise RecipeError(f"profile {profile} of recipe {self.name}: unknown keys {sorted(unknown)}")
        r = copy.deepcopy(self)
        r.model = delta.get("model", r.model)
        r.s3_root = delta.get("s3_root", r.s3_root)
        r.stages = _deep_merge(r.stages, delta.get("stages", {}))
        r.resources = _deep_merge(r.resources, delta.get("resources", {}))
        r.profile = profile
        return r

    def with_overrides(self, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
        r = copy.deepcopy(self)
        for item in overrides or ():
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise RecipeError(f"override {item!r} must look like key=value, e.g. rl.optim.lr=2e-5 or model=default")
            value = yaml.safe_load(text) if text.strip() else None
            parts = key.split(".")
            if key in ("model", "s3_root"):
                setattr(r, key, str(text.strip()))
            elif parts[0] == "resources" and len(parts) == 3:
                _set_path(r.resources, parts[1:], value)
            elif len(parts) >= 2:
                _set_path(r.stages, parts, value)
            else:
                raise RecipeError(f"override {item!r}: use model=..., s3_root=..., <step>.<field>=... or "
                                  f"resources.<step>.<field>=...")
        return r

    # ------------------------------------------------------------ per step

    def section(self, step: str) -> dict:
        return copy.deepcopy(self.stages.get(step) or {})

    def stage_config(self, step: str, stage: str) -> Any:
        """The step's config dataclass (validated) built from its recipe section."""
        from quarl.config import build_config

        try:
            return build_config(get_stage(stage).load_config_class(), self.section(step))
        except ConfigError as e:
            raise RecipeError(f"recipe {self.name}, stages.{step}: {e}") from None

    def typed_params(self, step: str, stage: str) -> dict[str, Any]:
        """Values of the step's typed knobs: the recipe's own value, else the config default."""
        spec = get_stage(stage)
        sec = self.section(step)
        cfg = config_to_dict(self.stage_config(step, stage))
        out = {}
        for name, p in spec.params.items():
            keys = p.key.split(".")
            _, v = get_path(cfg, keys)  # the validated, type-coerced value ("3e-4" -> 0.0003)
            found, raw = get_path(sec, keys)
            if found and isinstance(v, (list, dict)):
                v = raw  # keep the recipe's compact form ("gsm8k:/path") rather than every expanded field
            out[name] = p.from_config(v)
        return out

    def rest_yaml(self, step: str, stage: str) -> str:
        """YAML (one line) of the fields the recipe sets for ``step`` that no typed knob covers ("" if none)."""
        spec = get_stage(stage)
        sec = self.section(step)
        for p in spec.params.values():
            _del_path(sec, p.key.split("."))
        # One line of flow-style YAML: KFP's compiler copies defaults into the YAML header comment
        # unescaped, so a multi-line default would break the compiled file.
        return yaml.safe_dump(sec, sort_keys=False, default_flow_style=True, width=1 << 30).strip() if sec else ""

    def resources_for(self, step: str, spec: StageSpec) -> Resources:
        """The step's resources: the stage's, with the recipe's changes; several nodes only for a distributed stage."""
        from quarl.pipeline.stages import STAGES

        try:
            res = spec.resources.with_(**(self.resources.get(step) or {}))
        except ValueError as e:
            raise RecipeError(f"recipe {self.name}, resources.{step}: {e}") from None
        if res.num_nodes > 1 and not spec.distributed:
            able = ", ".join(n for n in STAGES if STAGES[n].distributed)
            raise RecipeError(f"recipe {self.name}, resources.{step}: num_nodes={res.num_nodes}, but stage "
                              f"{spec.name} runs in one pod; only {able} run on several nodes")
        return res

    def check_steps(self, pipeline) -> None:
        """Every section names a step of ``pipeline`` and loads as that stage's config."""
        steps = {s.id: s.stage for s in pipeline.steps}
        for where, d in (("stages", self.stages), ("resources", self.resources)):
            unknown = sorted(set(d) - set(steps))
            if unknown:
                raise RecipeError(f"recipe {self.name}: {where} has unknown step(s) {unknown}; "
                                  f"pipeline {pipeline.name} has steps {list(steps)}")
        for step, stage in steps.items():
            self.stage_config(step, stage)
            self.resources_for(step, get_stage(stage))


def load_recipe(name: str | Path, profile: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Load a recipe by name or path, apply a profile, then ``--set`` overrides."""
    path = recipe_path(name)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping")
    unknown = sorted(set(data) - set(_TOP))
    if unknown:
        raise RecipeError(f"recipe {path}: unknown top-level keys {unknown}; valid: {', '.join(_TOP)}")
    for k in ("pipeline", "model"):
        if not data.get(k):
            raise RecipeError(f"recipe {path} must set {k!r}")
    r = Recipe(
        name=path.stem,
        pipeline=str(data["pipeline"]),
        model=str(data["model"]),
        s3_root=str(data.get("s3_root") or "s3://quarl/runs"),
        description=str(data.get("description") or "").strip(),
        reproduces=str(data.get("reproduces") or "").strip(),
        stages=dict(data.get("stages") or {}),
        resources=dict(data.get("resources") or {}),
        profiles=dict(data.get("profiles") or {}),
        path=path,
    )
    return r.with_profile(profile).with_overrides(overrides)
