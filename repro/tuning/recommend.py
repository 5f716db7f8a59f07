"""The budget that is fastest here: tau(B) from a recording, round costs from bench results.

For each concurrency c the predicted DDTREE throughput of every budget B in the measured range
(and at most the recorded budget) is ``costs.predict_tok_s(c, M, TTFT(c, B), T_round(c, B),
tau(B))``; the recommendation is its argmax. DFLASH's throughput is the measured one where a DFLASH
cell exists, else predicted from the chain's tau on the recorded rows (its low bound: censored
rounds count their least) and T_round(c, L) (a round of L + 1 verify tokens, the same drafter).

A server takes one budget schedule (``repro.schedule``), so the recommendation is also a schedule:
at every captured batch size b the budget that maximises the predicted throughput of b clients, with
T_round and TTFT at b interpolated linearly between the measured concurrencies around it (a batch
size past them, or between two that share no measured budget, takes the nearest one's figures),
adjacent batch sizes of one budget merged.

Checks: predictions for cells measured but kept out of the fit (``holdout``) within
``PREDICTION_TOLERANCE``, on at least ``MIN_CHECK_CELLS`` cells; where the recommended budget was
measured, its throughput within ``RECOMMENDATION_TOLERANCE`` of the best measured budget's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from repro.algorithms import AR, DDTREE, DFLASH, TABLE
from repro.errors import UsageError
from repro.evidence.results import format_table
from repro.evidence.verdicts import FAIL, NOT_MEASURED, PASS, Verdict
from repro.schedule import BudgetSchedule
from repro.tuning.acceptance import ChainEstimate, Estimate, Recording, budget_taus, chain_estimate, prompt_sets
from repro.tuning.costs import CellCost, CostModel, cell_costs, interpolate, predict_tok_s

PREDICTION_TOLERANCE = 0.10  # predicted tok/s within 10% of measured on held-out cells
MIN_CHECK_CELLS = 3  # at least three (B, c) cells not used to fit the costs
RECOMMENDATION_TOLERANCE = 0.03  # recommended budget within 3% of the best measured one
SOURCE = "the tuning acceptance bounds (repro/tuning/recommend.py)"


def pick_recording(recordings: Sequence[Recording], requests: set[str] | None = None) -> Recording:
    """The DDTREE recordings of the largest budget and the latest digest, pooled (request ids
    prefixed by their recording so requests stay apart); only the rounds of ``requests`` (request
    ids) when given."""
    tree = [r for r in recordings if r.algorithm == DDTREE]
    if not tree:
        msg = "the recording file holds no DDTREE recording"
        raise UsageError(msg)
    top = max(r.budget for r in tree)
    latest = [r for r in tree if r.budget == top][-1]
    same = [r for r in tree if r.budget == top and r.digest == latest.digest]
    rounds = [dataclasses.replace(x, req=f"{r.rec}:{x.req}") for r in same for x in r.rounds
              if requests is None or x.req in requests]
    return dataclasses.replace(latest, rounds=rounds)


def cell_requests(records: list[dict[str, Any]], profile: str | None, temperature: float) -> set[str] | None:
    """The request ids (`repro bench`'s ``rid``) of the DDTREE cells of ``profile`` (every
    profile: None) at ``temperature``: the recording's rounds to keep, so warm-up requests and cells
    at another temperature (whose walk accepts by another law) stay out of τ(B). None when the
    results carry no ids (written before `repro bench` sent them): then every round counts."""
    rids = {r["rid"] for r in _requests(records, profile, temperature) if "rid" in r and r["cell"]["algorithm"] == DDTREE}
    return rids or None


def _requests(records: list[dict[str, Any]], profile: str | None, temperature: float) -> Iterator[dict[str, Any]]:
    """The request records of ``profile``'s cells (every profile's: None) at ``temperature``."""
    return (r for r in records if r.get("kind") == "request" and profile in (None, r["cell"]["profile"])
            and r["cell"]["temperature"] == temperature)


def _one(values: Iterable[Any], what: str) -> Any:
    found = sorted(set(values))
    if len(found) != 1:
        msg = f"the benchmark cells must share one {what} (got {found})"
        raise UsageError(msg)
    return found[0]


def analyze(records: list[dict[str, Any]], recording: Recording, *, profile: str, temperature: float,
            holdout: set[int], captured: Sequence[int] = ()) -> dict[str, Any]:
    """The tune result: costs, predictions, recommendation, DFLASH comparison and checks."""
    costs = cell_costs(records, profile, temperature)
    if not any(c.algorithm == DDTREE for c in costs):
        msg = f"no DDTREE benchmark cell of profile {profile!r} at T={temperature:g} in the results"
        raise UsageError(msg)
    new_tokens = _one((c.new_tokens for c in costs), "max_new_tokens")
    cell_prompts = _one((r["cell"]["prompts"] for r in _requests(records, profile, temperature)), "prompt set")
    sets = prompt_sets(recording)
    prompts = cell_prompts if cell_prompts in sets else "all" if "all" in sets else next(iter(sets), None)
    rounds = sets.get(prompts, []) if prompts else []
    if not rounds:
        msg = f"recording {recording.rec} holds no rounds"
        raise UsageError(msg)
    taus = budget_taus(rounds, recording.budget)
    chain = chain_estimate(rounds, recording.horizon)
    fit = {c.budget for c in costs if c.algorithm == DDTREE and c.budget not in holdout}
    model = CostModel(costs, fit)
    per_c = [_concurrency(model, c, new_tokens, taus, chain, recording) for c in
             sorted({c.concurrency for c in costs if c.algorithm == DDTREE})]
    checks = _checks(model, costs, new_tokens, taus, fit, recording.budget)
    sizes = sorted(set(captured) or {c.concurrency for c in costs if c.algorithm == DDTREE})
    return {
        "kind": "tune", "profile": profile, "temperature": temperature, "max_new_tokens": new_tokens,
        "prompts": cell_prompts,
        "recording": {"rec": recording.rec, "budget": recording.budget, "horizon": recording.horizon,
                      "digest": recording.digest, "prompts": prompts, "rounds": len(rounds),
                      "requests": len({r.req for r in rounds})},
        "tau": {str(b): taus[b].as_dict() for b in range(recording.budget + 1)},
        "chain": None if chain is None else chain.as_dict(),
        "costs": [c.as_dict() for c in costs], "fit_budgets": sorted(fit), "holdout_budgets": sorted(holdout),
        "concurrency": per_c, "schedule": schedule(model, sizes, new_tokens, taus, recording.budget), "checks": checks,
        "verdicts": [asdict(v) for v in _verdicts(per_c, checks, profile)],
    }


def _concurrency(model: CostModel, c: int, new_tokens: int, taus: list[Estimate], chain: ChainEstimate | None,
                 recording: Recording) -> dict[str, Any]:
    """Predicted curve, recommendation and the DFLASH comparison at one concurrency."""
    fitted = [b for b in model.budgets(c) if b <= recording.budget]
    curve = []
    if fitted:
        for b in range(fitted[0], fitted[-1] + 1):
            round_ms, ttft_ms = model.round_ms(c, b), model.ttft_ms(c, b)
            curve.append([b, predict_tok_s(c, new_tokens, ttft_ms, round_ms, taus[b].value)])
    best = max(curve, key=lambda p: p[1]) if curve else None
    drafter = model.drafter_ms(c)
    dflash = model.measured(DFLASH, c)
    dflash_tok_s, dflash_source = (dflash.tok_s, "measured") if dflash else (None, None)
    if dflash is None and chain is not None:
        verify_ms, ttft_ms = model.round_ms(c, recording.horizon), model.ttft_ms(c, recording.horizon)
        if verify_ms is not None:
            dflash_tok_s = predict_tok_s(c, new_tokens, ttft_ms, verify_ms, chain.low.value)
            dflash_source = "predicted (chain tau low bound, T_round(c, L))"
    ar = model.measured(AR, c)
    measured = [cell for cell in model.costs if cell.algorithm == DDTREE and cell.concurrency == c]
    top = max(measured, key=lambda cell: cell.tok_s, default=None)
    return {
        "concurrency": c, "curve": curve, "budget": best[0] if best else None, "tok_s": best[1] if best else None,
        "measured_tok_s": _measured_tok_s(model, c, best[0]) if best else None,
        "dflash_tok_s": dflash_tok_s, "dflash_source": dflash_source,
        "beats_dflash": None if best is None or dflash_tok_s is None else best[1] > dflash_tok_s,
        "best_measured_budget": top.budget if top else None, "best_measured_tok_s": top.tok_s if top else None,
        "ar_tok_s": ar.tok_s if ar else None,
        "drafter_ms": None if drafter is None else drafter[0],
        "drafter_extrapolated": None if drafter is None else drafter[1],
    }


def schedule(model: CostModel, sizes: Sequence[int], new_tokens: int, taus: list[Estimate],
             recorded: int) -> dict[str, Any] | None:
    """The budget schedule that maximises predicted throughput at every batch size of ``sizes``
    (module docstring), or None when no concurrency has a measured budget range."""
    measured = [c for c in sorted({c.concurrency for c in model.tree}) if model.budgets(c)]
    if not measured:
        return None
    rows = []
    for bs in sizes:
        lo, hi = max([c for c in measured if c <= bs], default=measured[0]), min([c for c in measured if c >= bs],
                                                                                  default=measured[-1])
        if not set(model.budgets(lo)) & set(model.budgets(hi)):  # no budget measured at both: the nearer one's
            lo = hi = min((lo, hi), key=lambda c: (abs(c - bs), c))
        budgets = [b for b in model.budgets(lo) if b in model.budgets(hi) and b <= recorded]
        at = min(max(bs, lo), hi)
        curve = []
        for b in range(budgets[0], budgets[-1] + 1) if budgets else ():
            round_ms, ttft_ms = (interpolate(sorted({(c, fig(c, b)) for c in (lo, hi)}), at)
                                 for fig in (model.round_ms, model.ttft_ms))
            curve.append((b, predict_tok_s(bs, new_tokens, ttft_ms, round_ms, taus[b].value)))
        if curve:
            best = max(curve, key=lambda p: p[1])
            rows.append({"bs": bs, "budget": best[0], "tok_s": best[1], "from_concurrency": sorted({lo, hi})})
    if not rows:
        return None
    table: dict[int, int] = {1: rows[0]["budget"]}
    for row in rows[1:]:
        if row["budget"] != table[max(table)]:
            table[row["bs"]] = row["budget"]
    text = BudgetSchedule.from_mapping(table)
    return {"rows": rows, "text": text.text, "toml": text.toml()}


def _measured_tok_s(model: CostModel, c: int, budget: int) -> float | None:
    cell = model.measured(DDTREE, c, budget)
    return cell.tok_s if cell else None


def _checks(model: CostModel, costs: list[CellCost], new_tokens: int, taus: list[Estimate], fit: set[int],
            recorded: int) -> list[dict[str, Any]]:
    """Predicted vs measured for every DDTREE cell the model covers."""
    out = []
    for cell in costs:
        if cell.algorithm != DDTREE or cell.budget is None or cell.budget > recorded:
            continue
        round_ms, ttft_ms = model.round_ms(cell.concurrency, cell.budget), model.ttft_ms(cell.concurrency, cell.budget)
        if round_ms is None or ttft_ms is None:
            continue
        predicted = predict_tok_s(cell.concurrency, new_tokens, ttft_ms, round_ms, taus[cell.budget].value)
        out.append({"budget": cell.budget, "concurrency": cell.concurrency, "fit": cell.budget in fit,
                    "predicted": predicted, "measured": cell.tok_s, "error": predicted / cell.tok_s - 1,
                    "tau_recorded": taus[cell.budget].value, "tau_measured": cell.tau})
    return out


def _verdicts(per_c: list[dict[str, Any]], checks: list[dict[str, Any]], profile: str) -> list[Verdict]:
    held = [c for c in checks if not c["fit"]]
    close = sum(abs(c["error"]) <= PREDICTION_TOLERANCE for c in held)
    worst = max((abs(c["error"]) for c in held), default=None)
    bound = f">= {MIN_CHECK_CELLS} held-out cells with |error| <= {PREDICTION_TOLERANCE:.0%}"
    subject = f"{profile} predicted vs measured tok/s, held-out cells within {PREDICTION_TOLERANCE:.0%} of {len(held)}"
    if worst is not None:
        subject += f" (worst |error| {worst:.1%})"
    status = NOT_MEASURED if len(held) < MIN_CHECK_CELLS else PASS if close >= MIN_CHECK_CELLS else FAIL
    verdicts = [Verdict("tune prediction", subject, float(close) if held else None, bound, status, SOURCE)]
    for row in per_c:
        best = row["best_measured_tok_s"]
        got = row["measured_tok_s"]
        value = None if got is None or not best else got / best
        ok = value is not None and value >= 1 - RECOMMENDATION_TOLERANCE
        verdicts.append(Verdict(
            "tune recommendation", f"{profile} c={row['concurrency']} B={row['budget']} vs best measured budget",
            value, f">= {1 - RECOMMENDATION_TOLERANCE:g} of the best measured",
            NOT_MEASURED if value is None else PASS if ok else FAIL, SOURCE))
    return verdicts


def _dflash_verdict(per_c: list[dict[str, Any]]) -> str:
    """Where DDTREE beats DFLASH, where not, and where no DFLASH figure exists to say."""
    wins, losses, unknown = ([str(r["concurrency"]) for r in per_c if r["beats_dflash"] is outcome]
                             for outcome in (True, False, None))
    if not wins and not losses:
        return "DDTREE against DFLASH: no DFLASH figure (bench a DFLASH cell, or a DDTREE budget at or below the horizon)."
    parts = [f"DDTREE beats DFLASH at c = {', '.join(wins) or 'none'}"]
    parts += [f"not at c = {', '.join(losses)}"] if losses else []
    parts += [f"unknown at c = {', '.join(unknown)} (no DFLASH figure)"] if unknown else []
    return "; ".join(parts) + "."


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any], *, markdown: bool) -> str:
    """A tune result as text or Markdown: recommendation per concurrency, DFLASH comparison,
    predicted vs measured, checks, and the server arguments to use."""
    rec, item, gap = result["recording"], "- " if markdown else "  ", [""] if markdown else []
    cells = f" on {result['prompts']}" if "prompts" in result else ""  # records before 2026-12-06 lack it
    out = [(f"tune {result['profile']} at T={result['temperature']:g}{cells}, {result['max_new_tokens']} new tokens: "
           f"recording {rec['rec']} (DDTREE B={rec['budget']}, {rec['rounds']} rounds of {rec['requests']} "
           f"requests, prompts {rec['prompts']}); costs fitted at B = {result['fit_budgets']}, held out "
           f"{result['holdout_budgets'] or 'none'}"), ""]
    rows = []
    for row in result["concurrency"]:
        ratio = None if not row["dflash_tok_s"] or row["tok_s"] is None else row["tok_s"] / row["dflash_tok_s"]
        drafter = _fmt(row["drafter_ms"], ".2f") + (" (extrapolated)" if row["drafter_extrapolated"] else "")
        rows.append([str(row["concurrency"]), _fmt(row["budget"], "d"), _fmt(row["tok_s"]), _fmt(row["measured_tok_s"]),
                     f"{_fmt(row['best_measured_tok_s'])} (B={row['best_measured_budget']})", _fmt(row["dflash_tok_s"]),
                     "-" if ratio is None else f"{ratio:.2f}x", _fmt(row["ar_tok_s"]), drafter])
    out.append(format_table(("c", "best B", "predicted tok/s", "measured", "best measured", "DFLASH tok/s",
                             "DDTREE/DFLASH", "AR tok/s", "drafter ms"), rows, markdown=markdown))
    out += [*gap, ("DFLASH: measured where a DFLASH cell exists, else predicted from the chain's tau low bound; "
            "drafter ms = T_round(c, 0) - T_AR(c).")]
    out.append(_dflash_verdict(result["concurrency"]))
    out += ["", "Predicted vs measured:", *gap]
    rows = [[str(c["budget"]), str(c["concurrency"]), "fit" if c["fit"] else "held out", _fmt(c["predicted"]),
             _fmt(c["measured"]), f"{100 * c['error']:+.1f}%", _fmt(c["tau_recorded"], ".2f"),
             _fmt(c["tau_measured"], ".2f")] for c in result["checks"]]
    out.append(format_table(("B", "c", "cell", "predicted", "measured", "error", "tau rec", "tau meas"), rows,
                            markdown=markdown))
    out += ["", "Checks:", *gap]
    spec = {"tune prediction": ".0f"}  # a count of cells; the others are ratios
    out += [f"{item}{v['status']}: {v['check']}, {v['subject']} = {_fmt(v['value'], spec.get(v['check'], '.3f'))} "
            f"({v['bound']})" for v in result["verdicts"]]
    out += ["", "Server arguments:", *gap]
    for row in result["concurrency"]:
        if row["budget"] is None:
            continue
        algo = DDTREE if row["beats_dflash"] is not False else DFLASH
        args = f"--speculative-algorithm {TABLE[algo].sglang}"
        if TABLE[algo].budgeted:
            args += f" --speculative-ddtree-budget {row['budget']}"
        out.append(f"{item}c={row['concurrency']} alone: `{args}`" if markdown else f"{item}c={row['concurrency']} alone: {args}")
    out += _schedule_lines(result.get("schedule"), item, gap, markdown=markdown)
    return "\n".join(out)


def _schedule_lines(plan: dict[str, Any] | None, item: str, gap: list[str], *, markdown: bool) -> list[str]:
    """The recommended budget schedule: its rows, server argument and profile key."""
    if plan is None:
        return []
    rows = [[str(r["bs"]), str(r["budget"]), _fmt(r["tok_s"]), "c = " + ", ".join(map(str, r["from_concurrency"]))]
            for r in plan["rows"]]
    arg, key = f"--speculative-ddtree-budget-schedule {plan['text']}", plan["toml"]
    tick = "`" if markdown else ""
    return ["", "Budget schedule (one server for every load: each batch size's best predicted budget):", *gap,
            format_table(("batch size", "best B", "predicted tok/s", "costs from"), rows, markdown=markdown), *gap,
            f"{item}server: {tick}--speculative-algorithm DDTREE {arg}{tick}", f"{item}profile: {tick}{key}{tick}"]
