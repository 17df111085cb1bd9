"""Built-in generator of verifiable math problems at graded difficulty 1-5.

The embedded default data source: no download, seedable, instant, and every
answer is exact because it is computed with :class:`fractions.Fraction` from
the same numbers that are written into the problem.

    level 1  one operation on small integers            "What is 7 + 5?"
    level 2  two operations with parentheses, negatives  "Compute (23 - 8) × 4."
    level 3  one/two-step integer word problems          speed × time, change from a bill, ...
    level 4  fractions and percentages, one/two steps    "25% off $80", "1/3 + 1/4 of a pizza"
    level 5  multi-step word problems mixing both        tank capacity, successive discounts, rates

Answers are integers or simple fractions written ``n`` / ``n/d`` (lowest
terms), which both math-verify and our reward parse. Each problem also gets a
worked ``solution`` whose lines are ``<arithmetic> = <value>`` in plain ASCII and
whose last line is ``#### <answer>`` (GSM8K style) — usable as an SFT target
and checked line by line in the tests.

Determinism: one ``random.Random(seed)`` drives everything, levels are dealt
round-robin, and a problem text already produced is re-drawn, so
``generate_problems(n, seed)`` returns the same ``n`` distinct problems on
every machine and Python version (``random`` guarantees its sequence for
``randint``/``choice`` given a seed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction as F

__all__ = ["LEVELS", "GeneratedProblem", "format_number", "generate_problems"]

LEVELS = (1, 2, 3, 4, 5)

NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kira",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
    "Uma",
    "Victor",
    "Wen",
    "Yara",
]
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "shells", "cards", "stamps", "coins"]
GOODS = ["jacket", "bicycle", "lamp", "backpack", "guitar", "watch", "chair", "printer"]


@dataclass(frozen=True)
class GeneratedProblem:
    problem: str
    answer: str  # "12", "-3", "7/12"
    solution: str  # "<expr> = <value>" lines, then "#### <answer>"
    difficulty: int


def format_number(x: F) -> str:
    """Exact, parseable text for a rational: ``12``, ``-3``, ``7/12``."""
    x = F(x)
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _q(x: F) -> str:  # a value inside a step expression: fractions parenthesised
    s = format_number(x)
    return f"({s})" if "/" in s else s


class _Steps:
    """Collects ``expr = value`` lines; ``add`` returns the value for chaining."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, expr: str, value: F) -> F:
        self.lines.append(f"{expr} = {format_number(value)}")
        return F(value)

    def render(self, answer: F) -> str:
        return "\n".join([*self.lines, f"#### {format_number(answer)}"])


_SYM = {"+": "+", "-": "-", "*": "×", "/": "÷"}


def _apply(a: F, op: str, b: F) -> F:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b  # callers guarantee b != 0


# ---------------------------------------------------------------- level 1


def _level1(r: random.Random) -> tuple[str, _Steps, F]:
    op = r.choice("+-*/")
    if op == "+":
        a, b = r.randint(1, 20), r.randint(1, 20)
    elif op == "-":
        a = r.randint(2, 20)
        b = r.randint(1, a)
    elif op == "*":
        a, b = r.randint(2, 12), r.randint(2, 12)
    else:
        b = r.randint(2, 12)
        a = b * r.randint(1, 12)
    s = _Steps()
    ans = s.add(f"{a} {op} {b}", _apply(F(a), op, F(b)))
    text = r.choice(["What is {e}?", "Compute {e}.", "Calculate {e}."]).format(e=f"{a} {_SYM[op]} {b}")
    return text, s, ans


# ---------------------------------------------------------------- level 2


def _level2(r: random.Random) -> tuple[str, _Steps, F]:
    """(a op b) op c, or a op (b op c) — always with explicit parentheses so the
    problem has one reading; division only when exact."""
    while True:
        a, b, c = (r.randint(2, 50) for _ in range(3))
        op1, op2 = r.choice("+-*"), r.choice("+-*/")
        inner_first = r.random() < 0.5
        if inner_first:
            inner = _apply(F(a), op1, F(b))
            if op2 == "/" and (c == 0 or inner % c != 0):
                continue
            value = _apply(inner, op2, F(c))
            expr_h = f"({a} {_SYM[op1]} {b}) {_SYM[op2]} {c}"
            steps = [(f"{a} {op1} {b}", inner), (f"{_q(inner)} {op2} {c}", value)]
        else:
            inner = _apply(F(b), op1, F(c))
            if op2 == "/" and (inner == 0 or F(a) % inner != 0):
                continue
            value = _apply(F(a), op2, inner)
            expr_h = f"{a} {_SYM[op2]} ({b} {_SYM[op1]} {c})"
            steps = [(f"{b} {op1} {c}", inner), (f"{a} {op2} {_q(inner)}", value)]
        if abs(value) > 5000:
            continue
        s = _Steps()
        for e, v in steps:
            s.add(e, v)
        return r.choice(["Compute {e}.", "Evaluate {e}.", "What is the value of {e}?"]).format(e=expr_h), s, value


