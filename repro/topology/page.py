"""The markdown page of a ``repro topology --predict PROFILE -o DIR``: the predicted table, the advice, and
the observed figures of collectives.toml ``[[comparisons]]`` beside the model's cell, each gap in a
sentence. docs/TOPOLOGY.md carries these pages' tables (verify/cpu/test_topology_page.py keeps them equal).
"""

from __future__ import annotations

from typing import Any

from repro.topology.advice import cell_label, name, table
from repro.topology.collectives import Table
from repro.topology.model import Box, Served, predict_round


def comparison_rows(pred: dict[str, Any], served: Served, tab: Table, *, cal: Any, spread: str) -> list[str]:
    """Markdown rows: each comparison on ``pred``'s GPU class with the model's tok/s for its cell (its own
    fabric: a P2P-off figure is set beside the P2P-off prediction)."""
    out = []
    for comp in tab.comparisons:
        cell = comp["cell"]
        if cell["gpu"] != pred["gpu"]:
            continue
        box = Box(tab.gpus[cell["gpu"]], tab.fabrics[cell["fabric"]], pred["gpus"])
        r = predict_round(served, box, cell["config"], cell["algorithm"], cell.get("budget"), int(cell["concurrency"]),
                          cal=cal, spread=spread)
        model = (f"{r['tok_s']:.0f}: {name(cell['config'], pred['gpus'])} {cell_label(r)} c {r['concurrency']}, "
                 f"{cell['fabric']}")
        out.append(f"| {comp['source']} | {comp['ran']} | {comp['figure']} | {model} | {comp['gap']} |")
    return out


def page(pred: dict[str, Any], served: Served, tab: Table, *, cal: Any) -> str:
    """The whole page (markdown) of one prediction (``repro.topology.prediction``'s dict)."""
    lines = [f"# Predicted tok/s (round ms): {pred.get('profile', pred['box'])}", "",
             f"Box {pred['box']}, {pred['spread']} router; compute: {pred['calibration']['source']}.", "",
             *table(pred["rows"], pred["configs"], pred["gpus"]), "", "## Advice", "",
             *(f"- {line}" for line in pred["advice"])]
    rows = comparison_rows(pred, served, tab, cal=cal, spread=pred["spread"])
    if rows:
        lines += ["", "## Observed figures beside the model", "",
                  "| source | what ran | figure | the model (tok/s: cell, fabric) | the gap |", "|---|---|---|---|---|",
                  *rows]
    return "\n".join(lines) + "\n"
