"""`repro report RESULTS... -o DIR`: the handoff report, as Markdown, JSON and PNG plots.

It gathers the verify tiers that ran and why the others were skipped (pytest ``--junitxml``
files), the stack fingerprint of the machine each benchmark ran on, the benchmark summary with its
latency figures and open-loop latency ratios, the verdicts against each profile's thresholds, TP vs
TP+EP throughput, what τ and the measured verify cost allow on the full-size targets beside what
was served (``--verify-cost``), plots, and with ``--baseline`` the results compared cell by cell
with a baseline run's (a change's before and after) rather than pooled with them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.evidence import compare, machines
from repro.evidence.intervals import Ratio
from repro.evidence.latency import LATENCY_HEADERS, SPREAD_NOTE, latency_rows
from repro.evidence.results import HEADERS, Cell, format_table, read_records, scan_results, summarize, table_rows
from repro.evidence.verdicts import FAIL, INCONCLUSIVE, judge, tp_ep_points
from repro.files import write_atomic
from repro.handoff import plots
from repro.serving.profiles import Profile, load_profiles
from repro.serving.thresholds import load_thresholds
from repro.stack.pins import git_revision
from repro.tuning import bound, recommend
from repro.tuning.recommend import render as render_tune

PLOTS = {"speedup_vs_budget.png": "DDTree speedup over AR (else over DFLASH) vs budget",
         "tau_vs_budget.png": "tau per request against DDTree budget B, mean and 95% interval",
         "tp_vs_ep_throughput.png": "TP vs TP+EP output throughput vs concurrency",
         "tune_predicted_vs_measured.png": "repro tune: predicted vs measured DDTREE throughput"}
_FLAG_SKIPS = ("--benchmark-skip active", "--benchmark-only active")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro report``."""
    parser.add_argument("results", nargs="*", type=Path, metavar="RESULTS",
                        help="bench JSONL files, or directories of them")
    parser.add_argument("-o", "--output-dir", type=Path, required=True)
    parser.add_argument("--tiers", nargs="+", action="extend", type=Path, default=[], metavar="JUNIT_XML",
                        help="pytest --junitxml files of the verify run(s)")
    parser.add_argument("--verify-cost", nargs="+", action="extend", type=Path, default=[], metavar="JSON",
                        help="verify/bench/verify_cost.py results of full-size targets")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="bench results (a file or directory) to compare RESULTS with cell by cell")
    parser.add_argument("--profile-file", type=Path, default=None, help="another profiles.toml")
    parser.add_argument("--thresholds-file", type=Path, default=None,
                        help="another thresholds.toml")


def _rank(outcome: str, reason: str) -> int:
    if outcome == "skipped":
        return 0 if any(flag in reason for flag in _FLAG_SKIPS) else 1
    return {"passed": 2, "failed": 3}[outcome]


def read_tiers(paths: list[Path]) -> dict[str, dict[str, Any]]:  # noqa: C901 - read, rank, then count
    """Per tier (``verify/<tier>/``): passed/failed/skipped counts and the skip reasons.

    A test seen in several files counts once, by its most telling outcome (failed, passed,
    skipped for a reason, skipped by a benchmark flag).
    """
    tests: dict[str, tuple[str, str, str]] = {}  # id -> (tier, outcome, reason)
    for path in paths:
        try:
            root = ET.parse(path).getroot()  # noqa: S314 - pytest's own JUnit output
        except (OSError, ET.ParseError) as exc:
            msg = f"--tiers: cannot read {path} as JUnit XML ({exc})"
            raise UsageError(msg) from None
        for case in root.iter("testcase"):
            classname = case.get("classname", "")
            parts = classname.split(".")
            tier = parts[1] if len(parts) > 2 and parts[0] == "verify" else "other"
            outcome, reason = "passed", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped" and outcome != "failed":
                    outcome, reason = "skipped", child.get("message", "")
            key = f"{classname}::{case.get('name')}"
            old = tests.get(key)
            if old is None or _rank(outcome, reason) > _rank(old[1], old[2]):
                tests[key] = (tier, outcome, reason)
    tiers: dict[str, dict[str, Any]] = {}
    for tier, outcome, reason in tests.values():
        t = tiers.setdefault(tier, {"passed": 0, "failed": 0, "skipped": 0, "reasons": {}})
        t[outcome] += 1
        if outcome == "skipped":
            t["reasons"][reason] = t["reasons"].get(reason, 0) + 1
    for t in tiers.values():
        t["status"] = "failed" if t["failed"] else "ran" if t["passed"] else "skipped"
    return dict(sorted(tiers.items()))


