"""The eval artifact's payload: metrics.json, samples.jsonl, report.md and report.html.

    metrics.json   machine-readable: per benchmark accuracy (avg@n) ± s.e., pass@k,
                   format rate, response lengths, truncation, by-difficulty, timing;
                   the model (quantization, adapter), the resolved config, the machine
    samples.jsonl  one line per sample: benchmark, problem id, prompt, completion,
                   extracted answer, gold, correct, formatted, length, truncated --
                   what a person reads to see *why* a score is what it is
    report.md      the results table, per-difficulty accuracy, a few verbatim examples
    report.html    the same, self-contained (no network, no external files), with
                   two plots as inline SVG: accuracy per benchmark (with standard-error
                   bars and pass@k) and the response-length histogram

Plots are drawn with matplotlib's Agg backend into SVG text (``svg.fonttype:
none`` keeps labels as text, so the file stays small and searchable). Without
matplotlib the HTML says so and carries the tables only; the numbers never
depend on it.
"""

from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["accuracy_plot_svg", "length_hist_svg", "render_html", "render_markdown", "write_report"]

_MAX_EXAMPLE_CHARS = 2000


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _sampling_line(s: dict) -> str:
    if s.get("greedy"):
        how = "greedy (argmax)"
    else:
        how = f"temperature {s['temperature']}, top-p {s['top_p']}"
    return f"{how}; {s['n']} sample(s) per problem; max {s['max_new_tokens']} new tokens; seed {s['seed']}"


def _model_line(m: dict) -> str:
    q = m.get("quantization", "none")
    parts = [f"`{m.get('model_uri')}`"]
    if q == "rtn":
        recipe = m.get("recipe") or {}
        parts.append(f"RTN-quantized ({recipe.get('default', recipe)})")
    elif q == "calibrated checkpoint":
        parts.append("calibrated quantized checkpoint")
    else:
        parts.append("full precision")
    if m.get("layers"):
        parts.append("layers: " + ", ".join(f"{k} x{v}" for k, v in m["layers"].items()))
    if m.get("adapter"):
        a = m["adapter"]
        parts.append(f"LoRA adapter `{a['uri']}` (r={a['r']}, alpha={a['alpha']})")
    parts.append(f"{m.get('dtype')} on {m.get('device')}")
    return "; ".join(parts)


def _ks(doc: dict) -> list[str]:
    ks: list[str] = []
    for b in doc["benchmarks"].values():
        for k in b["pass_at_k"]:
            if k != "1" and k not in ks:
                ks.append(k)
    return sorted(ks, key=int)


def _table_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    ks = _ks(doc)
    head = [
        "benchmark",
        "problems",
        "n",
        "avg@n % (± s.e.)",
        *[f"pass@{k} %" for k in ks],
        "format %",
        "answer found %",
        "mean tokens",
        "truncated %",
        "gen. s",
    ]
    rows = []
    for name, b in doc["benchmarks"].items():
        rows.append([
            name, str(b["problems"]), str(b["samples_per_problem"]),
            f"{_pct(b['accuracy'])} ± {_pct(b['accuracy_stderr'])}",
            *[_pct(b["pass_at_k"].get(k)) for k in ks],
            _pct(b["format_rate"]), _pct(b["answer_found_rate"]), f"{b['response_tokens']['mean']:.0f}",
            _pct(b["truncation_rate"]), f"{b['generation']['seconds']:.0f}",
        ])  # fmt: skip
    return head, rows


def _examples(samples: dict[str, list[list[Any]]], k: int) -> dict[str, list[Any]]:
    """First sample of the first ``k`` problems of each benchmark."""
    return {name: [group[0] for group in groups[:k]] for name, groups in samples.items()}


def _clip(s: str, n: int = _MAX_EXAMPLE_CHARS) -> str:
    return s if len(s) <= n else s[:n] + f" … [{len(s) - n} more characters in samples.jsonl]"


