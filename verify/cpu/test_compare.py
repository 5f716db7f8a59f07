"""Tests for `repro.evidence.compare`: open-loop latency ratios at one rate, and a run against its baseline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from repro.evidence.compare import before_after, before_after_rows, latency_ratios, ratio_rows
from repro.evidence.results import Cell, summarize
from verify.benchdata import cell, request


def opened(algorithm: str = "AR", budget: int | None = None, rate: float = 2.0, schedule: str | None = None) -> Cell:
    """An open-loop cell at ``rate`` capped at 8 in flight."""
    return replace(cell(algorithm, budget, 8), request_rate=rate, schedule=schedule)


def rows(c: Cell, seconds: float, n: int = 6) -> list[dict]:
    """``n`` requests of 64 tokens one after the other, taking about ``seconds`` each (TTFT 10 ms)."""
    took = [seconds * (1 + 0.05 * (i % 3)) for i in range(n)]
    return [request(c, i, start=sum(took[:i]), end=sum(took[: i + 1]), verify=16) | {"latency_s": took[i]}
            for i in range(n)]


class TestLatencyRatios:
    def test_each_cell_is_set_over_its_baselines_at_its_rate(self) -> None:
        """DFLASH over AR, DDTREE over AR and DFLASH, a schedule also over each fixed budget; the
        other rate's cell and closed-loop cells pair with nothing."""
        sched = opened("DDTREE", schedule="1:63,16:15")
        data = (rows(opened(), 2.0) + rows(opened("DFLASH"), 1.0) + rows(opened("DDTREE", 16), 0.8)
                + rows(sched, 0.7) + rows(opened("DDTREE", 16, rate=5.0), 0.8) + rows(cell("DFLASH"), 1.0))
        pairs = {(r.cell.label, r.over, r.cell.request_rate) for r in latency_ratios(summarize(data))}
        assert pairs == {("DFLASH", "AR", 2.0), ("DDTREE B=16", "AR", 2.0), ("DDTREE B=16", "DFLASH", 2.0),
                         ("DDTREE S=1:63,16:15", "AR", 2.0), ("DDTREE S=1:63,16:15", "DFLASH", 2.0),
                         ("DDTREE S=1:63,16:15", "DDTREE B=16", 2.0)}

    def test_the_ratio_is_of_the_medians_with_an_interval(self) -> None:
        """DDTREE's requests take 0.8 of DFLASH's: median TPOT and E2E ratios 0.8, each in its interval."""
        (ratio,) = latency_ratios(summarize(rows(opened("DFLASH"), 1.0) + rows(opened("DDTREE", 16), 0.8)))
        for name in ("TPOT p50", "E2E p50"):
            got = ratio.figures[name]
            assert got.value == pytest.approx(0.8, rel=0.02) and got.low <= got.value <= got.high
        assert ratio_rows([ratio])[0][:6] == ["p", "DDTREE B=16", "DFLASH", "8", "2/s", "0"]


class TestBeforeAfter:
    def test_cells_in_both_runs_compare_figure_by_figure(self) -> None:
        """A cell 20% faster after: tok/s 1.25x with its interval; cells on one side are listed apart."""
        before = summarize(rows(cell("DDTREE", 16), 1.0) + rows(cell("DDTREE", 32), 1.0))
        after = summarize(rows(cell("DDTREE", 16), 0.8) + rows(opened("DDTREE", 16), 0.8))
        got = before_after(before, after)
        figures = {r["figure"]: r for r in got["rows"]}
        assert list(figures) == ["tok/s", "TPOT p50 ms", "tau"]
        assert figures["tok/s"]["ratio"]["value"] == pytest.approx(1.25, rel=0.03)
        assert figures["tok/s"]["ratio"]["low"] < 1.25 < figures["tok/s"]["ratio"]["high"]
        assert figures["tau"]["ratio"]["value"] == pytest.approx(1.0)
        assert got["only_before"] == ["p DDTREE B=32 c=1 T=0 humaneval"]
        assert got["only_after"] == ["p DDTREE B=16 rate=2/s c<=8 T=0 humaneval"]
        assert before_after_rows(got["rows"])[0][:7] == ["p", "humaneval", "DDTREE B=16", "1", "-", "0", "tok/s"]

    def test_open_loop_cells_compare_latency(self) -> None:
        """An open-loop cell before and after compares TPOT and E2E medians and p90s, and tau."""
        got = before_after(summarize(rows(opened("DFLASH"), 1.0)), summarize(rows(opened("DFLASH"), 1.1)))
        assert [r["figure"] for r in got["rows"]] == ["TPOT p50 ms", "TPOT p90 ms", "E2E p50 ms", "E2E p90 ms", "tau"]
        assert got["rows"][2]["ratio"]["value"] == pytest.approx(1.1)
