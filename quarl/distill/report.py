"""The distill stage's report: before/after table and training curves.

``write_report(dir, rows, summary, title)`` writes ``report.md`` (the table the
Kubeflow UI shows) and ``curves.png`` (KL to the teacher and CE, on training
batches and on held-out text, loss and learning rate over the steps) when
matplotlib is installed (the CUDA image and dev installs have it; the slim CPU
image does not, and then ``report.md`` says so and carries the tables only).
"""

from __future__ import annotations

import math
from pathlib import Path

CURVES = [
    ("train/kl", "KL(teacher || student), training batches"),
    ("eval/kl", "KL(teacher || student), held-out"),
    ("train/ce", "CE on the labels, training batches"),
    ("eval/ce", "CE on the labels, held-out"),
    ("loss", "loss"),
    ("lr", "learning rate"),
]


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(int(r["step"]) + 1)
            ys.append(float(v))
    return xs, ys


def plot_curves(rows: list[dict], path: Path, before: dict | None = None) -> bool:
    """curves.png; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, title) in zip(axes.flat, CURVES):
        xs, ys = _series(rows, key)
        if before and key.startswith("eval/") and key[5:] in before:
            xs, ys = [0, *xs], [before[key[5:]], *ys]
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.5g}"
    return "" if v is None else str(v)


def write_report(out_dir: str | Path, rows: list[dict], summary: dict, title: str) -> Path:
    out = Path(out_dir)
    has_png = plot_curves(rows, out / "curves.png", summary.get("eval_before"))
    b, a = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    lines = [f"# {title}", "",
             (f"- teacher: `{summary.get('teacher_uri')}`; student init: `{summary.get('model_uri')}` "
              f"({summary.get('student', {}).get('init')})"),
             (f"- objective: {summary.get('objective')}; student mode: {summary.get('student', {}).get('mode')}; "
              f"data: {summary.get('data_source')} ({summary.get('train_sequences')} sequences)"),
             f"- steps: {summary.get('total_steps')}; wall time {_fmt(summary.get('wall_s'))} s", "",
             "## Held-out text (the student after re-quantization)", "",
             "| metric | before | after |", "|---|---:|---:|"]
    for k, name in (("kl", "KL(teacher || student), nats/token"), ("ce", "CE, nats/token"), ("ppl", "perplexity")):
        lines.append(f"| {name} | {_fmt(b.get(k))} | {_fmt(a.get(k))} |")
    acc_b, acc_a = summary.get("accuracy_before"), summary.get("accuracy_after")
    if acc_a is not None:
        lines.append(f"| held-out accuracy (greedy) | {_fmt(acc_b)} | {_fmt(acc_a)} |")
    if summary.get("teacher_eval"):
        t = summary["teacher_eval"]
        lines += ["", f"Teacher on the same text: CE {_fmt(t.get('ce'))}, accuracy {_fmt(t.get('accuracy'))}."]
    lines += ["", "## Curves", ""]
    lines.append("![curves](curves.png)" if has_png else "(matplotlib is not installed: no curves image; "
                 "metrics.jsonl has every step)")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
