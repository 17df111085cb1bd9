"""benchmarks/kernels/deepgemm_layouts.py on CPU: its candidates and its joules-per-call measure (session 35) without a
GPU -- the meter and the GEMM replaced by fakes, so what is checked is the arithmetic and the calls' count."""

from __future__ import annotations

import pytest

from tests.benchmarks.bench_module import load_bench

dl = load_bench("kernels/deepgemm_layouts.py", "deepgemm_layouts")


def test_candidates_are_the_1d2d_kernels_layouts():
    cands = dl.candidates()
    assert len(cands) == 27 and len(set(cands)) == 27
    assert all(bn <= 192 and not (bm > 128 and bn > 128) for bm, bn, _, _ in cands)
    assert (256, 128, 1, 2) in cands  # the heuristic's choice at the 7B shapes (session 32)


class FakeMeter:
    """A meter whose span costs 2 mJ a call (set by the fake GEMM) and reads 1400 MHz."""

    def __init__(self):
        self.calls = 0

    def start(self):
        self.calls, self.joules, self.sm_mhz = 0, None, None

    def stop(self):
        self.joules, self.sm_mhz = 2e-3 * self.calls, 1400.0


def test_joules_per_call_divides_the_span_by_its_calls(monkeypatch):
    meter = FakeMeter()

    def fake_call(ops, layout, shape):
        meter.calls += 1

    monkeypatch.setattr(dl, "call", fake_call)
    monkeypatch.setattr(dl.torch.cuda, "synchronize", lambda: None)
    j, mhz = dl.joules_per_call(meter, None, (256, 128, 1, 2), (16384, 3584, 3584), ms=1.6, seconds=0.5)
    assert meter.calls == round(0.5e3 / 1.6) and j == pytest.approx(2e-3) and mhz == 1400.0
    assert dl.joules_per_call(meter, None, None, None, ms=900.0, seconds=0.5)[0] == pytest.approx(2e-3)  # >= 1 call
    assert meter.calls == 1
    meter.stop = lambda: setattr(meter, "sm_mhz", None)  # NVML reads nothing
    assert dl.joules_per_call(meter, None, None, None, ms=1.0, seconds=0.01) == (None, None)


def _row(rnd, shape, mnk, hms, hj, ms, j):
    return {"round": rnd, "shape": shape, "mnk": mnk, "heuristic": hms, "heuristic_j": hj, "ms": ms, "j": j}


def test_pick_names_the_fewest_joules_layout_at_level_speed_per_shape():
    a, b, c = "(128, 160, 1, 2)", "(256, 128, 2, 1)", "(128, 96, 1, 1)"
    big, small = (16384, 18944, 3584), (16384, 3584, 3584)
    res = {"rows": [
        # big: a saves 4 % of the joules at level speed; b saves more but is 3 % slower; c is refused (None)
        _row(0, "big", big, 10.0, 1.00, {a: 10.05, b: 10.3, c: None}, {a: 0.96, b: 0.90, c: None}),
        _row(1, "big", big, 10.0, 1.00, {a: 10.05, b: 10.3, c: None}, {a: 0.96, b: 0.90, c: None}),
        # small: the best saving is 1 % -- under the 2 % asked: keeps the heuristic's (not named)
        _row(0, "small", small, 1.0, 0.10, {a: 1.0, b: 1.0, c: 1.0}, {a: 0.099, b: 0.1, c: 0.1}),
    ]}
    assert dl.pick(res) == "16384:18944:3584=128,160,1,2"
    assert dl.pick(res, max_slower=1.05) == "16384:18944:3584=256,128,2,1"
    assert dl.pick(res, max_joules=0.995) == "16384:18944:3584=128,160,1,2;16384:3584:3584=128,160,1,2"
    res["rows"][0]["heuristic_j"] = None  # a round without the meter: no choice for that shape
    assert dl.pick(res) == ""
