"""PNG figures (matplotlib, headless): the report's speedup and tau vs budget, TP vs EP and tune;
the top-K benchmark's time against batch size.

Each function writes one file and returns None, or returns a sentence saying why there was
nothing to plot (the report prints it in place of the figure).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np

from repro.algorithms import AR, DDTREE, DFLASH
from repro.evidence.results import CellSummary, label_order
from repro.evidence.verdicts import TpEpPoint
from repro.files import atomic_output
from repro.tuning.acceptance import Estimate, ratio_estimates


def unavailable() -> str | None:
    """Why no figure can be drawn (matplotlib is not installed), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (`pip install matplotlib`)"
    return None


def _pyplot() -> Any:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, panels: int) -> tuple[Any, list[Any]]:
    """A figure with ``panels`` axes, two per row; spare axes are hidden."""
    cols = min(panels, 2)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[panels:]:
        ax.set_visible(False)
    return fig, flat[:panels]


def _log2_axis(ax: Any, values: list[int]) -> None:
    """A base-2 x axis ticked at ``values``; a tick within 1.19x of the last labelled one (B 17 beside
    B 16) keeps no label, so labels never overlap."""
    ticks = sorted(set(values))
    labels, last = [], None
    for v in ticks:
        close = last is not None and v < last * 1.19
        labels.append("" if close else str(v))
        last = last if close else v
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.minorticks_off()


def _save(fig: Any, path: Path) -> None:
    """Write the figure whole (no half-written PNG survives a crash) and free it."""
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
    _pyplot().close(fig)  # pyplot keeps every figure it made until closed


def _ratios(here: list[CellSummary]) -> tuple[str, dict[tuple[int, int | None], float]] | None:
    """(baseline, {(concurrency, budget): DDTREE tok/s over it}) of one panel: over AR where the
    cells have AR speedups, else over the DFLASH cell of the same concurrency; None without either."""
    tree = [s for s in here if s.cell.algorithm == DDTREE and s.cell.budget is not None and s.cell.request_rate is None]
    with_ar = {(s.cell.concurrency, s.cell.budget): s.speedup for s in tree if s.speedup is not None}
    if with_ar:
        return AR, with_ar
    over = {(s.cell.concurrency, s.cell.budget): s.over_dflash for s in tree if s.over_dflash is not None}
    return (DFLASH, over) if over else None


def _levels(ax: Any, cells: list[CellSummary], baseline: str, color: str) -> None:
    """Horizontal lines of one concurrency's cells that have no budget: DFLASH over AR dashed, a
    budget schedule over the baseline dotted."""
    for s in cells:
        if baseline == AR and s.cell.algorithm == DFLASH and s.speedup:
            ax.axhline(s.speedup, color=color, linestyle="--", linewidth=1)
        ratio = s.speedup if baseline == AR else s.over_dflash
        if s.cell.schedule is not None and ratio:
            ax.axhline(ratio, color=color, linestyle=":", linewidth=1.5)