# ---------------------------------------------------------------- level 3


def _level3(r: random.Random) -> tuple[str, _Steps, F]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    kind = r.randrange(5)
    s = _Steps()
    if kind == 0:
        a, b = r.randint(10, 60), r.randint(5, 40)
        c = r.randint(1, a + b - 1)
        t = s.add(f"{a} + {b}", F(a + b))
        ans = s.add(f"{_q(t)} - {c}", t - c)
        text = (
            f"{name} has {a} {item}. {name} gets {b} more and then gives {c} away. "
            f"How many {item} does {name} have now?"
        )
    elif kind == 1:
        v, h = r.randint(30, 90), r.randint(2, 9)
        ans = s.add(f"{v} * {h}", F(v * h))
        text = f"A train travels at {v} kilometers per hour for {h} hours. How many kilometers does it travel?"
    elif kind == 2:
        k, m = r.randint(3, 12), r.randint(3, 25)
        ans = s.add(f"{k * m} / {k}", F(m))
        text = f"{name} packs {k * m} {item} into bags of {k}. How many bags does {name} fill?"
    elif kind == 3:
        p, n = r.randint(3, 15), r.randint(2, 6)
        bill = r.choice([x for x in (20, 50, 100) if x >= p * n] or [100])
        cost = s.add(f"{p} * {n}", F(p * n))
        ans = s.add(f"{bill} - {_q(cost)}", bill - cost)
        text = (
            f"Tickets cost ${p} each. {name} buys {n} tickets and pays with a ${bill} bill. "
            f"How many dollars of change does {name} get?"
        )
    else:
        w, d = r.randint(4, 15), r.randint(3, 7)
        extra = r.randint(2, 20)
        t = s.add(f"{w} * {d}", F(w * d))
        ans = s.add(f"{_q(t)} + {extra}", t + extra)
        text = (
            f"{name} reads {w} pages every day for {d} days and then {extra} more pages on the weekend. "
            f"How many pages does {name} read in total?"
        )
    return text, s, ans


# ---------------------------------------------------------------- level 4


def _level4(r: random.Random) -> tuple[str, _Steps, F]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    kind = r.randrange(4)
    s = _Steps()
    if kind == 0:
        pct = r.choice([10, 15, 20, 25, 30, 40, 50, 75])
        price = 20 * r.randint(2, 15)
        off = s.add(f"{price} * {pct} / 100", F(price * pct, 100))
        ans = s.add(f"{price} - {_q(off)}", price - off)
        good = r.choice(GOODS)
        text = f"A {good} costs ${price}. It is on sale for {pct}% off. What is the sale price in dollars?"
    elif kind == 1:
        b = r.choice([2, 3, 4, 5, 6, 8])
        a = r.randint(1, b - 1)
        n = b * r.randint(3, 15)
        frac = F(a, b)  # written in lowest terms, in the text and in the steps
        given = s.add(f"{n} * {frac.numerator} / {frac.denominator}", n * frac)
        ans = s.add(f"{n} - {_q(given)}", n - given)
        text = (
            f"{name} has {n} {item} and gives {format_number(frac)} of them to a friend. "
            f"How many {item} does {name} have left?"
        )
    elif kind == 2:
        while True:
            b, d = r.choice([2, 3, 4, 5, 6, 8]), r.choice([2, 3, 4, 5, 6, 8])
            x, y = F(r.randint(1, b - 1), b), F(r.randint(1, d - 1), d)
            if x + y < 1 and x.denominator > 1 and y.denominator > 1:
                break
        ans = s.add(f"{_q(x)} + {_q(y)}", x + y)
        friend = r.choice([n for n in NAMES if n != name])
        text = (
            f"{name} eats {format_number(x)} of a pizza and {friend} eats {format_number(y)} of the same pizza. "
            f"What fraction of the pizza do they eat together?"
        )
    else:
        pct = r.choice([5, 10, 20, 25, 50])
        total = 20 * r.randint(2, 20)
        ans = s.add(f"{total} * {pct} / 100", F(total * pct, 100))
        text = f"What is {pct}% of {total}?"
    return text, s, ans


# ---------------------------------------------------------------- level 5


