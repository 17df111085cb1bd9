"""A pipeline step on several GPUs: the stage runs as a Kubeflow Trainer v2 ``TrainJob``, the step's pod waits.

A stage that declares ``distributed=True`` in its ``spec.py`` (rl, distill, kd_coldstart) runs
under ``torchrun`` with any number of processes (docs/distributed.md). On Kubernetes that world is
a ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) on quarl's ``ClusterTrainingRuntime``
``quarl-torch-distributed`` (manifests/quarl-torch-distributed.yaml, a copy of Trainer's
``torch-distributed`` runtime with quarl's image, /dev/shm, /scratch and GPU toleration). The
Trainer controller makes one pod per node and injects torchrun's ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``, so each node
runs the stage's own command line::

    torchrun -m quarl.cli.main rl --config <resolved config> --model s3://... --data s3://... --output s3://...

Rank 0 writes the artifact, exactly where the one-GPU step would have written it. The KFP step
that asked for it is a *launcher* (``components/<stage>/launcher.py``, generated like every
component): a small CPU pod that resolves the config and inputs as any step does
(:mod:`quarl.pipeline.runtime`: step record, reuse, failure marker), then

1. renders the TrainJob (:func:`render_trainjob`) -- validated in tests against the Trainer v2.3.0
   CRD schema vendored in manifests/vendor/ -- and creates it, or re-attaches to the one a previous
   attempt of the same step created (the name is a hash of run id, step and config fingerprint, so a
   KFP retry of the launcher never starts a second job; a failed one is replaced, and the stage
   resumes from its checkpoints);
2. waits for its ``Complete`` or ``Failed`` condition (the Trainer copies them from the JobSet), up
   to the step's timeout, printing rank 0's log lines as they come (:class:`LogFollower`);
3. on ``Failed`` raises :class:`TrainJobFailedError` naming the job, the condition's reason and
   message, and the last lines of every failed pod, so the KFP step fails with that message;
4. reads the artifact's ``summary.json`` as the step result, and deletes the TrainJob unless
   ``keep_job`` (it is deleted too when the launcher times out or its run is cancelled, so no GPU
   stays held by an orphan).

Everything that talks to the cluster goes through :class:`quarl.pipeline.kube.KubeClient` (the
``kubernetes`` Python client); tests drive the same loop with a fake one. The launcher's service account needs the Role
in manifests/trainjob-launcher-rbac.yaml.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quarl.pipeline.kube import Cluster

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "RUNTIME",
    "S3_KEYS",
    "S3_SECRET",
    "VERSION",
    "LogFollower",
    "TrainJobError",
    "TrainJobFailedError",
    "TrainJobTimeoutError",
    "job_state",
    "launch_component",
    "render_trainjob",
    "run_trainjob",
    "stage_cli_args",
    "trainjob_name",
]

log = logging.getLogger("quarl.pipeline.trainjob")

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
RUNTIME = "quarl-torch-distributed"  # the ClusterTrainingRuntime in manifests/quarl-torch-distributed.yaml
NODE = "node"  # Trainer's name for the trainer ReplicatedJob and its container
CONFIG_ENV = "QUARL_STAGE_CONFIG"  # the resolved stage config (YAML), written to CONFIG_PATH on each node
CONFIG_PATH = "/tmp/quarl-stage-config.yaml"
# Labels the JobSet controller and the Job controller put on every pod of a TrainJob.
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# torchrun's variables: the Trainer's torch plugin sets them and rejects a TrainJob that does.
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# The namespace secret with S3 access (manifests/s3-secret.template.yaml); every quarl pod reads its keys.
S3_SECRET = "quarl-s3"
# S3 keys of the quarl-s3 secret; the two last are absent for AWS S3 proper (no endpoint) or IRSA setups.
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")
S3_OPTIONAL = ("AWS_ENDPOINT_URL", "AWS_REGION")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The launcher waits this long past the TrainJob's own deadline (its pods may first wait for free GPUs).
WAIT_MARGIN_S = 1800
# JobSet names pods <jobset>-node-<job index>-<pod index>; a hostname is at most 63 characters.
NAME_MAX = 40


class TrainJobError(RuntimeError):
    """The TrainJob could not be run or watched; the message names it and says why."""


class TrainJobFailedError(TrainJobError):
    """The TrainJob reached its ``Failed`` condition."""


class TrainJobTimeoutError(TrainJobError):
    """The TrainJob did not finish within the step's timeout."""


