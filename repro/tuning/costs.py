"""Measured round costs of a deployment (from `repro bench` results) and the throughput they predict.

Per closed-loop cell (algorithm, budget, concurrency c): ``T_round`` = decode seconds per verify round =
sum(latency - TTFT) / sum(rounds) over its requests (rounds: ``spec_verify_ct``; AR: one step per
token after the prefill's first). It includes whatever the server does between rounds (scheduling,
other requests' prefills), which is what throughput pays.

Measured throughput, closed loop, by Little's law: ``c * tokens / sum(latency)`` over the cell's
requests, i.e. c clients that each start a request as the last one ends. `repro bench` reports tokens
over wall time instead; the two agree for a refilling client, but under ``--interleave`` a cell runs in
waves of c that each end with their slowest request, and the wall time then holds that straggler wait
(10-15% at c 4 / 16 on qwen3-8b), which a served load never pays.

Prediction, closed loop (c clients, M new tokens per request, no think time): a client finishes a
request every ``TTFT + R * T_round`` seconds with ``R = (M - 1) / tau`` rounds after the prefill's
first token, so ``tok/s = c * M / (TTFT + (M - 1) / tau * T_round)``; for long outputs that is
``c * tau / T_round``. Between measured budgets ``T_round`` and TTFT are interpolated linearly in
B (verify work grows with the B + 1 verify tokens per request, the drafter's does not); outside
them nothing is predicted.

Drafter cost ``D(c) = T_round(c, 0) - T_AR(c)``: a B = 0 round is one drafter block and a
one-token verify, an AR step is a one-token decode. Without a B = 0 cell ``T_round(c, 0)`` is
extrapolated linearly from the two smallest budgets (and said so).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from repro.algorithms import AR, DDTREE
from repro.evidence.results import Cell, completed


@dataclass(frozen=True)
class CellCost:
    """The measured costs of one benchmark cell."""

    algorithm: str
    budget: int | None
    concurrency: int
    requests: int
    round_ms: float  # decode ms per verify round (AR: per token)
    ttft_ms: float  # mean time to first token
    tau: float | None  # completion tokens / verify rounds, bonus included (None for AR)
    tok_s: float  # closed-loop output tok/s by Little's law: c * tokens / sum(latency) (module docstring)
    new_tokens: int  # max_new_tokens of the cell

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def cell_costs(records: Iterable[dict[str, Any]], profile: str, temperature: float) -> list[CellCost]:
    """The costs of every cell of ``profile`` at ``temperature`` in bench records (a budget
    schedule's cells are not one budget's: they are left out)."""
    records = list(records)
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    cells: dict[str, Cell] = {}
    for r in records:
        if completed(r):
            cell = Cell(**r["cell"])
            if (cell.profile == profile and cell.temperature == temperature and cell.schedule is None
                    and cell.request_rate is None):
                cells[cell.key] = cell
                rows[cell.key].append(r)
    out = []
    for key, group in rows.items():
        cell = cells[key]
        rounds = [r["spec_verify_ct"] if r.get("spec_verify_ct") else r["completion_tokens"] - 1 for r in group]
        decode_s = sum(r["latency_s"] - r["ttft_s"] for r in group)
        spec = all(r.get("spec_verify_ct") for r in group)
        tokens = sum(r["completion_tokens"] for r in group)
        out.append(CellCost(
            algorithm=cell.algorithm, budget=cell.budget, concurrency=cell.concurrency, requests=len(group),
            round_ms=1e3 * decode_s / max(sum(rounds), 1), ttft_ms=1e3 * sum(r["ttft_s"] for r in group) / len(group),
            tau=tokens / sum(rounds) if spec else None,
            tok_s=cell.concurrency * tokens / sum(r["latency_s"] for r in group), new_tokens=cell.max_new_tokens))
    return sorted(out, key=lambda c: (c.algorithm, c.budget or 0, c.concurrency))


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """The piecewise-linear curve through ``points`` (distinct x) at ``x``; None outside them."""
    pts = sorted(points)
    if not pts or not pts[0][0] <= x <= pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1]  # a single point, at x


def predict_tok_s(concurrency: int, new_tokens: int, ttft_ms: float, round_ms: float, tau: float) -> float:
    """Closed-loop output tok/s of ``concurrency`` clients (module docstring)."""
    return concurrency * new_tokens / (1e-3 * (ttft_ms + (new_tokens - 1) / tau * round_ms))


class CostModel:
    """DDTREE round costs per concurrency, interpolated over the budgets measured (``fit``)."""

    def __init__(self, costs: Sequence[CellCost], fit: set[int] | None = None) -> None:
        self.costs = list(costs)
        self.tree = [c for c in self.costs if c.algorithm == DDTREE and (fit is None or c.budget in fit)]

    def _points(self, concurrency: int, name: str) -> list[tuple[float, float]]:
        return [(float(c.budget), getattr(c, name)) for c in self.tree if c.concurrency == concurrency]

    def budgets(self, concurrency: int) -> list[int]:
        """DDTREE budgets measured (and fitted) at ``concurrency``."""
        return sorted({c.budget for c in self.tree if c.concurrency == concurrency and c.budget is not None})

    def round_ms(self, concurrency: int, budget: int) -> float | None:
        """Interpolated T_round(c, B) in ms; None outside the measured budgets."""
        return interpolate(self._points(concurrency, "round_ms"), budget)

    def ttft_ms(self, concurrency: int, budget: int) -> float | None:
        """Interpolated TTFT(c, B) in ms; None outside the measured budgets."""
        return interpolate(self._points(concurrency, "ttft_ms"), budget)

    def measured(self, algorithm: str, concurrency: int, budget: int | None = None) -> CellCost | None:
        """The measured cell of ``algorithm`` (and budget) at ``concurrency``, if any."""
        for c in self.costs:
            if (c.algorithm, c.concurrency) == (algorithm, concurrency) and (algorithm != DDTREE or c.budget == budget):
                return c
        return None

    def drafter_ms(self, concurrency: int) -> tuple[float, bool] | None:
        """(D(c) in ms, whether T_round(c, 0) was extrapolated), or None without AR or two budgets."""
        ar = self.measured(AR, concurrency)
        pts = sorted(self._points(concurrency, "round_ms"))
        if ar is None or not pts or (pts[0][0] != 0 and len(pts) < 2):
            return None
        if pts[0][0] == 0:
            return pts[0][1] - ar.round_ms, False
        (x0, y0), (x1, y1) = pts[:2]
        return y0 - x0 * (y1 - y0) / (x1 - x0) - ar.round_ms, True
