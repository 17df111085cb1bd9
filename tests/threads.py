"""One intra-op thread for the tests of tiny models.

Their many small GEMMs gain nothing from OpenMP threads, and on a shared 2-core machine
spin-waiting threads make them several times slower (calibration ~10x). A test directory or
module opts in with one line, at the scope its fixtures need::

    _one_thread = one_thread_fixture()                  # each test
    _one_thread = one_thread_fixture(scope="session")   # also session fixtures (corpora, models)
"""

from __future__ import annotations

import pytest
import torch


def one_thread_fixture(scope: str = "function"):
    @pytest.fixture(scope=scope, autouse=True)
    def _one_thread():
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(n)

    return _one_thread
