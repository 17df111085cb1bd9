"""The search's report: the comparison table (markdown), the reward curve and the per-layer format chart (PNG)."""

from __future__ import annotations

import re
from pathlib import Path


def comparison_markdown(rows: list[dict]) -> str:
    """rows: {name, avg_bits, reward, loss, kl, kl_ref_quant, entropy, heldout: {...} | None, evaluations}.

    Search-batch columns first, then the held-out batch's (never used to choose); attention entropy only
    when it was measured."""
    ent = any(r.get("entropy") for r in rows)
    head = ["recipe", "avg bits", "reward", "KL(ref‖q)", "KL(q‖ref)", "loss"] + (["attn entropy"] if ent else []) + \
        ["held-out reward", "held-out KL(ref‖q)", "held-out KL(q‖ref)", "held-out loss", "evaluations"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        h = r.get("heldout") or {}
        hv = [f"{h[k]:.4f}" if k in h else "" for k in ("reward", "kl_ref_quant", "kl", "loss")]
        cells = [r["name"], f"{r['avg_bits']:.4f}", f"{r['reward']:.4f}", f"{r['kl_ref_quant']:.4f}",
                 f"{r['kl']:.4f}", f"{r['loss']:.4f}"] + ([f"{r['entropy']:.4f}"] if ent else []) + \
            hv + [str(r.get("evaluations", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_rewards(path: Path, ppo_returns: list[float], random_returns: list[float] | None,
                 refs: dict[str, float], window: int = 16) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def running(xs):
        return [sum(xs[max(0, i - window + 1): i + 1]) / len(xs[max(0, i - window + 1): i + 1]) for i in range(len(xs))]

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ppo_returns, ".", alpha=0.3, color="C0")
    ax.plot(running(ppo_returns), color="C0", label=f"PPO (mean of {window})")
    if random_returns:
        ax.plot(running(random_returns), color="C1", label=f"random (mean of {window})")
    for i, (name, v) in enumerate(refs.items()):
        ax.axhline(v, ls="--", lw=1, color=f"C{i + 2}", label=name)
    ax.set_xlabel("episode")
    ax.set_ylabel("episode reward R")
    ax.set_title("precision search: episode reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_formats(path: Path, unit_names: list[str], formats: list[str], recipes: dict[str, tuple]) -> None:
    """One row per recipe, one cell per unit, coloured by format."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    names = list(recipes)
    grid = [list(recipes[n]) for n in names]
    fig, ax = plt.subplots(figsize=(min(18, max(6, 0.12 * len(unit_names) + 3)), 0.45 * len(names) + 1.8))
    cmap = ListedColormap([f"C{i}" for i in range(len(formats))])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(formats) - 0.5, interpolation="nearest")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    blocks = [re.search(r"\.(\d+)(\.|$)", n) for n in unit_names]
    blocks = [int(m.group(1)) if m else i for i, m in enumerate(blocks)]
    starts = [i for i in range(len(blocks)) if i == 0 or blocks[i] != blocks[i - 1]]  # first unit of each block
    per = len(unit_names) // max(len(starts), 1)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in unit_names}, key=[n.rsplit(".", 1)[-1] for n in unit_names].index)
    ax.set_xticks(starts, [str(blocks[i]) for i in starts], fontsize=7)
    for x in starts[1:]:
        ax.axvline(x - 0.5, color="white", lw=0.6)
    ax.set_xlabel("decoder block" + (f" (each: {', '.join(kinds[:per])})" if per > 1 and not kinds[0].isdigit()
                                     else ""))
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i}") for i in range(len(formats))]
    ax.legend(handles, formats, ncol=len(formats), loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=8)
    ax.set_title("per-unit format")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
