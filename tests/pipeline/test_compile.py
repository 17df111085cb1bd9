"""Compiled YAML: committed copies are up to date; declared-but-unavailable pipelines say why."""

import pytest
import yaml
from kfp import components
from quarl_components import COMPONENTS
from quarl_pipelines import COMPILED_DIR, PIPELINES
from typer.testing import CliRunner

from quarl.cli.main import app
from quarl.pipeline.compile import compile_all, compile_components, components_dir
from quarl.pipeline.recipes import list_recipes, load_recipe
from quarl.pipeline.remote import spec_body
from quarl.pipeline.stages import STAGES, StageUnavailableError


def buildable_recipes() -> list[str]:
    return [n for n in list_recipes() if not PIPELINES[load_recipe(n).pipeline].missing_stages()]


STALE = "is stale: run `make compile` (quarl compile --all) and commit the result"


def test_committed_pipelines_are_up_to_date(tmp_path):
    _written, skipped = compile_all(tmp_path / "p", tmp_path / "c")
    names = buildable_recipes()
    assert sorted(p.stem for p in (tmp_path / "p").glob("*.yaml")) == sorted(names)
    assert set(skipped) == set(list_recipes()) - set(names)
    for n in names:
        committed = COMPILED_DIR / f"{n}.yaml"
        assert committed.is_file(), f"{committed} is missing: run `make compile` and commit it"
        # the leading comment block lists dict defaults in a per-process order (KFP); the spec is compared
        assert spec_body(committed.read_text()) == spec_body((tmp_path / "p" / f"{n}.yaml").read_text()), (
            f"{committed} {STALE}")
    # nothing committed for a pipeline that cannot be built (it would be a lie)
    for p in COMPILED_DIR.glob("*.yaml"):
        assert p.stem in names, f"{p} is committed but its pipeline cannot be built: {skipped.get(p.stem)}"


