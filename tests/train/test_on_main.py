"""Dist.on_main: rank 0 writes, every rank learns the outcome (single process, and a rank > 0 with the
broadcast stubbed; the real 2-rank path runs in test_distributed's stage scenarios)."""

from __future__ import annotations

import pytest

from quarl.train.distributed import Dist


def test_single_process_runs_and_reraises():
    assert Dist().on_main(lambda: 3, "x") == 3

    def boom():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        Dist().on_main(boom, "x")


def test_other_ranks_skip_the_work_and_fail_with_rank_0(monkeypatch):
    called = []
    monkeypatch.setattr(Dist, "broadcast_object", lambda self, obj, src=0: False)  # rank 0 reported a failure
    with pytest.raises(RuntimeError, match="rank 0 failed to write the rl artifact"):
        Dist(rank=1, world_size=2).on_main(lambda: called.append(1), "rl artifact")
    assert not called
    monkeypatch.setattr(Dist, "broadcast_object", lambda self, obj, src=0: True)
    assert Dist(rank=1, world_size=2).on_main(lambda: called.append(1), "rl artifact") is None and not called
