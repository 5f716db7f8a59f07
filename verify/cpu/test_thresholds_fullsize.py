"""The full-size targets' tau floors follow from their drafter profiles' fits.

A served tau on a planted target is the simulated tau of its hook profile up to sampling noise and
the max-new-tokens cut, so each floor is 0.9x the fit file's check tau (DFLASH at the profile's
block, DDTREE at the set's judged budget: its ``at`` budget, else the serving profile's), rounded
down to 0.1.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import pytest

from repro.serving.profiles import load_profiles
from repro.serving.thresholds import load_thresholds
from repro.testmodels.fullsize import load_model

FIT = json.loads(resources.files("repro.data").joinpath("drafter_profiles_fit.json").read_text())


@pytest.mark.parametrize("name", ["qwen3-8b", "k26-tp8"])
def test_tau_floors_are_ninety_percent_of_the_profile_fit(name):
    """thresholds.toml's floors for the serving profile equal floor(0.9 x simulated tau, 0.1)."""
    profile = load_profiles()[f"full-h200-{name}"]
    tset = load_thresholds()[profile.thresholds]
    simulated = FIT["profiles"][load_model(name).hook_profile]["check"]["tau"]
    want = {"DFLASH": simulated["dflash"], "DDTREE": simulated[str(tset.at_budget or profile.budget)]}
    assert tset.tau_floor == {algo: math.floor(9 * tau) / 10 for algo, tau in want.items()}


def test_k26_speedup_floors_are_ninety_percent_of_the_committed_run():
    """k26-tp8's speedup floors equal floor(0.9 x the c = 1, T = 0 speedups over AR of its committed
    example report), and it has no DDTREE/DFLASH floor: there DDTREE loses to DFLASH."""
    profile = load_profiles()["full-h200-k26-tp8"]
    tset = load_thresholds()[profile.thresholds]
    report = json.loads((Path(__file__).resolve().parents[2] / "docs/examples/full-k26-tp8/report.json").read_text())
    at = {s["algorithm"]: s for s in report["summaries"]
          if (s["concurrency"], s["temperature"], s["prompts"]) == (1, 0, "humaneval") and s["budget"] in (None, tset.at_budget)}
    assert tset.speedup_floor == {algo: math.floor(9 * at[algo]["speedup"]) / 10 for algo in ("DFLASH", "DDTREE")}
    assert at["DDTREE"]["over_dflash"] < 1
