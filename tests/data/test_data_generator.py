"""The built-in problem generator: deterministic, distinct, and correct."""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction

import pytest

from quarl.data.generator import LEVELS, format_number, generate_problems
from quarl.rewards import accuracy_reward

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def fraction_eval(expr: str) -> Fraction:
    """Evaluate + - * / and parentheses over exact Fractions (an independent oracle:
    Python's own parser, not the generator's arithmetic)."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        raise ValueError(f"unexpected syntax in {expr!r}")

    return ev(ast.parse(expr, mode="eval"))


def test_deterministic_per_seed_and_distinct():
    a = generate_problems(300, seed=7)
    b = generate_problems(300, seed=7)
    c = generate_problems(300, seed=8)
    assert a == b
    assert a != c
    assert len({p.problem for p in a}) == 300
    assert Counter(p.difficulty for p in a) == {lv: 60 for lv in LEVELS}


def test_levels_subset_and_errors():
    ps = generate_problems(20, seed=0, levels=[4, 5])
    assert {p.difficulty for p in ps} == {4, 5}
    with pytest.raises(ValueError, match="subset"):
        generate_problems(5, levels=[6])
    with pytest.raises(ValueError, match="distinct level-1"):
        generate_problems(20000, seed=0, levels=[1])  # level 1 has only a few thousand problems


def test_every_solution_step_is_exact_arithmetic_and_ends_in_the_answer():
    for p in generate_problems(500, seed=3):
        *steps, last = p.solution.splitlines()
        assert last == f"#### {p.answer}"
        value = None
        for line in steps:
            expr, _, stated = line.rpartition(" = ")
            value = fraction_eval(expr)
            assert value == fraction_eval(stated), (p.problem, line)
        assert format_number(value) == p.answer, p
        assert re.fullmatch(r"-?\d+(/\d+)?", p.answer), p.answer  # integer or simple fraction


def test_level_1_2_answers_match_the_problem_expression():
    # The problem text itself is the arithmetic: evaluate it independently.
    for p in generate_problems(200, seed=11, levels=[1, 2]):
        expr = re.sub(r"^(What is the value of|What is|Compute|Calculate|Evaluate) ", "", p.problem)[:-1]
        expr = expr.replace("×", "*").replace("÷", "/")
        assert format_number(fraction_eval(expr)) == p.answer, p.problem


def test_word_problem_numbers_come_from_the_text():
    # Every operand of the first step appears in the problem (or is a constant 1/100).
    for p in generate_problems(300, seed=5, levels=[3, 4, 5]):
        first = p.solution.splitlines()[0].rpartition(" = ")[0]
        for num in re.findall(r"\d+", first):
            assert num in re.findall(r"\d+", p.problem) or num in ("1", "100"), (p.problem, first)


def test_answers_are_accepted_by_the_reward():
    ps = generate_problems(100, seed=1)
    # The worked solution (ends in "#### answer") and a tagged answer both earn reward 1 ...
    assert accuracy_reward([p.solution for p in ps], [p.answer for p in ps]) == [1.0] * len(ps)
    tagged = [f"<think>...</think><answer>{p.answer}</answer>" for p in ps]
    assert accuracy_reward(tagged, [p.answer for p in ps]) == [1.0] * len(ps)
    # ... and a wrong number does not.
    wrong = [f"<answer>{Fraction(p.answer) + 1}</answer>" for p in ps]
    assert accuracy_reward(wrong, [p.answer for p in ps]) == [0.0] * len(ps)
