"""The stage registry: what a pipeline step is, declared once per stage in its own folder.

A stage is one folder ``quarl/<area>/`` holding its config dataclass, ``run_<stage>``
and ``spec.py``, which declares the stage once::

    # quarl/rl/spec.py  (imports nothing but this module)
    SPEC = StageSpec(
        name="rl", run="quarl.rl.stage:run_rl", config="quarl.rl.config:RLConfig",
        output=OutputSpec("adapter", None),
        inputs=(InputSpec("data", "dataset", "data_uri", help="a data_prep dataset (train split)."), ...),
        params={"lr": Param("optim.lr", help="learning rate."), ...},
        resources=GPU.with_(memory="128Gi"), doc="Train a quantized policy ...",
    )

Each :class:`StageSpec` says how the library stage is driven from a pipeline:

- ``run`` / ``config``: the library function and its config dataclass
  (``"module:name"``, imported lazily, so a spec imports nothing heavy);
- ``inputs``: the upstream artifacts it reads, each mapped to a ``run_<stage>``
  keyword; a model input may instead be named by a string reference (an HF id,
  ``default``, ``tiny-llama``, an ``s3://`` prefix) through ``ref_param``;
- ``output``: the one artifact it writes, stored at
  ``<s3_root>/<run_id>/<step>/<output.name>/``;
- ``params``: which config fields are run-form parameters (the typed parameters
  the component and the pipeline show), each naming the dotted config key it sets
  and its description. Their **type and default come from the config dataclass**
  (:func:`form_params`), so they cannot drift from it. KFP parameters cannot be
  null, so a field whose default is ``None`` is exposed with a stand-in value
  (``none=0``: "0 means no limit");
- ``resources``: image kind, CPU/memory, accelerators, retries and timeout of the
  step (recipes may override them per step);
- ``distributed``: the stage runs under ``torchrun`` on any number of GPUs, so a recipe may give
  its step ``num_nodes`` x ``accelerators`` > 1 and the step becomes a Kubeflow Trainer
  ``TrainJob`` (:mod:`quarl.pipeline.trainjob`).

Everything else is derived: ``quarl compile`` generates ``components/<stage>/``
(component.py, component.yaml, README.md) from the spec and the config
(:mod:`quarl.pipeline.codegen`), the pipelines' run form comes from
:func:`form_params`, and tests fail when a generated file is stale. The registry
(``STAGES``) collects every ``quarl/<area>/spec.py``; nothing is listed by hand.

This module is part of the library on purpose: the runtime executes inside the
component's container and must not need ``kfp``.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

__all__ = [
    "COMMON_PARAMS",
    "GPU",
    "PLANNED_STAGES",
    "STAGES",
    "FormParam",
    "InputSpec",
    "OutputSpec",
    "Param",
    "Resources",
    "StageSpec",
    "StageUnavailableError",
    "form_params",
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
    """A run-form parameter that sets one config field; its type and default are the field's."""

    key: str  # dotted key in the stage config, e.g. "optim.lr"
    none: Any = _UNSET  # the parameter value that stands for None in the config (e.g. 0 = "no limit")
    help: str = ""  # one line for the component docstring, the README and the Kubeflow UI
    # The default in the form when the field's default is a structure with a shorter spelling
    # (data_prep's sources: ["synthetic"] for [SourceConfig(name="synthetic")]). tests/pipeline
    # checks that it resolves to exactly the dataclass default.
    form_default: Any = _UNSET

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
    help: str = ""  # the input's description
    ref_default: str = "default"  # default of ref_param
    ref_help: str = ""  # description of ref_param

    @property
    def kfp_type(self) -> str:
        """How the Kubeflow UI types it: Dataset | Model | Artifact."""
        return {"dataset": "Dataset", "model": "Model", "adapter": "Model"}.get(self.kind, "Artifact")


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
    accelerators: int = 0  # GPUs of the step's pod; of each node's pod when num_nodes > 1
    # Nodes of a distributed stage's world (StageSpec.distributed). When num_nodes x accelerators > 1
    # the step runs as a Kubeflow Trainer TrainJob of num_nodes pods x accelerators GPUs (torchrun),
    # and the step's own pod only launches and waits for it (quarl.pipeline.trainjob).
    num_nodes: int = 1
    retries: int = 2  # a stage is idempotent (see runtime), so a retry after a node loss is safe
    backoff: str = "60s"
    backoff_factor: float = 2.0
    backoff_max: str = "3600s"
    timeout_s: int = 6 * 3600

    def __post_init__(self) -> None:
        for name in ("accelerators", "retries", "timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"resources {name} must be an integer >= 0, got {v!r}")
        if not isinstance(self.num_nodes, int) or isinstance(self.num_nodes, bool) or self.num_nodes < 1:
            raise ValueError(f"resources num_nodes must be an integer >= 1 (nodes of the step's TrainJob; 1 = the "
                             f"step's own pod), got {self.num_nodes!r}")
        if self.num_nodes > 1 and self.accelerators < 1:
            raise ValueError(f"resources num_nodes={self.num_nodes} needs accelerators >= 1 (GPUs per node), "
                             f"got {self.accelerators}")

    @property
    def launches_trainjob(self) -> bool:
        """Several GPUs: the step runs as a TrainJob (only for a stage declared ``distributed``)."""
        return self.num_nodes * max(self.accelerators, 1) > 1

    def with_(self, **changes: Any) -> Resources:
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown resource field(s) {sorted(unknown)}; valid: {', '.join(self.__dataclass_fields__)}"
            )
        return Resources(**{**self.__dict__, **changes})