def speedup_vs_budget(summaries: list[CellSummary], path: Path) -> str | None:
    """DDTREE speedup over AR against the budget, a line per concurrency, DFLASH dashed; a panel
    (a profile, prompt set and temperature) without AR cells shows DDTREE over DFLASH instead."""
    panels = []
    several = len({s.cell.prompts for s in summaries}) > 1
    for key in sorted({(s.cell.profile, s.cell.prompts, s.cell.temperature) for s in summaries
                       if s.cell.algorithm == DDTREE}):
        here = [s for s in summaries if (s.cell.profile, s.cell.prompts, s.cell.temperature) == key]
        ratios = _ratios(here)
        if ratios is not None:
            panels.append((key, here, *ratios))
    if not panels:
        return "no DDTREE cell has an AR or DFLASH baseline to compute a speedup from"
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels))
    colors = {c: f"C{k}" for k, c in enumerate(sorted({c for *_, ratios in panels for c, _ in ratios}))}
    for ax, ((profile, prompts, temp), here, baseline, ratios) in zip(axes, panels, strict=True):
        for conc in sorted({c for c, _ in ratios}):
            color = colors[conc]  # one color a concurrency in every panel
            pts = sorted((b, r) for (c, b), r in ratios.items() if c == conc)
            ax.plot(*zip(*pts, strict=True), marker="o", color=color, label=f"c={conc}")
            _levels(ax, [s for s in here if s.cell.concurrency == conc and s.cell.request_rate is None], baseline, color)
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--" if baseline == DFLASH else "-")
        _log2_axis(ax, [b for _, b in ratios])
        ax.set_xlabel("DDTree budget B (non-root nodes)")
        ax.set_ylabel(f"output tok/s over {baseline}")
        note = "DFLASH dashed" if baseline == AR else "DFLASH = 1 (no AR cell)"
        if any(s.cell.schedule is not None for s in here):
            note += ", schedule dotted"
        where = f"{profile} ({prompts})" if several else profile
        ax.set_title(f"{where}, T={temp:g}: DDTREE solid, {note}", fontsize=10)
        ax.legend(fontsize=8, title="concurrency", title_fontsize=8)
        ax.grid(alpha=0.3)
    _save(fig, path)
    return None


def _tau_estimates(cells: list[CellSummary]) -> dict[int | None, Estimate]:
    """Mean tau per request with its 95% interval, pooled over concurrency: per DDTREE budget, and
    DFLASH's under None."""
    pooled: dict[int | None, list[float]] = {}
    for s in cells:
        pooled.setdefault(s.cell.budget if s.cell.algorithm == "DDTREE" else None, []).extend(s.taus)
    return {b: ratio_estimates(np.array(t)[:, None], np.ones(len(t)))[0] for b, t in pooled.items()}


