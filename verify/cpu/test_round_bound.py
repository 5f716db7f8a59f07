"""CPU checks of verify/bench/round_bound.py: what τ and a verify-cost curve allow."""

from __future__ import annotations

import json

import pytest

from repro.testmodels import fullsize
from verify.bench import round_bound, verify_cost

TAUS = {"dflash": 4.0, "16": 5.0, "32": 6.0, "64": 6.5}


def _result(cost, model: str = "qwen3-8b") -> dict:
    return {"model": model, "rows": [{"bs": bs, "n": n, "gpu_busy_ms": cost(bs, n)}
                                     for bs in (1, 4) for n in verify_cost.TOKENS]}


def _row(rows, bs, algorithm, budget=None):
    return next(r for r in rows if (r["bs"], r["algorithm"], r["budget"]) == (bs, algorithm, budget))


class TestBound:
    def test_a_flat_verify_cost_and_a_free_drafter_give_the_tau_ratio(self):
        """Verify costing the same at every N, no drafter: DDTREE / DFLASH is the τ ratio and
        DFLASH / AR is DFLASH's τ."""
        rows = round_bound.bound(_result(lambda bs, n: 5.0), TAUS, block=16, draft_ms=0.0)
        assert _row(rows, 1, "DDTREE", 64)["over_dflash"] == pytest.approx(6.5 / 4.0)
        assert _row(rows, 4, "DFLASH")["over_ar"] == pytest.approx(4.0)
        assert {r["n"] for r in rows if r["algorithm"] == "DDTREE"} == {17, 33, 65}

    def test_a_rising_cost_moves_the_best_budget_down(self):
        """Verify cost 1 ms + 0.02 ms a token, drafter 1 ms: B 32 (6 / 2.66 ms) beats B 16
        (5 / 2.34) and B 64 (6.5 / 3.3); the rounds are drafter + verify(B + 1)."""
        rows = round_bound.bound(_result(lambda bs, n: 1.0 + 0.02 * n), TAUS, block=16, draft_ms=1.0)
        ddtree = [r for r in rows if r["bs"] == 1 and r["algorithm"] == "DDTREE"]
        assert [round(r["round_ms"], 6) for r in ddtree] == [2.34, 2.66, 3.3]
        assert max(ddtree, key=lambda r: r["tok_per_ms"])["budget"] == 32
        assert _row(rows, 1, "DFLASH")["round_ms"] == pytest.approx(1.0 + 1.0 + 0.32)

    def test_a_curve_short_of_the_budget_is_an_error(self):
        """Rows that stop before N = B + 1 name the batch size and the span."""
        result = {"model": "qwen3-8b", "rows": [{"bs": 1, "n": n, "gpu_busy_ms": 1.0} for n in (1, 16, 33)]}
        with pytest.raises(ValueError, match="bs 1 do not reach N = 65"):
            round_bound.bound(result, TAUS, block=16, draft_ms=0.0)


class TestCli:
    def test_prints_the_table_and_the_best_budget(self, tmp_path, capsys):
        """A full-size target's verify_cost JSON: the Markdown table with every budget of its
        hook profile's fit and one best-budget line per batch size."""
        path = tmp_path / "cost.json"
        path.write_text(json.dumps(_result(lambda bs, n: 4.0 + n / 100)))
        assert round_bound.main([str(path)]) == 0
        out = capsys.readouterr().out
        assert "| 1 | DDTREE B 512 | 513 |" in out
        assert out.count("best budget") == 2

    def test_drafter_floor_is_its_bytes_and_the_heads_over_the_copy_rate(self):
        """qwen3-8b: the drafter's weights plus the 151936 x 4096 bf16 head at 4.2 TB/s."""
        model = fullsize.load_model("qwen3-8b")
        want = (fullsize.weight_bytes(model.drafter) + 151936 * 4096 * 2) / 4.2e12 * 1e3
        assert round_bound.drafter_ms(model, 4.2) == pytest.approx(want)

    def test_bad_input_is_one_line(self, tmp_path, capsys):
        """A file that is not a verify_cost result of a full-size target: exit 2, one line."""
        path = tmp_path / "x.json"
        path.write_text(json.dumps({"model": "no-such-model", "rows": []}))
        assert round_bound.main([str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"round_bound: {path}:") and err.count("\n") == 1