GPU = Resources(image="cuda", cpu="8", memory="64Gi", accelerator="nvidia.com/gpu", accelerators=1)


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
    description: str = ""  # one line: the step report's subtitle
    doc: str = ""  # the component's docstring before its Args (the Kubeflow UI's description); "" = description
    # Runs under torchrun with any number of processes (rank 0 writes the artifact; docs/distributed.md),
    # so a pipeline may run it on several GPUs and nodes as a Kubeflow Trainer TrainJob: its
    # components/<stage>/launcher.py is generated and recipes may set resources.<step>.num_nodes.
    distributed: bool = False

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


# ---------------------------------------------------------------- the run form, derived from the config


@dataclass(frozen=True)
class FormParam:
    """One typed run-form parameter as the component and the pipeline show it."""

    name: str
    key: str  # dotted config key
    type: type  # str | int | float | bool | list | dict (what KFP can type)
    default: Any
    help: str


_FORM_TYPES = (str, int, float, bool, list, dict)


def _form_type(tp: Any, where: str) -> type:
    """The KFP type of a config field's annotation: Optional/Literal/list[...] folded to a plain type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        opts = [a for a in args if a is not type(None)]
        kinds = {_form_type(a, where) for a in opts}
        if len(kinds) == 1:
            return kinds.pop()
        if list in kinds:  # e.g. list[SourceConfig | str] | str: the form takes the list
            return list
        if kinds == {int, float}:
            return float
        raise TypeError(f"{where}: cannot type {tp} as one KFP parameter type; expose a simpler field")
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) == 1 and kinds.pop() in _FORM_TYPES:
            return type(args[0])
        raise TypeError(f"{where}: a Literal of mixed types ({tp}) cannot be one KFP parameter")
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        return list
    if origin is dict or tp is dict:
        return dict
    if isinstance(tp, type) and issubclass(tp, _FORM_TYPES):
        for t in (bool, int, float, str):  # bool before int: bool is an int
            if issubclass(tp, t):
                return t
    if dataclasses.is_dataclass(tp):
        raise TypeError(f"{where}: is a section ({tp.__name__}); a parameter sets one field of it")
    raise TypeError(f"{where}: type {tp} has no KFP parameter type")


def _field_at(cls: type, key: str, stage: str) -> tuple[Any, Any]:
    """(annotation, default value) of dotted field ``key`` of config class ``cls``."""
    from quarl.config import config_to_dict

    obj: Any = cls()
    tp: Any = cls
    for part in key.split("."):
        if not dataclasses.is_dataclass(tp):
            raise TypeError(f"stage {stage}: config key {key!r}: {part!r} is inside a value, not a section")
        hints = typing.get_type_hints(tp)
        if part not in hints:
            raise TypeError(f"stage {stage}: {tp.__name__} has no field {part!r} (config key {key!r}); "
                            f"fields: {', '.join(hints)}")
        tp = hints[part]
        opts = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (Union, types.UnionType) and len(opts) == 1 and dataclasses.is_dataclass(opts[0]):
            tp = opts[0]
        obj = getattr(obj, part)
    return tp, config_to_dict(obj)


def form_params(spec: StageSpec) -> list[FormParam]:
    """The stage's typed run-form parameters: names and help from the spec, type and default from the config."""
    cls = spec.load_config_class()
    out = []
    for name, p in spec.params.items():
        where = f"stage {spec.name}, parameter {name} ({p.key})"
        tp, value = _field_at(cls, p.key, spec.name)
        ftype = _form_type(tp, where)
        default = p.form_default if p.form_default is not _UNSET else p.from_config(value)
        if default is None:
            raise TypeError(f"{where}: the config default is None and KFP parameters cannot be null; give the "
                            f"Param a stand-in (none=0 or none=\"\") that means None")
        if ftype is float and isinstance(default, int) and not isinstance(default, bool):
            default = float(default)
        out.append(FormParam(name, p.key, ftype, default, p.help))
    return out