def pooled_revisions(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Cells whose requests came from runs at more than one commit (``revision``, ``+dirty`` for a
    working tree with changes): their rows average different code. {cell: [revisions]}; a cell
    names its prompt set where the records hold several."""
    revision: dict[str, str] = {}
    for r in records:
        git = (r.get("fingerprint") or {}).get("git") if r.get("kind") == "run" else None
        if isinstance(git, dict) and git.get("revision"):
            revision[r["session"]] = f"{git['revision'][:7]}{'+dirty' if git.get('dirty') else ''}"
    several = len({r["cell"]["prompts"] for r in records if r.get("kind") == "request"}) > 1
    by_cell: dict[str, set[str]] = {}
    for r in records:
        if r.get("kind") == "request" and r.get("session") in revision:
            c = Cell(**r["cell"])
            subject = f"{c.profile} {c.label} {c.load} T={c.temperature:g}"
            subject += f" prompts={c.prompts}" if several else ""
            by_cell.setdefault(subject, set()).add(revision[r["session"]])
    return {cell: sorted(revs) for cell, revs in sorted(by_cell.items()) if len(revs) > 1}


def _profiles(by_file: dict[Path, list[dict[str, Any]]], path: Path | None) -> dict[str, Profile]:
    """Profiles as the benchmarks ran them, else as the profiles file defines them."""
    profiles = dict(load_profiles(path))
    for file, records in by_file.items():
        for r in records:
            if r["kind"] == "run":
                profiles.update({n: Profile.from_dict(d, f"RESULTS: {file}: run record profiles.{n}")
                                 for n, d in r.get("profiles", {}).items()})
    return profiles


def _command(args: argparse.Namespace) -> str:
    """The ``repro report`` command line that ``args`` stand for."""
    words = ["repro", "report", *map(str, args.results), "-o", str(args.output_dir)]
    for flag, values in (("--tiers", args.tiers), ("--verify-cost", args.verify_cost)):
        words += [flag, *map(str, values)] if values else []
    for flag, value in (("--baseline", args.baseline), ("--profile-file", args.profile_file),
                        ("--thresholds-file", args.thresholds_file)):
        words += [flag, str(value)] if value is not None else []
    return shlex.join(words)


def _commit(git: dict[str, Any] | None) -> str:
    """``commit 1a2b3c4d5e6f`` (``, with uncommitted changes``) of the checkout that wrote the report."""
    if not git:
        return "no git checkout"
    dirty = " with uncommitted changes" if git.get("dirty") else ""
    return f"commit {str(git['revision'])[:12]}{dirty}"


def _listing(paths: list[str]) -> str:
    """``: `a`, `b`.`` for the results files a report was written from (nothing for none)."""
    return ": " + ", ".join(f"`{p}`" for p in paths) if paths else ""


def _bench_tables(summaries: list[Any]) -> list[str]:
    """The benchmark and latency tables, one each per prompt set where the results hold several."""
    sets = list(dict.fromkeys(s.cell.prompts for s in summaries))
    out = []
    for prompts in sets:
        mine = [s for s in summaries if s.cell.prompts == prompts]
        out += [*([f"Prompts `{prompts}`:", ""] if len(sets) > 1 else []),
                format_table(HEADERS, table_rows(mine), markdown=True), "",
                f"Latency ({SPREAD_NOTE}):", "", format_table(LATENCY_HEADERS, latency_rows(mine), markdown=True), ""]
    return out[:-1] or ["No benchmark results."]


def _ratio_markdown(ratios: list[compare.LatencyRatio]) -> list[str]:
    """The open-loop latency ratios section."""
    out = ["", "## Open-loop latency", ""]
    if not ratios:
        return [*out, "No open-loop cell has a baseline at its rate (`repro bench --request-rate`)."]
    return [*out, ("Each open-loop cell's median and p90 TPOT and end-to-end latency over its baseline's at the same "
                   "rate, cap and temperature, with the 95% interval (bootstrap over each cell's requests); below 1 is "
                   "faster. Below saturation every algorithm delivers the offered tokens, so these, not tok/s, tell "
                   "them apart."), "", format_table(compare.RATIO_HEADERS, compare.ratio_rows(ratios), markdown=True)]


def _baseline_markdown(section: dict[str, Any] | None) -> list[str]:
    """The before/after section of ``--baseline``."""
    if section is None:
        return []
    out = ["", "## Against the baseline", "", (f"Baseline (before){_listing(section['results'])}; after: the "
           "results above. Each cell measured in both, figure by figure, with after/before and its 95% interval "
           "(bootstrap over each side's requests)."), ""]
    out.append(format_table(compare.BEFORE_AFTER_HEADERS, compare.before_after_rows(section["rows"]), markdown=True)
               if section["rows"] else "No cell was measured in both.")
    for side, cells in (("before", section["only_before"]), ("after", section["only_after"])):
        if cells:
            out += ["", f"Measured {side} only:", "", *(f"- {c}" for c in cells)]
    return out


def _value(v: dict[str, Any]) -> str:
    """A verdict's value, with its 95% interval where it has one."""
    if v["value"] is None:
        return "-"
    if v["interval"] is None:
        return f"{v['value']:.3g}"
    low, high = v["interval"]
    return Ratio(v["value"], low, high).text()


def _markdown(data: dict[str, Any], summaries: list[Any], ratios: list[compare.LatencyRatio]) -> str:
    out = ["# k26-ddtree-repro handoff report", "",
           (f"Written {data['written']} by `{data['command']}` at {_commit(data['commit'])} from "
            f"{len(data['results'])} results file(s), {data['requests']} recorded requests" + _listing(data["results"]) + "."),
           ""]
    if data["skipped"]:
        out += [f"Skipped {len(data['skipped'])} file(s) of the results directories that are not bench results"
                + _listing(data["skipped"]) + ".", ""]
    out += ["## Verify tiers", ""]
    if data["tiers"]:
        rows = [[tier, t["status"], str(t["passed"]), str(t["failed"]), str(t["skipped"]),
                 "; ".join(f"{r} ({n})" for r, n in t["reasons"].items()) or "-"]
                for tier, t in data["tiers"].items()]
        out.append(format_table(("tier", "status", "passed", "failed", "skipped", "why skipped"),
                                rows, markdown=True))
    else:
        out.append("No verify run was given (`--tiers`).")
    out += ["", "## Stack fingerprint", "", machines.table(data["fingerprints"]), "", "## Verdicts", ""]
    if data["verdicts"]:
        sources = list(dict.fromkeys(v["source"] for v in data["verdicts"]))
        rows = [[v["check"], v["subject"], _value(v), v["bound"] or "-",
                 v["status"].upper() if v["status"] == FAIL else v["status"],
                 f"[{sources.index(v['source']) + 1}]"] for v in data["verdicts"]]
        out.append(format_table(("check", "subject", "value", "bound", "status", "source"), rows,
                                markdown=True))
        out += ["", ("A value's 95% interval, where it has one, is in brackets; a floor strictly inside it is "
                     "inconclusive."), "", "Sources (from repro/data/thresholds.toml unless said otherwise):", "",
                *(f"{i}. {source}" for i, source in enumerate(sources, 1))]
    else:
        out.append("No benchmark results: nothing to judge.")
    out += ["", "## Benchmarks", "", *_bench_tables(summaries)]
    out += ["", ("c: closed-loop clients, or with a rate (open loop: Poisson arrivals per second) the cap on requests "
                 "in flight; tok/s: output tokens over wall time per cell; tau: completion tokens / verify "
                 "rounds (bonus included); ITL: inter-token latency, a chunk of k tokens counting as k "
                 "gaps; TPOT: a request's (latency - TTFT) / (tokens - 1); E2E: a request's latency; in flight: "
                 "request-seconds over wall time; speedup: tok/s over AR at the same load and temperature, x DFLASH: "
                 "a DDTREE cell's over DFLASH's, each from the runs that served both cells side by side (a run without AR "
                 "through its DFLASH cell), else from the pooled cells; closed loop, with a 95% interval (bootstrap over "
                 "the two cells' requests of tokens per request-second). Failed requests (an HTTP error, a refusal, a "
                 "timeout) are counted apart; the figures are the completed requests'.")]
    if data["pooled_revisions"]:
        out += ["", "Cells pooled from runs at more than one commit (their figures average different code):", "",
                *(f"- {cell}: {', '.join(revs)}" for cell, revs in data["pooled_revisions"].items())]
    out += ["", "## TP vs TP+EP", ""]
    if data["tp_vs_ep"]:
        rows = [[p["machine"], p["label"], str(p["concurrency"]), f"{p['temperature']:g}",
                 f"{p['tp_tok_s']:.1f}", f"{p['ep_tok_s']:.1f}", f"{p['ratio']:.2f}"]
                for p in data["tp_vs_ep"]]
        out.append(format_table(("machine", "algorithm", "c", "T", "TP tok/s", "TP+EP tok/s",
                                 "TP/EP"), rows, markdown=True))
    else:
        out.append("No cell was measured on both a TP and a TP+EP profile of one machine.")
    out += ["", "## Verify cost and what it allows", ""]
    if data["verify_cost"]:
        out.append("The GPU-bound limit of each algorithm (`repro.tuning.bound`: a round is the drafter at its "
                   "HBM floor plus the verify at N, host cost left out), beside the served ratio.")
        for section in data["verify_cost"]:
            caption = f"{section['model']}: verify cost against N"
            note = section["figure_note"]
            out += ["", *bound.markdown(section), "", f"![{caption}](verify_cost_{section['model']}.png)"
                    if note is None else f"- {caption}: not drawn, {note}"]
    else:
        out.append("No verify-cost result was given (`--verify-cost`).")
    out += _ratio_markdown(ratios)
    out += _baseline_markdown(data["baseline"])
    out += tune_markdown(data["tune"])
    out += ["", "## Plots", ""]
    for name, caption in PLOTS.items():
        note = data["plots"][name]
        out += [f"![{caption}]({name})" if note is None else f"- {caption}: not drawn, {note}", ""]
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    """Write report.md, report.json and the plots into ``--output-dir``."""
    if not args.results and not args.tiers and not args.verify_cost:
        msg = "give RESULTS files or directories, --tiers JUNIT_XML or --verify-cost JSON"
        raise UsageError(msg)
    if args.baseline is not None and not args.results:
        msg = "--baseline compares RESULTS with it: give RESULTS files or directories too"
        raise UsageError(msg)
    missing = [p for p in [*args.results, *args.tiers, *args.verify_cost, *filter(None, [args.baseline])]
               if not p.exists()]
    if missing:
        msg = f"{missing[0]} does not exist"
        raise UsageError(msg)
    if args.output_dir.exists() and not args.output_dir.is_dir():
        msg = f"-o: {args.output_dir} is not a directory"
        raise UsageError(msg)
    files, skipped = scan_results(args.results)
    by_file = {f: read_records(f, "RESULTS") for f in files}
    records = [r for rs in by_file.values() for r in rs]
    tiers = read_tiers(args.tiers)
    summaries = summarize(records)
    closed = [s for s in summaries if s.cell.request_rate is None]  # throughput figures: closed loop only
    ratios = compare.latency_ratios(summaries)
    baseline = _baseline(args.baseline, summaries, skipped)
    profiles = _profiles(by_file, args.profile_file)
    verdicts = judge(summaries, profiles, load_thresholds(args.thresholds_file))
    points = tp_ep_points(summaries, profiles)
    tunes = tune_results(records)
    costs = [bound.allowed(p) for p in args.verify_cost]
    for section in costs:
        bound.add_measured(section, closed, {name: p.model for name, p in profiles.items()})
    out_dir = args.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    no_plots = plots.unavailable()
    if no_plots:
        print(f"report: no plots: {no_plots}", file=sys.stderr)
    for section in costs:
        section["figure_note"] = no_plots or plots.verify_cost_vs_tokens(
            section["cost_rows"], out_dir / f"verify_cost_{section['model']}.png", title=section["model"])
    drawn = {name: no_plots or draw(out_dir / name) for name, draw in {
        "speedup_vs_budget.png": lambda path: plots.speedup_vs_budget(closed, path),
        "tau_vs_budget.png": lambda path: plots.tau_vs_budget(summaries, path),
        "tp_vs_ep_throughput.png": lambda path: plots.tp_ep_throughput(points, path),
        "tune_predicted_vs_measured.png": lambda path: plots.tune_prediction(tunes, path),
    }.items()}
    for name, note in drawn.items():
        if note is not None:  # no stale figure from an earlier report in the same directory
            (out_dir / name).unlink(missing_ok=True)
    data = {
        "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": _command(args), "commit": git_revision(),
        "results": [str(p) for p in by_file], "skipped": [str(p) for p in skipped],
        "requests": sum(1 for r in records if r["kind"] == "request"),
        "tiers": tiers, "fingerprints": machines.fingerprints(records),
        "verdicts": [asdict(v) for v in verdicts],
        "summaries": [{**asdict(s.cell), **{k: v for k, v in asdict(s).items() if k not in ("cell", "samples")}}
                      for s in summaries],
        "latency_ratios": [r.as_dict() for r in ratios], "baseline": baseline,
        "pooled_revisions": pooled_revisions(records),
        "tp_vs_ep": [{**asdict(p), "ratio": p.ratio} for p in points], "plots": drawn, "tune": tunes,
        "verify_cost": costs,
    }
    write_atomic(out_dir / "report.json", json.dumps(data, indent=2, default=str) + "\n")
    write_atomic(out_dir / "report.md", _markdown(data, summaries, ratios) + "\n")
    failed = sum(1 for v in verdicts if v.status == FAIL)
    unsure = sum(1 for v in verdicts if v.status == INCONCLUSIVE)
    ran = ", ".join(f"{t} {d['status']}" for t, d in data["tiers"].items())
    print(f"report: {out_dir / 'report.md'} ({len(verdicts)} verdicts, {failed} failed"
          f"{f', {unsure} inconclusive' if unsure else ''}{'; tiers: ' + ran if ran else ''})")
    return 0


def _baseline(path: Path | None, after: list[Any], skipped: list[Path]) -> dict[str, Any] | None:
    """``--baseline``'s files and its comparison with the summaries of RESULTS (None without it);
    the files of its directory that are not results are added to ``skipped``."""
    if path is None:
        return None
    files, others = scan_results([path])
    skipped += others
    before = summarize(r for f in files for r in read_records(f, "--baseline"))
    return {"results": [str(f) for f in files], **compare.before_after(before, after)}


def tune_results(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest `repro tune` record of each profile, prompt set and temperature; its verdicts cite
    the bounds where the code states them today (the record keeps the wording of its day)."""
    latest = {(r["profile"], r.get("prompts"), r["temperature"]): r for r in records if r.get("kind") == "tune"}
    return [{**r, "verdicts": [{**v, "source": recommend.SOURCE} for v in r.get("verdicts", [])]}
            for r in latest.values()]


def tune_markdown(tunes: list[dict[str, Any]]) -> list[str]:
    """The report's budget-tuning section."""
    out = ["", "## Budget tuning (`repro tune`)", ""]
    if not tunes:
        return [*out, "No `repro tune` result was given."]
    for tune in tunes:
        out += [render_tune(tune, markdown=True), ""]
    return out
