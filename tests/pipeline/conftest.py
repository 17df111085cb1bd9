import pytest

from quarl.pipeline import stages
from tests.pipeline import fake_stage


@pytest.fixture
def echo_stage(monkeypatch):
    """Register the fake ``echo`` stage (tests/pipeline/fake_stage.py) for one test."""
    monkeypatch.setitem(stages.STAGES, "echo", fake_stage.SPEC)
    fake_stage.CALLS.clear()
    return fake_stage


CORE_STEPS = None


@pytest.fixture
def core_recipe(monkeypatch, tmp_path):
    """A pipeline of the stages that exist (data_prep -> calibrate -> rl -> eval) and a recipe for it
    made from qerl's sections, so the build/compile/submit mechanism is tested whatever has landed."""
    import yaml
    from quarl_pipelines import PIPELINES, PipelineDef, Step

    from quarl.pipeline.recipes import RECIPE_DIR, load_recipe

    core = PipelineDef(name="core", description="test pipeline", steps=(
        Step("data_prep"),
        Step("calibrate", inputs={"data": "data_prep.dataset"}),
        Step("rl", inputs={"model": "calibrate.model", "data": "data_prep.dataset"}),
        Step("eval", inputs={"model": "calibrate.model", "adapter": "rl.adapter", "data": "data_prep.dataset"}),
    ))
    monkeypatch.setitem(PIPELINES, "core", core)
    data = yaml.safe_load((RECIPE_DIR / "qerl.yaml").read_text())
    data["pipeline"] = "core"
    for d in (data["stages"], data["profiles"]["local"]["stages"]):
        d.pop("export", None)
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_recipe(path)