def test_committed_components_are_up_to_date(tmp_path):
    """component.py, __init__.py, component.yaml and README.md are what the stage's spec.py generates."""
    compile_components(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(COMPONENTS)
    for stage in COMPONENTS:
        # a distributed stage also has its TrainJob launcher (quarl.pipeline.trainjob), generated alike
        launcher = ("launcher.py", "launcher.yaml") if STAGES[stage].distributed else ()
        assert (components_dir() / stage / "launcher.py").is_file() == bool(launcher), f"{stage}: {STALE}"
        for name in ("component.py", "__init__.py", *launcher):
            committed = components_dir() / stage / name
            assert committed.is_file(), f"{committed} is missing: run `make compile`"
            assert committed.read_text() == (tmp_path / stage / name).read_text(), f"{committed} {STALE}"
        committed = components_dir() / stage / "component.yaml"
        assert committed.is_file(), f"{committed} is missing: run `make compile`"
        assert committed.read_text() == (tmp_path / stage / "component.yaml").read_text(), f"{committed} {STALE}"
        comp = components.load_component_from_file(str(committed))  # reusable from its YAML alone
        assert comp.name == stage.replace("_", "-")
        readme = components_dir() / stage / "README.md"
        assert readme.read_text() == (tmp_path / stage / "README.md").read_text(), f"{readme} {STALE}"


def test_compile_is_deterministic(tmp_path):
    for n in buildable_recipes():
        a, b = tmp_path / "a", tmp_path / "b"
        from quarl.pipeline.compile import compile_one

        compile_one(load_recipe(n), a)
        compile_one(load_recipe(n), b)
        assert spec_body((a / f"{n}.yaml").read_text()) == spec_body((b / f"{n}.yaml").read_text())


@pytest.mark.parametrize("name", sorted(set(list_recipes()) - set(buildable_recipes())))
def test_unavailable_pipeline_says_which_stage(name, tmp_path):
    missing = PIPELINES[load_recipe(name).pipeline].missing_stages()
    with pytest.raises(StageUnavailableError, match=f"stages? {missing[0]}.* not implemented yet"):
        PIPELINES[load_recipe(name).pipeline].build(load_recipe(name))
    res = CliRunner().invoke(app, ["compile", name, "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert missing[0] in res.output and "not implemented yet" in res.output
    assert not list(tmp_path.glob("*.yaml"))


def test_a_pipeline_waits_for_a_planned_stage(monkeypatch):
    """A pipeline naming a stage whose folder has not landed yet refuses to compile and says which."""
    from quarl.pipeline import stages

    assert "precision_search" in stages.STAGES  # loads the registry before taking the stage out of it
    monkeypatch.delitem(stages.STAGES, "precision_search")
    monkeypatch.setitem(stages.PLANNED_STAGES, "precision_search", "quarl.search:run_precision_search")
    assert PIPELINES["precision_search"].missing_stages() == ["precision_search"]
    res = CliRunner().invoke(app, ["compile", "precision_search"])
    assert res.exit_code == 1
    assert "stage precision_search is not implemented yet" in res.output


def test_distillation_pipelines_build():
    for name in ("qad", "reasoning_qat"):
        assert PIPELINES[name].missing_stages() == []


def test_run_form_and_task_settings(core_recipe, tmp_path):
    """The compiled run form is the recipe's; GPU steps ask for GPUs, retries, a deadline and the S3 secret."""
    from quarl.pipeline.compile import compile_one

    r = core_recipe
    text = compile_one(r, tmp_path).read_text()
    spec, platform = list(yaml.safe_load_all(text))
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["model"]["defaultValue"] == r.model and params["run_id"]["defaultValue"] == ""
    assert params["s3_root"]["defaultValue"] == "s3://quarl/runs"
    pdef = PIPELINES["core"]
    for step in pdef.steps:
        for k, v in r.typed_params(step.id, step.stage).items():
            got = params[f"{step.id}_{k}"].get("defaultValue")
            assert got == v or (isinstance(v, (int, float)) and float(got) == float(v)), (step.id, k, got, v)
        assert yaml.safe_load(params[f"{step.id}_config"].get("defaultValue") or "{}") == (
            yaml.safe_load(r.rest_yaml(step.id, step.stage)) or {})
    assert params["rl_lr"]["defaultValue"] == 1e-5 and params["calibrate_method"]["defaultValue"] == "awq"
    tasks = spec["root"]["dag"]["tasks"]
    execs = spec["deploymentSpec"]["executors"]
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert tasks["rl"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {
        "outputArtifactKey": "model", "producerTask": "calibrate"}
    assert tasks["calibrate"]["inputs"]["parameters"]["base_model"] == {"componentInputParameter": "model"}
    assert tasks["rl"]["inputs"]["parameters"]["kfp_run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    for step in pdef.steps:
        task = tasks[step.id.replace("_", "-")]
        assert task["retryPolicy"]["maxRetryCount"] == 2 and task["retryPolicy"]["backoffFactor"] == 2.0
        ex = task["componentRef"]["name"].replace("comp-", "exec-")
        res = execs[ex]["container"]["resources"]
        gpu = step.stage in ("calibrate", "rl", "eval")
        assert ("accelerator" in res) == gpu
        if gpu:
            assert res["accelerator"]["resourceCount"] == "1"
            assert res["accelerator"]["resourceType"] == "nvidia.com/gpu"
            assert "cuda" in execs[ex]["container"]["image"]
            assert any(t["key"] == "nvidia.com/gpu" for t in k8s[ex]["tolerations"])
        assert k8s[ex]["secretAsEnv"][0]["secretName"] == "quarl-s3"
        assert {m["envVar"] for m in k8s[ex]["secretAsEnv"][0]["keyToEnv"]} >= {"AWS_ACCESS_KEY_ID",
                                                                                "AWS_SECRET_ACCESS_KEY"}
        assert int(k8s[ex]["activeDeadlineSeconds"]) > 0
        assert any(v["mountPath"] == "/scratch" for v in k8s[ex]["emptyDirMounts"])
    assert execs["exec-rl"]["container"]["resources"]["memoryLimit"] == 137.438953472  # 128Gi from the recipe
    # credentials are never parameters (the UI and run history show those): only the secret's name is in the spec
    assert not [p for p in params if any(w in p.lower() for w in ("secret", "password", "access_key", "credential"))]