def render_markdown(doc: dict, samples: dict[str, list[list[Any]]], examples: int = 3) -> str:
    head, rows = _table_rows(doc)
    out = [
        "# Evaluation report",
        "",
        f"- Model: {_model_line(doc['model'])}",
        f"- Sampling: {_sampling_line(doc['sampling'])}",
        f"- Created: {doc['created']} on {doc['machine']['summary']}",
        (
            "- Accuracy is avg@n (mean fraction of correct samples per problem, the papers' pass@1); "
            "pass@k is the unbiased estimator of Chen et al. (2021)."
        ),
        "",
        "## Results",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|",
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
    ]
    for name, b in doc["benchmarks"].items():
        out.append(
            f"- **{name}**: {b['origin']}; template `{b['template']}`; answers found by "
            + ", ".join(f"{m} {c}" for m, c in b["extraction"].items())
        )
    out.append("")
    diffs = {n: b["by_difficulty"] for n, b in doc["benchmarks"].items() if b.get("by_difficulty")}
    if diffs:
        out += ["## Accuracy by difficulty", ""]
        for name, by in diffs.items():
            out += [f"**{name}**", "", "| level | problems | avg@n % |", "|---:|---:|---:|"]
            out += [f"| {lv} | {d['problems']} | {_pct(d['accuracy'])} |" for lv, d in by.items()]
            out.append("")
    if examples:
        intro = (
            f"The first sample of the first {examples} problem(s) per benchmark; every sample is in `samples.jsonl`."
        )
        out += ["## Examples", "", intro, ""]
        for name, exs in _examples(samples, examples).items():
            out += [f"### {name}", ""]
            for s in exs:
                mark = "correct" if s.correct else "wrong"
                out += [
                    f"**{s.problem_id}** — gold `{s.gold}`, extracted `{s.extracted_answer}` "
                    f"({s.extraction_method}), **{mark}**, {s.length_tokens} tokens"
                    + (", truncated" if s.truncated else ""),
                    "",
                    "```text",
                    _clip(s.completion).replace("```", "ʼʼʼ"),
                    "```",
                    "",
                ]
    return "\n".join(out)


# ----------------------------------------------------------------------------- plots


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.find("<svg") :]  # drop the XML prolog and DOCTYPE: it is inlined in HTML


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"
    return plt


def accuracy_plot_svg(doc: dict) -> str:
    """Grouped bars: avg@n (± s.e.) and pass@k per benchmark, in percent."""
    plt = _plt()
    names = list(doc["benchmarks"])
    series = [
        (
            "avg@n",
            [doc["benchmarks"][n]["accuracy"] for n in names],
            [doc["benchmarks"][n]["accuracy_stderr"] for n in names],
        )
    ]
    for k in _ks(doc):
        series.append((f"pass@{k}", [doc["benchmarks"][n]["pass_at_k"].get(k, float("nan")) for n in names], None))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(names) * len(series) + 1.5), 3.4))
    try:
        for i, (label, vals, err) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
            bars = ax.bar(
                xs,
                [100 * v for v in vals],
                width,
                yerr=None if err is None else [100 * e for e in err],
                capsize=3,
                label=label,
            )
            for j, (b, v) in enumerate(zip(bars, vals)):
                if not math.isnan(v):
                    top_of_bar = b.get_height() + (100 * err[j] if err is not None else 0.0)  # above the error bar
                    ax.annotate(
                        f"{100 * v:.1f}",
                        (b.get_x() + b.get_width() / 2, top_of_bar),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        xytext=(0, 2),
                        textcoords="offset points",
                    )
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("accuracy (%)")
        top = max([100 * v for _, vals, _ in series for v in vals if not math.isnan(v)] + [1.0])
        ax.set_ylim(0, min(100.0, top * 1.25 + 2))
        ax.set_title("Accuracy per benchmark")
        if len(series) > 1:
            ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        return _svg(fig)
    finally:
        plt.close(fig)