# ---------------------------------------------------------------- the TrainJob object


def trainjob_name(step: str, run_id: str, fingerprint: str = "") -> str:
    """``quarl-<step>-<hash>``: one name per (run, step, config), so a retried launcher finds its job again."""
    slug = re.sub(r"[^a-z0-9-]+", "-", step.lower()).strip("-")[:23].strip("-") or "step"
    digest = hashlib.sha256(f"{run_id}\0{step}\0{fingerprint}".encode()).hexdigest()[:10]
    return f"quarl-{slug}-{digest}"


def stage_cli_args(spec: Any, inputs: dict[str, str], output_uri: str) -> list[str]:
    """``quarl <stage>``'s arguments for resolved input URIs: ``rl --config <path> --model <uri> ... --output <uri>``.

    Each input's option is its component input name (``init_adapter`` -> ``--init-adapter``), the
    name the stage's CLI command uses (tests/pipeline/test_trainjob.py checks every distributed stage).
    """
    args = [spec.name.replace("_", "-"), "--config", CONFIG_PATH]
    for i in spec.inputs:
        if inputs.get(i.name):
            args += [f"--{i.name.replace('_', '-')}", inputs[i.name]]
    return [*args, "--output", output_uri]


def render_trainjob(*, name: str, namespace: str, stage_args: list[str], config_yaml: str, image: str,
                    num_nodes: int, gpus_per_node: int, cpu: str = "8", memory: str = "64Gi",
                    gpu_resource: str = "nvidia.com/gpu", s3_secret: str = S3_SECRET, runtime: str = RUNTIME,
                    timeout_s: int = 0, labels: dict[str, str] | None = None,
                    annotations: dict[str, str] | None = None, env: dict[str, str] | None = None) -> dict:
    """The TrainJob (a dict, as the Kubernetes API takes it) running ``torchrun -m quarl.cli.main <stage_args>``.

    ``num_nodes`` pods of ``gpus_per_node`` GPUs (``cpu``/``memory`` each, requests = limits), one
    torchrun process per GPU; the stage config travels in an environment variable and is written to
    ``CONFIG_PATH`` on each node before torchrun starts; S3 credentials come from the keys of secret
    ``s3_secret`` (never values in the object); ``timeout_s`` becomes ``activeDeadlineSeconds``.
    """
    problems = []
    if not (_DNS1035.match(name or "") and len(name) <= NAME_MAX):
        problems.append(f"name {name!r} must be a DNS-1035 label of at most {NAME_MAX} characters "
                        "(lowercase letters, digits, '-'; starting with a letter)")
    for what, v in (("num_nodes", num_nodes), ("gpus_per_node", gpus_per_node)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            problems.append(f"{what} must be an integer >= 1, got {v!r}")
    if not namespace:
        problems.append("namespace is empty")
    if not image:
        problems.append("image is empty")
    if not stage_args:
        problems.append("stage_args is empty (expected e.g. ['rl', '--config', ...])")
    if timeout_s < 0:
        problems.append(f"timeout_s must be >= 0 (0 = no deadline), got {timeout_s}")
    bad_env = sorted(set(env or {}) & {*RESERVED_ENV, CONFIG_ENV, *S3_KEYS})
    if bad_env:
        problems.append(f"env sets {bad_env}, which the TrainJob sets itself (torchrun's PET_* come from the Trainer)")
    if problems:
        raise ValueError("cannot render TrainJob: " + "; ".join(problems))

    per_node = {"cpu": str(cpu), "memory": str(memory), gpu_resource: str(gpus_per_node)}
    envs = [{"name": CONFIG_ENV, "value": config_yaml}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    envs += [{"name": k, "value": str(v)} for k, v in sorted((env or {}).items())]
    envs += [{"name": k, "valueFrom": {"secretKeyRef": {"name": s3_secret, "key": k,
                                                         **({"optional": True} if k in S3_OPTIONAL else {})}}}
             for k in S3_KEYS]
    # sh writes the config, then becomes torchrun; "$@" are the trainer args (the stage's CLI arguments).
    script = f'printf "%s" "${CONFIG_ENV}" > "$0" && exec torchrun -m quarl.cli.main "$@"'
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": runtime},
        "trainer": {
            "image": image,
            "command": ["sh", "-c", script, CONFIG_PATH],
            "args": list(stage_args),
            "env": envs,
            "numNodes": num_nodes,
            "numProcPerNode": gpus_per_node,
            "resourcesPerNode": {"requests": dict(per_node), "limits": dict(per_node)},
        },
    }
    if timeout_s:
        spec["activeDeadlineSeconds"] = int(timeout_s)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {"app.kubernetes.io/part-of": "quarl", **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}


def job_state(job: dict) -> tuple[str, dict]:
    """(``Complete`` | ``Failed`` | ``Suspended`` | ``Running``, the deciding condition or {})."""
    conds = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}
    for t in ("Failed", "Complete"):  # Failed first: a deadline can fail a job the JobSet still calls running
        if conds.get(t, {}).get("status") == "True":
            return t, conds[t]
    if conds.get("Suspended", {}).get("status") == "True":
        return "Suspended", conds["Suspended"]
    return "Running", {}


