"""Tests for verify/bench/bench_serving_pool.py (no GPU): repeats of the bench_serving check pooled into
medians, the repeats' spread as noise, and verdicts that say inconclusive where the noise is wider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verify.bench import bench_serving_pool as pool


def _check(tpot: tuple[float, float], tok_s: tuple[float, float] = (1000.0, 1000.0)) -> dict:
    """One repeat's check: (repro, bench_serving) median TPOT and output tok/s at 18/s, and a figure
    compared without a verdict."""
    def row(figure: str, mine: float, theirs: float, *, judged: bool) -> dict:
        return {"backend": "sglang", "rate": 18.0, "figure": figure, "repro": mine, "bench_serving": theirs,
                "ratio": mine / theirs, "within": (abs(mine / theirs - 1) <= 0.1) if judged else None}
    return {"tolerance": 0.1, "rows": [row("output tok/s", *tok_s, judged=True), row("TPOT median ms", *tpot, judged=True),
                                       row("TTFT median ms", 60.0, 90.0, judged=False)]}


def _rows(checks: list[dict]) -> dict[str, dict]:
    return {r["figure"]: r for r in pool.pool(checks)}


def test_medians_of_steady_repeats_pass() -> None:
    """Three repeats whose clients agree within 10%: medians, their ratio, the spread, yes."""
    rows = _rows([_check((1.80, 1.90)), _check((1.85, 1.95)), _check((2.00, 1.88))])
    tpot = rows["TPOT median ms"]
    assert (tpot["repro"], tpot["bench_serving"], tpot["repeats"]) == (1.85, 1.90, 3)
    assert tpot["ratio"] == pytest.approx(1.85 / 1.90)
    assert tpot["spread"] == pytest.approx(2.00 / 1.80 - 1)
    assert tpot["verdict"] == "yes" and rows["output tok/s"]["verdict"] == "yes"
    assert rows["TTFT median ms"]["verdict"] is None


def test_a_gap_inside_the_repeats_noise_is_inconclusive() -> None:
    """Medians 16% apart while repro's own repeats differ by 30%: the repeats cannot decide the bar."""
    rows = _rows([_check((1.81, 2.15)), _check((2.36, 2.20)), _check((1.75, 2.10))])
    assert rows["TPOT median ms"]["ratio"] == pytest.approx(1.81 / 2.15)
    assert rows["TPOT median ms"]["verdict"] == "inconclusive"


def test_a_steady_gap_fails() -> None:
    """Repeats within 3% of each other and 20% apart between the clients: NO."""
    rows = _rows([_check((1.80, 2.25)), _check((1.82, 2.26)), _check((1.81, 2.27))])
    assert rows["TPOT median ms"]["verdict"] == "NO" and rows["TPOT median ms"]["spread"] < 0.03


def test_main_writes_the_pooled_json_and_exits_by_the_verdicts(tmp_path: Path, capsys) -> None:
    """One file per repeat in, the pooled JSON out; exit 0 only when every verdict is yes; a file that is
    not a check is one clear message."""
    paths = []
    for i, tpot in enumerate(((1.80, 1.90), (1.85, 1.95), (1.90, 1.88))):
        (tmp_path / f"check-{i}").mkdir()
        paths.append(tmp_path / f"check-{i}" / "bench_serving_check.json")
        paths[-1].write_text(json.dumps(_check(tpot)))
    assert pool.main([str(p) for p in paths]) == 0
    result = json.loads((tmp_path / "bench_serving_pool.json").read_text())
    assert result["passed"] is True and len(result["rows"]) == 3
    assert "verdict over 3 repeats: 2 yes, 0 inconclusive, 0 NO" in capsys.readouterr().out
    paths[0].write_text(json.dumps(_check((1.2, 2.0))))
    paths[1].write_text(json.dumps(_check((1.2, 2.0))))
    assert pool.main([str(p) for p in paths]) == 1
    (tmp_path / "x.json").write_text("[]")
    with pytest.raises(SystemExit, match=r"each file must be a bench_serving_check\.json"):
        pool.main([str(tmp_path / "x.json")])
