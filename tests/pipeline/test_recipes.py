"""Recipes: every shipped recipe loads, and the run form (typed knobs + <step>_config) reproduces it exactly."""

import pytest
import yaml
from quarl_pipelines import PIPELINES

from quarl.config import config_to_dict, get_path
from quarl.pipeline.recipes import RecipeError, list_recipes, load_recipe
from quarl.pipeline.runtime import resolve_config
from quarl.pipeline.stages import STAGES, get_stage, stage_available


def _profiles(name):
    return [None, *load_recipe(name).profiles]


CASES = [(n, p) for n in list_recipes() for p in _profiles(n)]


def test_one_recipe_per_pipeline():
    names = {load_recipe(n).pipeline for n in list_recipes()}
    assert names == set(PIPELINES)


@pytest.mark.parametrize(("name", "profile"), CASES)
def test_run_form_reproduces_the_recipe(name, profile):
    """typed knobs + the rest YAML, resolved the way the component does, == the recipe's stage config."""
    r = load_recipe(name, profile=profile)
    pdef = PIPELINES[r.pipeline]
    for step in pdef.steps:
        if not stage_available(step.stage):
            continue
        spec = get_stage(step.stage)
        want = config_to_dict(r.stage_config(step.id, step.stage))
        typed = r.typed_params(step.id, step.stage)
        rest = r.rest_yaml(step.id, step.stage)
        got = config_to_dict(resolve_config(spec, rest, typed))
        assert got == want, f"{name}/{profile}/{step.id}"
        # each field lives in exactly one place of the form
        rest_d = yaml.safe_load(rest) or {}
        for p in spec.params.values():
            assert not get_path(rest_d, p.key.split("."))[0], f"{step.id}: {p.key} is both typed and in the YAML"


def test_local_profile_is_the_embedded_default_on_cpu():
    r = load_recipe("qerl", profile="local")
    assert r.model == "default" and r.profile == "local"
    rl = r.typed_params("rl", "rl")
    assert rl["device"] == "cpu" and rl["optimizer"] == "adamw" and rl["steps"] <= 5
    assert r.typed_params("data_prep", "data_prep")["sources"][0]["name"] == "synthetic"
    # the paper settings stay underneath
    paper = load_recipe("qerl")
    assert paper.model == "Qwen/Qwen2.5-7B-Instruct"
    assert paper.typed_params("rl", "rl")["lr"] == 1e-5 and paper.typed_params("rl", "rl")["group_size"] == 8
    assert paper.typed_params("calibrate", "calibrate")["method"] == "awq"


def test_overrides():
    r = load_recipe("qerl", profile="local", overrides=["rl.optim.lr=3e-4", "model=tiny-llama",
                                                         "resources.rl.accelerators=8", "s3_root=s3://other/x"])
    assert r.typed_params("rl", "rl")["lr"] == 3e-4
    assert r.model == "tiny-llama" and r.s3_root == "s3://other/x"
    assert r.resources_for("rl", STAGES["rl"]).accelerators == 8
    with pytest.raises(RecipeError, match="must look like key=value"):
        load_recipe("qerl", overrides=["rl.optim.lr"])
    with pytest.raises(RecipeError, match="use model="):
        load_recipe("qerl", overrides=["lr=1"])
    with pytest.raises(RecipeError, match=r"stages.rl: .*unknown config key 'optim.lrr'"):
        load_recipe("qerl", overrides=["rl.optim.lrr=1"]).stage_config("rl", "rl")


def test_bad_recipes(tmp_path):
    with pytest.raises(RecipeError, match="unknown recipe 'nope'; available: .*qerl"):
        load_recipe("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: qerl\nmodel: m\nstagse: {}\n")
    with pytest.raises(RecipeError, match="unknown top-level keys \\['stagse'\\]"):
        load_recipe(bad)
    bad.write_text("pipeline: qerl\n")
    with pytest.raises(RecipeError, match="must set 'model'"):
        load_recipe(bad)
    bad.write_text("pipeline: qerl\nmodel: m\nstages: {rll: {}}\n")
    with pytest.raises(RecipeError, match=r"unknown step\(s\) \['rll'\]"):
        load_recipe(bad).check_steps(PIPELINES["qerl"])
    with pytest.raises(RecipeError, match="has no profile 'gpu'"):
        load_recipe("qerl", profile="gpu")
    with pytest.raises(RecipeError, match="unknown resource field"):
        load_recipe("qerl", overrides=["resources.rl.gpus=2"]).resources_for("rl", STAGES["rl"])