# ---------------------------------------------------------------- logs


def _ts_key(line: str) -> tuple[str, str]:
    """(sortable timestamp, text) of a ``kubectl logs --timestamps`` line (RFC 3339, fraction padded to 9 digits)."""
    ts, _, text = line.partition(" ")
    head, dot, frac = ts.rstrip("Z").partition(".")
    return (f"{head}.{frac.ljust(9, '0')}" if dot else f"{head}.000000000"), text


@dataclass
class LogFollower:
    """Prints new log lines of the TrainJob's rank-0 pod on every :meth:`poll` (pods restart: followed by name).

    Reads only a window (``since_s``) each time and drops lines already printed by their
    timestamp, so a 48-hour job costs no more per poll than a new one.
    """

    cluster: Cluster
    job: str
    out: Callable[[str], None] = print
    window_s: int = 60
    first_tail: int = 200  # attaching to a job that has been running: its last lines only
    _last: dict[str, tuple[str, set]] = field(default_factory=dict)  # pod -> (last ts, texts at that ts)

    def rank0(self, pods: list[dict]) -> list[dict]:
        return [p for p in pods if p["rjob"] == NODE and str(p["index"]) == "0" and p["phase"] != "Pending"]

    def poll(self, pods: list[dict] | None = None) -> None:
        for p in self.rank0(self.cluster.pods(self.job) if pods is None else pods):
            self._emit(p["name"], p["name"] not in self._last)

    def _emit(self, pod: str, first: bool) -> None:
        lines = self.cluster.logs(pod, tail=self.first_tail) if first else self.cluster.logs(pod, since_s=self.window_s)
        last, seen = self._last.get(pod, ("", set()))
        for line in lines:
            ts, text = _ts_key(line)
            if ts < last or (ts == last and text in seen):
                continue
            if ts > last:
                last, seen = ts, set()
            seen.add(text)
            self.out(text)
        self._last[pod] = (last, seen)

    def failure_tails(self, pods: Iterable[dict], lines: int = 30) -> dict[str, list[str]]:
        """The last ``lines`` lines of every failed pod (the failing rank is often not rank 0)."""
        return {p["name"]: [_ts_key(ln)[1] for ln in self.cluster.logs(p["name"], tail=lines)]
                for p in pods if p["phase"] == "Failed"}


