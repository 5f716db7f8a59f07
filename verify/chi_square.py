"""The chi-square goodness-of-fit test every T > 0 losslessness test uses (scipy.stats.chisquare).

Cells expected fewer than 5 times are pooled into one, so the chi-square approximation holds.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import chisquare

MIN_EXPECTED = 5


def chi_square_p(observed: ArrayLike, probs: ArrayLike) -> float:
    """p-value of the counts ``observed`` against the probabilities ``probs`` (scaled to the counts'
    total); 0 when a count falls where nothing is expected."""
    obs = np.asarray(observed, dtype=np.float64).reshape(-1)
    exp = np.asarray(probs, dtype=np.float64).reshape(-1)
    exp = exp / exp.sum() * obs.sum()
    big = exp >= MIN_EXPECTED
    obs = np.append(obs[big], obs[~big].sum())
    exp = np.append(exp[big], exp[~big].sum())
    if obs[exp == 0].any():
        return 0.0
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep]).pvalue)


def keyed(counts: Mapping[Hashable, int], probs: Mapping[Hashable, float]) -> tuple[np.ndarray, np.ndarray]:
    """(observed, probs) of counts and probabilities keyed alike, as arrays over the keys of
    ``probs`` plus one cell of probability 0 for the counts of keys ``probs`` lacks."""
    outside = sum(c for k, c in counts.items() if k not in probs)
    observed = [*(counts.get(k, 0) for k in probs), outside]
    return np.array(observed, dtype=np.float64), np.array([*probs.values(), 0.0])
