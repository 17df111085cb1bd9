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


# small stage settings and a text corpus for the offload / streaming stage tests
SMALL_STAGE = ["data.num_samples=4", "data.seq_len=32", "data.batch_size=2", "eval.num_samples=3", "eval.batch_size=2",
               "awq.n_grid=4", "device=cpu"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "corpus.txt"
    p.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over {i} lazy dogs and {2 * i} cats."
                             for i in range(60)))
    return str(p)

