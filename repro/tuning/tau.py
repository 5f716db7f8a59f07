"""`repro tau RECORDING`: tau for every budget up to the recorded one, and the DFLASH chain's, from one run.

Reads an acceptance recording (:mod:`repro.recording`; written by ``repro demo --record`` or a
server with ``$REPRO_DDTREE_RECORD`` set) and prints, per recording and prompt set, tau(B') for
every B' <= B with a 95% interval over requests (:mod:`repro.tuning.acceptance`), then the chain's tau
on the same drafter rows with the number of rounds it could only bound. A recording written during
`repro bench` also holds its warm-up requests and every temperature's cells: ``--results`` (the
bench's JSONL) keeps only the rounds of its DDTREE requests at ``--temperature``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from repro.argtypes import number
from repro.errors import UsageError
from repro.evidence.results import format_table, load_records
from repro.tuning.acceptance import Recording, budget_taus, budgets_run, chain_estimate, prompt_sets, read_recordings
from repro.tuning.recommend import cell_requests


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro tau``."""
    parser.add_argument("recording", type=Path, metavar="RECORDING", help="acceptance recording (JSONL)")
    parser.add_argument("--budgets", default=None,
                        help="comma-separated budgets B' (default: every B' up to the recorded budget)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--results", type=Path, nargs="+", action="extend", default=None, metavar="RESULTS",
                        help="repro bench JSONL: count only the rounds of its DDTREE requests at --temperature")
    parser.add_argument("--temperature", type=number(at_least=0), default=None,
                        help="with --results: the cells' sampling temperature (default 0)")


def parse_budgets(text: str) -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16]; UsageError naming --budgets otherwise."""
    try:
        budgets = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        budgets = []
    if not budgets or budgets[0] < 0:
        msg = f"--budgets must be comma-separated integers >= 0 (got {text!r})"
        raise UsageError(msg)
    return budgets


def summarize(recording: Recording, budgets: list[int] | None) -> dict[str, Any]:
    """The JSON-ready tau summary of one recording (every B' up to its budget unless ``budgets``)."""
    wanted = [b for b in budgets if b <= recording.budget] if budgets else list(range(recording.budget + 1))
    groups = []
    for prompts, rounds in prompt_sets(recording).items():
        taus = budget_taus(rounds, recording.budget)
        chain = chain_estimate(rounds, recording.horizon)
        groups.append({"prompts": prompts, "rounds": len(rounds),
                       "requests": len({r.req for r in rounds}),
                       "budgets": {str(b): n for b, n in budgets_run(rounds).items()},
                       "tau": [{"budget": b, **taus[b].as_dict()} for b in wanted if taus[b].requests],
                       "chain": None if chain is None else chain.as_dict()})
    header = recording.header
    return {"rec": recording.rec, "algorithm": recording.algorithm, "budget": recording.budget,
            "horizon": recording.horizon, "digest": recording.digest, "source": header.get("source", ""),
            "groups": groups}


def _table(summary: dict[str, Any]) -> str:
    title = (f"recording {summary['rec']}: {summary['algorithm']} B={summary['budget']} "
             f"L={summary['horizon']}, source {summary['source'] or '-'}, digest {summary['digest'][:12]}")
    out = [title]
    if not summary["groups"]:
        out.append("  no rounds recorded")
    for group in summary["groups"]:
        runs = group.get("budgets") or {}
        mixed = f" at budgets {', '.join(f'{b} ({n})' for b, n in runs.items())}" if len(runs) > 1 else ""
        out.append(f"\nprompts {group['prompts']}: {group['rounds']} rounds of {group['requests']} requests{mixed}"
                   + ("; tau(B') from the rounds of budget >= B'" if mixed else ""))
        rows = [[str(t["budget"]), f"{t['tau']:.3f}", f"{t['low']:.3f}-{t['high']:.3f}"] for t in group["tau"]]
        out.append(format_table(("B'", "tau", "95% CI"), rows, markdown=False))
        chain = group["chain"]
        if chain is None:
            out.append("DFLASH chain: not recorded (no chain fields)")
        else:
            value = f"{chain['low']:.3f}" if chain["censored"] == 0 else f"{chain['low']:.3f}..{chain['high']:.3f}"
            out.append(f"DFLASH chain (L={summary['horizon']}) on the same rows: tau {value} "
                       f"(95% CI {chain['ci_low']:.3f}-{chain['ci_high']:.3f}); {chain['censored']} of "
                       f"{chain['rounds']} rounds censored (the tree held the chain only as deep as the "
                       f"path went: counted at 1 + depth for the low, 1 + L for the high figure)")
    return "\n".join(out)


def _of_cells(recordings: list[Recording], results: list[Path], temperature: float) -> list[Recording]:
    """The recordings with only the rounds of the results' DDTREE requests at ``temperature``."""
    rids = cell_requests(load_records(results, "--results"), None, temperature)
    if rids is None:
        msg = (f"--results: no DDTREE request at T={temperature:g} with a request id in "
               f"{', '.join(map(str, results))} (results of a repro bench that sent no request ids cannot select rounds)")
        raise UsageError(msg)
    kept = [dataclasses.replace(r, rounds=[x for x in r.rounds if x.req in rids]) for r in recordings]
    if not any(r.rounds for r in kept):
        msg = f"--results: the recording holds no round of its {len(rids)} DDTREE requests at T={temperature:g}"
        raise UsageError(msg)
    return kept


def main(args: argparse.Namespace) -> int:
    """Print the tau table (or JSON) of every recording in the file."""
    budgets = parse_budgets(args.budgets) if args.budgets is not None else None
    recordings = read_recordings(args.recording)
    if budgets and budgets[-1] > max(r.budget for r in recordings):
        msg = (f"--budgets: {budgets[-1]} is above every recorded budget in {args.recording} "
               f"(largest {max(r.budget for r in recordings)})")
        raise UsageError(msg)
    if args.results is not None:
        recordings = _of_cells(recordings, args.results, args.temperature or 0.0)
    elif args.temperature is not None:
        msg = "--temperature selects cells of --results; pass the bench JSONL with --results"
        raise UsageError(msg)
    summaries = [summarize(r, budgets) for r in recordings]
    if args.json:
        print(json.dumps({"recording": str(args.recording), "recordings": summaries}, indent=2))
    else:
        print("\n\n".join(_table(s) for s in summaries))
    return 0
