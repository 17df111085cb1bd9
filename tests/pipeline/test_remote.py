"""quarl submit / schedule against a fake kfp.Client (no Kubeflow here).

The fake keeps pipelines, versions, experiments, runs and recurring runs in memory with the
same method names, arguments and response shapes (the kfp_server_api V2beta1 fields quarl
reads), so the upload-once / re-pin-on-new-version logic is exercised for real.
"""

import itertools
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import yaml

from quarl.pipeline import remote
from quarl.pipeline.recipes import load_recipe
from tests.pipeline.test_compile import buildable_recipes


class FakeClient:
    def __init__(self):
        self.ids = (f"id-{i}" for i in itertools.count())
        self.pipelines: dict[str, str] = {}  # name -> id
        self.versions: dict[str, list] = {}  # pipeline id -> [NS(pipeline_version_id, display_name, spec)]
        self.experiments: dict[str, str] = {}
        self.runs: list[dict] = []
        self.recurring: list[NS] = []
        self.calls: list[str] = []

    def get_pipeline_id(self, name):
        return self.pipelines.get(name)

    def upload_pipeline(self, pipeline_package_path, pipeline_name=None, description=None, namespace=None):
        self.calls.append("upload_pipeline")
        pid = next(self.ids)
        self.pipelines[pipeline_name] = pid
        # like the server: uploading a pipeline also creates its first version, named after it
        self.versions[pid] = [NS(pipeline_version_id=next(self.ids), display_name=pipeline_name,
                                 spec=next(yaml.safe_load_all(Path(pipeline_package_path).read_text())))]
        return NS(pipeline_id=pid, display_name=pipeline_name)

    def upload_pipeline_version(self, pipeline_package_path, pipeline_version_name, pipeline_id=None,
                                pipeline_name=None, description=None):
        self.calls.append("upload_pipeline_version")
        v = NS(pipeline_version_id=next(self.ids), display_name=pipeline_version_name,
               spec=next(yaml.safe_load_all(Path(pipeline_package_path).read_text())))
        self.versions[pipeline_id].append(v)
        return v

    def list_pipeline_versions(self, pipeline_id, page_token="", page_size=10, sort_by="", filter=None):
        vs = self.versions[pipeline_id]
        start = int(page_token or 0)
        nxt = start + page_size
        return NS(pipeline_versions=vs[start:nxt], next_page_token=str(nxt) if nxt < len(vs) else "")

    def create_experiment(self, name, description=None, namespace=None):
        self.experiments.setdefault(name, next(self.ids))
        return NS(experiment_id=self.experiments[name])

    def run_pipeline(self, experiment_id, job_name, pipeline_package_path=None, params=None, pipeline_id=None,
                     version_id=None, pipeline_root=None, enable_caching=None, cache_key=None,
                     service_account=None):
        rid = next(self.ids)
        self.runs.append({"run_id": rid, "experiment_id": experiment_id, "job_name": job_name, "pipeline_id": pipeline_id,
                              "version_id": version_id, "params": params, "enable_caching": enable_caching})
        return NS(run_id=rid)

    def list_recurring_runs(self, page_token="", page_size=10, sort_by="", experiment_id=None, namespace=None,
                            filter=None):
        rs = [r for r in self.recurring if r.experiment_id == experiment_id]
        return NS(recurring_runs=rs, next_page_token="")

    def delete_recurring_run(self, recurring_run_id):
        self.calls.append("delete_recurring_run")
        self.recurring = [r for r in self.recurring if r.recurring_run_id != recurring_run_id]
        return {}

    def create_recurring_run(self, experiment_id, job_name, description=None, start_time=None, end_time=None,
                             interval_second=None, cron_expression=None, max_concurrency=1, no_catchup=None,
                             params=None, pipeline_package_path=None, pipeline_id=None, version_id=None,
                             enabled=True, pipeline_root=None, enable_caching=None, cache_key=None,
                             service_account=None):
        self.calls.append("create_recurring_run")
        rr = NS(recurring_run_id=next(self.ids), display_name=job_name, experiment_id=experiment_id,
                pipeline_version_reference=NS(pipeline_id=pipeline_id, pipeline_version_id=version_id),
                trigger=NS(cron_schedule=NS(cron=cron_expression)), max_concurrency=max_concurrency,
                no_catchup=no_catchup, enabled=enabled)
        self.recurring.append(rr)
        return rr


@pytest.fixture
def recipe(core_recipe):
    """A shipped recipe when one is buildable, else the test pipeline of the stages that exist."""
    names = buildable_recipes()
    return load_recipe(names[0]) if names else core_recipe


def test_submit_uploads_once_and_reuses_identical_versions(recipe):
    c = FakeClient()
    first = remote.submit(recipe, c, experiment="exp")
    assert first["new_version"] and c.calls == ["upload_pipeline", "upload_pipeline_version"]
    again = remote.submit(recipe, c, experiment="exp")
    assert not again["new_version"] and again["version_id"] == first["version_id"]
    assert c.calls == ["upload_pipeline", "upload_pipeline_version"]  # nothing uploaded the second time
    assert [r["version_id"] for r in c.runs] == [first["version_id"]] * 2
    assert c.runs[0]["enable_caching"] is False and c.runs[0]["experiment_id"] == c.experiments["exp"]
    # the uploaded spec is the recipe's pipeline with the paper defaults as its run form
    spec = next(v.spec for v in c.versions[first["pipeline_id"]] if v.pipeline_version_id == first["version_id"])
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["model"]["defaultValue"] == recipe.model
    # a changed recipe is a new version of the same pipeline
    changed = recipe.with_overrides(["model=other/model"])
    third = remote.submit(changed, c, experiment="exp")
    assert third["new_version"] and third["pipeline_id"] == first["pipeline_id"]
    assert third["version_id"] != first["version_id"]


def test_schedule_creates_keeps_and_repins(recipe):
    c = FakeClient()
    a = remote.schedule(recipe, c, cron="0 0 2 * * *")
    assert a["action"] == "created" and len(c.recurring) == 1
    rr = c.recurring[0]
    assert rr.display_name == f"nightly-{recipe.name.replace('_', '-')}" and rr.max_concurrency == 1
    assert rr.no_catchup is True and rr.pipeline_version_reference.pipeline_version_id == a["version_id"]
    b = remote.schedule(recipe, c, cron="0 0 2 * * *")  # nothing changed: keep it
    assert b["action"] == "unchanged" and b["recurring_run_id"] == a["recurring_run_id"]
    assert c.calls.count("create_recurring_run") == 1
    # new code/recipe -> new version -> the recurring run is re-created on it (they pin a version)
    newer = recipe.with_overrides(["model=other/model"])
    d = remote.schedule(newer, c, cron="0 0 2 * * *")
    assert d["action"] == "replaced" and d["version_id"] != a["version_id"]
    assert len(c.recurring) == 1 and c.recurring[0].pipeline_version_reference.pipeline_version_id == d["version_id"]
    # a new cron on the same version is also a re-creation
    e = remote.schedule(newer, c, cron="0 30 3 * * *")
    assert e["action"] == "replaced" and c.recurring[0].trigger.cron_schedule.cron == "0 30 3 * * *"
    with pytest.raises(ValueError, match="6 fields"):
        remote.schedule(recipe, c, cron="0 2 * * *")
