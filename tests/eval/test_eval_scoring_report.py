"""Scoring (verdicts, avg@n, pass@k, s.e., by difficulty) and the report files."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from quarl.eval.benchmarks import Benchmark, EvalProblem
from quarl.eval.config import BenchmarkConfig
from quarl.eval.generate import Completion
from quarl.eval.report import render_markdown, write_report
from quarl.eval.scoring import benchmark_metrics, score_samples
from quarl.rewards import RewardConfig

GOOD = "<think>3 + 4 = 7</think> <answer>7</answer>"


def _bench():
    probs = [
        EvalProblem("p1", "3 + 4?", "7", "P1", "synthetic", 1),
        EvalProblem("p2", "1/2 + 1/4?", "3/4", "P2", "synthetic", 2),
        EvalProblem("p3", "10 * 10?", "100", "P3", "synthetic", 2),
    ]
    return Benchmark("toy", probs, BenchmarkConfig(name="heldout"), {"origin": "test", "available": 3})


def _completions():
    c = lambda t, n=10, tr=False: Completion(t, n, tr)
    return [
        [c(GOOD), c("The answer is \\boxed{7}."), c("<answer>8</answer>"), c("no idea", 50, True)],  # 2 of 4
        [c("<think>x</think><answer>\\frac{3}{4}</answer>"), c("0.75"), c("#### 0.75"), c("1/2")],  # 3 of 4
        [c("<answer>99</answer>"), c("101"), c(""), c("<answer></answer> 100")],  # 0 of 4: empty tag wins
    ]


@pytest.fixture(scope="module")
def scored():
    b = _bench()
    return b, score_samples(b, _completions(), RewardConfig(timeout_mode="none"))


def test_verdicts(scored):
    _, res = scored
    assert [[s.correct for s in g] for g in res] == [
        [True, True, False, False], [True, True, True, False], [False, False, False, False],
    ]  # fmt: skip
    assert [s.extraction_method for s in res[0]] == ["answer_tag", "boxed", "answer_tag", "none"]
    assert res[0][0].formatted and not res[0][1].formatted and res[1][0].formatted
    assert res[0][1].extracted_answer == "7" and res[0][3].extracted_answer is None
    assert (res[1][2].problem_id, res[1][2].sample, res[1][2].gold, res[1][2].difficulty) == ("p2", 2, "3/4", 2)
    assert res[0][3].truncated and res[0][3].length_tokens == 50


def test_metrics_against_hand_values(scored):
    b, res = scored
    m = benchmark_metrics(b, res, pass_k=[1, 2, 8])
    acc = [2 / 4, 3 / 4, 0.0]
    assert m["accuracy"] == pytest.approx(sum(acc) / 3)
    mean = sum(acc) / 3
    sd = math.sqrt(sum((a - mean) ** 2 for a in acc) / 2)
    assert m["accuracy_stderr"] == pytest.approx(sd / math.sqrt(3))
    # pass@2: 1 - C(n-c, 2)/C(4, 2) per problem: 1 - 1/6, 1 - 0, 0
    assert m["pass_at_k"] == pytest.approx({"1": sum(acc) / 3, "2": (5 / 6 + 1 + 0) / 3, "4": 2 / 3})
    assert "8" not in m["pass_at_k"]  # k > n is not reported; k = n always is
    assert (m["problems"], m["samples_per_problem"], m["samples"]) == (3, 4, 12)
    assert m["format_rate"] == pytest.approx(2 / 12)
    assert m["answer_found_rate"] == pytest.approx(9 / 12)  # "no idea", "" and the empty tag
    assert m["truncation_rate"] == pytest.approx(1 / 12)
    assert m["response_tokens"]["max"] == 50 and m["response_tokens"]["mean"] == pytest.approx((11 * 10 + 50) / 12)
    assert m["by_difficulty"] == {"1": {"problems": 1, "accuracy": 0.5},
                                  "2": {"problems": 2, "accuracy": pytest.approx(0.375)}}  # fmt: skip


def _doc(b, res):
    m = benchmark_metrics(b, res, [1, 2])
    m.update(origin="test <data>", template="qerl", generation={"seconds": 1.5, "generated_tokens": 160})
    return {
        "created": "2026-11-21T00:00:00+00:00",
        "model": {"model_uri": "tiny-llama", "quantization": "rtn", "recipe": {"default": "nvfp4"},
                  "layers": {"nvfp4": 14}, "dtype": "float32", "device": "cpu"},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "n": 4, "greedy": False, "max_new_tokens": 64, "seed": 0},
        "benchmarks": {"toy": m, "toy2": dict(m, by_difficulty=None)},
        "machine": {"summary": "test machine"},
    }  # fmt: skip


class _Tags(HTMLParser):
    VOID = frozenset({"meta", "br", "img", "hr", "input", "link"})

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.count = [], [], {}

    def handle_starttag(self, tag, attrs):
        self.count[tag] = self.count.get(tag, 0) + 1
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append((tag, list(self.stack[-3:])))
        else:
            self.stack.pop()


def test_report_files_are_well_formed(scored, tmp_path):
    b, res = scored
    doc = _doc(b, res)
    samples = {"toy": res, "toy2": res}
    names = write_report(tmp_path, doc, samples, examples=2)
    assert sorted(names) == sorted(p.name for p in tmp_path.iterdir())
    assert json.loads((tmp_path / "metrics.json").read_text())["benchmarks"]["toy"]["accuracy"] == pytest.approx(
        doc["benchmarks"]["toy"]["accuracy"])  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 24
    assert {"benchmark", "problem_id", "prompt", "completion", "extracted_answer", "gold", "correct",
            "length_tokens"} <= set(lines[0])  # fmt: skip
    md = (tmp_path / "report.md").read_text()
    table = [ln for ln in md.splitlines() if ln.startswith("|")][:4]
    assert len({ln.count("|") for ln in table}) == 1  # header, rule and rows have the same columns
    assert "| toy | 3 | 4 | 41.7 ± 22.0 |" in md
    assert "pass@2 %" in md and "pass@4 %" in md and "nvfp4" in md
    html = (tmp_path / "report.html").read_text()
    parser = _Tags()
    parser.feed(html)
    assert parser.errors == [] and parser.stack == []
    assert parser.count.get("svg") == 2 and parser.count.get("table", 0) >= 2
    assert "test &lt;data&gt;" in html  # escaped
    for svg in html.split("<svg")[1:]:
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")  # each plot is well-formed XML
    assert "toy" in html.split("<svg")[1]  # the accuracy chart labels the benchmarks


def test_markdown_examples_are_fenced_safely(scored):
    b, res = scored
    res = [[type(s)(**{**s.to_json(), "completion": "```\nrm -rf /\n```"}) for s in g] for g in res]
    md = render_markdown(_doc(b, res), {"toy": res}, examples=1)
    body = md.split("## Examples", 1)[1]
    assert body.count("```") == 2  # only our fence: the completion cannot close it
