"""quarl.pipeline.trainjob: the TrainJob against the Trainer v2 CRD schema, and the launcher's wait/log/fail loop.

No cluster here: the schema is Kubeflow Trainer v2.3.0's, vendored in manifests/vendor/ (its
provenance is checked below), and the loop runs against :class:`FakeCluster`, a scripted stand-in
for :class:`quarl.pipeline.trainjob.KubeClient` that plays the Trainer controller's part.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from kfp import dsl

from quarl.artifacts import write_artifact
from quarl.pipeline import trainjob as tj
from quarl.pipeline.runtime import FAILURE_MARKER, read_step_record
from quarl.pipeline.stages import STAGES, get_stage
from tests.pipeline import fake_stage

ROOT = Path(__file__).resolve().parents[2]
VENDORED = ROOT / "manifests" / "vendor" / "trainer-crd-schemas.json"


# ---------------------------------------------------------------- the CRD schema


def _strict(schema):
    """The schema as ``kubectl apply`` (field validation Strict) applies it: unknown fields are errors."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("default", "enum", "x-kubernetes-validations") else _strict(v)) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd(kind: str) -> dict:
    return json.loads(VENDORED.read_text())["crds"][kind]


def validate(obj: dict, kind: str) -> None:
    """JSON-schema validation against the vendored CRD, plus the CEL rules a TrainJob's create runs."""
    c = crd(kind)
    assert obj["apiVersion"] == f"{c['group']}/{c['version']}" and obj["kind"] == kind
    jsonschema.Draft7Validator(_strict(c["openAPIV3Schema"])).validate(obj)
    # x-kubernetes-validations are CEL, which jsonschema does not run: the ones on create, by hand
    rules = {v["rule"] for v in c["openAPIV3Schema"].get("x-kubernetes-validations", [])}
    if kind == "TrainJob":
        assert rules == {"self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                         "size(self.metadata.name) <= 63"}, "the CRD's name rules changed: update this check"
        name = obj["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
        assert obj["spec"]["trainer"].get("numProcPerNode", 1) >= 1  # the field's own CEL rule (self >= 1)


def test_vendored_schemas_say_where_they_come_from():
    d = json.loads(VENDORED.read_text())
    assert d["source"] == "https://github.com/kubeflow/trainer" and d["tag"] == "v2.3.0"
    assert re.fullmatch(r"[0-9a-f]{40}", d["commit"])
    for kind, plural in (("TrainJob", "trainjobs"), ("ClusterTrainingRuntime", "clustertrainingruntimes")):
        c = d["crds"][kind]
        assert c["url"].startswith(f"https://github.com/kubeflow/trainer/blob/{d['commit']}/manifests/base/crds/")
        assert re.fullmatch(r"[0-9a-f]{64}", c["sha256"])
        assert (c["group"], c["version"], c["plural"]) == (tj.GROUP, tj.VERSION, plural)
    spec = d["crds"]["TrainJob"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["runtimeRef"] and "trainer" in spec["properties"]


def job(**kw) -> dict:
    base = {"name": tj.trainjob_name("rl", "qerl-20261125", "f" * 64), "namespace": "quarl",
                "stage_args": ["rl", "--config", tj.CONFIG_PATH, "--model", "s3://quarl/runs/r/calibrate/model",
                            "--data", "s3://quarl/runs/r/data_prep/dataset", "--output", "s3://quarl/runs/r/rl/adapter"],
                "config_yaml": "algo: {algo: grpo}\n", "image": "ghcr.io/quarl-project/quarl-cuda:0.1.0",
                "num_nodes": 2, "gpus_per_node": 8, "cpu": "32", "memory": "512Gi", "timeout_s": 172800,
                "labels": {"quarl.io/stage": "rl"}, "annotations": {"quarl.io/run-id": "qerl-20261125"}}
    base.update(kw)
    return tj.render_trainjob(**base)


def test_rendered_trainjob_is_valid_for_the_trainer_crd():
    body = job()
    validate(body, "TrainJob")
    t = body["spec"]["trainer"]
    assert body["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                          "name": "quarl-torch-distributed"}
    assert (t["numNodes"], t["numProcPerNode"]) == (2, 8)
    assert t["resourcesPerNode"]["limits"] == {"cpu": "32", "memory": "512Gi", "nvidia.com/gpu": "8"}
    assert t["resourcesPerNode"]["requests"] == t["resourcesPerNode"]["limits"]
    # sh writes the config from the environment, then becomes torchrun; the stage's CLI args follow
    assert t["command"][:2] == ["sh", "-c"] and "exec torchrun -m quarl.cli.main" in t["command"][2]
    assert t["command"][3] == tj.CONFIG_PATH and t["args"][0] == "rl"
    env = {e["name"]: e for e in t["env"]}
    assert env[tj.CONFIG_ENV]["value"] == "algo: {algo: grpo}\n"
    # credentials by reference only; torchrun's PET_* are the Trainer's to set (it rejects a job that sets them)
    for k in tj.S3_KEYS:
        assert env[k]["valueFrom"]["secretKeyRef"] == {"name": "quarl-s3", "key": k,
                                                        **({"optional": True} if k in tj.S3_OPTIONAL else {})}
    assert not set(env) & set(tj.RESERVED_ENV)
    assert body["spec"]["activeDeadlineSeconds"] == 172800
    validate(job(timeout_s=0, num_nodes=1, gpus_per_node=1, annotations=None), "TrainJob")


def test_the_schema_check_can_fail():
    """Mistakes the API server would reject are caught by the same validation (so the test above means something)."""
    for path, value in ((("trainer", "numProcPerNode"), "auto"),  # an int in Trainer v2.3, not "auto"
                        (("trainer", "gpus"), 8),  # no such field
                        (("runtimeRef",), {"kind": "ClusterTrainingRuntime"}),  # name is required
                        (("trainer", "env"), [{"value": "x"}])):  # an env var needs a name
        body = job()
        node = body["spec"]
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validate(body, "TrainJob")


@pytest.mark.parametrize("kw,words", [
    ({"num_nodes": 0}, "num_nodes must be an integer >= 1, got 0"),
    ({"gpus_per_node": 0}, "gpus_per_node must be an integer >= 1"),
    ({"num_nodes": 1.5}, "num_nodes must be an integer"),
    ({"name": "Quarl_RL"}, "must be a DNS-1035 label"),
    ({"name": "q" * 41}, "at most 40 characters"),
    ({"env": {"PET_NNODES": "2"}}, "which the TrainJob sets itself"),
    ({"namespace": ""}, "namespace is empty"),
])
def test_render_rejects_bad_values_naming_them(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        job(**kw)


def test_job_names_are_stable_per_run_step_and_config():
    a = tj.trainjob_name("rl", "run-1", "fp")
    assert a == tj.trainjob_name("rl", "run-1", "fp")  # a retried launcher finds its job again
    assert len({a, tj.trainjob_name("rl", "run-2", "fp"), tj.trainjob_name("rl", "run-1", "fp2"),
                tj.trainjob_name("kd_coldstart", "run-1", "fp")}) == 4
    for step in ("rl", "kd_coldstart", "A Very_Long step name that goes on and on", "___"):
        name = tj.trainjob_name(step, "r", "f")
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= tj.NAME_MAX, name


@pytest.mark.parametrize("stage", sorted(n for n in STAGES if STAGES[n].distributed))
def test_trainjob_args_are_the_stage_cli(stage):
    """What the nodes run parses as `quarl <stage>`: every input's option exists in the stage's command."""
    import typer.main

    from quarl.cli.main import app

    spec = get_stage(stage)
    args = tj.stage_cli_args(spec, {i.name: f"s3://b/{i.name}" for i in spec.inputs}, "s3://b/out")
    group = typer.main.get_command(app)
    cmd = group.get_command(None, args[0])
    assert cmd is not None, f"no `quarl {args[0]}` command"
    ctx = cmd.make_context(args[0], list(args[1:]))
    assert ctx.params["config"] == tj.CONFIG_PATH and ctx.params["output"] == "s3://b/out"
    for i in spec.inputs:
        assert ctx.params[i.name] == f"s3://b/{i.name}"
    assert stage in {"rl", "distill", "kd_coldstart"}  # the stages spec.py declares distributed=True


def test_runtime_manifest_is_a_valid_torch_runtime_in_quarls_image():
    from quarl_components.images import IMAGES

    (rt,) = [d for d in yaml.safe_load_all((ROOT / "manifests" / "quarl-torch-distributed.yaml").read_text()) if d]
    validate(rt, "ClusterTrainingRuntime")
    assert rt["metadata"]["name"] == tj.RUNTIME and rt["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert "torch" in rt["spec"]["mlPolicy"]
    (rjob,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == tj.NODE
    assert rjob["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    pod = rjob["template"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["name"] == tj.NODE and c["image"] == f"{IMAGES['cuda'].repository}:{IMAGES['cuda'].tag}"
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/dev/shm", "/scratch"}
    broken = json.loads(json.dumps(rt))
    broken["spec"]["mlPolicy"]["torch"] = {"numProcPerNode": "auto"}  # v2.0's field, gone in v2.3
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "ClusterTrainingRuntime")


def test_launcher_rbac_allows_what_the_client_calls():
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "manifests" / "trainjob-launcher-rbac.yaml").read_text())
            if d}
    rules = {(g, r): set(rule["verbs"]) for rule in docs["Role"]["rules"] for g in rule["apiGroups"]
             for r in rule["resources"]}
    assert rules[(tj.GROUP, tj.PLURAL)] >= {"create", "get", "delete"}  # KubeClient.create/get/delete
    assert rules[("", "pods")] >= {"list"} and rules[("", "pods/log")] >= {"get"}  # pods(), logs()
    assert docs["RoleBinding"]["roleRef"]["name"] == docs["Role"]["metadata"]["name"]


# ---------------------------------------------------------------- the wait / log / failure loop


class FakeCluster:
    """The Trainer controller, scripted: each poll of ``get`` moves the job one state along ``script``.

    ``script`` items: "Running", "Complete", ("Failed", reason, message), "Gone". ``logs`` are the
    rank-0 pod's lines (timestamped as the API returns them with timestamps=true) revealed per poll.
    """

    namespace = "quarl"

    def __init__(self, script, logs=(), existing=None, on_create=None, failed_pod_logs=()):
        self.script, self.logs_by_poll, self.existing = list(script), list(logs), existing
        self.on_create, self.failed_pod_logs = on_create, list(failed_pod_logs)
        self.calls: list[tuple] = []
        self.job: dict | None = existing
        self.polls, self.shown = 0, []

    def create(self, body):
        self.calls.append(("create", body["metadata"]["name"]))
        if self.job is not None:
            raise FileExistsError(body["metadata"]["name"])
        self.job = json.loads(json.dumps(body))
        if self.on_create:
            self.on_create(body)

    def get(self, name):
        self.calls.append(("get", name))
        first = sum(1 for x in self.calls if x[0] == "get") == 1  # the launcher's look for an earlier attempt
        if self.job is None or self.job["metadata"]["name"] != name:
            return None
        if first or not self.script:
            return self.job
        state = self.script.pop(0)
        self.polls += 1
        self.shown = self.logs_by_poll[: self.polls]
        if state == "Gone":
            self.job = None
            return None
        conds = []
        if state == "Complete":
            conds = [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "done"}]
        elif isinstance(state, tuple):
            conds = [{"type": "Failed", "status": "True", "reason": state[1], "message": state[2]}]
        self.job["status"] = {"conditions": conds}
        return self.job

    def delete(self, name):
        self.calls.append(("delete", name))
        self.job = None

    def pods(self, name):
        failed = [{"name": f"{name}-node-1-0-xyz", "phase": "Failed", "rjob": "node", "index": "1", "reason": ""}]
        return [{"name": f"{name}-node-0-0-abc", "phase": "Running", "rjob": "node", "index": "0", "reason": ""},
                *(failed if self.failed_pod_logs else [])]

    def logs(self, pod, *, since_s=None, tail=None):
        if "-node-1-" in pod:
            return list(self.failed_pod_logs)
        lines = [ln for chunk in self.shown for ln in chunk]
        return lines[-tail:] if tail else lines  # a window re-reads old lines: the follower must drop them


def run(cluster, body=None, **kw):
    printed = []
    kw = {"timeout_s": 0, "poll_s": 0.0, "out": printed.append, "sleep": lambda s: None, **kw}
    result = tj.run_trainjob(cluster, body or job(), **kw)
    return result, printed


def test_complete_job_streams_rank0_logs_once_and_is_deleted():
    c = FakeCluster(["Running", "Running", "Complete"], logs=[
        ["2026-11-25T10:00:00.1Z step 1", "2026-11-25T10:00:00.12Z step 2"],
        ["2026-11-25T10:00:01Z step 3"],
        ["2026-11-25T10:00:01Z step 3b", "2026-11-25T10:00:02.000000001Z done"],
    ])
    result, printed = run(c)
    assert tj.job_state(result)[0] == "Complete"
    lines = [p for p in printed if not p.startswith("[quarl]")]
    assert lines == ["step 1", "step 2", "step 3", "step 3b", "done"]  # in order, each once
    assert [x[0] for x in c.calls if x[0] != "get"] == ["create", "delete"]
    assert any("created TrainJob quarl/quarl-rl-" in p and "2 node(s) x 8 GPU(s)" in p for p in printed)


def test_failed_job_raises_naming_the_job_the_condition_and_the_failing_pod():
    c = FakeCluster(["Running", ("Failed", "FailedJobs", "jobset failed: node-1 exited with code 1")],
                    logs=[["2026-11-25T10:00:00Z rank 0 says hi"]],
                    failed_pod_logs=["2026-11-25T10:00:03Z Traceback (most recent call last):",
                                     "2026-11-25T10:00:03Z torch.OutOfMemoryError: CUDA out of memory"])
    body = job()
    with pytest.raises(tj.TrainJobFailedError) as e:
        run(c, body)
    msg = str(e.value)
    assert f"TrainJob quarl/{body['metadata']['name']} failed: FailedJobs: jobset failed: node-1 exited" in msg
    assert "node-1-0-xyz" in msg and "CUDA out of memory" in msg
    assert c.calls[-1] == ("delete", body["metadata"]["name"])


def test_keep_job_keeps_it_and_a_timeout_deletes_it():
    c = FakeCluster(["Running", "Complete"])
    run(c, keep_job=True)
    assert not [x for x in c.calls if x[0] == "delete"]
    ticks = iter(range(0, 10_000, 100))
    c = FakeCluster(["Running"] * 50)
    with pytest.raises(tj.TrainJobTimeoutError, match=r"did not finish within 250 s .*node-0-0-abc=Running"):
        run(c, timeout_s=250, clock=lambda: next(ticks))
    assert c.calls[-1][0] == "delete"


def test_a_retried_launcher_attaches_to_its_running_job_and_replaces_a_failed_one():
    body = job()
    running = dict(json.loads(json.dumps(body)), status={"conditions": []})
    c = FakeCluster(["Running", "Complete"], existing=running)
    run(c, body)
    assert ("create", body["metadata"]["name"]) not in c.calls  # attached, no second job
    failed = dict(json.loads(json.dumps(body)),
                  status={"conditions": [{"type": "Failed", "status": "True", "reason": "X", "message": "boom"}]})
    c = FakeCluster(["Complete"], existing=failed)  # the previous attempt's job, failed
    _, printed = run(c, body)
    ops = [x[0] for x in c.calls if x[0] != "get"]
    assert ops == ["delete", "create", "delete"] and any("an earlier attempt failed (X: boom)" in p for p in printed)


def test_a_job_deleted_under_the_launcher_fails_clearly():
    with pytest.raises(tj.TrainJobError, match="disappeared while the step waited"):
        run(FakeCluster(["Running", "Gone"]))


# ---------------------------------------------------------------- the launcher component, end to end


@pytest.fixture
def echo_distributed(monkeypatch):
    from quarl.pipeline import stages

    monkeypatch.setitem(stages.STAGES, "echo", dataclasses.replace(fake_stage.SPEC, distributed=True))


def launcher_args(root, tmp_path, **kw):
    out = {"out": dsl.Artifact(uri=str(tmp_path / "kfp" / "out")), "metrics": dsl.Metrics(uri=str(tmp_path / "kfp" / "m")),
           "report": dsl.Markdown(uri=str(tmp_path / "kfp" / "report"))}
    base = {"s3_root": str(root), "run_id": "r1", "kfp_run_id": "", "step": "echo", "message": "hi", "size": 4,
            "limit": 0, "config_yaml": "", "overrides": [], "source": None, "num_nodes": 2, "gpus_per_node": 4,
            "image": "img:1", "cpu": "4", "memory": "16Gi", "gpu_resource": "nvidia.com/gpu",
            "runtime": tj.RUNTIME, "s3_secret": "quarl-s3", "timeout_s": 3600, "keep_job": False}
    return {**base, **out, **kw}


def rank0(body):
    """What the nodes would do: rank 0 runs the stage from the TrainJob's own config and arguments."""
    t = body["spec"]["trainer"]
    cfg_text = next(e["value"] for e in t["env"] if e["name"] == tj.CONFIG_ENV)
    args = t["args"]
    out = args[args.index("--output") + 1]
    cfg = fake_stage.EchoConfig(**{k: v for k, v in yaml.safe_load(cfg_text).items() if k != "inner"},
                                inner=fake_stage.Inner(**yaml.safe_load(cfg_text)["inner"]))
    with write_artifact(out, "report", "echo", config=cfg) as art:
        (art.path / "echo.md").write_text(f"# {cfg.message} from {t['numNodes']}x{t['numProcPerNode']}\n")
        (art.path / "summary.json").write_text(json.dumps({"chars": cfg.inner.size, "nested": {"score": 0.9}}))


def test_launcher_step_runs_the_stage_as_a_trainjob_and_reports_its_result(echo_distributed, tmp_path):
    c = FakeCluster(["Running", "Complete"], on_create=rank0)
    a = launcher_args(tmp_path / "s3", tmp_path)
    rec = tj.launch_component("echo", cluster=c, poll_s=0, **a)
    uri = str(tmp_path / "s3" / "r1" / "echo" / "out")
    assert rec["status"] == "succeeded" and rec["result"]["chars"] == 4 and rec["result"]["output_uri"] == uri
    assert rec["trainjob"] == {"name": tj.trainjob_name("echo", "r1", rec["fingerprint"]), "namespace": "quarl",
                               "num_nodes": 2, "gpus_per_node": 4}
    # the KFP outputs are filled as for a one-GPU step: pointer, metrics, the artifact's report
    assert a["out"].metadata["quarl_uri"] == uri and a["metrics"].metadata["nested.score"] == 0.9
    assert (tmp_path / "kfp" / "report").read_text() == "# hi from 2x4\n"
    assert read_step_record(str(tmp_path / "s3"), "r1", "echo")["trainjob"]["num_nodes"] == 2
    assert fake_stage.CALLS == [] or all(x["output_uri"] != uri for x in fake_stage.CALLS)  # not run in this pod


def test_a_failing_trainjob_fails_the_step_with_its_message(echo_distributed, tmp_path, capsys):
    c = FakeCluster([("Failed", "FailedJobs", "jobset failed: job node-0 has failed")],
                    failed_pod_logs=["2026-11-25T10:00:00Z RuntimeError: NCCL timeout"])
    with pytest.raises(tj.TrainJobFailedError, match="FailedJobs: jobset failed: job node-0 has failed"):
        tj.launch_component("echo", cluster=c, poll_s=0, **launcher_args(tmp_path / "s3", tmp_path))
    marker = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(FAILURE_MARKER))
    err = json.loads(marker[len(FAILURE_MARKER):])
    assert err["step"] == "echo" and "TrainJobFailedError: TrainJob quarl/quarl-echo-" in err["error"]
    assert "NCCL timeout" in err["error"]
    rec = read_step_record(str(tmp_path / "s3"), "r1", "echo")
    assert rec["status"] == "failed" and "jobset failed" in rec["error"]


def test_a_trainjob_that_completes_without_an_artifact_fails_the_step(echo_distributed, tmp_path):
    from quarl.pipeline.runtime import StepError

    with pytest.raises(StepError, match="completed but .* holds no complete artifact: rank 0"):
        tj.launch_component("echo", cluster=FakeCluster(["Complete"]), poll_s=0,
                            **launcher_args(tmp_path / "s3", tmp_path))


def test_launcher_refuses_bad_sizes_before_creating_anything(echo_distributed, tmp_path):
    c = FakeCluster(["Complete"])
    with pytest.raises(ValueError, match="num_nodes must be an integer >= 1, got 0"):
        tj.launch_component("echo", cluster=c, poll_s=0, **launcher_args(tmp_path / "s3", tmp_path, num_nodes=0))
    assert not [x for x in c.calls if x[0] == "create"]


# ---------------------------------------------------------------- the pipelines: one GPU unchanged, several GPUs


def test_one_gpu_pipelines_run_each_step_in_its_own_pod():
    """The committed compiled YAML (kept current by test_compile) has no launcher and no size parameters."""
    from quarl_pipelines import COMPILED_DIR, PIPELINES

    from quarl.pipeline.recipes import load_recipe

    for path in sorted(COMPILED_DIR.glob("*.yaml")):
        text = path.read_text()
        assert "trainjob" not in text and "_num_nodes" not in text and "_gpus_per_node" not in text, path
        r = load_recipe(path.stem)
        assert PIPELINES[r.pipeline].trainjob_steps(r) == []
    qerl = [d for d in yaml.safe_load_all((COMPILED_DIR / "qerl.yaml").read_text()) if d]
    rl = qerl[0]["deploymentSpec"]["executors"]["exec-rl"]["container"]
    assert rl["resources"]["accelerator"]["count"] == "1" and "quarl-cuda" in rl["image"]


def test_launcher_components_default_to_one_node_of_one_gpu():
    from kfp import components
    from quarl_components import LAUNCHERS

    from quarl.pipeline.compile import components_dir

    assert sorted(LAUNCHERS) == sorted(n for n in STAGES if STAGES[n].distributed) == ["distill", "kd_coldstart", "rl"]
    for stage in LAUNCHERS:
        comp = components.load_component_from_file(str(components_dir() / stage / "launcher.yaml"))
        params = comp.component_spec.inputs
        assert (params["num_nodes"].default, params["gpus_per_node"].default) == (1, 1), stage
        assert params["runtime"].default == tj.RUNTIME and params["s3_secret"].default == "quarl-s3"


def test_several_gpus_run_the_step_as_a_trainjob_with_sizes_on_the_run_form(tmp_path):
    from quarl_components.images import IMAGES
    from quarl_pipelines import PIPELINES

    from quarl.pipeline.compile import compile_one
    from quarl.pipeline.recipes import load_recipe

    r = load_recipe("qerl", overrides=["resources.rl.num_nodes=2", "resources.rl.accelerators=8"])
    params = {n: (t, d) for n, t, d in PIPELINES["qerl"].parameters(r)}
    assert params["rl_num_nodes"] == (int, 2) and params["rl_gpus_per_node"] == (int, 8)
    assert "eval_num_nodes" not in params and "calibrate_gpus_per_node" not in params
    doc = next(d for d in yaml.safe_load_all(compile_one(r, tmp_path).read_text()) if d)
    task = doc["root"]["dag"]["tasks"]["rl-trainjob"]["inputs"]["parameters"]
    assert task["num_nodes"] == {"componentInputParameter": "rl_num_nodes"}
    assert task["gpus_per_node"] == {"componentInputParameter": "rl_gpus_per_node"}
    assert task["image"]["runtimeValue"]["constant"] == IMAGES["cuda"].ref  # the nodes run the stage's image
    assert task["memory"]["runtimeValue"]["constant"] == "128Gi"  # qerl's rl resources, per node
    launcher = doc["deploymentSpec"]["executors"]["exec-rl-trainjob"]["container"]
    assert "accelerator" not in launcher["resources"] and launcher["image"] == IMAGES["cpu"].ref
    assert doc["root"]["inputDefinitions"]["parameters"]["rl_num_nodes"]["defaultValue"] == 2
    # downstream steps read the launcher's outputs, as they read rl's
    assert doc["root"]["dag"]["tasks"]["eval"]["inputs"]["artifacts"]["adapter"]["taskOutputArtifact"] == {
        "outputArtifactKey": "adapter", "producerTask": "rl-trainjob"}


@pytest.mark.parametrize("bad,words", [
    ("resources.rl.num_nodes=0", "num_nodes must be an integer >= 1 (nodes of the step's TrainJob"),
    ("resources.rl.num_nodes=two", "num_nodes must be an integer >= 1"),
    ("resources.rl.accelerators=-1", "accelerators must be an integer >= 0"),
    ("resources.eval.num_nodes=2", "stage eval runs in one pod; only rl, distill, kd_coldstart run on several nodes"),
])
def test_bad_sizes_are_rejected_at_compile_and_submit(bad, words, tmp_path):
    from typer.testing import CliRunner

    from quarl.cli.main import app

    res = CliRunner().invoke(app, ["compile", "qerl", "--set", bad, "--out", str(tmp_path)])
    assert res.exit_code == 1 and words in res.output, res.output
    assert not list(tmp_path.glob("*.yaml"))
    res = CliRunner().invoke(app, ["submit", "qerl", "--host", "http://127.0.0.1:9", "--set", bad])
    assert res.exit_code == 1 and words in res.output and "healthz" not in res.output, res.output


def test_quarl_run_refuses_a_step_on_several_gpus():
    from quarl_pipelines import PIPELINES

    from quarl.pipeline.recipes import RecipeError, load_recipe

    r = load_recipe("qerl", profile="local", overrides=["resources.rl.accelerators=2"])
    with pytest.raises(RecipeError, match=r"step rl asks for 1 node\(s\) x 2 GPU\(s\) .*quarl run runs every step"):
        PIPELINES["qerl"].build(r, retries=False, trainjobs=False)


def test_kube_client_maps_api_errors_to_what_the_loop_expects():
    """409 -> FileExistsError (attach), 404 -> None / nothing to delete, 403 -> an error naming the RBAC manifest."""
    from kubernetes.client.exceptions import ApiException

    from quarl.pipeline.kube import KubeClient

    class Api:
        def __init__(self, status):
            self.status = status

        def _raise(self, *a, **k):
            raise ApiException(status=self.status, reason="Nope")

        create_namespaced_custom_object = get_namespaced_custom_object = delete_namespaced_custom_object = _raise

    def client(status):
        c = KubeClient.__new__(KubeClient)  # no cluster config: the API objects are stand-ins
        c.namespace, c._custom, c._core = "quarl", Api(status), None
        return c

    with pytest.raises(FileExistsError):
        client(409).create(job())
    assert client(404).get("x") is None
    client(404).delete("x")  # already gone: fine
    with pytest.raises(tj.TrainJobError, match="403 Nope.*trainjob-launcher-rbac.yaml"):
        client(403).create(job())
    with pytest.raises(tj.TrainJobError, match="Kubeflow Trainer v2 installed"):
        client(404).create(job())
