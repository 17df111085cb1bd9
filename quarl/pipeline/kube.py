"""The Kubernetes API calls a TrainJob launcher makes, behind one small interface (:class:`Cluster`).

:func:`quarl.pipeline.trainjob.run_trainjob` needs five calls: create, get and delete a TrainJob,
list its pods, read a pod's log. :class:`KubeClient` makes them with the ``kubernetes`` Python client
(in-cluster credentials in a pod, else the kube config) and turns API errors into what the loop
expects (409 -> ``FileExistsError``: attach to the existing job; 404 -> ``None``) or into a
:class:`~quarl.pipeline.trainjob.TrainJobError` that says what to fix (403: the RBAC manifest; 404 on
create: Trainer not installed). tests/pipeline/test_trainjob.py drives the loop with a fake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from quarl.pipeline.trainjob import GROUP, INDEX_LABEL, JOBSET_LABEL, NODE, PLURAL, RJOB_LABEL, VERSION, TrainJobError

__all__ = ["Cluster", "KubeClient"]


class Cluster(Protocol):
    """What the launcher needs from Kubernetes (:class:`KubeClient`; tests use a fake)."""

    namespace: str

    def create(self, body: dict) -> None: ...  # raises FileExistsError when the name is taken
    def get(self, name: str) -> dict | None: ...  # None when absent
    def delete(self, name: str) -> None: ...
    def pods(self, name: str) -> list[dict]: ...  # {"name", "phase", "rjob", "index", "reason"}
    def logs(self, pod: str, *, since_s: int | None = None, tail: int | None = None) -> list[str]: ...


def _own_namespace() -> str:
    p = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return p.read_text().strip() if p.is_file() else ""


class KubeClient:
    """:class:`Cluster` on the ``kubernetes`` client: in-cluster credentials in a pod, else the kube config.

    ``namespace`` empty = the pod's own namespace (a Kubeflow run's namespace, where the ``quarl-s3``
    secret is), else the kube config context's, else ``default``.
    """

    def __init__(self, namespace: str = ""):
        from kubernetes import client, config

        try:
            config.load_incluster_config()
            ns = _own_namespace()
        except config.ConfigException:
            config.load_kube_config()
            ns = (config.list_kube_config_contexts()[1] or {}).get("context", {}).get("namespace", "")
        self.namespace = namespace or ns or "default"
        api = client.ApiClient()
        self._custom, self._core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    @staticmethod
    def _status(e: Exception) -> int | None:
        return getattr(e, "status", None)

    def create(self, body: dict) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        except ApiException as e:
            if e.status == 409:
                raise FileExistsError(body["metadata"]["name"]) from None
            raise TrainJobError(f"cannot create TrainJob {self.namespace}/{body['metadata']['name']}: "
                                f"{_api_message(e)}{_hint(e.status)}") from None

    def get(self, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise TrainJobError(f"cannot read TrainJob {self.namespace}/{name}: {_api_message(e)}"
                                f"{_hint(e.status)}") from None

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                         propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise TrainJobError(f"cannot delete TrainJob {self.namespace}/{name}: {_api_message(e)}"
                                    f"{_hint(e.status)}") from None

    def pods(self, name: str) -> list[dict]:
        out = []
        for p in self._core.list_namespaced_pod(self.namespace, label_selector=f"{JOBSET_LABEL}={name}").items:
            labels = p.metadata.labels or {}
            out.append({"name": p.metadata.name, "phase": p.status.phase, "rjob": labels.get(RJOB_LABEL, ""),
                        "index": labels.get(INDEX_LABEL, ""), "reason": p.status.reason or ""})
        return out

    def logs(self, pod: str, *, since_s: int | None = None, tail: int | None = None) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        kw: dict[str, Any] = {"container": NODE, "timestamps": True}
        if since_s:
            kw["since_seconds"] = since_s
        if tail:
            kw["tail_lines"] = tail
        try:
            return self._core.read_namespaced_pod_log(pod, self.namespace, **kw).splitlines()
        except ApiException as e:
            if e.status in (400, 404):  # container not started yet / pod gone
                return []
            raise


def _api_message(e: Exception) -> str:
    """``<status> <reason>[: <the API server's message>]`` of an ApiException."""
    head = f"{getattr(e, 'status', '?')} {getattr(e, 'reason', '')}".strip()
    try:
        msg = json.loads(getattr(e, "body", "") or "{}").get("message", "")
    except (ValueError, AttributeError):
        msg = ""
    return f"{head}: {msg}" if msg else head


def _hint(status: int | None) -> str:
    if status == 403:
        return ("; the launcher's service account may not manage TrainJobs: apply "
                "manifests/trainjob-launcher-rbac.yaml in this namespace")
    if status == 404:
        return ("; is Kubeflow Trainer v2 installed (CRD trainjobs.trainer.kubeflow.org)? see manifests/README.md")
    return ""