# ---------------------------------------------------------------- the registry

# Packages whose ``spec.py`` declares stages (``SPEC = StageSpec(...)`` or ``SPECS = (...)``) are
# discovered, not listed: a new ``quarl/<area>/spec.py`` registers its stage(s) with no edit here.
# The order stages are listed in (docs, compile output); others follow by name.
_ORDER = ("data_prep", "calibrate", "rl", "eval", "export")


SPEC_FILES: dict[str, str] = {}  # stage -> the file declaring it (for generated headers and errors)


def _discover() -> list[StageSpec]:
    """Every StageSpec declared by a ``quarl/<area>/spec.py``."""
    import pkgutil
    from pathlib import Path

    import quarl

    out: list[StageSpec] = []
    for info in pkgutil.iter_modules(quarl.__path__):
        if not info.ispkg or not (Path(info.module_finder.path) / info.name / "spec.py").is_file():
            continue
        mod = importlib.import_module(f"quarl.{info.name}.spec")
        specs = getattr(mod, "SPECS", None) or ((mod.SPEC,) if hasattr(mod, "SPEC") else ())
        for spec in specs:  # none: a spec.py of another kind (quarl/quant/spec.py is the format grammar)
            if not isinstance(spec, StageSpec):
                raise TypeError(f"quarl/{info.name}/spec.py: SPEC/SPECS must hold StageSpec objects, got {spec!r}")
            out.append(spec)
            SPEC_FILES[spec.name] = f"quarl/{info.name}/spec.py"
    rank = {n: i for i, n in enumerate(_ORDER)}
    return sorted(out, key=lambda sp: (rank.get(sp.name, len(rank)), sp.name))


class _Registry(dict):
    """``STAGES``: name -> StageSpec, filled from the stage folders on first use.

    Lazy because importing a stage's package (``quarl.rl``) imports torch; ``quarl --help``
    and this module stay light. An entry set before the first use (a test's fake stage) is kept.
    """

    _loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for spec in _discover():
                if super().get(spec.name, spec) is not spec:
                    raise TypeError(f"stage {spec.name!r} is declared twice; rename one")
                super().__setitem__(spec.name, spec)

    def __getitem__(self, k):
        self._load()
        return super().__getitem__(k)

    def __contains__(self, k):
        self._load()
        return super().__contains__(k)

    def __iter__(self):
        self._load()
        return super().__iter__()

    def __len__(self):
        self._load()
        return super().__len__()

    def __repr__(self):
        self._load()
        return super().__repr__()

    def get(self, k, default=None):
        self._load()
        return super().get(k, default)

    def keys(self):
        self._load()
        return super().keys()

    def values(self):
        self._load()
        return super().values()

    def items(self):
        self._load()
        return super().items()


STAGES: dict[str, StageSpec] = _Registry()

# Stages the papers' pipelines use whose library function is still to be written.
# Pipelines naming them compile only once the stage's folder (spec.py) exists.
PLANNED_STAGES = {
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
