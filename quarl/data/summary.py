"""summary.json / summary.md for a prepared dataset.

What a reviewer wants to know before spending GPU time on it: how many rows
per split and source, how long the prompts are (chars, and tokens when a
tokenizer is configured), how difficulty is distributed, what the filters
dropped, and a few example rows.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd

__all__ = ["build_summary", "summary_markdown"]


def _stats(values) -> dict:
    a = np.asarray(list(values), dtype=np.float64)
    if a.size == 0:
        return {"count": 0}
    return {
        "count": int(a.size),
        "min": int(a.min()),
        "mean": round(float(a.mean()), 1),
        "p50": int(np.percentile(a, 50)),
        "p95": int(np.percentile(a, 95)),
        "max": int(a.max()),
    }


def build_summary(
    df: pd.DataFrame,
    *,
    source_counts: dict[str, dict[str, int]],
    drops: dict[str, int],
    prompt_tokens: list[int] | None = None,
    template: str = "",
    examples: int = 3,
) -> dict:
    splits = {}
    for split in ("train", "eval"):
        part = df[df["split"] == split]
        diff = Counter("unknown" if pd.isna(d) else str(int(d)) for d in part["difficulty"])
        entry = {
            "rows": len(part),
            "by_source": {k: int(v) for k, v in sorted(Counter(part["source"]).items())},
            "difficulty_histogram": dict(sorted(diff.items())),
            "problem_chars": _stats(part["problem"].str.len()),
            "prompt_chars": _stats(part["prompt"].str.len()),
            "answer_chars": _stats(part["answer"].str.len()),
        }
        if prompt_tokens is not None:
            mask = (df["split"] == split).to_numpy()
            entry["prompt_tokens"] = _stats(np.asarray(prompt_tokens)[mask])
        splits[split] = entry
    ex = []
    for _, r in df[df["split"] == "train"].head(examples).iterrows():
        ex.append({"id": r["id"], "source": r["source"], "problem": r["problem"], "answer": r["answer"]})
    return {
        "rows": len(df),
        "template": template,
        "splits": splits,
        "sources": source_counts,
        "dropped": drops,
        "examples": ex,
    }


def summary_markdown(s: dict) -> str:
    lines = [f"# Dataset summary ({s['rows']} rows, template `{s['template']}`)", ""]
    lines += ["| split | rows | by source | difficulty |", "|---|---|---|---|"]
    for split, e in s["splits"].items():
        by = ", ".join(f"{k} {v}" for k, v in e["by_source"].items())
        hist = ", ".join(f"{k}: {v}" for k, v in e["difficulty_histogram"].items())
        lines.append(f"| {split} | {e['rows']} | {by} | {hist} |")
    lines += ["", "## Lengths", "", "| split | field | min | mean | p50 | p95 | max |", "|---|---|---|---|---|---|---|"]
    for split, e in s["splits"].items():
        for key in ("problem_chars", "prompt_chars", "prompt_tokens", "answer_chars"):
            st = e.get(key)
            if st and st.get("count"):
                lines.append(
                    f"| {split} | {key} | {st['min']} | {st['mean']} | {st['p50']} | {st['p95']} | {st['max']} |"
                )
    lines += ["", "## Sources", "", "| source | read | kept | dropped (per-source filters) |", "|---|---|---|---|"]
    for name, c in s["sources"].items():
        dropped = ", ".join(f"{k.removeprefix('dropped_')} {v}" for k, v in c.items() if k.startswith("dropped_") and v)
        lines.append(f"| {name} | {c.get('read', 0)} | {c.get('kept', 0)} | {dropped} |")
    lines += ["", "## Dropped by the filters", ""]
    lines += [f"- {k}: {v}" for k, v in s["dropped"].items()] or ["- nothing"]
    if s.get("examples"):
        lines += ["", "## Examples (train)", ""]
        for e in s["examples"]:
            lines.append(f"- `{e['id']}` ({e['source']}): {json.dumps(e['problem'])[:300]} -> **{e['answer']}**")
    return "\n".join(lines) + "\n"
