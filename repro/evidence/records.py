"""What a results record may hold: the checks every record read passes, so that summaries and
reports never meet a missing or mistyped key.

A ``request`` record is a finished request, or a failed one: a request that ended in an HTTP error,
a refusal or a timeout is recorded with its ``error`` and without the figures of a completed one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from repro.algorithms import ALGORITHMS, budgeted
from repro.errors import UsageError
from repro.files import is_finite_number
from repro.schedule import BudgetSchedule

OPTIONAL_CELL_FIELDS = ("schedule", "request_rate", "api")
ALGORITHM_ORDER = {name: i for i, name in enumerate(ALGORITHMS)}
APIS = ("native", "openai")  # what `repro bench --api` measures through; a cell records all but native
KINDS = ("run", "server", "request", "tune")  # tune: `repro tune`'s result, read by `repro report`


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_seconds(v: Any) -> bool:
    return is_finite_number(v) and v >= 0


_CELL_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "profile": (lambda v: isinstance(v, str), "a string"),
    "algorithm": (lambda v: v in ALGORITHM_ORDER, f"one of {', '.join(ALGORITHM_ORDER)}"),
    "budget": (lambda v: v is None or _is_int(v), "an integer >= 0 or null"),
    "concurrency": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "temperature": (_is_seconds, "a finite number >= 0"),
    "prompts": (lambda v: isinstance(v, str), "a string"),
    "max_new_tokens": (lambda v: _is_int(v, 1), "an integer >= 1"),
    "schedule": (lambda v: v is None or _is_schedule(v), "a budget schedule (e.g. '1:63,16:15') or null"),
    "request_rate": (lambda v: v is None or (is_finite_number(v) and v > 0), "a number > 0 or null"),
    "api": (lambda v: v is None or v in APIS[1:], f"one of {', '.join(APIS[1:])} or null (native)"),
}
ALWAYS, COMPLETED, OPTIONAL = "always", "completed", "optional"  # when a request record must hold a key
_REQUEST_FIELDS: dict[str, tuple[Callable[[Any], bool], str, str]] = {  # check, expected, when required
    "session": (lambda v: isinstance(v, str), "a string", ALWAYS),
    "index": (_is_int, "an integer >= 0", ALWAYS),
    "rid": (lambda v: isinstance(v, str) and bool(v), "a non-empty string", OPTIONAL),  # load.request_id
    "turn": (_is_int, "an integer >= 0", OPTIONAL),  # bench --interleave: which of the cell's turns
    "start": (is_finite_number, "a finite number", ALWAYS),
    "end": (is_finite_number, "a finite number", ALWAYS),
    "completion_tokens": (_is_int, "an integer >= 0", COMPLETED),
    "ttft_s": (_is_seconds, "a finite number >= 0", COMPLETED),
    "prompt_tokens": (_is_int, "an integer >= 0", OPTIONAL),
    "latency_s": (_is_seconds, "a finite number >= 0", OPTIONAL),
    "spec_verify_ct": (lambda v: v is None or _is_int(v, 1), "an integer >= 1 or null", OPTIONAL),
    "tau": (lambda v: v is None or (is_finite_number(v) and v > 0), "a number > 0 or null", OPTIONAL),
    "chunks": (lambda v: isinstance(v, list) and all(
        isinstance(c, list) and len(c) == 2 and _is_seconds(c[0]) and _is_int(c[1], 1) for c in v),
        "a list of [seconds, tokens] pairs", OPTIONAL),
    "finish_reason": (lambda v: v is None or isinstance(v, str), "a string or null", OPTIONAL),
    "config": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
               "an object of digests", OPTIONAL),
    "error": (lambda v: isinstance(v, str) and bool(v), "a non-empty string", OPTIONAL),  # a failed request
    "arrival_s": (_is_seconds, "a finite number >= 0", OPTIONAL),  # open loop: when it arrived in its cell's schedule
}
_OTHER_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {  # optional in run/server records
    "session": (lambda v: isinstance(v, str), "a string"),
    "profiles": (lambda v: isinstance(v, dict), "an object"),
    "fingerprint": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "topology": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "profile": (lambda v: isinstance(v, str), "a string"),
    "label": (lambda v: isinstance(v, str), "a string"),
}


def check_record(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it is a results record whose keys have the types the readers rely on."""
    def fail(problem: str) -> None:
        msg = f"{where}: {problem}"
        raise UsageError(msg)

    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        fail(f"not a results record (expected a JSON object whose kind is {', '.join(KINDS)}; "
             f"got {record!r:.60})")
    if record["kind"] != "request":
        for key, (ok, expected) in _OTHER_FIELDS.items():
            if key in record and not ok(record[key]):
                fail(f"key '{key}' must be {expected} (got {record[key]!r:.60})")
        return record
    _check_request(record, fail)
    return record


def _check_request(record: dict[str, Any], fail: Callable[[str], None]) -> None:
    failed = "error" in record
    for key, (ok, expected, required) in _REQUEST_FIELDS.items():
        if key not in record:
            if required == ALWAYS or (required == COMPLETED and not failed):
                fail(f"key '{key}' is missing (expected {expected})")
        elif not ok(record[key]):
            fail(f"key '{key}' must be {expected} (got {record[key]!r:.60})")
    if record["end"] < record["start"]:
        fail(f"key 'end' must be >= start ({record['start']}) (got {record['end']})")
    _check_cell(record.get("cell"), fail)


def _check_cell(cell: Any, fail: Callable[[str], None]) -> None:
    required = set(_CELL_FIELDS) - set(OPTIONAL_CELL_FIELDS)
    if not isinstance(cell, dict) or not required <= set(cell) <= set(_CELL_FIELDS):
        fail(f"key 'cell' must be an object with the keys {', '.join(sorted(required))} (and optionally "
             f"{', '.join(OPTIONAL_CELL_FIELDS)}) (got {cell!r:.80})")
    for key, (ok, expected) in _CELL_FIELDS.items():
        if key in cell and not ok(cell[key]):
            fail(f"key 'cell.{key}' must be {expected} (got {cell[key]!r:.60})")
    scheduled = cell.get("schedule") is not None
    if (budgeted(cell["algorithm"]) and not scheduled) != (cell["budget"] is not None):
        fail(f"key 'cell.budget' must be set for DDTREE without a schedule and only then (got {cell['budget']!r} "
             f"for {cell['algorithm']})")
    if scheduled and not budgeted(cell["algorithm"]):
        fail(f"key 'cell.schedule' must be null for {cell['algorithm']} (got {cell['schedule']!r:.40})")


def _is_schedule(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return BudgetSchedule.parse(value).text == value
    except ValueError:
        return False
