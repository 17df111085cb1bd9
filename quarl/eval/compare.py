"""Compare eval artifacts problem by problem: is a quantized model really worse, or is it noise?

    rows = compare_runs([bf16_uri, nvfp4_uri])      # the first run is the baseline
    print(compare_markdown(rows))

Accuracy differences between two runs on the same problems are *paired*: most
problems are solved (or failed) by both, so the per-problem difference
``d_p = acc_B(p) - acc_A(p)`` has a much smaller standard error,
``std(d) / sqrt(P)``, than the two unpaired errors combined. Next to it:

* ``same_answer``  -- fraction of samples (matched by problem and sample index)
  whose extracted answers are equal as strings;
* ``same_text``    -- fraction whose completions are identical (with greedy
  decoding, how often quantization did not change a single token);
* ``gained`` / ``lost`` -- problems only run B / only the baseline got right
  (at least one correct sample), the discordant pairs a McNemar test counts.

Reads ``metrics.json`` and ``samples.jsonl`` through ``open_artifact`` (local
or ``s3://``, checksums verified).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np

__all__ = ["compare_markdown", "compare_runs"]


def _load(uri: str) -> tuple[dict, dict[str, dict[str, list[dict]]]]:
    from quarl.artifacts import open_artifact

    art = open_artifact(uri, kind="metrics")
    metrics = json.loads(art.file("metrics.json").read_text())
    samples: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    with open(art.file("samples.jsonl"), encoding="utf-8") as f:
        for line in f:
            s = json.loads(line)
            samples[s["benchmark"]][s["problem_id"]].append(s)
    return metrics, samples


def _label(metrics: dict, uri: str) -> str:
    m = metrics.get("model", {})
    q = m.get("quantization", "none")
    if q == "rtn":
        q = f"RTN {(m.get('recipe') or {}).get('default', '')}".strip()
    elif q == "none":
        q = m.get("dtype", "full precision")
    if m.get("adapter"):
        q += " + LoRA"
    return f"{q} ({uri})"


def compare_runs(uris: list[str]) -> list[dict]:
    """One row per (run, benchmark); runs after the first carry paired stats against it."""
    if len(uris) < 2:
        raise ValueError("compare needs at least two eval artifacts (the first is the baseline)")
    loaded = [_load(u) for u in uris]
    base_s = loaded[0][1]
    rows = []
    for i, (uri, (m, s)) in enumerate(zip(uris, loaded)):
        for bench, bm in m["benchmarks"].items():
            row = {"run": _label(m, uri), "benchmark": bench, "problems": bm["problems"], "n": bm["samples_per_problem"],
                   "accuracy": bm["accuracy"], "accuracy_stderr": bm["accuracy_stderr"],
                   "format_rate": bm["format_rate"], "mean_tokens": bm["response_tokens"]["mean"]}  # fmt: skip
            if i > 0 and bench in base_s:
                row.update(_paired(base_s[bench], s[bench]))
            rows.append(row)
    return rows


def _paired(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> dict:
    common = sorted(set(a) & set(b))
    if not common:
        return {"paired_problems": 0}
    acc = lambda ss: sum(x["correct"] for x in ss) / len(ss)
    d = np.array([acc(b[p]) - acc(a[p]) for p in common])
    pairs = [(x, y) for p in common for x, y in zip(sorted(a[p], key=lambda s: s["sample"]),
                                                    sorted(b[p], key=lambda s: s["sample"]))]  # fmt: skip
    solved_a = {p for p in common if any(x["correct"] for x in a[p])}
    solved_b = {p for p in common if any(x["correct"] for x in b[p])}
    return {
        "paired_problems": len(common),
        "delta": float(d.mean()),
        "delta_stderr": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0,
        "same_answer": float(np.mean([x["extracted_answer"] == y["extracted_answer"] for x, y in pairs])),
        "same_text": float(np.mean([x["completion"] == y["completion"] for x, y in pairs])),
        "gained": len(solved_b - solved_a),
        "lost": len(solved_a - solved_b),
    }


def compare_markdown(rows: list[dict]) -> str:
    """A table a person reads (accuracy in percent, deltas in points)."""
    head = ["run", "benchmark", "problems", "n", "accuracy % (± s.e.)", "Δ vs first (± paired s.e.)",
            "same answer %", "same text %", "gained / lost", "format %", "mean tokens"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    for r in rows:
        paired = "delta" in r
        out.append("| " + " | ".join([
            r["run"], r["benchmark"], str(r["problems"]), str(r["n"]),
            f"{100 * r['accuracy']:.1f} ± {100 * r['accuracy_stderr']:.1f}",
            f"{100 * r['delta']:+.1f} ± {100 * r['delta_stderr']:.1f}" if paired else "-",
            f"{100 * r['same_answer']:.0f}" if paired else "-",
            f"{100 * r['same_text']:.0f}" if paired else "-",
            f"{r['gained']} / {r['lost']}" if paired else "-",
            f"{100 * r['format_rate']:.1f}", f"{r['mean_tokens']:.0f}",
        ]) + " |")  # fmt: skip
    return "\n".join(out)