# ---------------------------------------------------------------- create, wait, fail clearly


def run_trainjob(cluster: Cluster, body: dict, *, timeout_s: float, poll_s: float = 10.0, keep_job: bool = False,
                 out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> dict:
    """Create ``body`` (or re-attach to it), follow rank 0's logs, return the job once ``Complete``.

    Raises :class:`TrainJobFailedError` on ``Failed`` and :class:`TrainJobTimeoutError` after
    ``timeout_s`` (0 = no limit). The job is deleted once finished, failed or timed out unless
    ``keep_job``.
    """
    name = body["metadata"]["name"]
    where = f"{cluster.namespace}/{name}"
    prev = cluster.get(name)
    if prev is not None:
        state, cond = job_state(prev)
        if state == "Failed":
            out(f"[quarl] TrainJob {where}: an earlier attempt failed ({cond.get('reason')}: {cond.get('message')}); "
                "replacing it (the stage resumes from its checkpoints)")
            cluster.delete(name)
            _wait_gone(cluster, name, sleep, clock, timeout_s=300)
            prev = None
        else:
            out(f"[quarl] TrainJob {where} exists ({state}): attaching to it")
    if prev is None:
        try:
            cluster.create(body)
        except FileExistsError:
            out(f"[quarl] TrainJob {where} was created meanwhile: attaching to it")
        else:
            t = body["spec"]["trainer"]
            out(f"[quarl] created TrainJob {where}: {t['numNodes']} node(s) x {t['numProcPerNode']} GPU(s), "
                f"runtime {body['spec']['runtimeRef']['name']}, image {t['image']}")
    follower = LogFollower(cluster, name, out=out, window_s=max(60, int(3 * poll_s)))
    t0 = clock()
    try:
        while True:
            job = cluster.get(name)
            if job is None:
                raise TrainJobError(f"TrainJob {where} disappeared while the step waited for it (deleted by hand?)")
            pods = cluster.pods(name)
            follower.poll(pods)
            state, cond = job_state(job)
            if state == "Complete":
                out(f"[quarl] TrainJob {where} complete")
                return job
            if state == "Failed":
                raise _failed(where, cond, follower.failure_tails(pods))
            if timeout_s and clock() - t0 > timeout_s:
                phases = ", ".join(f"{p['name']}={p['phase']}" for p in pods) or "none scheduled"
                raise TrainJobTimeoutError(
                    f"TrainJob {where} did not finish within {timeout_s:.0f} s (state {state}; pods: {phases}); "
                    "it is deleted. Raise the step's timeout_s, or check that the cluster has the nodes and GPUs "
                    "it asks for")
            sleep(poll_s)
    finally:  # finished, failed, timed out, cancelled: no TrainJob outlives its step unless asked to
        if not keep_job:
            _delete_quietly(cluster, name, out)


def _failed(where: str, cond: dict, tails: dict[str, list[str]]) -> TrainJobFailedError:
    msg = f"TrainJob {where} failed: {cond.get('reason') or 'Failed'}: {cond.get('message') or '(no message)'}"
    for pod, lines in tails.items():
        msg += f"\n--- last lines of pod {pod} ---\n" + "\n".join(lines[-30:])
    return TrainJobFailedError(msg)


def _wait_gone(cluster: Cluster, name: str, sleep, clock, timeout_s: float) -> None:
    t0 = clock()
    while cluster.get(name) is not None:
        if clock() - t0 > timeout_s:
            raise TrainJobError(f"TrainJob {cluster.namespace}/{name} is still being deleted after {timeout_s:.0f} s")
        sleep(2.0)


def _delete_quietly(cluster: Cluster, name: str, out) -> None:
    try:
        cluster.delete(name)
        out(f"[quarl] deleted TrainJob {cluster.namespace}/{name}")
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the step's own error
        out(f"[quarl] could not delete TrainJob {cluster.namespace}/{name}: {e}")


# ---------------------------------------------------------------- the launcher component's body

# Arguments of a launcher component beyond its stage component's (see quarl.pipeline.codegen.launcher_args).
LAUNCH_PARAMS = ("num_nodes", "gpus_per_node", "image", "cpu", "memory", "gpu_resource", "runtime", "s3_secret",
                 "timeout_s", "keep_job")


def launch_component(stage: str, *, cluster: Cluster | None = None, poll_s: float = 10.0, **kwargs: Any) -> dict:
    """Run stage ``stage`` as a TrainJob from a launcher component's arguments; returns the step record.

    The step itself (config, inputs, step record, reuse, failure marker) is
    :func:`quarl.pipeline.runtime.run_component`'s; only the execution differs.
    """
    from quarl.pipeline.runtime import run_component

    launch = {k: kwargs.pop(k) for k in LAUNCH_PARAMS}

    def execute(spec, cfg, output_uri: str, inputs: dict[str, str], rec: dict) -> dict:
        import yaml

        from quarl.config import config_to_dict

        if not spec.distributed:
            raise TrainJobError(f"stage {spec.name} does not run under torchrun (its spec.py has no distributed=True)")
        from quarl.pipeline.kube import KubeClient

        c = cluster or KubeClient()
        name = trainjob_name(rec["step"], rec["run_id"], rec.get("fingerprint", ""))
        body = render_trainjob(
            name=name, namespace=c.namespace, stage_args=stage_cli_args(spec, inputs, output_uri),
            config_yaml=yaml.safe_dump(config_to_dict(cfg), sort_keys=False), image=launch["image"],
            num_nodes=launch["num_nodes"], gpus_per_node=launch["gpus_per_node"], cpu=launch["cpu"],
            memory=launch["memory"], gpu_resource=launch["gpu_resource"], s3_secret=launch["s3_secret"],
            runtime=launch["runtime"], timeout_s=launch["timeout_s"],
            labels={"quarl.io/stage": spec.name.replace("_", "-")},
            annotations={"quarl.io/step": rec["step"], "quarl.io/run-id": rec["run_id"], "quarl.io/output": output_uri})
        rec["trainjob"] = {"name": name, "namespace": c.namespace, "num_nodes": launch["num_nodes"],
                           "gpus_per_node": launch["gpus_per_node"]}
        with _cancel_as_exit():
            wait_s = launch["timeout_s"] + WAIT_MARGIN_S if launch["timeout_s"] else 0
            run_trainjob(c, body, timeout_s=wait_s, poll_s=poll_s, keep_job=launch["keep_job"])
        return _artifact_result(spec, output_uri, name, rec["trainjob"])

    return run_component(stage, executor=execute, **kwargs)


def _artifact_result(spec, output_uri: str, job: str, info: dict) -> dict:
    """The step result of a finished TrainJob: its artifact's summary.json (what run_<stage> returned)."""
    from quarl.pipeline.runtime import StepError, _manifest, _read_text
    from quarl.storage import join_uri

    m = _manifest(output_uri)
    if not (m and m.get("complete")):
        raise StepError(f"TrainJob {job} completed but {output_uri} holds no complete artifact: rank 0 of "
                        f"`quarl {spec.name.replace('_', '-')}` must write it (docs/distributed.md)")
    text = _read_text(join_uri(output_uri, "summary.json"))
    summary = json.loads(text) if text else {}
    return {"output_uri": output_uri, "kind": m.get("kind"), "complete": True, **summary, "trainjob": info}


class _cancel_as_exit:
    """SIGTERM (a cancelled or evicted launcher pod) raises SystemExit, so the TrainJob is deleted on the way out."""

    def __enter__(self):
        self._old = None
        try:
            self._old = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread (a test runner's worker): leave signals alone
            pass
        return self

    @staticmethod
    def _raise(signum, frame):
        raise SystemExit(f"launcher received signal {signum}")

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False
