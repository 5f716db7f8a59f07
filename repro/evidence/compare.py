"""Cell against cell, each ratio with its 95% interval (:mod:`repro.evidence.intervals`).

Under an open-loop load below saturation every algorithm delivers the offered tokens, so throughput
ratios sit at 1; what differs is how long each request takes. :func:`latency_ratios` sets an
open-loop cell's median and p90 TPOT and end-to-end latency over those of its baselines at the same
rate: AR and DFLASH, and for a DDTREE budget schedule each fixed-budget DDTREE cell.
:func:`before_after` compares a run with its baseline run (a change's before and after) cell by cell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from repro.algorithms import AR, DDTREE, DFLASH
from repro.evidence import intervals
from repro.evidence.intervals import Ratio, Statistic
from repro.evidence.latency import rate_text
from repro.evidence.results import Cell, CellSummary

Figure = tuple[Callable[[CellSummary], Sequence], Statistic]  # per-request values of a summary, statistic
LATENCY_FIGURES: dict[str, Figure] = {
    "TPOT p50": (lambda s: s.samples.tpot_s, intervals.percentile(50)),
    "TPOT p90": (lambda s: s.samples.tpot_s, intervals.percentile(90)),
    "E2E p50": (lambda s: s.samples.e2e_s, intervals.percentile(50)),
    "E2E p90": (lambda s: s.samples.e2e_s, intervals.percentile(90)),
}
RATIO_HEADERS = ("profile", "algorithm", "over", "c", "rate", "T", *LATENCY_FIGURES)


@dataclass(frozen=True)
class LatencyRatio:
    """An open-loop cell's latency figures over a baseline cell's at the same load (None: unmeasured)."""

    cell: Cell
    over: str  # the baseline's label
    figures: dict[str, Ratio | None]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self.cell), "over": self.over,
                "figures": {k: None if r is None else asdict(r) for k, r in self.figures.items()}}


def _is_baseline(base: Cell, cell: Cell) -> bool:
    """AR for every other algorithm, DFLASH for DDTREE, a fixed-budget DDTREE cell for a schedule."""
    if base.algorithm == AR:
        return cell.algorithm != AR
    if base.algorithm == DFLASH:
        return cell.algorithm == DDTREE
    return base.schedule is None and cell.schedule is not None


def _load(cell: Cell) -> tuple[Any, ...]:
    """What two cells must share to be compared: all but the algorithm and budget (or schedule)."""
    return (cell.profile, cell.prompts, cell.temperature, cell.max_new_tokens, cell.request_rate, cell.concurrency,
            cell.api)


def latency_ratios(summaries: Iterable[CellSummary]) -> list[LatencyRatio]:
    """Every open-loop cell's latency over each of its baselines at the same rate, cap and temperature."""
    opened = [s for s in summaries if s.cell.request_rate is not None]
    return [LatencyRatio(s.cell, base.cell.label,
                         {name: intervals.figure_ratio(values(s), values(base), stat)
                          for name, (values, stat) in LATENCY_FIGURES.items()})
            for s in opened for base in opened
            if _load(base.cell) == _load(s.cell) and _is_baseline(base.cell, s.cell)]


def ratio_rows(ratios: Iterable[LatencyRatio]) -> list[list[str]]:
    """Rows of :data:`RATIO_HEADERS`."""
    return [[r.cell.source, r.cell.label, r.over, str(r.cell.concurrency), rate_text(r.cell.request_rate),
             f"{r.cell.temperature:g}", *("-" if x is None else x.text("x") for x in r.figures.values())]
            for r in ratios]


def subject(cell: Cell) -> str:
    """A cell in words: ``p DDTREE B=16 c=4 T=0 humaneval``."""
    return f"{cell.profile} {cell.label} {cell.load} T={cell.temperature:g} {cell.prompts}"


def _figures(cell: Cell) -> dict[str, tuple[Callable[[CellSummary], float | None], Figure]]:
    """The figures a before/after row compares: throughput and tau closed loop, latency open loop."""
    tok_s = (lambda s: s.output_tok_s, (lambda s: list(zip(s.samples.tokens, s.samples.e2e_s, strict=True)),
                                        intervals.throughput))
    tau = (lambda s: s.tau_mean, (lambda s: s.taus, intervals.mean))
    tpot50 = (lambda s: s.tpot_ms and s.tpot_ms.p50, LATENCY_FIGURES["TPOT p50"])
    if cell.request_rate is None:
        return {"tok/s": tok_s, "TPOT p50 ms": tpot50, "tau": tau}
    return {"TPOT p50 ms": tpot50, "TPOT p90 ms": (lambda s: s.tpot_ms and s.tpot_ms.p90, LATENCY_FIGURES["TPOT p90"]),
            "E2E p50 ms": (lambda s: s.e2e_ms and s.e2e_ms.p50, LATENCY_FIGURES["E2E p50"]),
            "E2E p90 ms": (lambda s: s.e2e_ms and s.e2e_ms.p90, LATENCY_FIGURES["E2E p90"]), "tau": tau}


def before_after(before: list[CellSummary], after: list[CellSummary]) -> dict[str, Any]:
    """Cell by cell, each figure before and after with the after/before ratio and its interval
    (``rows``), and the cells measured on one side only (``only_before``, ``only_after``)."""
    old = {s.cell.key: s for s in before}
    rows = []
    for s in after:
        base = old.get(s.cell.key)
        if base is None:
            continue
        for name, (value, (values, stat)) in _figures(s.cell).items():
            now, then = value(s), value(base)
            if now is None or then is None:
                continue
            got = intervals.ratio(now / then, values(s), values(base), stat) if then else None
            rows.append({**asdict(s.cell), "figure": name, "before": then, "after": now,
                         "ratio": None if got is None else asdict(got)})
    new = {s.cell.key for s in after}
    return {"rows": rows, "only_before": [subject(s.cell) for s in before if s.cell.key not in new],
            "only_after": [subject(s.cell) for s in after if s.cell.key not in old]}


BEFORE_AFTER_HEADERS = ("profile", "prompts", "algorithm", "c", "rate", "T", "figure", "before", "after", "after/before")
_WHOLE = 100  # figures from here up are shown without decimals


def before_after_rows(rows: Iterable[dict[str, Any]]) -> list[list[str]]:
    """Rows of :data:`BEFORE_AFTER_HEADERS` from :func:`before_after`'s ``rows``."""
    def number(v: float) -> str:
        return f"{v:.3g}" if abs(v) < _WHOLE else f"{v:.0f}"

    out = []
    for r in rows:
        cell = Cell(**{k: r[k] for k in Cell.__dataclass_fields__})
        got = r["ratio"]
        out.append([cell.profile, cell.prompts, cell.label, str(cell.concurrency), rate_text(cell.request_rate),
                    f"{cell.temperature:g}", r["figure"], number(r["before"]), number(r["after"]),
                    "-" if got is None else Ratio(**got).text("x")])
    return out
