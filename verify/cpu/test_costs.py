"""Tests for `repro.tuning.costs`: round costs from bench records, interpolation, the throughput model."""

from __future__ import annotations

import pytest

from repro.tuning.costs import CostModel, cell_costs, interpolate, predict_tok_s
from verify.tunedata import bench_records, linear_round_ms

TAUS = [1.0 + 0.02 * b for b in range(129)]


@pytest.fixture(scope="module")
def costs():
    """Costs of AR, DFLASH and DDTREE B = 0/8/32/128 at c = 1, 4 with linear round times."""
    return cell_costs(bench_records(TAUS, linear_round_ms, budgets=[0, 8, 32, 128], concurrency=[1, 4]), "p", 0.0)


class TestCellCosts:
    def test_round_time_tau_and_throughput_per_cell(self, costs):
        """T_round is decode time over verify rounds (AR: over tokens after the first), tau is
        tokens over rounds, tok/s is bench's tokens over wall time."""
        by = {(c.algorithm, c.budget, c.concurrency): c for c in costs}
        tree = by["DDTREE", 32, 4]
        rounds = round(127 / TAUS[32])
        assert tree.round_ms == pytest.approx(linear_round_ms("DDTREE", 32, 4))
        assert tree.tau == pytest.approx(128 / rounds)
        assert tree.ttft_ms == pytest.approx(20.0)
        latency = (20 + rounds * linear_round_ms("DDTREE", 32, 4)) / 1e3
        assert tree.tok_s == pytest.approx(4 * 128 / latency)
        ar = by["AR", None, 1]
        assert ar.tau is None and ar.round_ms == pytest.approx(linear_round_ms("AR", None, 1))
        assert len(costs) == 2 * 6

    def test_other_profiles_and_temperatures_are_left_out(self):
        """Only the named profile's cells at the asked temperature count."""
        records = bench_records(TAUS, linear_round_ms, budgets=[8], concurrency=[1], profile="q")
        assert cell_costs(records, "p", 0.0) == [] and cell_costs(records, "q", 1.0) == []


class TestInterpolate:
    def test_piecewise_linear_inside_none_outside(self):
        """Straight lines between points; nothing outside them."""
        pts = [(8.0, 10.0), (32.0, 22.0), (0.0, 6.0)]
        assert interpolate(pts, 16) == pytest.approx(14.0)
        assert interpolate(pts, 4) == pytest.approx(8.0)
        assert interpolate(pts, 32) == 22.0
        assert interpolate(pts, 33) is None and interpolate([], 1) is None
        assert interpolate([(5.0, 2.0)], 5) == 2.0


class TestModel:
    def test_linear_costs_interpolate_exactly(self, costs):
        """Round costs linear in B are recovered exactly between the fitted budgets."""
        model = CostModel(costs, fit={8, 128})
        assert model.budgets(4) == [8, 128]
        assert model.round_ms(4, 32) == pytest.approx(linear_round_ms("DDTREE", 32, 4))
        assert model.round_ms(4, 200) is None and model.round_ms(4, 0) is None

    def test_drafter_cost_is_the_b0_round_minus_an_ar_step(self, costs):
        """D(c) = T_round(c, 0) - T_AR(c): measured with a B = 0 cell, extrapolated without."""
        assert CostModel(costs).drafter_ms(4) == (pytest.approx(2.0 + 0.5 * 4), False)
        assert CostModel(costs, fit={8, 32}).drafter_ms(4) == (pytest.approx(2.0 + 0.5 * 4), True)
        assert CostModel(costs, fit={8}).drafter_ms(4) is None

    def test_closed_loop_throughput(self):
        """c clients x M tokens over TTFT + (M - 1)/tau rounds of T_round."""
        assert predict_tok_s(4, 101, 10.0, 5.0, 2.5) == pytest.approx(4 * 101 / ((10 + 40 * 5) / 1e3))
