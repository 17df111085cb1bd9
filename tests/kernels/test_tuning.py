"""quarl_kernels.tuning: the weight-only kernels' tiny autotuner -- the measured default unless tuning is asked for,
the fastest candidate timed once, kept in memory and in a JSON file that a fresh process reads back instead of
timing again, an unreadable file ignored with a warning, nothing timed inside a CUDA-graph capture. On CPU: the
timing is replaced by each candidate's given time (``run`` returns it)."""

import json
from dataclasses import dataclass

import pytest
import torch
from quarl_kernels import tuning


@dataclass(frozen=True)
class Cfg:
    name: str

    def __str__(self) -> str:
        return f"cfg-{self.name}"


A, B, C = Cfg("a"), Cfg("b"), Cfg("c")
TIMES = {A: 3.0, B: 1.0, C: 2.0}  # ms: B is the fastest


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A process with no choice made yet and its cache file at tmp_path; timing counted."""
    cache = tmp_path / "kernel_configs.json"
    monkeypatch.setenv("QUARL_KERNELS_CACHE", str(cache))
    monkeypatch.delenv("QUARL_KERNELS_TUNE", raising=False)
    monkeypatch.setattr(tuning, "_CHOICE", {})
    monkeypatch.setattr(tuning, "_DISK", None)
    timed = []
    monkeypatch.setattr(tuning, "_time_ms", lambda fn, reps=20: timed.append(1) or fn())
    return cache, timed


def _choose(tune, default=A, key=(0, 512, 1024, 0)):
    return tuning.choose("fwd", key, (A, B, C), lambda c: TIMES[c], tune, default)


def test_untuned_calls_take_the_default_and_time_nothing(fresh):
    cache, timed = fresh
    assert _choose(None) is A and _choose(False, default=C) is C
    assert timed == [] and not cache.exists()


def test_tuning_picks_the_fastest_once_and_a_fresh_process_reads_it_back(fresh, monkeypatch):
    cache, timed = fresh
    assert _choose(True) is B and len(timed) == 3  # each candidate timed once
    assert _choose(True) is B and len(timed) == 3  # remembered in memory
    saved = json.loads(cache.read_text())
    assert list(saved.values()) == ["cfg-b"]
    (key,) = saved
    assert key.startswith("cpu|") and key.endswith("|fwd|0|512|1024")  # device name, Triton version, kind, key
    monkeypatch.setattr(tuning, "_CHOICE", {})  # a new process: the file, not the clock
    monkeypatch.setattr(tuning, "_DISK", None)
    assert _choose(True) is B and len(timed) == 3
    assert _choose(True, key=(0, 512, 2048, 0)) is B and len(timed) == 6  # another shape is tuned on its own
    assert len(json.loads(cache.read_text())) == 2


def test_the_environment_switch_turns_tuning_on(fresh, monkeypatch):
    _, timed = fresh
    monkeypatch.setenv("QUARL_KERNELS_TUNE", "1")
    assert _choose(None) is B and len(timed) == 3


def test_cache_off_keeps_choices_in_memory_only(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("QUARL_KERNELS_CACHE", "off")
    assert _choose(True) is B
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_cache_is_ignored_with_a_warning_and_rewritten(fresh):
    cache, timed = fresh
    cache.write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring unreadable kernel config cache"):
        assert _choose(True) is B
    assert len(timed) == 3 and json.loads(cache.read_text()) != {}
    assert not list(cache.parent.glob("*.tmp"))  # written through a temporary file, renamed into place


def test_a_stale_entry_naming_no_candidate_is_tuned_again(fresh):
    cache, timed = fresh
    _choose(True)
    (key,) = json.loads(cache.read_text())
    cache.write_text(json.dumps({key: "cfg-gone"}))  # a config this version no longer offers
    tuning._CHOICE.clear()
    tuning._DISK = None
    assert _choose(True) is B and len(timed) == 6


def test_nothing_is_timed_inside_a_graph_capture(fresh, monkeypatch):
    cache, timed = fresh
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "a GPU")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _choose(True, default=C) is C and timed == [] and not cache.exists()
