"""Vendor the Kubeflow Trainer v2 CRD schemas that quarl's TrainJob and runtime are validated against.

    python manifests/vendor/vendor_trainer_crds.py <trainer checkout> [--tag v2.3.0]

reads ``manifests/base/crds/trainer.kubeflow.org_{trainjobs,clustertrainingruntimes}.yaml`` of
a kubeflow/trainer checkout at ``--tag`` (``git show <tag>:<path>``) and writes
``manifests/vendor/trainer-crd-schemas.json``: for each CRD the ``openAPIV3Schema`` of version
``v1alpha1`` with every ``description`` removed (documentation only: the schema validates exactly
as upstream's; the full CRDs are ~1.5 MB of YAML, the stripped schemas, one line of JSON, ~120 KB), plus the source
URL, tag, commit and the sha256 of each upstream file, so anyone can re-derive and diff it.
tests/pipeline/test_trainjob.py validates the rendered TrainJob and manifests/quarl-torch-distributed.yaml
against it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from pathlib import Path

import yaml

CRDS = {"TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
        "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml"}
OUT = Path(__file__).resolve().parent / "trainer-crd-schemas.json"
DATA_KEYS = ("default", "enum", "example", "x-kubernetes-validations")  # values, not schemas: kept verbatim
MAP_KEYS = ("properties", "patternProperties", "definitions")  # name -> schema: names are kept


def strip_descriptions(schema):
    """The schema without its ``description`` keywords (a property *named* description is kept)."""
    if isinstance(schema, list):
        return [strip_descriptions(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "description":
            continue
        if k in MAP_KEYS:
            out[k] = {name: strip_descriptions(s) for name, s in v.items()}
        elif k in DATA_KEYS:
            out[k] = v
        else:
            out[k] = strip_descriptions(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path, help="a git checkout of github.com/kubeflow/trainer")
    ap.add_argument("--tag", default="v2.3.0")
    a = ap.parse_args()
    commit = subprocess.check_output(["git", "-C", str(a.checkout), "rev-parse", f"{a.tag}^{{commit}}"], text=True).strip()
    out = {"source": "https://github.com/kubeflow/trainer", "tag": a.tag, "commit": commit,
           "transform": "spec.versions[name=v1alpha1].schema.openAPIV3Schema, 'description' keywords removed",
           "crds": {}}
    for kind, name in CRDS.items():
        path = f"manifests/base/crds/{name}"
        text = subprocess.check_output(["git", "-C", str(a.checkout), "show", f"{a.tag}:{path}"])
        crd = yaml.safe_load(text)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        out["crds"][kind] = {
            "url": f"https://github.com/kubeflow/trainer/blob/{commit}/{path}",
            "sha256": hashlib.sha256(text).hexdigest(),
            "group": crd["spec"]["group"], "version": "v1alpha1", "plural": crd["spec"]["names"]["plural"],
            "scope": crd["spec"]["scope"],
            "openAPIV3Schema": strip_descriptions(version["schema"]["openAPIV3Schema"]),
        }
    OUT.write_text(json.dumps(out, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes) from kubeflow/trainer {a.tag} ({commit})")


if __name__ == "__main__":
    main()
