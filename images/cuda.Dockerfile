# syntax=docker/dockerfile:1
# quarl CUDA image: the GPU stages (calibrate, rl, eval; distill and friends later).
#
#   docker build -f images/cuda.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t quarl-cuda .
#
# CUDA comes from the pinned wheels (torch 2.14.0 ships the CUDA 13 runtime as nvidia-* packages),
# so the base is a plain Python image and the host needs only an NVIDIA driver for CUDA 13
# (>= 580). Versions are pinned by images/constraints-cuda.txt (resolved for torch 2.14.0 +
# vllm 0.33.0 + triton). Triton needs a C compiler at run time for its small launcher stub,
# hence gcc. quarl's Triton kernels are compiled for sm_90a at build time into
# TRITON_CACHE_DIR (images/precompile_kernels.py); the cache stays writable for new shapes.
# Nothing is pip-installed when a pod starts. Runs as uid 1000.
FROM python:3.11.14-slim-bookworm

ARG GIT_COMMIT=unknown

LABEL org.opencontainers.image.title="quarl-cuda" \
      org.opencontainers.image.description="quarl GPU stages: torch, triton, vllm, quarl kernels (sm_90a)" \
      org.opencontainers.image.source="https://github.com/quarl-project/quarl" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    QUARL_GIT_COMMIT=${GIT_COMMIT} \
    QUARL_CACHE=/scratch/quarl \
    HF_HOME=/scratch/hf \
    TRITON_CACHE_DIR=/opt/quarl/triton-cache \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 quarl \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin quarl \
 && mkdir -p /scratch /opt/quarl/triton-cache \
 && chown quarl:quarl /scratch /opt/quarl/triton-cache

WORKDIR /opt/quarl/src

COPY images/constraints-cuda.txt /opt/quarl/constraints.txt
# The heavy, rarely changing layer first: torch + vllm (+ triton through torch).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --constraint /opt/quarl/constraints.txt torch vllm

COPY pyproject.toml setup.py README.md ./
COPY quarl ./quarl
COPY kernels ./kernels
COPY components ./components
COPY pipelines ./pipelines
COPY benchmarks/kernels/ ./benchmarks/kernels/
COPY images/precompile_kernels.py ./images/
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --constraint /opt/quarl/constraints.txt ".[gpu]" \
 && python -c "import quarl, quarl_kernels, quarl_components, triton, vllm, bitsandbytes; print('quarl', quarl.__version__)"

USER 1000:1000
# No GPU at build time: Triton compiles for the sm_90a target explicitly.
RUN python images/precompile_kernels.py --report /opt/quarl/triton-cache/precompiled.json

WORKDIR /home/quarl
