"""The component factory: one decorator turns a typed signature into a quarl KFP component.

A quarl component is a *lightweight Python component* whose body is a single call
into the library (``quarl.pipeline.runtime.run_component``); everything it needs at
run time is already installed in its image (``install_kfp_package=False``: no pip
at run time). Its signature is the contract the Kubeflow UI shows::

    @stage_component("data_prep")
    def data_prep(dataset: Output[Dataset], metrics: Output[Metrics], report: Output[Markdown],
                  s3_root: str = "s3://quarl/runs", run_id: str = "", kfp_run_id: str = "",
                  step: str = "data_prep", <typed knobs>, config_yaml: str = "", overrides: list = []):
        args = dict(locals())  # first: exactly the parameters above
        from quarl.pipeline.runtime import run_component

        run_component("data_prep", **args)

``stage_component`` checks the signature against the stage's ``StageSpec``
(every input, output, common parameter and typed knob present, nothing else) so a
drift between a component and the library fails at import, not in a cluster.

Resources are per *task* in KFP, so they are applied where a pipeline uses the
component: :func:`configure_task` sets CPU/memory, accelerators (+ the usual GPU
taint toleration), retries with exponential backoff, the pod deadline, scratch
volumes, and the S3 credentials — from the Kubernetes secret ``quarl-s3`` through
kfp-kubernetes, never as parameters (which the UI and the run history show).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from kfp import dsl
from quarl_components.images import IMAGES

from quarl.pipeline.stages import COMMON_PARAMS, Resources, StageSpec, get_stage

__all__ = ["S3_SECRET", "S3_SECRET_KEYS", "SCRATCH", "configure_task", "stage_component"]

# The namespace secret holding S3 access (template: manifests/s3-secret.yaml).
S3_SECRET = "quarl-s3"
S3_SECRET_KEYS = {k: k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")}
SCRATCH = "/scratch"  # emptyDir for the model/artifact cache (QUARL_CACHE): keeps the container layer small

_ARTIFACT_TYPES = {"Dataset": dsl.Dataset, "Model": dsl.Model, "Artifact": dsl.Artifact}


def _expected(spec: StageSpec) -> dict[str, str]:
    """name -> what it must be, for the signature check."""
    exp = {spec.output.name: f"Output[{spec.output.kfp_type}]", "metrics": "Output[Metrics]",
           "report": "Output[Markdown]"}
    for i in spec.inputs:
        if i.name in exp:
            raise TypeError(f"StageSpec {spec.name}: input {i.name!r} has the name of an output; rename one")
        exp[i.name] = "Input[...]"
        if i.ref_param:
            exp[i.ref_param] = "str"
    for p in (*COMMON_PARAMS, *spec.params):
        exp.setdefault(p, "parameter")
    return exp


def _check_signature(spec: StageSpec, func: Callable) -> None:
    params = inspect.signature(func).parameters
    exp = _expected(spec)
    missing = [n for n in exp if n not in params]
    extra = [n for n in params if n not in exp]
    if missing or extra:
        raise TypeError(
            f"component {func.__name__} does not match StageSpec {spec.name!r}: "
            f"missing {missing or 'nothing'}, unexpected {extra or 'nothing'}; "
            "edit the component signature or quarl/pipeline/stages.py so they agree"
        )
    for n in ("config_yaml", "overrides", "s3_root", "run_id", "kfp_run_id", "step"):
        if params[n].default is inspect.Parameter.empty:
            raise TypeError(f"component {func.__name__}: parameter {n} needs a default")
    if params["step"].default != spec.name:
        raise TypeError(f"component {func.__name__}: step must default to {spec.name!r}")
    for name, want in exp.items():
        ann = str(params[name].annotation)
        if want.startswith("Output[") and not (ann.startswith("typing.Annotated") and "OutputAnnotation" in ann
                                                and want[7:-1] in ann):
            raise TypeError(f"component {func.__name__}: {name} must be annotated {want}, got {ann}")
        if want == "Input[...]" and "InputAnnotation" not in ann:
            raise TypeError(f"component {func.__name__}: {name} must be an Input[...] artifact, got {ann}")


def stage_component(stage: str) -> Callable:
    """Decorator: check ``func`` against the stage spec and make it a KFP component in the stage's image."""
    spec = get_stage(stage)

    def deco(func: Callable):
        _check_signature(spec, func)
        return dsl.component(func=func, base_image=IMAGES[spec.resources.image].ref, install_kfp_package=False)

    return deco


def configure_task(task: dsl.PipelineTask, step: str, res: Resources) -> dsl.PipelineTask:
    """Apply a step's resources, retries, timeout, scratch and S3 secret to a pipeline task."""
    from kfp import kubernetes

    task.set_display_name(step)
    task.set_cpu_request(res.cpu).set_cpu_limit(res.cpu)
    task.set_memory_request(res.memory).set_memory_limit(res.memory)
    if res.accelerators:
        task.set_accelerator_type(res.accelerator or "nvidia.com/gpu").set_accelerator_limit(res.accelerators)
        kubernetes.add_toleration(task, key=res.accelerator or "nvidia.com/gpu", operator="Exists",
                                  effect="NoSchedule")
        # NCCL / DataLoader workers need a real /dev/shm (the container default is 64 MiB).
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    if res.retries:
        task.set_retry(num_retries=res.retries, backoff_duration=res.backoff, backoff_factor=res.backoff_factor,
                       backoff_max_duration=res.backoff_max)
    if res.timeout_s:
        kubernetes.set_timeout(task, res.timeout_s)
    # The images point QUARL_CACHE and HF_HOME under /scratch (ENV in the Dockerfiles, not task env vars,
    # which kfp.local would also apply to local subprocesses).
    kubernetes.empty_dir_mount(task, volume_name="scratch", mount_path=SCRATCH)
    kubernetes.use_secret_as_env(task, secret_name=S3_SECRET, secret_key_to_env=S3_SECRET_KEYS)
    return task
