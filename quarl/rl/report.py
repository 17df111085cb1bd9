"""The RL stage's human-readable report: summary numbers and training curves.

``summarize(rows)`` condenses ``metrics.jsonl`` into ``summary.json`` numbers
(first/last-window means of reward, accuracy, entropy; time per step; tokens/s).
``write_report(dir, rows, summary, config)`` writes ``report.md`` (tables) and
``report.html`` (the same plus curves). Curves are inline SVG polylines drawn
here: the report is one self-contained file with no plotting dependency
(matplotlib is not a quarl dependency and is absent from the CPU image), which
opens in any browser and in the Kubeflow UI's HTML viewer.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

CURVES = [
    ("reward/mean", "reward (mean)"),
    ("reward/accuracy", "accuracy reward"),
    ("policy/entropy", "policy entropy (nats/token)"),
    ("response/length_mean", "response length (tokens)"),
    ("aqn/sigma", "AQN sigma"),
    ("mismatch/kl", "rollout/trainer KL"),
    ("grad_norm", "grad norm"),
    ("time/step_s", "step time (s)"),
]


def _series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append((int(r["step"]), float(v)))
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(rows: list[dict], window: int = 10) -> dict:
    """First/last-window means of the main curves, and timing."""
    out: dict = {"steps_logged": len(rows)}
    if not rows:
        return out
    w = max(1, min(window, len(rows) // 2 or 1))
    for key in ("reward/mean", "reward/accuracy", "reward/format", "policy/entropy", "response/length_mean",
                "mismatch/abs_logprob_diff", "mismatch/kl", "policy/clip_fraction"):
        vals = [v for _, v in _series(rows, key)]
        if vals:
            out[f"{key}/first{w}"] = _mean(vals[:w])
            out[f"{key}/last{w}"] = _mean(vals[-w:])
    step_s = [v for _, v in _series(rows, "time/step_s")]
    if step_s:
        out["time/step_s_mean"] = _mean(step_s)
        out["time/total_s"] = sum(step_s)
        for part in ("rollout", "logprob", "update"):
            out[f"time/{part}_s_mean"] = _mean([v for _, v in _series(rows, f"time/{part}_s")])
    tps = [v for _, v in _series(rows, "rollout/tokens_per_s")]
    if tps:
        out["rollout/tokens_per_s_mean"] = _mean(tps)
    mem = [v for _, v in _series(rows, "memory/peak_gb")]
    if mem:
        out["memory/peak_gb_max"] = max(mem)
    return out


def svg_line_chart(points: list[tuple[int, float]], title: str, width: int = 420, height: int = 220) -> str:
    """A minimal, dependency-free line chart (axes, min/max labels, one polyline)."""
    pad_l, pad_r, pad_t, pad_b = 56, 12, 24, 28
    t = html.escape(title)
    if not points:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
                f'<text x="8" y="16" font-size="13">{t}: no data</text></svg>')
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) * 0.05 or 0.5), y1 + (abs(y1) * 0.05 or 0.5)
    iw, ih = width - pad_l - pad_r, height - pad_t - pad_b

    def px(x):
        return pad_l + (x - x0) / (x1 - x0) * iw

    def py(y):
        return pad_t + (1 - (y - y0) / (y1 - y0)) * ih

    poly = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2"/>' for x, y in points) if len(points) <= 60 else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
        f'<text x="{pad_l}" y="15" font-size="13" font-weight="bold">{t}</text>'
        f'<rect x="{pad_l}" y="{pad_t}" width="{iw}" height="{ih}" fill="none" stroke="#ccc"/>'
        f'<text x="{pad_l - 4}" y="{pad_t + 10}" font-size="10" text-anchor="end">{y1:.4g}</text>'
        f'<text x="{pad_l - 4}" y="{pad_t + ih}" font-size="10" text-anchor="end">{y0:.4g}</text>'
        f'<text x="{pad_l}" y="{height - 8}" font-size="10">{x0}</text>'
        f'<text x="{pad_l + iw}" y="{height - 8}" font-size="10" text-anchor="end">step {x1}</text>'
        f'<polyline points="{poly}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
        f'<g fill="#1f77b4">{dots}</g></svg>'
    )


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_report(out_dir: str | Path, rows: list[dict], summary: dict, title: str = "quarl RL run") -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    items = [(k, v) for k, v in summary.items() if not isinstance(v, (dict, list))]
    md = [f"# {title}", "", "| metric | value |", "|---|---|"]
    md += [f"| {k} | {_fmt(v)} |" for k, v in items]
    md += ["", "Curves: see report.html (inline SVG) or the TensorBoard logs in `tensorboard/`.", ""]
    last = rows[-1] if rows else {}
    if last:
        md += ["## Last step", "", "| metric | value |", "|---|---|"]
        md += [f"| {k} | {_fmt(v)} |" for k, v in last.items()]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md) + "\n")

    charts = "".join(f'<div class="c">{svg_line_chart(_series(rows, k), label)}</div>' for k, label in CURVES)
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>" for k, v in items)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:24px}}"
        ".c{display:inline-block;margin:6px}td{padding:2px 10px;border-bottom:1px solid #eee}</style></head>"
        f"<body><h1>{html.escape(title)}</h1><div>{charts}</div><h2>Summary</h2><table>{table}</table></body></html>"
    )
    html_path = out / "report.html"
    html_path.write_text(page)
    return md_path, html_path
