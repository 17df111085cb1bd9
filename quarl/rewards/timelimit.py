"""Per-item time limits for reward computation.

Checking a completion means parsing LaTeX into sympy and comparing
expressions; a pathological completion (``9^{9^{9^{9}}}``, a 100k-character
nest of braces) can make sympy run for minutes. A rollout must never hang on
one bad sample, so every item is scored under a time limit and a timeout
scores 0.0.

math-verify ships its own limit, built on ``signal.alarm``: whole seconds only,
main thread only (off the main thread it raises ``ValueError``), and it
re-arms the process-wide alarm at every call, so it cannot nest under an outer
limit. We therefore switch it off (``parsing_timeout=None``,
``timeout_seconds=None``) and apply one limit of our own around the whole
item (extraction + both parses + verify):

* ``signal`` — ``setitimer(ITIMER_REAL)`` with sub-second resolution; the
  handler raises :class:`RewardTimeout`, a ``BaseException`` so that sympy's
  many ``except Exception`` blocks cannot swallow it. Costs nothing, but only
  works on the main thread, and cannot interrupt a single long C call (a
  big-integer power inside CPython); sympy's evaluation loops are Python, so
  in practice it fires (tested on ``2^{2^{64}}``, ``(10^{10})!``).
* ``process`` — items are scored in a persistent worker process (started
  with ``spawn``: safe under torch and threads) that applies the ``signal``
  limit to each item on *its* main thread. The parent waits with a deadline
  of ``n_items * limit + slack``; if the worker still does not answer (a C call
  that ignores signals) it is killed, restarted, and the batch is re-scored
  item by item so that only the culprit scores 0.0. Works from any thread;
  costs one process start (~2 s of imports) and a pickle round trip per batch.
* ``auto`` — ``signal`` on the main thread, ``process`` elsewhere (e.g. a
  reward computed in a trainer's background thread).
* ``none`` — no limit (trusted inputs, debugging).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence

log = logging.getLogger(__name__)

MODES = ("auto", "signal", "process", "none")


class RewardTimeout(BaseException):
    """Raised inside an item that exceeded its time limit (BaseException on
    purpose: library code catching ``Exception`` must not swallow it)."""


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def resolve_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"timeout mode {mode!r} is not one of {MODES}")
    if mode == "auto":
        return "signal" if on_main_thread() and hasattr(signal, "setitimer") else "process"
    if mode == "signal" and not on_main_thread():
        raise ValueError(
            "timeout mode 'signal' only works on the main thread (Python delivers signals there); "
            "use mode='process' or 'auto' when scoring from a worker thread"
        )
    return mode


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`RewardTimeout` in the block after ``seconds`` of wall time.

    Main thread only. Nests: an outer ``time_limit`` (or any ITIMER_REAL user)
    that would expire first keeps its own deadline and handler, and after the
    block the outer timer is re-armed with what is left of it.
    """
    if seconds is None or seconds <= 0:
        yield
        return

    def _handler(signum, frame):
        raise RewardTimeout(f"reward item exceeded {seconds:g}s")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, _handler)
    outer_remaining, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    if 0 < outer_remaining <= seconds:  # the outer deadline comes first: leave it in charge
        signal.signal(signal.SIGALRM, old_handler)
        signal.setitimer(signal.ITIMER_REAL, outer_remaining)
        yield  # the outer handler fires (or the timer is still pending) as before
        return
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer_remaining > 0:
            left = outer_remaining - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))  # >0: a zero would disarm it


# --------------------------------------------------------------------------- process mode

ItemFn = Callable[..., float]


def _score_items_with_signal(fn: ItemFn, items: Sequence[tuple], seconds: float | None) -> list[float]:
    out = []
    for args in items:
        try:
            with time_limit(seconds):
                out.append(float(fn(*args)))
        except RewardTimeout:
            out.append(0.0)
        except Exception:
            log.debug("reward item failed", exc_info=True)
            out.append(0.0)
    return out


def _warm_up() -> None:
    """Pay math-verify's lazy set-up (sympy, LaTeX grammar) before the first item, so a
    tight per-item limit does not time out a good answer on a cold worker."""
    try:
        from math_verify import parse, verify

        verify(parse("$\\frac{1}{2}$"), parse("0.5"))
    except Exception:  # scoring still works, only the first item pays the set-up
        log.debug("math-verify warm-up failed", exc_info=True)


def _worker_main(conn) -> None:  # runs in the child process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C
    _warm_up()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        fn, items, seconds = msg
        conn.send(_score_items_with_signal(fn, items, seconds))


class ProcessScorer:
    """A persistent child process that scores items under per-item limits.

    Not thread-safe by itself; :func:`score_in_process` serialises access.
    """

    START_SLACK_S = 60.0  # first call pays for spawning and importing sympy/math-verify
    CALL_SLACK_S = 2.0

    def __init__(self) -> None:
        self._proc = None
        self._conn = None
        self._fresh = True

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="quarl-reward-scorer")
        proc.start()
        child.close()
        self._proc, self._conn, self._fresh = proc, parent, True

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(Exception):
                self._conn.send(None)
                self._proc.join(timeout=2)
        self._kill()

    def _call(self, fn: ItemFn, items: Sequence[tuple], seconds: float | None, deadline_s: float) -> list[float] | None:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        if self._fresh:
            deadline_s += self.START_SLACK_S
        try:
            self._conn.send((fn, list(items), seconds))
            if self._conn.poll(deadline_s):
                res = self._conn.recv()
                self._fresh = False
                return res
        except (EOFError, OSError, BrokenPipeError):
            log.warning("reward scorer process died; restarting it")
        self._kill()
        return None

    def score(self, fn: ItemFn, items: Sequence[tuple], seconds: float | None) -> list[float]:
        if not items:
            return []
        per = seconds if seconds and seconds > 0 else 60.0
        res = self._call(fn, items, seconds, len(items) * per + self.CALL_SLACK_S)
        if res is not None:
            return res
        # Something ignored the in-process limit: find it by scoring one at a time.
        log.warning("reward batch of %d items overran its deadline; re-scoring item by item", len(items))
        out = []
        for it in items:
            r = self._call(fn, [it], seconds, per + self.CALL_SLACK_S)
            out.append(r[0] if r is not None else 0.0)
        return out


_SCORER: ProcessScorer | None = None
_SCORER_LOCK = threading.Lock()


def score_in_process(fn: ItemFn, items: Sequence[tuple], seconds: float | None) -> list[float]:
    """Score ``fn(*item)`` for each item in the shared worker process.

    ``fn`` must be a picklable module-level function."""
    global _SCORER
    with _SCORER_LOCK:
        if _SCORER is None:
            _SCORER = ProcessScorer()
        return _SCORER.score(fn, items, seconds)


def score_items(fn: ItemFn, items: Sequence[tuple], seconds: float | None, mode: str = "auto") -> list[float]:
    """Score every item with ``fn`` under a per-item limit; errors and timeouts -> 0.0."""
    mode = resolve_mode(mode)
    if mode == "none":
        return _score_items_with_signal(fn, items, None)
    if mode == "signal":
        return _score_items_with_signal(fn, items, seconds)
    return score_in_process(fn, items, seconds)
