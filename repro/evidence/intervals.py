"""95% intervals of ratios between two cells' figures: a percentile bootstrap over each cell's requests.

Each cell's requests are resampled with replacement, independently, and the figure (a median TPOT, a
throughput) recomputed on each resample; the interval is the 2.5th to 97.5th percentile of the
resampled ratio relative to the measured one, applied to the ratio shown (which may come from the runs
that served both cells side by side). The generator is seeded, so a report reads the same every time
it is written. It reflects how the requests vary, not how a machine drifts between runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95

Statistic = Callable[[np.ndarray], np.ndarray]  # per-request values [..., n(, k)] -> a figure per row [...]


def percentile(q: float) -> Statistic:
    """The statistic ``q``-th percentile (50: the median) of per-request values."""
    return lambda x: np.percentile(x, q, axis=-1)


def mean(x: np.ndarray) -> np.ndarray:
    """The mean of per-request values."""
    return x.mean(axis=-1)


def throughput(x: np.ndarray) -> np.ndarray:
    """Tokens per request-second of per-request ``[tokens, seconds]`` pairs."""
    return x[..., 0].sum(axis=-1) / x[..., 1].sum(axis=-1)


@dataclass(frozen=True)
class Ratio:
    """A ratio of one cell's figure over another's, with its 95% interval (None: too few requests)."""

    value: float
    low: float | None = None
    high: float | None = None

    def straddles(self, bound: float) -> bool:
        """True when ``bound`` lies strictly inside the interval: the data cannot tell which side it is on."""
        return self.low is not None and self.high is not None and self.low < bound < self.high

    def text(self, suffix: str = "") -> str:
        """``1.05x [0.98, 1.12]`` (with ``suffix`` "x"), the interval left out when there is none."""
        if self.low is None or self.high is None:
            return f"{self.value:.2f}{suffix}"
        return f"{self.value:.2f}{suffix} [{self.low:.2f}, {self.high:.2f}]"


def relative_interval(a: Sequence, b: Sequence, statistic: Statistic) -> tuple[float, float] | None:
    """The 95% interval of ``statistic(a*) / statistic(b*)`` over its measured value, ``a*`` and ``b*``
    resamples of the per-request values ``a`` and ``b``; None when a side has under two requests or
    a figure is not finite and positive."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = np.random.default_rng(SEED)

    def relative(values: Sequence) -> np.ndarray:
        x = np.asarray(values, dtype=float)
        picks = x[rng.integers(0, len(x), (RESAMPLES, len(x)))]
        return statistic(picks) / statistic(x[None])[0]

    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = relative(a) / relative(b)
    if not np.all(np.isfinite(ratios)) or not np.all(ratios > 0):
        return None
    low, high = np.percentile(ratios, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return float(low), float(high)


def ratio(value: float, a: Sequence, b: Sequence, statistic: Statistic) -> Ratio:
    """``value`` (a's figure over b's) with the bootstrap interval of ``statistic`` over a's and b's requests."""
    interval = relative_interval(a, b, statistic)
    if interval is None:
        return Ratio(value)
    return Ratio(value, value * interval[0], value * interval[1])


def figure_ratio(a: Sequence, b: Sequence, statistic: Statistic) -> Ratio | None:
    """``statistic(a) / statistic(b)`` of two cells' per-request values, with its interval; None when
    a side has no request or b's figure is 0."""
    if not len(a) or not len(b):
        return None
    top, bottom = (float(statistic(np.asarray(v, dtype=float)[None])[0]) for v in (a, b))
    return ratio(top / bottom, a, b, statistic) if bottom > 0 else None
