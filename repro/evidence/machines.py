"""The machines a report's results came from: their stack fingerprints (run records'), as one table."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from repro.evidence.results import format_table


def fingerprints(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per distinct machine the results came from, or this machine's if none."""
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == "run":
            entry = {"fingerprint": r.get("fingerprint"), "topology": r.get("topology")}
            seen.setdefault(json.dumps(entry, sort_keys=True, default=str), entry)
    if seen:
        return list(seen.values())
    from repro.stack.pins import fingerprint

    return [{"fingerprint": fingerprint(), "topology": None, "note": "the machine that wrote this "
             "report (no benchmark results carry one)"}]


def _gpus(gpus: Any) -> str:
    """``8 x NVIDIA H200 (sm 9.0)``, a group per model."""
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        return str(gpus)
    groups = Counter(f"{g.get('name')} (sm {g.get('capability')})" for g in gpus)
    return ", ".join(f"{n} x {name}" for name, n in groups.items()) or "none"


def _fingerprint_rows(entry: dict[str, Any]) -> dict[str, str]:
    """A machine's fingerprint as table rows: row name -> value."""
    fp = dict(entry.get("fingerprint") or {})
    rows = {"note": entry["note"]} if entry.get("note") else {}
    if "gpus" in fp:
        rows["GPUs"] = _gpus(fp.pop("gpus"))
    for key, value in fp.items():
        if key == "packages" and isinstance(value, dict):
            rows |= {name: version or "missing" for name, version in value.items()}
        elif key == "git" and isinstance(value, dict):
            rows["commit"] = f"{str(value.get('revision'))[:12]}{' (dirty)' if value.get('dirty') else ''}"
        elif key == "stack_sha256" and isinstance(value, str):
            rows["stack.toml sha256"] = value[:12]
        elif isinstance(value, list):
            rows[key] = ", ".join(map(str, value)) or "-"
        else:
            rows[key] = "-" if value is None else json.dumps(value) if isinstance(value, dict) else str(value)
    topo = entry.get("topology")
    if topo:
        rows["topology"] = str(topo.get("interconnect") or topo.get("error"))
    return rows


def table(entries: list[dict[str, Any]]) -> str:
    """The machines' fingerprints side by side: a row per item, a column per machine (entries that
    differ only in their commit share a column, which lists every commit)."""
    machines: dict[str, dict[str, str]] = {}
    for entry in entries:
        rows = _fingerprint_rows(entry)
        key = json.dumps({k: v for k, v in rows.items() if k != "commit"}, sort_keys=True)
        seen = machines.setdefault(key, rows)
        if seen is not rows and "commit" in rows and rows["commit"] not in seen.get("commit", "").split(", "):
            seen["commit"] = ", ".join(filter(None, [seen.get("commit"), rows["commit"]]))
    names = list(dict.fromkeys(k for m in machines.values() for k in m))
    if not names:
        return "No run record carries a stack fingerprint."
    headers = ["what", *(f"machine {i}" for i in range(1, len(machines) + 1))] if len(machines) > 1 else ["what", "value"]
    return format_table(headers, [[n, *(m.get(n, "-") for m in machines.values())] for n in names], markdown=True)
