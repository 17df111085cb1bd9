"""manifests/: valid YAML, and consistent with what the components and launcher expect."""

from pathlib import Path

import yaml
from quarl_components._base import S3_SECRET, S3_SECRET_KEYS

from quarl.pipeline.recipes import list_recipes
from quarl.pipeline.remote import load_recurring_spec

ROOT = Path(__file__).resolve().parents[2] / "manifests"


def docs():
    out = {}
    for p in sorted(ROOT.glob("*.yaml")):
        out[p.name] = [d for d in yaml.safe_load_all(p.read_text()) if d]
    return out


def test_all_manifests_parse_and_have_kinds():
    found = docs()
    assert set(found) >= {"kfp-launcher.yaml", "s3-secret.template.yaml", "nightly-recurring-run.yaml",
                          "seaweedfs-dev.yaml"}
    for name, ds in found.items():
        for d in ds:
            assert d.get("apiVersion") and d.get("kind") and d["metadata"]["name"], name


def test_secret_template_matches_the_components():
    (secret,) = docs()["s3-secret.template.yaml"]
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == S3_SECRET
    assert set(secret["stringData"]) == set(S3_SECRET_KEYS)
    assert "<secret access key>" in secret["stringData"]["AWS_SECRET_ACCESS_KEY"]  # a template, no real value


def test_launcher_config_points_the_pipeline_root_at_s3():
    (cm,) = docs()["kfp-launcher.yaml"]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "kfp-launcher"
    assert cm["data"]["defaultPipelineRoot"].startswith("s3://")
    providers = yaml.safe_load(cm["data"]["providers"])
    ref = providers["s3"]["default"]["credentials"]["secretRef"]
    assert ref["secretName"] == S3_SECRET and {ref["accessKeyKey"], ref["secretKeyKey"]} <= set(S3_SECRET_KEYS)


def test_seaweedfs_dev_deployment_and_service_agree():
    kinds = {d["kind"]: d for d in docs()["seaweedfs-dev.yaml"]}
    assert set(kinds) == {"PersistentVolumeClaim", "Deployment", "Service"}
    pod = kinds["Deployment"]["spec"]["template"]
    assert pod["metadata"]["labels"].items() >= kinds["Service"]["spec"]["selector"].items()
    c = pod["spec"]["containers"][0]
    assert "-s3" in c["args"] and any(p["containerPort"] == 8333 for p in c["ports"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["initContainers"][0]["envFrom"][0]["secretRef"]["name"] == S3_SECRET
    assert kinds["Service"]["spec"]["ports"][0]["port"] == 8333
    (cm,) = docs()["kfp-launcher.yaml"]
    svc = f"{kinds['Service']['metadata']['name']}.{kinds['Service']['metadata']['namespace']}.svc.cluster.local:8333"
    assert yaml.safe_load(cm["data"]["providers"])["s3"]["default"]["endpoint"] == svc


def test_nightly_recurring_run_names_a_recipe():
    spec = load_recurring_spec(ROOT / "nightly-recurring-run.yaml")
    assert spec["recipe"] in list_recipes() and len(spec["cron"].split()) == 6
