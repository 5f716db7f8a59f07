"""The TP/EP bounds of repro/data/thresholds.toml are the cost model's predictions (repro.topology), widened
by its stated tolerance: a change to the model or its measurements shows here until the bounds follow."""

from __future__ import annotations

import pytest

from repro.serving.thresholds import load_thresholds
from repro.topology import TP_EP_TOLERANCE, tp_over_ep_bounds

PAIRS = {"k26-pcie": ("k26-pro6000-tp8", "k26-pro6000-ep8"), "k26-nvlink": ("k26-b300-tp8", "k26-b300-ep8")}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_bounds_are_the_models(name: str) -> None:
    """min / max equal tp_over_ep_bounds of the set's profile pair at its concurrency."""
    tset = load_thresholds()[name]
    lo, hi = tp_over_ep_bounds(*PAIRS[name], concurrency=tset.at_concurrency)
    assert (tset.tp_over_ep_min, tset.tp_over_ep_max) == (lo, hi)
    assert f"{TP_EP_TOLERANCE:.0%}" in tset.tp_over_ep_source
