"""Final-answer extraction from model completions and reference solutions.

A completion is free text; the reward needs the one span that states the final
answer. We look for it in a fixed order of precedence, most explicit first:

1. ``<answer>…</answer>``  — the format the QeRL/R1 prompt asks for. The *last*
   tag wins (models sometimes draft an answer and then revise it). An opening
   tag that is never closed (a generation cut off by the token limit) still
   yields its text: the accuracy reward should not punish a right answer twice
   (the format reward already does).
2. ``\\boxed{…}`` / ``\\fbox{…}`` — the MATH convention; braces are matched, so
   ``\\boxed{\\frac{1}{2}}`` yields ``\\frac{1}{2}``. Last box wins.
3. ``#### n`` — the GSM8K convention (rest of that line).
4. the last number in the text (``1,000``, ``-3.5``, ``7/12``) — a lenient
   fallback for models that ignore every instruction; it can be switched off.

Extraction is pure string work, linear in the text length, and never calls
sympy: the expensive and potentially unbounded part (parsing and comparing)
lives in :mod:`quarl.rewards.accuracy`, under a time limit.
"""

from __future__ import annotations

import re

__all__ = [
    "extract_all_boxed",
    "extract_answer",
    "extract_boxed",
    "extract_hash",
    "extract_tag",
    "last_number",
    "match_braces",
    "strip_thousands",
]

_TAG_CACHE: dict[str, tuple[re.Pattern, re.Pattern]] = {}

# A number as people write it: optional sign, thousands groups or plain digits,
# optional decimals, optional "/denominator". Thousands groups must be exact
# (1,000 / 12,345,678) so "3,4" (a list) is two numbers, not 34.
_NUMBER_RE = re.compile(
    r"(?<![\w.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?![\d])"
    r"|(?<![\w.])[-+\u2212]?\.\d+"
)
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")


def _tag_patterns(tag: str) -> tuple[re.Pattern, re.Pattern]:
    if tag not in _TAG_CACHE:
        t = re.escape(tag)
        _TAG_CACHE[tag] = (
            re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL | re.IGNORECASE),
            re.compile(rf"<{t}>", re.IGNORECASE),
        )
    return _TAG_CACHE[tag]


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>…</tag>`` (stripped); an unclosed last tag
    yields the rest of the text. ``None`` when the tag never opens."""
    closed, opening = _tag_patterns(tag)
    last_closed = None
    for last_closed in closed.finditer(text):
        pass
    opens = list(opening.finditer(text))
    if not opens:
        return None
    last_open = opens[-1]
    if last_closed is not None and last_closed.start() >= last_open.start():
        return last_closed.group(1).strip()
    # The last opening tag has no closing tag after it: truncated generation.
    rest = text[last_open.end() :]
    return rest.strip()


def match_braces(text: str, open_idx: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``open_idx``; None if unbalanced.
    Escaped braces (``\\{``) do not count."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":  # skip the escaped character, e.g. \{ or \}
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_all_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{…}``/``\\fbox{…}`` in order, nested braces
    matched. ``\\boxed 5`` (no braces, TeX's one-token argument) yields ``5``."""
    out: list[str] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        j = m.end()
        if j < len(text) and text[j] == "{":
            end = match_braces(text, j)
            if end is None:  # unbalanced: take nothing from this box
                pos = j + 1
                continue
            out.append(text[j + 1 : end - 1].strip())
            pos = end
        else:
            tok = re.match(r"[^\s$]+", text[j:])
            if tok is None:
                return out
            out.append(tok.group(0))
            pos = j + tok.end()


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (nested braces handled), else None."""
    boxes = extract_all_boxed(text)
    return boxes[-1] if boxes else None


def extract_hash(text: str) -> str | None:
    """The text after the last ``####`` (GSM8K's final-answer marker), else None."""
    found = _HASH_RE.findall(text)
    if not found:
        return None
    ans = found[-1].strip()
    return ans or None


def strip_thousands(s: str) -> str:
    """``1,234,567.5`` -> ``1234567.5``; leaves ``3,4`` (a list) alone."""
    return _THOUSANDS_RE.sub("", s)


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed, else None."""
    found = _NUMBER_RE.findall(text)
    if not found:
        return None
    num = found[-1].replace("\u2212", "-").replace(" ", "")
    return strip_thousands(num)


def extract_answer(text: str, *, fallback_last_number: bool = True) -> tuple[str | None, str]:
    """The final answer stated in ``text`` and how it was found.

    Returns ``(answer, method)`` with method one of ``"answer_tag"``, ``"boxed"``,
    ``"hash"``, ``"last_number"``, ``"none"``. When an ``<answer>`` tag is present
    its content is authoritative even if empty (an empty tag is a wrong answer,
    not a reason to search the reasoning for one).
    """
    if not text:
        return None, "none"
    tagged = extract_tag(text, "answer")
    if tagged is not None:
        return (tagged or None), "answer_tag"
    boxed = extract_boxed(text)
    if boxed:
        return boxed, "boxed"
    hashed = extract_hash(text)
    if hashed:
        return hashed, "hash"
    if fallback_last_number:
        num = last_number(text)
        if num is not None:
            return num, "last_number"
    return None, "none"
