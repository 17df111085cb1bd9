"""Switches from the environment and the interpreter check, below every kernel module (``launch``, ``pdl``) so that
none of them imports another only for these."""

from __future__ import annotations

import os

__all__ = ["env_flag", "env_int", "interpreting"]


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (CPU emulation: no inline PTX, no Gluon)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_ON = ("1", "true", "on", "yes")
_OFF = ("", "0", "false", "off", "no")


def env_flag(name: str, default: bool) -> bool:
    """An on/off switch from the environment: 1 / true / on / yes, or 0 / false / off / no
    (case-insensitive); unset means ``default``. Anything else is an error naming the variable."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ValueError(f"{name}={raw!r} is neither on nor off: set it to 1 (on) or 0 (off)")


def env_int(name: str, default: int, what: str) -> int:
    """A non-negative count from the environment (unset or empty: ``default``); ``what`` says what it sets, for the
    error a non-integer or a negative value gets."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set {what}") from None
    if v < 0:
        raise ValueError(f"{name}={v} is negative; set {what}")
    return v
