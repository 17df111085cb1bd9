"""The search's report: the comparison table (markdown), the reward curve and the per-layer format chart (PNG)."""

from __future__ import annotations

from pathlib import Path


def comparison_markdown(rows: list[dict]) -> str:
    """rows: {name, avg_bits, loss, kl, kl_ref_quant, entropy, reward, heldout: {...} | None, evaluations}."""
    head = ("| recipe | avg bits | reward | loss | KL(q‖ref) | attn entropy | held-out loss | held-out KL(q‖ref) | "
            "held-out KL(ref‖q) | evaluations |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        h = r.get("heldout") or {}
        hv = [f"{h[k]:.4f}" if k in h else "" for k in ("loss", "kl", "kl_ref_quant")]
        lines.append(f"| {r['name']} | {r['avg_bits']:.3f} | {r['reward']:.4f} | {r['loss']:.4f} | {r['kl']:.4f} | "
                     f"{r['entropy']:.4f} | {hv[0]} | {hv[1]} | {hv[2]} | {r.get('evaluations', '')} |")
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
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * len(unit_names)), 0.6 * len(names) + 1.6))
    cmap = ListedColormap([f"C{i}" for i in range(len(formats))])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(formats) - 0.5, interpolation="nearest")
    ax.set_yticks(range(len(names)), names)
    step = max(1, len(unit_names) // 30)
    ax.set_xticks(range(0, len(unit_names), step), [unit_names[i].rsplit(".", 1)[-1] if unit_names[i].rsplit(".", 1)[-1]
                                                      .isdigit() else unit_names[i].split(".", 2)[-1]
                                                      for i in range(0, len(unit_names), step)], rotation=90,
                  fontsize=7)
    ax.set_xlabel("unit (decoder block / group)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i}") for i in range(len(formats))]
    ax.legend(handles, formats, ncol=len(formats), loc="upper center", bbox_to_anchor=(0.5, -0.35), fontsize=8)
    ax.set_title("per-unit format")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
