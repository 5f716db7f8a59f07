"""Judge benchmark summaries against each profile's threshold set (used by reports and the live tier).

Floors apply to closed-loop cells at the set's ``at`` conditions (concurrency, temperature); DDTREE
is judged at the set's ``at`` budget, else at the profile's own. A ratio whose 95% interval
(bootstrap over requests) holds its floor strictly inside is inconclusive, neither pass nor fail.
TP vs TP+EP pairs are two profiles of one machine and model with the same tp, one with ep 1 and
one with ep > 1; their ratio is judged with the TP profile's set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from repro.algorithms import DDTREE
from repro.evidence.results import CellSummary, label_order
from repro.serving.profiles import Profile
from repro.serving.thresholds import ThresholdSet

PASS, FAIL, NOT_MEASURED, RECORDED, INCONCLUSIVE = "pass", "fail", "not measured", "recorded", "inconclusive"


@dataclass(frozen=True)
class Verdict:
    """One check of a measured value against its bound."""

    check: str  # tau | speedup | DDTREE/DFLASH | TP/EP
    subject: str  # what was measured, e.g. "test-h200-tp1 DDTREE B=32 c=1 T=0"
    value: float | None
    bound: str  # e.g. ">= 3.5"; empty when recorded only
    status: str  # PASS | FAIL | NOT_MEASURED | RECORDED | INCONCLUSIVE
    source: str
    interval: tuple[float, float] | None = None  # the value's 95% interval, where it has one


@dataclass(frozen=True)
class TpEpPoint:
    """Throughput of one cell measured on both the TP and the TP+EP profile of a machine."""

    machine: str
    tp_profile: str
    ep_profile: str
    label: str
    concurrency: int
    temperature: float
    tp_tok_s: float
    ep_tok_s: float

    @property
    def ratio(self) -> float:
        """TP tok/s over TP+EP tok/s."""
        return self.tp_tok_s / self.ep_tok_s if self.ep_tok_s else float("inf")


def tp_ep_points(summaries: list[CellSummary], profiles: dict[str, Profile]) -> list[TpEpPoint]:
    """Every cell measured under a TP profile and its TP+EP twin."""
    def match(s: CellSummary) -> tuple[object, ...]:
        c = s.cell
        return (c.algorithm, c.budget, c.schedule, c.concurrency, c.request_rate, c.temperature, c.prompts,
                c.max_new_tokens)

    points = []
    by_profile: dict[str, dict[tuple[object, ...], CellSummary]] = {}
    for s in summaries:
        by_profile.setdefault(s.cell.profile, {})[match(s)] = s
    for tp_name, tp_cells in by_profile.items():
        tp = profiles.get(tp_name)
        if tp is None or tp.ep != 1 or not tp.machine:
            continue
        for ep_name, ep_cells in by_profile.items():
            ep = profiles.get(ep_name)
            if ep is None or ep.ep == 1 or (ep.machine, ep.model, ep.tp) != (tp.machine, tp.model,
                                                                           tp.tp):
                continue
            for key in tp_cells.keys() & ep_cells.keys():
                a, b = tp_cells[key], ep_cells[key]
                points.append(TpEpPoint(tp.machine, tp_name, ep_name, a.cell.label,
                                        a.cell.concurrency, a.cell.temperature,
                                        a.output_tok_s, b.output_tok_s))
    return sorted(points, key=lambda p: (p.machine, p.temperature, label_order(p.label),
                                         p.concurrency))


def _floor(check: str, subject: str, value: float | None, floor: float, source: str,
           interval: tuple[float, float] | None = None) -> Verdict:
    if value is None:
        return Verdict(check, subject, None, f">= {floor:g}", NOT_MEASURED, source)
    if interval is not None and interval[0] < floor < interval[1]:
        return Verdict(check, subject, value, f">= {floor:g}", INCONCLUSIVE, source, interval)
    return Verdict(check, subject, value, f">= {floor:g}", PASS if value >= floor else FAIL, source, interval)


def _profile_verdicts(profile: Profile, tset: ThresholdSet,
                      summaries: list[CellSummary]) -> Iterable[Verdict]:
    budget = tset.at_budget or profile.budget
    schedule = None if tset.at_budget else profile.budget_schedule  # the set's budget, else the profile's own
    judged = f"S={schedule}" if schedule else f"B={budget}"
    at = {s.cell.algorithm: s for s in summaries
          if s.cell.profile == profile.name and s.cell.request_rate is None and s.cell.concurrency == tset.at_concurrency
          and s.cell.temperature == tset.at_temperature
          and (s.cell.algorithm != DDTREE or (s.cell.budget, s.cell.schedule) == (budget, schedule))}
    where = f"c={tset.at_concurrency} T={tset.at_temperature:g}"
    for algorithm, floor in tset.tau_floor.items():
        s = at.get(algorithm)
        label = s.cell.label if s else (f"DDTREE {judged}" if algorithm == DDTREE else algorithm)
        yield _floor("tau", f"{profile.name} {label} {where}", s.tau_mean if s else None, floor,
                     tset.tau_source)
    for name, floor in tset.speedup_floor.items():
        if name == "DDTREE-over-DFLASH":
            tree = at.get(DDTREE)
            yield _floor("DDTREE/DFLASH", f"{profile.name} {judged} {where}", tree and tree.over_dflash,
                         floor, tset.speedup_source, tree and tree.over_dflash_interval)
        else:
            s = at.get(name)
            yield _floor("speedup", f"{profile.name} {s.cell.label if s else name} {where}",
                         s.speedup if s else None, floor, tset.speedup_source, s and s.speedup_interval)


def judge(summaries: list[CellSummary], profiles: dict[str, Profile],
          sets: dict[str, ThresholdSet]) -> list[Verdict]:
    """Every verdict for the profiles that appear in ``summaries``."""
    verdicts: list[Verdict] = []
    names = dict.fromkeys(s.cell.profile for s in summaries)
    for name in names:
        profile = profiles.get(name)
        if profile is not None and profile.thresholds in sets:
            verdicts.extend(_profile_verdicts(profile, sets[profile.thresholds], summaries))
    for p in tp_ep_points(summaries, profiles):
        tset = sets.get(profiles[p.tp_profile].thresholds)
        if tset is None or (p.concurrency, p.temperature) != (tset.at_concurrency,
                                                               tset.at_temperature):
            continue
        subject = (f"{p.machine} {p.label} c={p.concurrency} T={p.temperature:g} "
                   f"({p.tp_profile} / {p.ep_profile})")
        lo, hi = tset.tp_over_ep_min, tset.tp_over_ep_max
        if lo is None and hi is None:
            verdicts.append(Verdict("TP/EP", subject, p.ratio, "", RECORDED,
                                    "no bound in this threshold set"))
            continue
        bound = " and ".join(b for b in (lo is not None and f">= {lo:g}",
                                         hi is not None and f"<= {hi:g}") if b)
        ok = (lo is None or p.ratio >= lo) and (hi is None or p.ratio <= hi)
        verdicts.append(Verdict("TP/EP", subject, p.ratio, bound, PASS if ok else FAIL,
                                tset.tp_over_ep_source))
    return verdicts
