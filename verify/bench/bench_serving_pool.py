"""Repeats of `bench_serving_check` pooled: each figure's median over the repeats, the spread of the
repeats as the noise, and a verdict that says "inconclusive" where the noise is wider than the bar.

    python -m verify.bench.bench_serving_pool CHECK.json... [--out POOLED.json]

Each CHECK.json is one repeat's ``bench_serving_check.json`` (``repro bench`` then ``bench_serving`` at
the same loads on the same server). One 64-request open-loop cell is a few seconds of traffic, and two
runs of the same load on the same server can differ by more than 10% in median TPOT, so one pair
cannot decide a 10% bar. Per (backend, rate, figure): repro's and bench_serving's medians over the
repeats and their ratio; the spread is the widest relative range, max / min - 1, among either
client's own repeats. Verdict, for the figures the check judges: ``yes`` when the ratio of medians is
within the tolerance, ``inconclusive`` when it is not but the repeats of one client differ by more
than that ratio does, ``NO`` otherwise. Exit 0 only when every verdict is yes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median
from typing import Any

from repro.evidence.results import format_table

HEADERS = ("backend", "rate", "figure", "repeats", "repro", "bench_serving", "repro/bs", "spread", "verdict")


def _spread(values: list[float]) -> float:
    """max / min - 1 of one client's repeats (0 for one repeat)."""
    low = min(values)
    return max(values) / low - 1 if low > 0 else float("inf")


def pool(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (backend, rate, figure) of the repeats' rows: medians, their ratio, the spread and
    the verdict (None for figures the check does not judge)."""
    tolerance = checks[0]["tolerance"]
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for check in checks:
        for row in check["rows"]:
            groups.setdefault((row["backend"], row["rate"], row["figure"]), []).append(row)
    out = []
    for (backend, rate, figure), rows in groups.items():
        mine = [r["repro"] for r in rows if isinstance(r["repro"], int | float)]
        theirs = [r["bench_serving"] for r in rows if isinstance(r["bench_serving"], int | float)]
        both = len(mine) == len(theirs) == len(rows)
        ratio = median(mine) / median(theirs) if both and median(theirs) else None
        spread = max(_spread(mine), _spread(theirs)) if both else None
        verdict = None
        if rows[0]["within"] is not None:
            if ratio is None or spread is None:
                verdict = "NO"
            elif abs(ratio - 1) <= tolerance:
                verdict = "yes"
            else:
                verdict = "inconclusive" if spread >= abs(ratio - 1) else "NO"
        out.append({"backend": backend, "rate": rate, "figure": figure, "repeats": len(rows),
                    "repro": median(mine) if mine else None, "bench_serving": median(theirs) if theirs else None,
                    "ratio": ratio, "spread": spread, "verdict": verdict})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The pooled rows as a text table."""
    def num(v: Any, spec: str = ".3g") -> str:
        return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)

    return format_table(HEADERS, [[r["backend"], f"{r['rate']:g}/s", r["figure"], str(r["repeats"]), num(r["repro"]),
                                   num(r["bench_serving"]), num(r["ratio"], ".3f"),
                                   "-" if r["spread"] is None else f"{r['spread']:.0%}", r["verdict"] or ""]
                                  for r in rows], markdown=False)


def main(argv: list[str] | None = None) -> int:
    """Pool the repeats, write the JSON, print the table; 0 when every verdict is yes."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checks", nargs="+", type=Path, help="bench_serving_check.json of each repeat")
    p.add_argument("--out", type=Path, default=None, help="the pooled JSON (default: beside the first check)")
    args = p.parse_args(argv)
    try:
        checks = [json.loads(path.read_text()) for path in args.checks]
    except (OSError, ValueError) as e:
        sys.exit(f"bench_serving_pool: {e}")
    if any(not isinstance(c, dict) or "rows" not in c or "tolerance" not in c for c in checks):
        sys.exit("bench_serving_pool: each file must be a bench_serving_check.json (rows and tolerance)")
    rows = pool(checks)
    verdicts = [r["verdict"] for r in rows if r["verdict"] is not None]
    passed = bool(verdicts) and all(v == "yes" for v in verdicts)
    out = args.out or args.checks[0].parent.parent / "bench_serving_pool.json"
    out.write_text(json.dumps({"tolerance": checks[0]["tolerance"], "repeats": [str(p) for p in args.checks],
                               "passed": passed, "rows": rows}, indent=1) + "\n")
    print(table(rows))
    counts = {v: verdicts.count(v) for v in ("yes", "inconclusive", "NO")}
    print(f"\nverdict over {len(checks)} repeats: {counts['yes']} yes, {counts['inconclusive']} inconclusive, "
          f"{counts['NO']} NO ({out})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
