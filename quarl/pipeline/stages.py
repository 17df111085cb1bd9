"""The stage registry: what a pipeline step is, in one table.

Each :class:`StageSpec` says how a library stage (``run_<stage>`` in ``quarl/<area>``)
is driven from a pipeline:

- ``run`` / ``config``: the library function and its config dataclass
  (``"module:name"``, imported lazily, so this module imports nothing heavy and a
  stage that has not landed yet is simply *unavailable*, never an import error);
- ``inputs``: the upstream artifacts it reads, each mapped to a ``run_<stage>``
  keyword; a model input may instead be named by a string reference (an HF id,
  ``default``, ``tiny-llama``, an ``s3://`` prefix) through ``ref_param``;
- ``output``: the one artifact it writes, stored at
  ``<s3_root>/<run_id>/<step>/<output.name>/``;
- ``params``: the typed parameters a component shows (the Kubeflow run form),
  each naming the dotted config key it sets. KFP parameters cannot be null, so a
  config field whose default is ``None`` is exposed with a stand-in value
  (``none=0``: "0 means no limit");
- ``resources``: image kind, CPU/memory, accelerators, retries and timeout of the
  step (recipes may override them per step).

The KFP component (``components/<stage>/``) is a typed signature whose body calls
:func:`quarl.pipeline.runtime.run_component`; the runtime reads this table. So
adding a stage is: one ``StageSpec`` here and one short component function.

This module is part of the library on purpose: the runtime executes inside the
component's container and must not need ``kfp``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COMMON_PARAMS",
    "STAGES",
    "InputSpec",
    "OutputSpec",
    "Param",
    "Resources",
    "StageSpec",
    "StageUnavailableError",
    "get_stage",
    "stage_available",
]

# Parameters every component takes besides its typed knobs (see quarl.pipeline.runtime).
COMMON_PARAMS = ("s3_root", "run_id", "kfp_run_id", "step", "config_yaml", "overrides")

_UNSET = object()


class StageUnavailableError(RuntimeError):
    """A pipeline needs a stage whose library function has not been written (or failed to import)."""


@dataclass(frozen=True)
class Param:
    """A typed component parameter that sets one config field."""

    key: str  # dotted key in the stage config, e.g. "optim.lr"
    none: Any = _UNSET  # the parameter value that stands for None in the config (e.g. 0 = "no limit")

    def to_config(self, value: Any) -> Any:
        if self.none is not _UNSET and value == self.none:
            return None
        return value

    def from_config(self, value: Any) -> Any:
        if value is None and self.none is not _UNSET:
            return self.none
        return value


@dataclass(frozen=True)
class InputSpec:
    """An upstream artifact a stage reads."""

    name: str  # component input name (a KFP input artifact)
    kind: str  # quarl artifact kind expected: dataset | model | adapter | recipe | metrics
    kwarg: str  # keyword of run_<stage> receiving the URI
    optional: bool = False
    ref_param: str | None = None  # a str parameter naming the input instead of an artifact (model refs)
    as_list: bool = False  # the library takes a list of URIs (e.g. eval's data_uris)


@dataclass(frozen=True)
class OutputSpec:
    """The one artifact a stage writes (the KFP output of the same name points at it)."""

    name: str  # also the last segment of its URI: <s3_root>/<run_id>/<step>/<name>
    kind: str | None  # quarl artifact kind; None when it depends on the config (rl: adapter or model)
    kfp_type: str = "Model"  # Dataset | Model | Artifact: how the Kubeflow UI shows it


@dataclass(frozen=True)
class Resources:
    """What a step asks of the cluster. GPU stages run in the CUDA image."""

    image: str = "cpu"  # key of quarl_components.images.IMAGES
    cpu: str = "2"
    memory: str = "8Gi"
    accelerator: str | None = None  # e.g. "nvidia.com/gpu"
    accelerators: int = 0
    retries: int = 2  # a stage is idempotent (see runtime), so a retry after a node loss is safe
    backoff: str = "60s"
    backoff_factor: float = 2.0
    backoff_max: str = "3600s"
    timeout_s: int = 6 * 3600

    def with_(self, **changes: Any) -> Resources:
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown resource field(s) {sorted(unknown)}; valid: {', '.join(self.__dataclass_fields__)}"
            )
        return Resources(**{**self.__dict__, **changes})


@dataclass(frozen=True)
class StageSpec:
    name: str
    run: str  # "module:function" of run_<stage>
    config: str  # "module:Class" of its config dataclass
    output: OutputSpec
    inputs: tuple[InputSpec, ...] = ()
    params: dict[str, Param] = field(default_factory=dict)
    # A markdown file inside the output artifact shown as the step's report in the UI;
    # None: the runtime renders one from the result dict.
    report_file: str | None = None
    # Dotted prefixes of the result dict whose numeric leaves become the step's KFP metrics
    # (None: all of them). Keeps per-layer tables out of the UI's metrics view.
    metrics: tuple[str, ...] | None = None
    resources: Resources = field(default_factory=Resources)
    description: str = ""

    def load_run(self):
        return _load(self.run, self.name)

    def load_config_class(self):
        return _load(self.config, self.name)


def _load(target: str, stage: str):
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise StageUnavailableError(f"stage {stage} is not implemented yet ({module} does not exist)") from None
        raise
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise StageUnavailableError(f"stage {stage} is not implemented yet ({module} has no {attr})") from None


GPU = Resources(image="cuda", cpu="8", memory="64Gi", accelerator="nvidia.com/gpu", accelerators=1)

STAGES: dict[str, StageSpec] = {
    s.name: s
    for s in (
        StageSpec(
            name="data_prep",
            run="quarl.data:run_data_prep",
            config="quarl.data:DataPrepConfig",
            output=OutputSpec("dataset", "dataset", kfp_type="Dataset"),
            params={
                "sources": Param("sources"),
                "template": Param("template"),
                "eval_size": Param("split.eval_size"),
                "max_train_samples": Param("split.max_train_samples", none=0),
                "max_eval_samples": Param("split.max_eval_samples", none=0),
                "seed": Param("seed"),
            },
            report_file="summary.md",
            metrics=("rows", "dropped", "sources"),
            resources=Resources(image="cpu", cpu="2", memory="8Gi", timeout_s=2 * 3600),
            description="Sources -> filtered, deduplicated, split and validated prompts (parquet).",
        ),
        StageSpec(
            name="calibrate",
            run="quarl.calibrate:run_calibrate",
            config="quarl.calibrate:CalibrateConfig",
            output=OutputSpec("model", "model"),
            inputs=(
                InputSpec("base", "model", "model_uri", ref_param="base_model"),
                InputSpec("data", "dataset", "data_uri", optional=True),
                InputSpec("recipe", "recipe", "recipe_uri", optional=True),
            ),
            params={
                "method": Param("method"),
                "format": Param("format"),
                "num_samples": Param("data.num_samples", none=0),
                "seq_len": Param("data.seq_len", none=0),
                "device": Param("device"),
            },
            report_file="report.md",
            metrics=("quality.kl", "quality.ppl", "quality.ref_ppl", "rel_error", "quality", "memory.total_bytes",
                     "calibration.windows", "calibration.seconds"),
            resources=GPU.with_(memory="96Gi", timeout_s=4 * 3600),
            description="Full-precision model -> quantized compressed-tensors checkpoint (RTN/GPTQ/AWQ), with "
                        "held-out KL and perplexity.",
        ),
        StageSpec(
            name="precision_search",
            run="quarl.search:run_precision_search",
            config="quarl.search:PrecisionSearchConfig",
            output=OutputSpec("recipe", "recipe", kfp_type="Artifact"),
            inputs=(
                InputSpec("base", "model", "model_uri", ref_param="base_model"),
                InputSpec("data", "dataset", "data_uri", optional=True),
            ),
            params={
                "formats": Param("formats"),
                "granularity": Param("granularity"),
                "method": Param("method"),
                "budget_bits": Param("budget_bits", none=0.0),
                "episodes": Param("ppo.episodes"),
                "w_perf": Param("reward.w_perf"),
                "w_kl": Param("reward.w_kl"),
                "w_ent": Param("reward.w_ent"),
                "w_mem": Param("reward.w_mem"),
                "device": Param("device"),
            },
            report_file="report.md",
            metrics=("searched", "seconds.total", "evaluations.unique"),
            resources=Resources(image="cpu", cpu="4", memory="16Gi", timeout_s=6 * 3600),
            description="Per-layer weight formats chosen by a PPO agent under an average-bits budget -> a "
                        "mixed-precision recipe for calibrate, with uniform/greedy/random baselines.",
        ),
        StageSpec(
            name="rl",
            run="quarl.rl.stage:run_rl",
            config="quarl.rl.config:RLConfig",
            # kind "adapter" (policy.mode=lora) or "model" (policy.mode=full)
            output=OutputSpec("adapter", None),
            inputs=(
                InputSpec("model", "model", "model_uri", ref_param="base_model"),
                InputSpec("data", "dataset", "data_uri"),
                InputSpec("init_adapter", "adapter", "init_adapter_uri", optional=True),
            ),
            params={
                "algo": Param("algo.algo"),
                "mode": Param("policy.mode"),
                "format": Param("policy.format"),
                "lora_r": Param("policy.lora_r"),
                "lr": Param("optim.lr"),
                "optimizer": Param("optim.optimizer"),
                "steps": Param("train.steps"),
                "prompts_per_step": Param("train.prompts_per_step"),
                "group_size": Param("rollout.group_size"),
                "max_new_tokens": Param("rollout.max_new_tokens"),
                "temperature": Param("rollout.temperature"),
                "updates_per_rollout": Param("algo.updates_per_rollout"),
                "aqn": Param("aqn.enabled"),
                "aqn_sigma_start": Param("aqn.sigma_start"),
                "aqn_sigma_end": Param("aqn.sigma_end"),
                "device": Param("train.device"),
            },
            report_file="report.md",
            metrics=("reward/accuracy", "reward/mean", "reward", "response", "policy/entropy", "mismatch",
                     "total_steps", "time/step_s_mean", "time/total_s", "rollout/tokens_per_s_mean", "memory"),
            resources=GPU.with_(memory="128Gi", timeout_s=48 * 3600),
            description="GRPO/DAPO on the quantized policy (frozen low-bit base + LoRA) with adaptive quantization "
                        "noise; resumable from checkpoints mirrored to S3.",
        ),
        StageSpec(
            name="eval",
            run="quarl.eval:run_eval",
            config="quarl.eval:EvalConfig",
            output=OutputSpec("results", "metrics", kfp_type="Artifact"),
            inputs=(
                InputSpec("model", "model", "model_uri", ref_param="base_model"),
                InputSpec("adapter", "adapter", "adapter_uri", optional=True),
                InputSpec("data", "dataset", "data_uris", optional=True, as_list=True),
            ),
            params={
                "benchmarks": Param("benchmarks"),
                "samples": Param("sampling.n"),
                "temperature": Param("sampling.temperature"),
                "top_p": Param("sampling.top_p"),
                "greedy": Param("sampling.greedy"),
                "max_new_tokens": Param("sampling.max_new_tokens"),
                "quant": Param("quant", none=""),
                "device": Param("device"),
            },
            report_file="report.md",
            metrics=("benchmarks",),  # <name>.accuracy, .accuracy_stderr, .pass_at_k.<k>, .format_rate
            resources=GPU.with_(timeout_s=6 * 3600),
            description="Model (+ LoRA adapter) on math benchmarks: avg@n and unbiased pass@k, report with examples.",
        ),
        StageSpec(
            name="export",
            run="quarl.export:run_export",
            config="quarl.export:ExportConfig",
            output=OutputSpec("model", "model"),
            inputs=(
                InputSpec("base", "model", "model_uri", ref_param="base_model"),
                InputSpec("adapter", "adapter", "adapter_uri", optional=True),
            ),
            params={
                "verify": Param("verify"),
                "merge": Param("merge"),
                "requant_format": Param("requant_format", none=""),
                "model_name": Param("model_name", none=""),
            },
            report_file="README.md",  # the model card
            metrics=("verification",),
            resources=Resources(image="cpu", cpu="8", memory="64Gi", timeout_s=4 * 3600),
            description="Quantized base (+ LoRA adapter, optionally merged) -> compressed-tensors/PEFT checkpoints "
                        "that vLLM and transformers load unchanged, verified by reloading them.",
        ),
    )
}

# Stages the papers' pipelines use whose library function is still to be written.
# Pipelines naming them compile only once a StageSpec and a component exist.
PLANNED_STAGES = {
    "distill": "quarl.distill:run_distill",
    "kd_coldstart": "quarl.distill:run_kd_coldstart",
}


def get_stage(name: str) -> StageSpec:
    """The spec of stage ``name``; StageUnavailableError for planned/unknown stages."""
    if name in STAGES:
        return STAGES[name]
    if name in PLANNED_STAGES:
        raise StageUnavailableError(f"stage {name} is not implemented yet")
    raise StageUnavailableError(f"unknown stage {name!r}; known stages: {', '.join([*STAGES, *PLANNED_STAGES])}")


def stage_available(name: str) -> bool:
    """True when the stage is registered and its library function and config import."""
    try:
        spec = get_stage(name)
        spec.load_run()
        spec.load_config_class()
    except StageUnavailableError:
        return False
    return True
