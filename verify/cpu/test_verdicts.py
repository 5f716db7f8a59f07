"""Tests for `repro.evidence.verdicts`: floors at the set's conditions and TP vs TP+EP pairing."""

from __future__ import annotations

import dataclasses

import pytest

from repro.evidence.results import summarize
from repro.evidence.verdicts import FAIL, INCONCLUSIVE, NOT_MEASURED, PASS, RECORDED, judge, tp_ep_points
from repro.serving.profiles import Profile
from repro.serving.thresholds import ThresholdSet
from verify.benchdata import cell, request

BASE = Profile(name="tp", model="m", target="sm90", tp=2, algorithm="DDTREE", thresholds="t",
               attention_backend="triton", draft_attention_backend="triton", machine="box",
               drafter="d", budget=32)
PROFILES = {"tp": BASE, "ep": dataclasses.replace(BASE, name="ep", ep=2)}
SETS = {"t": ThresholdSet("t", tau_floor={"DFLASH": 2.0, "DDTREE": 3.0}, tau_source="tau src",
                          speedup_floor={"DDTREE": 1.5, "DDTREE-over-DFLASH": 1.1},
                          speedup_source="speedup src", tp_over_ep_max=0.8,
                          tp_over_ep_source="seed")}


def rows(profile: str = "tp", *, ar_end: float = 2.0, tree_verify: int = 16,
         budget: int = 32) -> list[dict]:
    """AR, DFLASH (tau 64/26) and DDTREE (tau 64/tree_verify) cells of one profile at c=1."""
    return [request(cell("AR", profile=profile), 0, end=ar_end),
            request(cell("DFLASH", profile=profile), 0, end=1.0, verify=26),
            request(cell("DDTREE", budget, profile=profile), 0, end=0.5, verify=tree_verify)]


def by_check(verdicts: list) -> dict:
    """Verdicts keyed by (check, the algorithm named in the subject)."""
    return {(v.check, v.subject.split()[1]): v for v in verdicts}