def tau_vs_budget(summaries: list[CellSummary], path: Path) -> str | None:
    """Mean tau per request against the DDTREE budget B, with its 95% interval over requests
    (pooled over concurrency), a color per temperature; DFLASH's tau dashed with its interval
    shaded. A panel a profile and prompt set (a set's tau is its prompts')."""
    spec = [s for s in summaries if s.taus and (s.cell.algorithm == "DFLASH" or s.cell.budget is not None)]
    panels = sorted({(s.cell.profile, s.cell.prompts) for s in spec if s.cell.algorithm == "DDTREE"})
    if not panels:
        return "no DDTREE cell of a fixed budget reported spec_verify_ct, so there is no tau to plot against B"
    several = len({prompts for _, prompts in panels}) > 1
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels))
    colors = {t: f"C{k}" for k, t in enumerate(sorted({s.cell.temperature for s in spec}))}
    for ax, (profile, prompts) in zip(axes, panels, strict=True):
        mine = [s for s in spec if (s.cell.profile, s.cell.prompts) == (profile, prompts)]
        budgets = []
        for temp in sorted({s.cell.temperature for s in mine}):
            est = _tau_estimates([s for s in mine if s.cell.temperature == temp])
            color = colors[temp]  # one color a temperature in every panel
            tree = sorted((b, e) for b, e in est.items() if b is not None)
            if tree:
                xs, es = zip(*tree, strict=True)
                ax.errorbar(xs, [e.value for e in es], yerr=[[e.value - e.low for e in es], [e.high - e.value for e in es]],
                            marker="o", capsize=3, color=color, label=f"DDTREE T={temp:g}")
                budgets += xs
            if None in est:
                ax.axhline(est[None].value, color=color, linestyle="--", linewidth=1, label=f"DFLASH T={temp:g}")
                ax.axhspan(est[None].low, est[None].high, color=color, alpha=0.12)
        _log2_axis(ax, budgets)
        ax.set_xlabel("DDTree budget B (non-root nodes)")
        ax.set_ylabel("tau per request (tokens per verify round)")
        ax.set_title(f"{profile} ({prompts}): mean and 95% interval" if several else f"{profile}: mean and 95% interval",
                     fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _save(fig, path)
    return None


TOPK_SERIES = (
    ("fused_graph_us", "fused top-K + lse", "o", "-"),
    ("torch_topk_graph_us", "torch.topk", "s", "-"),
    ("log_softmax_topk_graph_us", "log_softmax + torch.topk", "^", "-"),
    ("read_once_graph_us", "read once (torch.amax)", "v", ":"),
    ("floor_us", "HBM floor (bytes / 4.3 TB/s)", "", "--"),
)
"""bench_topk row columns drawn by :func:`topk_vs_batch`: (column, label, marker, line style)."""


def topk_vs_batch(rows: list[dict[str, Any]], path: Path) -> str | None:
    """Microseconds per call against bs (log-log) of each ``TOPK_SERIES`` column of
    ``verify/bench/bench_topk.py`` rows (random logits only), a panel per (K, V); the issue's
    targets as black crosses."""
    timed = [r for r in rows if r.get("kind", "random") == "random" and "fused_graph_us" in r]
    if not timed:
        return "no random-logit row was timed, so there is no top-K curve to plot"
    panels = sorted({(r["k"], r["vocab"]) for r in timed})
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels))
    for ax, (k, vocab) in zip(axes, panels, strict=True):
        here = sorted((r for r in timed if (r["k"], r["vocab"]) == (k, vocab)), key=lambda r: r["bs"])
        for column, label, marker, style in TOPK_SERIES:
            pts = [(r["bs"], r[column]) for r in here if math.isfinite(r.get(column, math.nan))]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, linestyle=style, label=label)
        targets = [(r["bs"], r["target_us"]) for r in here if "target_us" in r]
        if targets:
            ax.plot(*zip(*targets, strict=True), "kx", markersize=9, label="target")
        _log2_axis(ax, [r["bs"] for r in here])
        ax.set_yscale("log")
        ax.set_xlabel("batch size (rows = 15 x bs)")
        ax.set_ylabel("µs per call (CUDA graph)")
        ax.set_title(f"K {k}, V {vocab}, {here[0].get('dtype', 'bf16')} logits", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    _save(fig, path)
    return None


def tp_ep_throughput(points: list[TpEpPoint], path: Path) -> str | None:
    """Output tok/s against concurrency: TP solid, TP+EP dashed, a color per algorithm."""
    if not points:
        return "no cell was measured on both a TP and a TP+EP profile of one machine"
    panels = sorted({(p.machine, p.temperature) for p in points})
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels))
    for ax, (machine, temp) in zip(axes, panels, strict=True):
        here = [p for p in points if (p.machine, p.temperature) == (machine, temp)]
        for k, label in enumerate(sorted({p.label for p in here}, key=label_order)):
            line = sorted((p.concurrency, p.tp_tok_s, p.ep_tok_s) for p in here if p.label == label)
            conc, tp, ep = zip(*line, strict=True)
            ax.plot(conc, tp, marker="o", color=f"C{k}", label=f"{label} TP")
            ax.plot(conc, ep, marker="s", color=f"C{k}", linestyle="--", label=f"{label} TP+EP")
        _log2_axis(ax, [p.concurrency for p in here])
        ax.set_xlabel("concurrency (closed-loop clients)")
        ax.set_ylabel("output tok/s")
        ax.set_title(f"{machine}: {here[0].tp_profile} vs {here[0].ep_profile}, T={temp:g}",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _save(fig, path)
    return None


def verify_cost_vs_tokens(rows: list[dict[str, Any]], path: Path, *, title: str = "") -> str | None:
    """Milliseconds per target forward against N tokens per request (log2 axis), a color per
    batch size: GPU busy time solid, wall time dashed (rows of ``verify/bench/verify_cost.py``)."""
    timed = [r for r in rows if "gpu_busy_ms" in r and "wall_ms" in r]
    if not timed:
        return "no (bs, N) point was timed, so there is no verify-cost curve to plot"
    plt = _pyplot()
    fig, (ax,) = _grid(plt, 1)
    for k, bs in enumerate(sorted({r["bs"] for r in timed})):
        pts = sorted((r["n"], r["gpu_busy_ms"], r["wall_ms"]) for r in timed if r["bs"] == bs)
        n, busy, wall = zip(*pts, strict=True)
        ax.plot(n, busy, marker="o", color=f"C{k}", label=f"bs {bs}: GPU busy")
        ax.plot(n, wall, linestyle="--", color=f"C{k}", label=f"bs {bs}: wall (eager)")
    _log2_axis(ax, [2 ** round(math.log2(r["n"])) for r in timed])
    ax.set_xlabel("N tokens per request (a DDTree verify of budget B has N = B + 1)")
    ax.set_yscale("log")
    ax.set_ylabel("ms per forward")
    ax.set_title(f"{title}: target forward cost against N" if title else "target forward cost against N",
                 fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    _save(fig, path)
    return None


def tune_prediction(tunes: list[dict[str, Any]], path: Path) -> str | None:
    """Per `repro tune` result: predicted DDTREE tok/s against B per concurrency (measured cells as
    dots, hollow when held out of the fit; DFLASH dashed; the recommendation starred), and predicted
    against measured with the +-10% band."""
    tunes = [t for t in tunes if t["checks"]]
    if not tunes:
        return "no `repro tune` result with a measured cell to compare a prediction with"
    plt = _pyplot()
    fig, axes = _grid(plt, 2 * len(tunes))
    colors = {c: f"C{k}" for k, c in enumerate(sorted({row["concurrency"] for t in tunes for row in t["concurrency"]}))}
    for k, tune in enumerate(tunes):
        _tune_curves(axes[2 * k], tune, colors)
        _tune_scatter(axes[2 * k + 1], tune)
    _save(fig, path)
    return None


def _tune_name(tune: dict[str, Any]) -> str:
    """The profile, and the prompt set its cells ran (tune records carry it since 2026-12-06)."""
    return f"{tune['profile']} {tune['prompts']}" if "prompts" in tune else tune["profile"]


def _tune_curves(ax: Any, tune: dict[str, Any], colors: dict[int, str]) -> None:
    budgets = []
    for row in tune["concurrency"]:
        color = colors[row["concurrency"]]  # one color a concurrency in every panel
        if row["curve"]:
            xs, ys = zip(*row["curve"], strict=True)
            ax.plot(xs, ys, color=color, label=f"c={row['concurrency']}")
            ax.plot([row["budget"]], [row["tok_s"]], "*", color=color, markersize=12)
            budgets += [b for b in (xs[0], xs[-1]) if b > 0]
        if row["dflash_tok_s"]:
            ax.axhline(row["dflash_tok_s"], color=color, linestyle="--", linewidth=1)
        mine = [c for c in tune["checks"] if c["concurrency"] == row["concurrency"]]
        for check in mine:
            ax.plot([check["budget"]], [check["measured"]], "o", color=color,
                    markerfacecolor=color if check["fit"] else "none")
        budgets += [c["budget"] for c in mine if c["budget"] > 0]
    _log2_axis(ax, budgets or [1])
    ax.set_xlabel("DDTree budget B")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"{_tune_name(tune)}: predicted (lines), measured (dots, hollow held out), DFLASH dashed", fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _tune_scatter(ax: Any, tune: dict[str, Any]) -> None:
    pts = [(c["measured"], c["predicted"], c["fit"]) for c in tune["checks"]]
    top = 1.1 * max(max(m, p) for m, p, _ in pts)
    ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="gray", alpha=0.15, label="+-10%")
    ax.plot([0, top], [0, top], color="gray", linewidth=0.8)
    for fit, label in ((True, "fit"), (False, "held out")):
        mine = [(m, p) for m, p, f in pts if f == fit]
        if mine:
            ax.plot(*zip(*mine, strict=True), "o", markerfacecolor="C0" if fit else "none", color="C0", label=label)
    ax.set_xlabel("measured tok/s")
    ax.set_ylabel("predicted tok/s")
    ax.set_title(f"{_tune_name(tune)} T={tune['temperature']:g}: prediction vs measurement", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
