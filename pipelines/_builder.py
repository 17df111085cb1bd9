"""Pipelines as data: a DAG of steps, turned into a KFP pipeline whose run form comes from a recipe.

    QERL = PipelineDef(
        name="qerl", description="...",
        steps=(
            Step("data_prep"),
            Step("calibrate", inputs={"data": "data_prep.dataset"}),
            Step("rl", inputs={"model": "calibrate.model", "data": "data_prep.dataset"}),
            ...
        ),
    )
    pipeline = QERL.build(recipe)          # a kfp GraphComponent: compile it, run it with kfp.local, submit it

A step is a stage (``quarl.pipeline.stages``) plus where its input artifacts come
from (``"<step>.<output>"``). A model input that no step feeds is named by the
pipeline's ``model`` parameter (an HF id, ``default``, an ``s3://`` prefix).

The run form (pipeline parameters) is generated, not hand-written, so it cannot
drift from the components:

    model, s3_root, run_id                common to every step
    <step>_<knob>                         each typed knob of the step's component
    <step>_num_nodes, <step>_gpus_per_node   only for a step the recipe runs on several GPUs (below)
    <step>_config                         YAML of every other field the recipe sets for that step

with defaults taken from the recipe (its ``stages.<step>`` sections are stage
configs, exactly what ``quarl <stage> --config`` reads). At run time the typed
knobs override ``<step>_config`` (see quarl.pipeline.runtime), and the recipe
puts each field in exactly one of the two, so the form never contradicts itself.

Several GPUs: a step of a ``distributed`` stage (rl, distill, kd_coldstart) whose recipe
resources ask for ``num_nodes`` x ``accelerators`` > 1 (``--set resources.rl.num_nodes=2
--set resources.rl.accelerators=8``) uses the stage's *launcher* component instead: its small CPU
pod runs the stage as a Kubeflow Trainer ``TrainJob`` and waits for it
(:mod:`quarl.pipeline.trainjob`); the run form then has ``<step>_num_nodes`` and
``<step>_gpus_per_node`` (defaults from the recipe, changeable per run). KFP sizes a task's pod
when the pipeline is compiled, which is why the choice is made there: with one GPU the compiled
pipeline is exactly what it was, and the step runs in its own GPU pod.

Why generate the KFP function instead of writing one per pipeline: a hand-written
pipeline repeats every component parameter twice (signature and call) for five
steps — hundreds of lines that must track the components by hand. KFP reads a
pipeline's parameters from ``inspect.signature``, so a synthesized ``__signature__``
is all it needs; the body is the loop below.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quarl.pipeline.stages import (
    Resources,
    StageSpec,
    StageUnavailableError,
    form_params,
    get_stage,
    stage_available,
)

if TYPE_CHECKING:
    from quarl.pipeline.recipes import Recipe

__all__ = ["COMMON_PIPELINE_PARAMS", "PipelineDef", "Step"]

COMMON_PIPELINE_PARAMS = ("model", "s3_root", "run_id")


@dataclass(frozen=True)
class Step:
    stage: str
    name: str = ""  # step name (unique in the pipeline); default: the stage name
    inputs: Mapping[str, str] = field(default_factory=dict)  # component input -> "<step>.<output>"

    @property
    def id(self) -> str:
        return self.name or self.stage


@dataclass(frozen=True)
class PipelineDef:
    name: str
    description: str
    steps: tuple[Step, ...]
    paper: str = ""

    # ------------------------------------------------------------ structure

    @property
    def chain(self) -> str:
        return " -> ".join(s.id for s in self.steps)

    def missing_stages(self) -> list[str]:
        """Stages this pipeline needs whose library function or component does not exist yet."""
        from quarl_components import COMPONENTS

        out = []
        for s in self.steps:
            if s.stage not in out and (s.stage not in COMPONENTS or not stage_available(s.stage)):
                out.append(s.stage)
        return out

    def check_available(self) -> None:
        missing = self.missing_stages()
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise StageUnavailableError(
                f"stage{plural} {', '.join(missing)} {'are' if plural else 'is'} not implemented yet; pipeline "
                f"{self.name} ({self.chain}) cannot be built until {'they land' if plural else 'it lands'}"
            )

    def validate(self) -> None:
        """Step names unique, inputs wired to earlier steps' outputs with the right input names."""
        seen: dict[str, StageSpec] = {}
        for s in self.steps:
            spec = get_stage(s.stage)
            if s.id in seen:
                raise ValueError(f"pipeline {self.name}: step name {s.id!r} is used twice; give one a name=")
            names = {i.name for i in spec.inputs}
            for inp, src in s.inputs.items():
                if inp not in names:
                    raise ValueError(f"pipeline {self.name}: stage {s.stage} has no input {inp!r}; inputs: {names}")
                up, _, out = src.partition(".")
                if up not in seen:
                    raise ValueError(f"pipeline {self.name}: step {s.id} reads {src!r} but {up!r} is not an earlier step")
                if out != seen[up].output.name:
                    raise ValueError(f"pipeline {self.name}: step {up} outputs {seen[up].output.name!r}, not {out!r}")
            for i in spec.inputs:
                if not i.optional and not i.ref_param and i.name not in s.inputs:
                    raise ValueError(f"pipeline {self.name}: step {s.id} needs input {i.name!r} wired")
            seen[s.id] = spec

    # ------------------------------------------------------------ build

    def parameters(self, recipe: Recipe) -> list[tuple[str, type, Any]]:
        """(name, type, default) of every pipeline parameter, defaults from ``recipe``."""
        params: list[tuple[str, type, Any]] = [
            ("model", str, recipe.model),
            ("s3_root", str, recipe.s3_root),
            ("run_id", str, ""),
        ]
        for s in self.steps:
            spec = get_stage(s.stage)
            values = recipe.typed_params(s.id, s.stage)
            for p in form_params(spec):  # types from the stage's config, as the component's
                params.append((f"{s.id}_{p.name}", p.type, values[p.name]))
            res = self.step_resources(recipe, s)
            if spec.distributed and res.launches_trainjob:
                params += [(f"{s.id}_num_nodes", int, res.num_nodes), (f"{s.id}_gpus_per_node", int, res.accelerators)]
            params.append((f"{s.id}_config", str, recipe.rest_yaml(s.id, s.stage)))
        return params

    def step_resources(self, recipe: Recipe, step: Step) -> Resources:
        """The step's resources (:meth:`Recipe.resources_for`: several nodes only for a distributed stage)."""
        return recipe.resources_for(step.id, get_stage(step.stage))

    def trainjob_steps(self, recipe: Recipe) -> list[str]:
        """Steps that ``recipe`` runs as Kubeflow Trainer TrainJobs."""
        return [s.id for s in self.steps if self.step_resources(recipe, s).launches_trainjob
                and get_stage(s.stage).distributed]

    def build(self, recipe: Recipe, retries: bool = True, trainjobs: bool = True):
        """The KFP pipeline (a GraphComponent) for ``recipe``.

        ``retries=False`` drops the retry policy: kfp.local honours it, and on one
        machine a failed step fails the same way again (no node to lose).
        ``trainjobs=False`` (kfp.local: no cluster) refuses a step on several GPUs.
        """
        from kfp import dsl
        from quarl_components import COMPONENTS, LAUNCHERS
        from quarl_components._base import configure_task, launcher_resources
        from quarl_components.images import IMAGES

        from quarl.pipeline.recipes import RecipeError

        self.check_available()
        self.validate()
        recipe.check_steps(self)
        launched = set(self.trainjob_steps(recipe))
        if launched and not trainjobs:
            s = min(launched)
            r = self.step_resources(recipe, next(x for x in self.steps if x.id == s))
            raise RecipeError(f"step {s} asks for {r.num_nodes} node(s) x {r.accelerators} GPU(s) "
                              f"(resources.{s}), which runs as a Kubeflow Trainer TrainJob on a cluster (quarl "
                              f"submit); quarl run runs every step on this machine: drop resources.{s}.num_nodes/"
                              "accelerators or set them to 1")
        plist = self.parameters(recipe)
        P = inspect.Parameter
        signature = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD, default=d, annotation=t) for n, t, d in plist])
        steps = self.steps

        def body(*args, **kwargs):
            a = signature.bind(*args, **kwargs).arguments
            tasks: dict[str, Any] = {}
            for s in steps:
                spec = get_stage(s.stage)
                kw: dict[str, Any] = {
                    "s3_root": a["s3_root"], "run_id": a["run_id"], "kfp_run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                    "step": s.id, "config_yaml": a[f"{s.id}_config"],
                }
                kw.update({k: a[f"{s.id}_{k}"] for k in spec.params})
                for i in spec.inputs:
                    if i.name in s.inputs:
                        up, _, out = s.inputs[i.name].partition(".")
                        kw[i.name] = tasks[up].outputs[out]
                    elif i.ref_param:
                        kw[i.ref_param] = a["model"]
                res = recipe.resources_for(s.id, spec)
                if s.id in launched:  # several GPUs: this task's pod launches and waits for a TrainJob
                    kw.update(num_nodes=a[f"{s.id}_num_nodes"], gpus_per_node=a[f"{s.id}_gpus_per_node"],
                              image=IMAGES[res.image].ref, cpu=res.cpu, memory=res.memory,
                              gpu_resource=res.accelerator or "nvidia.com/gpu", timeout_s=res.timeout_s)
                    task = LAUNCHERS[s.stage](**kw)
                    res = launcher_resources(res)
                else:
                    task = COMPONENTS[s.stage](**kw)
                configure_task(task, s.id, res if retries else res.with_(retries=0))
                tasks[s.id] = task

        body.__signature__ = signature
        body.__name__ = self.name
        return dsl.pipeline(name=self.name.replace("_", "-"), description=self.description)(body)
