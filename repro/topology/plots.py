"""Figures of the TP / EP work (matplotlib, headless): the one-GPU shares' MoE layer against T, the
experts each reads and the most-loaded EP rank's share. Each function writes one PNG and returns None,
or returns why there was nothing to plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.files import atomic_output


def _pyplot() -> Any:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mean_by(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(T, mean of ``key``) over the rows of each T (the layers), sorted by T."""
    by_t: dict[int, list[float]] = {}
    for r in rows:
        if r.get(key) is not None:
            by_t.setdefault(int(r["t"]), []).append(float(r[key]))
    return sorted((t, sum(v) / len(v)) for t, v in by_t.items())


def share_cost_figure(rows: list[dict[str, Any]], path: Path, *, title: str = "") -> str | None:
    """Three panels against T = bs x N (log2): the MoE layer's us, the experts the GPU reads (TP8: slices
    of every picked expert; EP8: its own whole experts), and the most-loaded EP rank's share of the pairs."""
    timed = [r for r in rows if "us" in r]
    if not timed:
        return "no share_cost row was timed, so there is nothing to plot"
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
    styles = {"planted": "-", "skewed": "--"}
    colors = {"k26-tp8": "C0", "k26-ep8": "C3"}
    for share in sorted({r["share"] for r in timed}):
        for spread in sorted({r["spread"] for r in timed}):
            mine = [r for r in timed if r["share"] == share and r["spread"] == spread]
            if not mine:
                continue
            label = f"{share}, {spread}"
            for ax, key in ((axes[0], "us"), (axes[1], "experts")):
                pts = _mean_by(mine, key)
                ax.plot([t for t, _ in pts], [v for _, v in pts], styles.get(spread, ":"), marker="o", ms=3,
                        color=colors.get(share, "C7"), label=label)
            if share == "k26-ep8":
                pts = _mean_by(mine, "rank_share")
                axes[2].plot([t for t, _ in pts], [v for _, v in pts], styles.get(spread, ":"), marker="o", ms=3,
                             color=colors[share], label=label)
    axes[2].axhline(1 / 8, color="grey", lw=0.8, ls=":", label="balanced (1/8)")
    ylabels = ("us per MoE layer (CUDA graph)", "experts read per layer", "most-loaded EP rank's share of pairs")
    for ax, ylabel in zip(axes, ylabels, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T = bs x N tokens")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    fig.suptitle(f"one-GPU shares of Kimi-K2.6 at 8 GPUs: fused MoE layer{f' ({title})' if title else ''}", fontsize=10)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return None


def prediction_figure(pred: dict[str, Any], path: Path) -> None:
    """One panel per concurrency: predicted tok/s of each configuration across AR, DFLASH and DDTREE's budgets."""
    from repro.topology.advice import cell_label, name

    plt = _pyplot()
    levels = sorted({r["concurrency"] for r in pred["rows"]})
    fig, axes = plt.subplots(1, len(levels), figsize=(5.5 * len(levels), 4.2), squeeze=False)
    for ax, c in zip(axes[0], levels, strict=True):
        for i, config in enumerate(pred["configs"]):
            mine = [r for r in pred["rows"] if r["config"] == config and r["concurrency"] == c]
            ax.plot(range(len(mine)), [r["tok_s"] for r in mine], marker="o", ms=3, color=f"C{i}",
                    label=name(config, pred["gpus"]))
            ax.set_xticks(range(len(mine)), [cell_label(r).replace("DDTREE ", "") for r in mine], rotation=45,
                          fontsize=7)
        ax.set_title(f"c {c}", fontsize=9)
        ax.set_ylabel("predicted tok/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{pred.get('profile', '')} {pred['box']}: predicted tok/s ({pred['spread']} router)", fontsize=10)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