class TestFloors:
    def test_floors_pass_fail_and_ratio(self) -> None:
        """tau, speedup and DDTREE/DFLASH are judged at c=1, T=0 against the set's floors."""
        verdicts = by_check(judge(summarize(rows(tree_verify=32)), PROFILES, SETS))
        assert verdicts[("tau", "DFLASH")].status == PASS  # 64 / 26 = 2.46
        assert verdicts[("tau", "DDTREE")].status == FAIL  # 64 / 32 = 2.0 < 3
        assert verdicts[("speedup", "DDTREE")].value == pytest.approx(4.0)
        assert verdicts[("DDTREE/DFLASH", "B=32")].value == pytest.approx(2.0)
        assert verdicts[("tau", "DFLASH")].source == "tau src"

    def test_ddtree_is_judged_at_the_profiles_budget_only(self) -> None:
        """A sweep that misses the profile's budget leaves its DDTREE floors not measured."""
        verdicts = by_check(judge(summarize(rows(budget=64)), PROFILES, SETS))
        assert verdicts[("tau", "DDTREE")].status == NOT_MEASURED
        assert verdicts[("tau", "DDTREE")].subject.startswith("tp DDTREE B=32")

    def test_a_schedule_profile_is_judged_on_its_schedules_cells(self) -> None:
        """A profile with a budget schedule is judged on the cells of that schedule, not on a fixed
        budget's (nor another schedule's)."""
        profiles = {"tp": dataclasses.replace(BASE, budget=None, budget_schedule="1:32,4:8")}
        sched = dataclasses.replace(cell("DDTREE", None, profile="tp"), schedule="1:32,4:8")
        other = dataclasses.replace(sched, schedule="1:8")
        base = rows(budget=32)
        verdicts = by_check(judge(summarize([*base, request(sched, 0, end=0.5, verify=16),
                                             request(other, 0, end=0.5, verify=32)]), profiles, SETS))
        assert verdicts[("tau", "DDTREE")].status == PASS  # the schedule's 64 / 16, not 1:8's 64 / 32
        assert verdicts[("DDTREE/DFLASH", "S=1:32,4:8")].value == pytest.approx(2.0)
        missed = by_check(judge(summarize(base), profiles, SETS))
        assert missed[("tau", "DDTREE")].subject.startswith("tp DDTREE S=1:32,4:8")

    def test_the_sets_at_budget_overrides_the_profiles(self) -> None:
        """A set with `at.budget` judges DDTREE at that budget, not at the profile's."""
        sets = {"t": dataclasses.replace(SETS["t"], at_budget=64)}
        verdicts = by_check(judge(summarize(rows(budget=64)), PROFILES, sets))
        assert verdicts[("tau", "DDTREE")].status == PASS  # 64 / 16 = 4 >= 3
        assert verdicts[("DDTREE/DFLASH", "B=64")].value == pytest.approx(2.0)
        missed = by_check(judge(summarize(rows(budget=32)), PROFILES, sets))
        assert missed[("tau", "DDTREE")].subject.startswith("tp DDTREE B=64")
        assert missed[("tau", "DDTREE")].status == NOT_MEASURED

    def test_other_conditions_are_not_judged(self) -> None:
        """Cells at other concurrencies do not count towards the c=1 floors."""
        data = [request(cell("DFLASH", concurrency=4, profile="tp"), 0, verify=64)]
        (verdict, *_) = judge(summarize(data), PROFILES, SETS)
        assert verdict.status == NOT_MEASURED


    @pytest.mark.parametrize(("spread", "status"), [(0.02, PASS), (0.6, INCONCLUSIVE)])
    def test_a_floor_inside_the_interval_is_inconclusive(self, spread: float, status: str) -> None:
        """DDTREE 1.2x DFLASH against a 1.1 floor passes when the requests agree, and is inconclusive
        when they vary so much that the 95% interval holds the floor."""
        def cell_rows(algorithm: str, budget: int | None, seconds: float) -> list[dict]:
            took = [seconds * (1 + spread * k) for k in (-1, 1, -0.5, 0.5, 0, 0)]  # one after the other
            return [request(cell(algorithm, budget, profile="tp"), i, start=sum(took[:i]), end=sum(took[: i + 1]),
                            verify=16) for i in range(len(took))]

        data = cell_rows("DFLASH", None, 1.2) + cell_rows("DDTREE", 32, 1.0)
        verdict = by_check(judge(summarize(data), PROFILES, SETS))[("DDTREE/DFLASH", "B=32")]
        assert verdict.status == status and verdict.interval is not None
        assert verdict.interval[0] < verdict.value < verdict.interval[1]

    def test_open_loop_cells_are_not_judged(self) -> None:
        """Floors judge closed-loop cells: an open-loop cell at the set's concurrency leaves them not measured."""
        data = [request(dataclasses.replace(cell("DFLASH", profile="tp"), request_rate=2.0), 0, verify=8)]
        assert {v.status for v in judge(summarize(data), PROFILES, SETS)} == {NOT_MEASURED}


class TestTpVsEp:
    def test_pairs_share_machine_model_and_tp(self) -> None:
        """TP and TP+EP profiles of one machine pair up cell by cell."""
        data = rows("tp") + rows("ep", ar_end=1.0)
        points = tp_ep_points(summarize(data), PROFILES)
        ar = next(p for p in points if p.label == "AR")
        assert (ar.tp_profile, ar.ep_profile, ar.ratio) == ("tp", "ep", pytest.approx(0.5))

    def test_ratio_is_judged_with_the_tp_profiles_bound(self) -> None:
        """TP/EP 0.5 passes a max of 0.8; equal throughput fails it."""
        ok = [v for v in judge(summarize(rows("tp") + rows("ep", ar_end=1.0)), PROFILES, SETS)
              if v.check == "TP/EP" and " AR " in v.subject]
        bad = [v for v in judge(summarize(rows("tp") + rows("ep")), PROFILES, SETS)
               if v.check == "TP/EP" and " AR " in v.subject]
        assert ok[0].status == PASS and ok[0].bound == "<= 0.8" and bad[0].status == FAIL

    def test_unbounded_ratio_is_recorded(self) -> None:
        """A set without tp-over-ep records the ratio without judging it."""
        sets = {"t": dataclasses.replace(SETS["t"], tp_over_ep_max=None)}
        ratios = [v for v in judge(summarize(rows("tp") + rows("ep")), PROFILES, sets)
                  if v.check == "TP/EP"]
        assert ratios and {v.status for v in ratios} == {RECORDED}

    def test_different_tp_does_not_pair(self) -> None:
        """Profiles with different tp are not a TP vs TP+EP pair."""
        profiles = {**PROFILES, "ep": dataclasses.replace(PROFILES["ep"], tp=4, ep=4)}
        assert tp_ep_points(summarize(rows("tp") + rows("ep")), profiles) == []
