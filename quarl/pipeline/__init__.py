"""Running quarl stages as Kubeflow pipelines: the library side.

    stages.py    the stage registry (collects quarl/<area>/spec.py) and the run form derived from the configs
    codegen.py   components/<stage>/component.py (and launcher.py) generated from a stage spec
    runtime.py   what a component runs: config resolution, S3 layout, pointers, step records, idempotency
    recipes.py   recipe YAML (papers' settings as stage configs, profiles, --set overrides)
    local.py     ``quarl run``: SeaweedFS + kfp.local on this machine
    remote.py    ``quarl submit`` / ``quarl schedule``: a Kubeflow Pipelines endpoint through kfp.Client
    summary.py   run summaries read back from the step records
    trainjob.py  a distributed stage's step on several GPUs: a Kubeflow Trainer v2 TrainJob the step's pod
                 creates, follows and fails with
    kube.py      the Kubernetes calls that needs (the ``kubernetes`` client, imported only when used)

The KFP objects themselves live in ``quarl_components`` (components/) and
``quarl_pipelines`` (pipelines/); this package does not import kfp at import
time, because ``runtime`` executes inside the components' containers.
"""

from quarl.pipeline.recipes import Recipe, RecipeError, list_recipes, load_recipe
from quarl.pipeline.stages import STAGES, StageSpec, StageUnavailableError, get_stage, stage_available

__all__ = [
    "STAGES",
    "Recipe",
    "RecipeError",
    "StageSpec",
    "StageUnavailableError",
    "get_stage",
    "list_recipes",
    "load_recipe",
    "stage_available",
]
