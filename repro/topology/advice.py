"""The advice text: which collectives each configuration runs, where EP wins or loses and why, and the
budget each configuration wants per concurrency, from the model's predictions (repro.topology.model).
"""

from __future__ import annotations

from typing import Any

from repro.algorithms import AR, DDTREE
from repro.topology.model import CONCURRENCY, Box, best

NAMES = {"tp": "TP8", "ep": "TP8 + EP8 (a2a none)", "deepep": "TP8 + EP8 (DeepEP)"}
ARGS = {"tp": "--tp-size {p}", "ep": "--tp-size {p} --ep-size {p}",
        "deepep": "--tp-size {p} --ep-size {p} --moe-a2a-backend deepep"}


def name(config: str, p: int) -> str:
    """``TP8 + EP8 (a2a none)`` for p GPUs."""
    return NAMES[config].replace("8", str(p))


def cell_label(row: dict[str, Any]) -> str:
    """``AR``, ``DFLASH``, ``DDTREE B 16``."""
    return row["algorithm"] + (f" B {row['budget']}" if row["budget"] else "")


def collectives_line(box: Box, rows: list[dict[str, Any]], config: str) -> str:
    """What ``config`` runs a round at c 1 (AR) and how long, in one sentence."""
    r = next(r for r in rows if r["config"] == config and r["algorithm"] == AR and r["concurrency"] == 1)
    ar = [c for c in r["collectives"] if c["op"] == "all-reduce"]
    count = sum(c["count"] for c in ar)
    impl = sorted({c["impl"] for c in ar})
    if config == "deepep":
        ops = ", ".join(f"{c['count']} {c['op']}" for c in r["collectives"])
        return (f"{name(config, box.gpus)}: {ops} a forward ({r['collectives_ms']:.2f} ms at c 1); the shared expert "
                f"is whole on every GPU")
    return (f"{name(config, box.gpus)}: {count} all-reduces of [T, 7168] bf16 ({', '.join(impl)}) + the logits "
            f"all-gather a forward: {r['collectives_ms']:.2f} ms at c 1 (AR), the same in both a2a-none configurations")


def ep_reason(rows: list[dict[str, Any]], concurrency: int) -> str:
    """Why EP (a2a none) wins or loses against TP at one concurrency, for DDTREE's best TP budget."""
    tp = best(rows, config="tp", concurrency=concurrency)
    ep = next((r for r in rows if r["config"] == "ep" and r["concurrency"] == concurrency
               and (r["algorithm"], r["budget"]) == (tp["algorithm"], tp["budget"])), None) if tp else None
    if tp is None or ep is None:
        return ""
    wins = ep["tok_s"] > tp["tok_s"]
    why = ""
    if wins and ep["expert_gb"] > tp["expert_gb"]:
        why = ("; it wins despite the bytes because its fused MoE's per-layer floor is lower (48 wide experts "
               "against 384 narrow slices, measured on one GPU)")
    elif not wins and ep["expert_gb"] <= tp["expert_gb"] * 1.01:
        why = "; the bytes are equal here, and EP's 64-row M tiles (past 48 tokens a layer) cost it the difference"
    return (f"c {concurrency}, {cell_label(tp)} (T = {tp['tokens']}): EP {'wins' if wins else 'loses'} ({ep['tok_s']:.0f} "
            f"vs {tp['tok_s']:.0f} tok/s): its most-loaded GPU reads {ep['experts_read']:.0f} whole experts a layer "
            f"({ep['rank_share']:.0%} of the token-expert pairs) against TP's {tp['experts_read']:.0f} one-eighth "
            f"slices: {ep['expert_gb']:.1f} vs {tp['expert_gb']:.1f} GB of experts a forward; the collectives are "
            f"the same ({ep['collectives_ms']:.2f} ms){why}")


def budget_lines(box: Box, rows: list[dict[str, Any]], configs: list[str]) -> list[str]:
    """Per configuration, the fastest algorithm / budget at each concurrency."""
    out = []
    for config in configs:
        picks = []
        for c in CONCURRENCY:
            r = best(rows, config=config, concurrency=c)
            if r is not None:
                picks.append(f"c {c}: {cell_label(r)} {r['tok_s']:.0f} tok/s")
        out.append(f"{name(config, box.gpus)} wants {'; '.join(picks)}")
    return out


def allreduce_bound(rows: list[dict[str, Any]]) -> str:
    """Where DDTREE's verify turns collective-bound (the collectives over half the round)."""
    bound = [r for r in rows if r["config"] == "tp" and r["algorithm"] == DDTREE
             and r["collectives_ms"] > 0.5 * r["round_ms"]]
    if not bound:
        return "no DDTREE cell spends half its round in collectives under TP"
    first = min(bound, key=lambda r: r["tokens"])
    return (f"TP's DDTREE verify turns collective-bound from T = {first['tokens']} ({cell_label(first)} at c "
            f"{first['concurrency']}: {first['collectives_ms']:.1f} of {first['round_ms']:.1f} ms): the all-reduce "
            f"payload grows with N = B + 1, so large budgets cost collectives before compute")


def advice(box: Box, rows: list[dict[str, Any]], configs: list[str]) -> list[str]:
    """The advice lines for one box."""
    lines = [collectives_line(box, rows, c) for c in configs]
    if "deepep" not in configs:
        lines.append(f"DeepEP: not on {box.fabric.key} (it needs NVLink P2P between every GPU pair: DeepEP README); "
                     f"SGLang would refuse --moe-a2a-backend deepep here")
    lines.append("DP attention: DFLASH refuses it (arg_groups/speculative_hook.py:155-158), so attention stays TP "
                 "in every configuration")
    lines += [line for c in CONCURRENCY if (line := ep_reason(rows, c))]
    lines.append(allreduce_bound(rows))
    lines += budget_lines(box, rows, configs)
    top = best(rows)
    if top is not None:
        lines.append(f"fastest predicted: {name(top['config'], box.gpus)} {cell_label(top)} at c {top['concurrency']} "
                     f"({top['tok_s']:.0f} tok/s); SGLang arguments: {ARGS[top['config']].format(p=box.gpus)}")
    return lines


def table(rows: list[dict[str, Any]], configs: list[str], p: int) -> list[str]:
    """Markdown: tok/s (round ms) per configuration x cell at each concurrency."""
    heads = [f"{name(c, p)} c {k}" for c in configs for k in CONCURRENCY]
    out = ["| cell | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for label in dict.fromkeys(cell_label(r) for r in rows):
        cells = []
        for c in configs:
            for k in CONCURRENCY:
                r = next((r for r in rows if r["config"] == c and r["concurrency"] == k and cell_label(r) == label), None)
                cells.append("-" if r is None else f"{r['tok_s']:.0f} ({r['round_ms']:.1f})")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out
