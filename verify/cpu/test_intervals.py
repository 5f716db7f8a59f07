"""Tests for `repro.evidence.intervals`: bootstrap intervals of ratios between two cells' requests."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from repro.evidence import intervals
from repro.evidence.intervals import Ratio

RNG = np.random.default_rng(3)
FAST = RNG.lognormal(np.log(0.010), 0.3, 64)  # per-request TPOT, seconds
SLOW = RNG.lognormal(np.log(0.014), 0.3, 64)


def test_the_interval_matches_scipys_percentile_bootstrap() -> None:
    """The ratio of medians' interval agrees with scipy.stats.bootstrap's percentile method for two
    independent samples (both resample each cell's requests), to the resampling noise."""
    got = intervals.figure_ratio(FAST, SLOW, intervals.percentile(50))
    ref = stats.bootstrap((FAST, SLOW), lambda a, b, axis: np.median(a, axis=axis) / np.median(b, axis=axis),
                          paired=False, vectorized=True, method="percentile", n_resamples=20_000,
                          random_state=np.random.default_rng(0)).confidence_interval
    assert got is not None and got.value == pytest.approx(np.median(FAST) / np.median(SLOW))
    assert (got.low, got.high) == (pytest.approx(ref.low, rel=0.02), pytest.approx(ref.high, rel=0.02))


def test_the_same_requests_give_the_same_interval() -> None:
    """The generator is seeded: two reports of one run read the same."""
    first = intervals.figure_ratio(FAST, SLOW, intervals.percentile(90))
    assert first == intervals.figure_ratio(FAST, SLOW, intervals.percentile(90))


def test_a_clear_difference_excludes_one_and_a_tie_holds_it() -> None:
    """40% slower requests put the interval above 1; a cell against itself holds 1."""
    slower = intervals.figure_ratio(SLOW, FAST, intervals.percentile(50))
    same = intervals.figure_ratio(FAST, FAST, intervals.percentile(50))
    assert slower is not None and slower.low > 1 and same is not None and same.straddles(1.0)


def test_throughput_resamples_token_and_second_pairs() -> None:
    """Tokens per request-second of [tokens, seconds] pairs; the interval scales the ratio shown."""
    a, b = [(64, s) for s in FAST], [(64, s) for s in SLOW]
    assert intervals.throughput(np.asarray(a, dtype=float)[None])[0] == pytest.approx(64 * len(a) / FAST.sum())
    shown = intervals.ratio(1.5, a, b, intervals.throughput)
    raw = intervals.relative_interval(a, b, intervals.throughput)
    assert raw is not None and (shown.low, shown.high) == (pytest.approx(1.5 * raw[0]), pytest.approx(1.5 * raw[1]))


def test_too_few_requests_or_no_figure_give_no_interval() -> None:
    """A side with one request has no interval; a side with none, or a zero baseline, no ratio."""
    assert intervals.figure_ratio(FAST, SLOW[:1], intervals.mean) == Ratio(pytest.approx(FAST.mean() / SLOW[0]))
    assert intervals.figure_ratio(FAST, [], intervals.mean) is None
    assert intervals.figure_ratio(FAST, [0.0, 0.0], intervals.mean) is None


def test_a_ratio_reads_with_its_interval() -> None:
    """``1.05x [0.98, 1.12]``; a bound strictly inside straddles, one at an end does not."""
    r = Ratio(1.05, 0.98, 1.12)
    assert r.text("x") == "1.05x [0.98, 1.12]" and Ratio(1.05).text() == "1.05"
    assert r.straddles(1.0) and not r.straddles(0.98) and not Ratio(1.05).straddles(1.0)
