"""Fixtures for tests/models.

``smollm2_dir`` converts the embedded SmolLM2 GGUF once per test session (and in
practice once per machine: it lives in the normal quarl cache, so later sessions
reuse it). Tiny models need it too, for their tokenizer, so it is autouse here;
the time the conversion took is printed in the pytest summary.
"""

from __future__ import annotations

import time

import pytest

_NOTES: list[str] = []


@pytest.fixture(scope="session")
def smollm2_dir():
    from quarl.models import cache_dir, default_model_dir
    from quarl.models.default import DEFAULT_MODEL_NAME, _is_current

    fresh = not _is_current(cache_dir() / "models" / DEFAULT_MODEL_NAME)
    t0 = time.perf_counter()
    path = default_model_dir()
    dt = time.perf_counter() - t0
    _NOTES.append(
        f"default model: {'converted GGUF -> safetensors in' if fresh else 'reused cached conversion in'} "
        f"{dt:.1f} s ({path})"
    )
    return path


@pytest.fixture(autouse=True)
def _default_model_ready(smollm2_dir):
    return smollm2_dir


def pytest_terminal_summary(terminalreporter):
    for note in _NOTES:
        terminalreporter.write_line(f"[quarl.models] {note}")
