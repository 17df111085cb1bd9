"""Shared fixtures: tiny models built once per session (copied per test), calibration token batches."""

import copy

import pytest
import torch

from tests.threads import one_thread_fixture

_one_thread = one_thread_fixture(scope="session")


@pytest.fixture(scope="session")
def _tiny_models():
    from quarl.models import load_model

    return {k: load_model(f"tiny-{k}") for k in ("llama", "qwen2", "qwen3")}


@pytest.fixture
def tiny(_tiny_models):
    """tiny("llama") -> (a fresh copy of the model, its tokenizer)."""

    def get(kind: str = "llama"):
        m, tok = _tiny_models[kind]
        return copy.deepcopy(m), tok

    return get


@pytest.fixture(scope="session")
def calib_batches():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 49152, (4, 32), generator=g) for _ in range(2)]


@pytest.fixture(scope="session")
def eval_ids():
    return torch.randint(0, 49152, (2, 32), generator=torch.Generator().manual_seed(1))
