"""The side-stream decode's bookkeeping (``quarl_kernels.dequant_ahead``) on CPU, with the CUDA streams faked.

What is checked here is *which* decode each call uses: the order learned from the calls, a started decode taken by
the call it was started for, a wrong guess dropped (never used), an in-place write noticed, a deleted weight not
kept alive, the switch. The streams' real behaviour (and bit-equal outputs) is ``test_dequant_ahead_gpu.py``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import weakref

import pytest
import torch
from quarl_kernels import dequant_ahead


@dataclasses.dataclass(frozen=True)
class FakeWeight:  # the fields of wo_gemm.PackedWeight that dequant_ahead reads
    fmt: int
    group: int
    n: int
    k: int
    words: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    gscale: torch.Tensor | None


class FakeStream:
    def __init__(self):
        self.waits = []

    def wait_event(self, e):
        self.waits.append(e)

    def record_event(self):
        return object()


def _w(n: int) -> FakeWeight:
    return FakeWeight(0, 16, n, 8, torch.zeros(n, 1, dtype=torch.int32), torch.zeros(n, 1, dtype=torch.uint8), None,
                      torch.ones(1))


@pytest.fixture
def fake(monkeypatch):
    """(main stream, log of what was made / decoded ahead)."""
    main, side = FakeStream(), FakeStream()
    monkeypatch.setattr(dequant_ahead, "_active", lambda pw: dequant_ahead.enabled())
    monkeypatch.setattr(dequant_ahead, "_main", lambda device: main)
    monkeypatch.setattr(dequant_ahead, "_side", lambda device: side)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)
    monkeypatch.delenv(dequant_ahead.ENV, raising=False)
    dequant_ahead.reset()
    log = []
    yield main, log
    dequant_ahead.reset()


def _call(pw, log, direction="fwd", ahead_of=None):
    def make():
        log.append(("made", pw.n))
        return torch.full((pw.n, pw.k), 1.0)

    def decode_into(p, buf):
        log.append(("ahead", p.n))
        buf.fill_(2.0)

    return dequant_ahead.weight(pw, direction, make, decode_into, ahead_of)


def test_order_is_learned_then_each_call_takes_the_decode_started_for_it(fake):
    main, log = fake
    a, b, c = _w(3), _w(4), _w(5)
    for pw in (a, b, c):
        assert _call(pw, log)[0, 0] == 1.0  # nothing known yet: made
    assert log == [("made", 3), ("made", 4), ("made", 5)]
    log.clear()
    outs = [_call(pw, log) for pw in (a, b, c, a)]
    # a: made (c -> a only learned now), b's decode started; b taken, c started; c taken, a started; a taken
    assert log == [("made", 3), ("ahead", 4), ("ahead", 5), ("ahead", 3), ("ahead", 4)]
    assert [o[0, 0].item() for o in outs] == [1.0, 2.0, 2.0, 2.0]
    assert len(main.waits) == 3  # one wait per decode taken


def test_a_wrong_guess_is_dropped_not_used(fake):
    _, log = fake
    a, b, c = _w(3), _w(4), _w(5)
    for pw in (a, b, a, b):
        _call(pw, log)
    log.clear()
    wasted = dequant_ahead.stats["wasted"]
    out = _call(c, log)  # b's decode was started (after a comes b); c came instead
    assert out[0, 0] == 1.0 and log[0] == ("made", 5)
    assert dequant_ahead.stats["wasted"] == wasted + 1
    assert not dequant_ahead._pending


def test_directions_are_learned_apart(fake):
    _, log = fake
    a, b = _w(3), _w(4)
    for _ in range(2):
        _call(a, log, "fwd")
        _call(b, log, "bwd")
    log.clear()
    _call(a, log, "fwd")  # a (fwd) was followed by b (bwd): b's backward decode starts
    assert _call(b, log, "bwd")[0, 0] == 2.0
    assert _call(b, log, "fwd")[0, 0] == 1.0  # the forward of b was never seen: made


def test_inplace_write_after_the_decode_started_is_noticed(fake):
    _, log = fake
    a, b = _w(3), _w(4)
    for pw in (a, b, a):
        _call(pw, log)  # the last call starts b's decode
    b.words.add_(1)  # a checkpoint load, calibration: the version counter moves
    log.clear()
    assert _call(b, log)[0, 0] == 1.0 and log[0] == ("made", 4)


def test_ahead_of_can_skip_a_weight_kept_elsewhere(fake):
    _, log = fake
    a, b = _w(3), _w(4)
    for pw in (a, b, a):
        _call(pw, log, ahead_of=lambda p: p.n != 4)  # b is "kept": never decoded ahead
    assert ("ahead", 4) not in log


def test_a_deleted_weight_is_not_kept_alive(fake):
    _, log = fake
    a, b = _w(3), _w(4)
    for pw in (a, b, a):
        _call(pw, log)
    _call(b, log)
    wr = weakref.ref(a.words)
    del a, pw
    _call(_w(6), log)  # drops a's pending decode, if any
    gc.collect()
    assert wr() is None  # the learned order held a's tensors weakly


def test_switched_off_learns_nothing(fake, monkeypatch):
    _, log = fake
    monkeypatch.setenv(dequant_ahead.ENV, "0")
    a, b = _w(3), _w(4)
    for pw in (a, b, a, b):
        _call(pw, log)
    assert [e[0] for e in log] == ["made"] * 4 and not dequant_ahead._after
