"""The losslessness tests' chi-square helper (verify/chi_square.py): pooling, counts outside the
support, keyed counts, and its power on draws from a fixed-seed generator."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from verify.chi_square import chi_square_p, keyed


def test_sparse_cells_are_pooled_into_one():
    """Cells expected under 5 times count as one cell; the probabilities are scaled to the counts."""
    observed = [40, 50, 3, 1, 6]
    probs = [0.4, 0.5, 0.02, 0.03, 0.05]  # expected 40, 50, 2, 3, 5 of 100
    want = chisquare([40, 50, 6, 4], [40, 50, 5, 5]).pvalue
    assert chi_square_p(observed, probs) == pytest.approx(want)
    assert chi_square_p(observed, [4, 5, 0.2, 0.3, 0.5]) == pytest.approx(want)


def test_a_count_where_nothing_is_expected_fails():
    """A count in a cell of probability 0 with no sparse cell to share gives p = 0."""
    assert chi_square_p([50, 50, 1], [0.5, 0.5, 0.0]) == 0.0


def test_keyed_counts_put_unknown_keys_in_a_cell_of_probability_zero():
    """Keys the probabilities lack are counted in one extra cell of probability 0."""
    observed, probs = keyed({"a": 3, "z": 2, "y": 1}, {"a": 0.6, "b": 0.4})
    assert observed.tolist() == [3, 0, 3]
    assert probs.tolist() == [0.6, 0.4, 0.0]


def test_draws_pass_against_their_law_and_fail_against_another():
    """10,000 draws of a 6-cell law pass at alpha 1e-3; against a law off by 0.02 per cell they fail."""
    law = np.array([0.3, 0.25, 0.2, 0.15, 0.07, 0.03])
    counts = np.bincount(np.random.default_rng(0).choice(6, 10_000, p=law), minlength=6)
    assert chi_square_p(counts, law) > 1e-3
    assert chi_square_p(counts, law + 0.02 * np.array([1, -1, 1, -1, 1, -1])) < 1e-3
