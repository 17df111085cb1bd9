"""The stage declarations (quarl/<area>/spec.py): one source for the component, the CLI and the run form.

A component's parameter names, types and defaults are derived from its spec and its config
dataclass; these tests fail when a committed component drifts from either.
"""

import dataclasses
import inspect
import re

import pytest
from quarl_components import COMPONENTS
from quarl_components._base import _check_signature

from quarl.config import config_to_dict
from quarl.pipeline.runtime import resolve_config
from quarl.pipeline.stages import SPEC_FILES, STAGES, Param, form_params, get_stage

STAGE_NAMES = ["data_prep", "calibrate", "rl", "eval", "export"]


def test_every_stage_is_discovered_from_its_folder():
    assert STAGE_NAMES[:5] == ["data_prep", "calibrate", "rl", "eval", "export"]
    assert set(BAD) == set(STAGES), "give each stage a value its config must reject (BAD below)"
    assert SPEC_FILES["rl"] == "quarl/rl/spec.py" and SPEC_FILES["data_prep"] == "quarl/data/spec.py"
    assert set(COMPONENTS) == set(STAGES)  # every declared stage has its generated component


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_component_matches_spec_and_config(stage):
    """Names, order, annotations and defaults of the committed component == what the spec + config derive."""
    _check_signature(get_stage(stage), COMPONENTS[stage].python_func)


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_component_defaults_are_the_config_defaults(stage):
    """Passing every typed parameter at its component default gives exactly the dataclass's default config."""
    spec = get_stage(stage)
    sig = inspect.signature(COMPONENTS[stage].python_func).parameters
    typed = {name: sig[name].default for name in spec.params}
    cfg = resolve_config(spec, "", typed)
    assert config_to_dict(cfg) == config_to_dict(spec.load_config_class()())
    for p in form_params(spec):  # the type too: KFP would coerce a drifted type silently
        assert sig[p.name].annotation is p.type, (stage, p.name)


def _respec(stage, **params):
    spec = get_stage(stage)
    return dataclasses.replace(spec, params={**spec.params, **params})


def test_a_drifted_default_type_or_name_fails_at_import():
    fn = COMPONENTS["rl"].python_func
    with pytest.raises(TypeError, match="lr defaults to 1e-05, the config says 0.1"):
        _check_signature(_respec("rl", lr=Param("optim.weight_decay", help="x")), fn)  # default drift
    with pytest.raises(TypeError, match="lr is annotated float, expected int"):
        _check_signature(_respec("rl", lr=Param("train.steps", help="x")), fn)  # type drift
    with pytest.raises(TypeError, match="quarl compile --all"):
        _check_signature(_respec("rl", beta=Param("algo.beta", none=0.0, help="x")), fn)  # a new name


def test_a_param_must_name_a_config_field_and_stand_in_for_none():
    with pytest.raises(TypeError, match="has no field 'lrr'"):
        form_params(_respec("rl", lr=Param("optim.lrr")))
    with pytest.raises(TypeError, match="stand-in"):
        form_params(_respec("calibrate", seq_len=Param("data.seq_len")))  # default None, no none=
    with pytest.raises(TypeError, match="is a section"):
        form_params(_respec("rl", aqn=Param("aqn")))


# ---------------------------------------------------------------- validated at construction

BAD = {  # stage -> (a value its pod would reject, words the error must contain)
    "data_prep": ("template=nope", "template='nope'"),
    "calibrate": ("format=nvfp5", "format='nvfp5'"),
    "rl": ("algo.algo=ppo", "algo.algo must be one of"),
    "eval": ("device=gpu0", "device='gpu0' is not a device name"),
    "export": ("requant_format=int9", "requant_format='int9'"),
    "distill": ("loss.objective=kl", "loss.objective must be one of"),
    "kd_coldstart": ("loss.objective=kl", "loss.objective must be one of"),
    "precision_search": ("granularity=layer", "granularity"),
}


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_every_stage_config_is_validated_when_built(stage):
    from quarl.config import ConfigError, build_config

    bad, words = BAD[stage]
    with pytest.raises(ConfigError, match=re.escape(words)):
        build_config(get_stage(stage).load_config_class(), {}, [bad])


@pytest.mark.parametrize("bad,words", [
    ("rl.algo.algo=ppo", "algo.algo must be one of"),
    ("rl.aqn.schedule=step", "aqn.schedule must be one of"),
    ("rl.aqn.num_stages=2", "aqn.num_stages must be >= 3"),
    ("rl.policy.format=nvfp5", "policy.format='nvfp5'"),
    ("calibrate.method=hqq", "method"),
])
def test_compile_and_submit_reject_what_the_pod_would(bad, words, tmp_path):
    from typer.testing import CliRunner

    from quarl.cli.main import app

    res = CliRunner().invoke(app, ["compile", "qerl", "--set", bad, "--out", str(tmp_path)])
    assert res.exit_code == 1 and words in res.output, res.output
    assert not list(tmp_path.glob("*.yaml"))
    # submit fails the same way before it contacts any Kubeflow (nothing listens on this port)
    res = CliRunner().invoke(app, ["submit", "qerl", "--host", "http://127.0.0.1:9", "--set", bad])
    assert res.exit_code == 1 and words in res.output and "healthz" not in res.output, res.output


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_stage_has_its_cli_command_reading_its_config(stage):
    """`quarl <stage> --print-config` loads the config class the spec names (through cli.common.run_stage)."""
    import yaml
    from typer.testing import CliRunner

    from quarl.cli.main import app

    if stage == "rl":
        args = ["rl", "--print-config", "--set", "algo.algo=dapo"]
    else:
        args = [stage.replace("_", "-"), "--print-config", "--output", "x"]
        args += ["--model", "tiny-llama"] if stage in ("calibrate", "eval", "export") else []
        args += ["--set", "device=cpu"] if stage in ("calibrate", "eval") else []
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    printed = yaml.safe_load(res.output)
    fields = {f.name for f in dataclasses.fields(get_stage(stage).load_config_class())}
    assert set(printed) == fields
    res = CliRunner().invoke(app, [*args, "--set", "nope=1"])
    assert res.exit_code == 1 and "unknown config key 'nope'" in res.output


def test_pipeline_docstrings_name_only_parameters_that_exist():
    """A ``<step>_<param>`` named in a pipeline module's docstring is a parameter of its run form."""
    import importlib
    import re

    from quarl_pipelines import PIPELINES

    from quarl.pipeline.recipes import list_recipes, load_recipe

    for name in list_recipes():
        recipe = load_recipe(name)
        pipe = PIPELINES[recipe.pipeline]
        if pipe.missing_stages():
            continue
        params = {n for n, _, _ in pipe.parameters(recipe)}
        doc = importlib.import_module(f"quarl_pipelines.{pipe.name}").__doc__
        steps = tuple(f"{s.id}_" for s in pipe.steps)
        named = {t for t in re.findall(r"``(\w+)``", doc) if t.startswith(steps)}
        assert named <= params, f"pipelines/{pipe.name}.py names {sorted(named - params)}, not parameters"
