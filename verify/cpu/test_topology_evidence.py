"""The TP / EP model's shipped constants are the fit of the committed one-GPU measurements (docs/perf),
and its held-out checks run on them (verify/bench/topology_check.py): what docs/TOPOLOGY.md reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.topology import checks, model
from repro.topology.compute import DEFAULT
from verify.bench import topology_check

SHARES = Path(__file__).parents[2] / "docs" / "perf" / "share_cost_h100_2026-12-06.json"


@pytest.fixture(scope="module")
def result() -> dict:
    """The checks on the committed measurements, once for the module."""
    return topology_check.run(SHARES)


def test_default_calibration_is_the_fit(result: dict) -> None:
    """compute.DEFAULT equals the fit of the share measurements and the k26-tp8 forward (1%)."""
    cal = result["calibration"]
    assert cal["layer_us"] == pytest.approx(DEFAULT.layer_us, rel=0.01)
    assert cal["flops_eff"] == pytest.approx(DEFAULT.flops_eff, rel=0.01)
    for width, eff in DEFAULT.moe.items():
        for key in ("fixed_us", "bw_eff", "flops_eff", "pad_eff"):
            assert cal["moe"][width][key] == pytest.approx(getattr(eff, key), rel=0.01), (width, key)


def test_default_host_is_the_fit(result: dict) -> None:
    """model.DEFAULT_HOST equals the host time fitted on the k26-tp8 share's served rounds (1%)."""
    fitted = result["served"]["k26-tp8"]["host_ms"]
    for algorithm, (base, per_root) in model.DEFAULT_HOST.ms.items():
        assert fitted[algorithm][0] == pytest.approx(base, rel=0.01)
        assert fitted[algorithm][1] == pytest.approx(per_root, rel=0.01)


def test_share_checks_as_documented(result: dict) -> None:
    """The MoE layer of both shares: EP8 all 48 held-out points within 10%, TP8 45 of 48 (docs/TOPOLOGY.md)."""
    within = {c["name"]: sum(abs(p["error"]) <= checks.SHARE_TOLERANCE for p in c["held_out"])
              for c in result["shares"]["checks"]}
    assert within == {"k26-ep8 MoE layer": 48, "k26-tp8 MoE layer": 45}


def test_served_checks_as_documented(result: dict) -> None:
    """The served rounds: held-out cells within 15% and the stated bars met, as docs/TOPOLOGY.md reports."""
    served = result["served"]
    assert {name: (s["within"], len(s["held_out"])) for name, s in served.items()} == {
        "k26-tp8": (13, 16), "qwen3-8b": (18, 20), "4-layer": (7, 11)}
    assert all(s["bar"]["passed"] for s in served.values())


def test_the_4_layer_bar_is_its_measured_spread() -> None:
    """The 4-layer target's bar is the largest spread of its repeated served rounds: 4.19 / 2.52 ms (DFLASH, bs 1)."""
    assert topology_check.round_spread() == pytest.approx(4.19 / 2.52 - 1, abs=0.01)