def _level5(r: random.Random) -> tuple[str, _Steps, F]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    kind = r.randrange(4)
    s = _Steps()
    if kind == 0:
        # Successive percentages then a fraction of the rest; integral throughout.
        p = r.choice([10, 20, 25, 50])
        b = r.choice([2, 3, 4, 5])
        a = r.randint(1, b - 1)
        n = 20 * b * r.randint(1, 8)  # n*p/100 and the remainder*a/b stay integral for p % 5 == 0
        sold1 = s.add(f"{n} * {p} / 100", F(n * p, 100))
        left1 = s.add(f"{n} - {_q(sold1)}", n - sold1)
        frac = F(a, b)
        sold2 = s.add(f"{_q(left1)} * {frac.numerator} / {frac.denominator}", left1 * frac)
        ans = s.add(f"{_q(left1)} - {_q(sold2)}", left1 - sold2)
        text = (
            f"A shop has {n} {item}. On Monday it sells {p}% of them, and on Tuesday it sells "
            f"{format_number(frac)} of the remaining {item}. How many {item} are left?"
        )
    elif kind == 1:
        # Tank: a/b full, add L liters -> c/d full. Capacity = L / (c/d - a/b).
        while True:
            b, d = r.choice([2, 3, 4, 5, 6]), r.choice([2, 3, 4, 5, 6])
            x, y = F(r.randint(1, b - 1), b), F(r.randint(1, d - 1), d)
            if y > x:
                break
        cap = (y - x).denominator * r.randint(2, 12)
        liters = cap * (y - x)
        diff = s.add(f"{_q(y)} - {_q(x)}", y - x)
        ans = s.add(f"{_q(liters)} / {_q(diff)}", liters / diff)
        text = (
            f"A water tank is {format_number(x)} full. After {format_number(liters)} liters are added, "
            f"it is {format_number(y)} full. How many liters does the full tank hold?"
        )
    elif kind == 2:
        # Two pipes filling together: a*b/(a+b) hours (often a simple fraction).
        a, b = r.randint(2, 12), r.randint(2, 12)
        ra = s.add(f"1 / {a}", F(1, a))
        rb = s.add(f"1 / {b}", F(1, b))
        both = s.add(f"{_q(ra)} + {_q(rb)}", ra + rb)
        ans = s.add(f"1 / {_q(both)}", 1 / both)
        text = (
            f"Pipe A can fill a pool in {a} hours and pipe B can fill it in {b} hours. "
            f"Working together, how many hours do they take to fill the pool? Give the exact value."
        )
    else:
        # Price up by p%, then down by q%, then a coupon; integral by construction.
        p, q = r.choice([10, 20, 25, 50]), r.choice([10, 20, 25, 50])
        price = 400 * r.randint(1, 5)
        coupon = r.choice([5, 10, 15, 20])
        up = s.add(f"{price} * (100 + {p}) / 100", F(price * (100 + p), 100))
        down = s.add(f"{_q(up)} * (100 - {q}) / 100", up * F(100 - q, 100))
        ans = s.add(f"{_q(down)} - {coupon}", down - coupon)
        good = r.choice(GOODS)
        text = (
            f"A {good} costs ${price}. Its price rises by {p}%, and later the new price is cut by {q}%. "
            f"{name} then uses a ${coupon} coupon. How many dollars does {name} pay?"
        )
    return text, s, ans


_MAKERS: dict[int, Callable[[random.Random], tuple[str, _Steps, F]]] = {
    1: _level1,
    2: _level2,
    3: _level3,
    4: _level4,
    5: _level5,
}


def generate_problems(
    n: int,
    seed: int = 0,
    levels: tuple[int, ...] | list[int] = LEVELS,
    max_tries: int = 200,
) -> list[GeneratedProblem]:
    """``n`` distinct problems, levels dealt round-robin from ``levels``.

    Raises ValueError when a level cannot produce enough distinct problems
    (level 1 has a few thousand) instead of silently returning fewer.
    """
    levels = sorted({int(x) for x in levels})
    bad = [x for x in levels if x not in _MAKERS]
    if bad or not levels:
        raise ValueError(f"generator levels must be a non-empty subset of {list(LEVELS)}, got {levels}")
    if n < 0:
        raise ValueError(f"number of problems must be >= 0, got {n}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[GeneratedProblem] = []
    for i in range(n):
        level = levels[i % len(levels)]
        for _ in range(max_tries):
            text, steps, ans = _MAKERS[level](rng)
            if text not in seen:
                break
        else:
            raise ValueError(
                f"generator: could not draw a new distinct level-{level} problem after {max_tries} tries "
                f"({len(out)} made); ask for fewer problems or include more levels"
            )
        seen.add(text)
        out.append(
            GeneratedProblem(problem=text, answer=format_number(ans), solution=steps.render(ans), difficulty=level)
        )
    return out
