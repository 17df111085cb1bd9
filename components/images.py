"""Container images of quarl components: one constant per runtime, immutable references.

    IMAGES["cpu"].ref   -> "ghcr.io/quarl-project/quarl-cpu:0.1.0"            (before CI pinned it)
                        -> "ghcr.io/quarl-project/quarl-cpu:0.1.0@sha256:..."  (after)

Scheme (why both a tag and a digest):
- The *tag* is the quarl version (``quarl.__version__``). Tags are immutable by
  policy: the CI workflow (.github/workflows/images.yml) refuses to push a tag
  that already exists in the registry, so ``quarl-cuda:0.1.0`` means one image.
- The *digest* makes that true even against a registry that allows overwrites:
  after pushing, CI runs ``images/pin_digests.py`` which rewrites ``DIGESTS``
  below with the pushed digests and re-compiles the components and pipelines, so
  compiled YAML names ``repo:tag@sha256:...`` and a pod gets exactly the bytes CI
  built and tested. Until an image has been pushed (a fresh version on a dev
  branch) its digest is ``None`` and the reference is the tag alone; ``kfp.local``
  ignores images entirely.
- Forks change ``REGISTRY`` (one line) and run ``make compile``.

Each image is built from ``images/<kind>.Dockerfile``; tests/components check that
every image a component names is defined here and has its Dockerfile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import quarl

__all__ = ["DIGESTS", "IMAGES", "REGISTRY", "Image"]

REGISTRY = "ghcr.io/quarl-project"

# Filled by images/pin_digests.py in CI after a push: {kind: "sha256:<64 hex>"}.
DIGESTS: dict[str, str | None] = {
    "cpu": None,
    "cuda": None,
}


@dataclass(frozen=True)
class Image:
    kind: str  # "cpu" | "cuda": also the Dockerfile name under images/
    repository: str
    tag: str
    digest: str | None = None
    description: str = ""

    @property
    def ref(self) -> str:
        base = f"{self.repository}:{self.tag}"
        return f"{base}@{self.digest}" if self.digest else base

    @property
    def dockerfile(self) -> Path:
        return Path(__file__).resolve().parent.parent / "images" / f"{self.kind}.Dockerfile"


IMAGES: dict[str, Image] = {
    "cpu": Image("cpu", f"{REGISTRY}/quarl-cpu", quarl.__version__, DIGESTS["cpu"],
                 "CPU stages (data_prep, export): python 3.11-slim, torch 2.13 CPU, quarl"),
    "cuda": Image("cuda", f"{REGISTRY}/quarl-cuda", quarl.__version__, DIGESTS["cuda"],
                  "GPU stages (calibrate, rl, eval): torch 2.14 (CUDA 13), triton, vllm, quarl kernels pre-compiled for sm_90a"),
}