def length_hist_svg(doc: dict, samples: dict[str, list[list[Any]]]) -> str:
    """Histogram of generated tokens per sample, one outline per benchmark; the token limit dashed."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    try:
        limit = doc["sampling"]["max_new_tokens"]
        bins = min(40, max(5, limit // 8))
        for name, groups in samples.items():
            lengths = [s.length_tokens for g in groups for s in g]
            ax.hist(lengths, bins=bins, range=(0, limit), histtype="step", linewidth=1.5, label=name)
        ax.axvline(limit, linestyle="--", color="gray", linewidth=1)
        ax.set_xlabel("generated tokens per sample")
        ax.set_ylabel("samples")
        ax.set_title("Response length")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        return _svg(fig)
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.3em .6em}
td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.6em;white-space:pre-wrap;word-break:break-word;font-size:90%}
.ok{color:#17692e;font-weight:600}.bad{color:#a31515;font-weight:600}.plots svg{max-width:100%;height:auto}
.meta li{margin:.2em 0}
"""


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = []
    for r in rows:
        tds = "".join(
            f"<td>{html.escape(c)}</td>" if i == 0 else f"<td class='num'>{html.escape(c)}</td>"
            for i, c in enumerate(r)
        )
        trs.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(trs)}</tbody></table>"


def render_html(doc: dict, samples: dict[str, list[list[Any]]], examples: int = 3) -> str:
    e = html.escape
    head, rows = _table_rows(doc)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>quarl eval report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Evaluation report</h1><ul class='meta'>",
        f"<li><b>Model</b>: {e(_model_line(doc['model']))}</li>",
        f"<li><b>Sampling</b>: {e(_sampling_line(doc['sampling']))}</li>",
        f"<li><b>Created</b>: {e(doc['created'])} on {e(doc['machine']['summary'])}</li>",
        (
            "<li>Accuracy is avg@n (mean fraction of correct samples per problem, the papers' pass@1); "
            "pass@k is the unbiased estimator of Chen et al. (2021).</li></ul>"
        ),
        "<h2>Results</h2>",
        _html_table(head, rows),
        "<ul>",
        *[
            f"<li><b>{e(n)}</b>: {e(b['origin'])}; template <code>{e(b['template'])}</code></li>"
            for n, b in doc["benchmarks"].items()
        ],
        "</ul><h2>Plots</h2><div class='plots'>",
    ]
    try:
        parts += [accuracy_plot_svg(doc), length_hist_svg(doc, samples)]
    except ImportError:
        parts.append(
            "<p>Plots need matplotlib (<code>pip install matplotlib</code>); the tables above are "
            "complete without it.</p>"
        )
    parts.append("</div>")
    diffs = {n: b["by_difficulty"] for n, b in doc["benchmarks"].items() if b.get("by_difficulty")}
    if diffs:
        parts.append("<h2>Accuracy by difficulty</h2>")
        for name, by in diffs.items():
            parts.append(f"<h3>{e(name)}</h3>")
            parts.append(
                _html_table(
                    ["level", "problems", "avg@n %"],
                    [[lv, str(d["problems"]), _pct(d["accuracy"])] for lv, d in by.items()],
                )
            )
    if examples:
        parts.append(
            f"<h2>Examples</h2><p>The first sample of the first {examples} problem(s) per benchmark; "
            "every sample is in <code>samples.jsonl</code>.</p>"
        )
        for name, exs in _examples(samples, examples).items():
            parts.append(f"<h3>{e(name)}</h3>")
            for s in exs:
                cls, mark = ("ok", "correct") if s.correct else ("bad", "wrong")
                parts.append(
                    f"<p><b>{e(s.problem_id)}</b> — gold <code>{e(s.gold)}</code>, extracted "
                    f"<code>{e(str(s.extracted_answer))}</code> ({e(s.extraction_method)}), "
                    f"<span class='{cls}'>{mark}</span>, {s.length_tokens} tokens"
                    f"{', truncated' if s.truncated else ''}</p><pre>{e(_clip(s.completion))}</pre>"
                )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out_dir: str | Path, doc: dict, samples: dict[str, list[list[Any]]], examples: int = 3) -> list[str]:
    """Write the four files into ``out_dir``; returns their names."""
    out = Path(out_dir)
    (out / "metrics.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
    with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
        for groups in samples.values():
            for group in groups:
                f.writelines(json.dumps(s.to_json(), ensure_ascii=False) + "\n" for s in group)
    (out / "report.md").write_text(render_markdown(doc, samples, examples) + "\n", encoding="utf-8")
    (out / "report.html").write_text(render_html(doc, samples, examples) + "\n", encoding="utf-8")
    return ["metrics.json", "samples.jsonl", "report.md", "report.html"]
