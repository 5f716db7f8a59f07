"""Benchmark results: the crash-safe JSONL file and the per-cell summaries built from it.

Every line is one JSON record with a ``kind``: ``run`` (a bench invocation: argv, stack
fingerprint, profiles), ``server`` (a server's ``/server_info`` snapshot) or ``request`` (one
finished request). Lines are appended, flushed and fsynced one at a time, so a crash loses at
most the line being written; readers drop a torn last line and resume cuts it away (a complete
last record that only lacks its newline is kept). Every record read is checked, so summaries
and reports never meet a missing or mistyped key.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.files import is_finite_number, parse_json, read_text
from repro.schedule import BudgetSchedule


@dataclass(frozen=True)
class Cell:
    """One benchmark configuration; its requests are numbered 0..n-1."""

    profile: str
    algorithm: str
    budget: int | None
    concurrency: int
    temperature: float
    prompts: str
    max_new_tokens: int
    schedule: str | None = None  # DDTREE with a budget schedule (repro.schedule's text); budget None then
    request_rate: float | None = None  # open loop: Poisson arrivals per second, concurrency their cap

    @property
    def key(self) -> str:
        """The cell as canonical JSON, to match records against cells (the optional fields only
        when set, so a cell keeps the key it had before they existed)."""
        fields = {k: v for k, v in asdict(self).items() if v is not None or k not in OPTIONAL_CELL_FIELDS}
        return json.dumps(fields, sort_keys=True)

    @property
    def label(self) -> str:
        """The algorithm, with the budget or schedule for DDTREE (``"DDTREE B=16"``, ``"DDTREE S=1:63,16:15"``)."""
        if self.algorithm != "DDTREE":
            return self.algorithm
        return f"DDTREE S={self.schedule}" if self.schedule is not None else f"DDTREE B={self.budget}"


OPTIONAL_CELL_FIELDS = ("schedule", "request_rate")
ALGORITHM_ORDER = {"AR": 0, "DFLASH": 1, "DDTREE": 2}
KINDS = ("run", "server", "request", "tune")  # tune: `repro tune`'s result, read by `repro report`


def label_order(label: str) -> tuple[int, int, str]:
    """Sort key of a cell label: AR, DFLASH, DDTREE by budget (``"DDTREE B=16"``), then schedules."""
    algorithm, _, budget = label.partition(" B=")
    if " S=" in label:
        algorithm, _, schedule = label.partition(" S=")
        return ALGORITHM_ORDER.get(algorithm, 3), 1 << 30, schedule
    return ALGORITHM_ORDER.get(algorithm, 3), int(budget or 0), ""


class ResultsWriter:
    """Append-only, fsync-per-line JSONL writer, safe to call from several threads.

    Opening an existing file (``resume``) first reads and checks every record, so a file that is
    not a results file, or is binary, is refused untouched; then a last line without its newline
    is repaired: a complete record keeps its bytes and gets the newline, and only a torn record
    (the start of a JSON object that a crash cut) is cut away.
    """

    def __init__(self, path: Path, *, resume: bool, what: str = "-o") -> None:
        existing_records(path, resume=resume, what=what)  # refuses before touching anything
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            _repair_tail(path)
        self.path = path
        self._file = path.open("a")
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one JSON line and fsync it."""
        line = json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def existing_records(path: Path, *, resume: bool, what: str = "-o") -> list[dict[str, Any]]:
    """The records of a results file about to be written (checked; nothing is written): none
    for a new or empty file, a UsageError for a directory, or for results without ``resume``."""
    if path.is_dir():
        msg = f"{what}: {path} is a directory (expected a results JSONL file)"
        raise UsageError(msg)
    if not path.exists() or not path.stat().st_size:
        return []
    if not resume:
        msg = f"{what}: {path} already holds results (pass --resume to continue it, or choose another file)"
        raise UsageError(msg)
    return read_records(path, what)


def _repair_tail(path: Path) -> None:
    """End the file with a newline: keep a complete last record, cut a torn one."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        parse_json(data[cut:].decode())
    except ValueError:  # torn by a crash (read_records accepted it only as a record's start)
        with path.open("r+b") as f:
            f.truncate(cut)
            os.fsync(f.fileno())
        return
    with path.open("ab") as f:
        f.write(b"\n")
        os.fsync(f.fileno())


def read_records(path: Path, what: str = "results file") -> list[dict[str, Any]]:
    """All records of one results file, each checked (:func:`check_record`).

    A last line without its newline is a record when it parses, and a torn record (dropped)
    when it is the start of a JSON object that does not; anything else is a UsageError naming
    the file and line, as is a binary file or a line that is not a results record.
    """
    text = read_text(path, what, "a results JSONL file")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{what}: {path}:{number}"
        try:
            row = parse_json(line)
        except ValueError as exc:
            if number == len(lines) and line.lstrip().startswith("{"):  # torn tail
                break
            msg = f"{where}: not a JSON record ({exc})"
            raise UsageError(msg) from None
        records.append(check_record(row, where))
    return records


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
}
_REQUEST_FIELDS: dict[str, tuple[Callable[[Any], bool], str, bool]] = {  # check, expected, required
    "session": (lambda v: isinstance(v, str), "a string", True),
    "index": (_is_int, "an integer >= 0", True),
    "rid": (lambda v: isinstance(v, str) and bool(v), "a non-empty string", False),  # bench.request_id
    "turn": (_is_int, "an integer >= 0", False),  # bench --interleave: which of the cell's turns
    "start": (is_finite_number, "a finite number", True),
    "end": (is_finite_number, "a finite number", True),
    "completion_tokens": (_is_int, "an integer >= 0", True),
    "ttft_s": (_is_seconds, "a finite number >= 0", True),
    "prompt_tokens": (_is_int, "an integer >= 0", False),
    "latency_s": (_is_seconds, "a finite number >= 0", False),
    "spec_verify_ct": (lambda v: v is None or _is_int(v, 1), "an integer >= 1 or null", False),
    "tau": (lambda v: v is None or (is_finite_number(v) and v > 0), "a number > 0 or null", False),
    "chunks": (lambda v: isinstance(v, list) and all(
        isinstance(c, list) and len(c) == 2 and _is_seconds(c[0]) and _is_int(c[1], 1) for c in v),
        "a list of [seconds, tokens] pairs", False),
    "finish_reason": (lambda v: v is None or isinstance(v, str), "a string or null", False),
    "config": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
               "an object of digests", False),
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
    for key, (ok, expected, required) in _REQUEST_FIELDS.items():
        if key not in record:
            if required:
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
    if (cell["algorithm"] == "DDTREE" and not scheduled) != (cell["budget"] is not None):
        fail(f"key 'cell.budget' must be set for DDTREE without a schedule and only then (got {cell['budget']!r} "
             f"for {cell['algorithm']})")
    if scheduled and cell["algorithm"] != "DDTREE":
        fail(f"key 'cell.schedule' must be null for {cell['algorithm']} (got {cell['schedule']!r:.40})")


def _is_schedule(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return BudgetSchedule.parse(value).text == value
    except ValueError:
        return False


def results_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, a directory standing for the ``*.jsonl`` (and gzipped ``*.jsonl.gz``) files in it."""
    return [f for p in paths
            for f in (sorted([*p.glob("*.jsonl"), *p.glob("*.jsonl.gz")]) if p.is_dir() else [p])]


def load_records(paths: Iterable[Path], what: str = "RESULTS") -> list[dict[str, Any]]:
    """Records of every results file of :func:`results_files`."""
    return [r for f in results_files(paths) for r in read_records(f, what)]


def finished(records: Iterable[dict[str, Any]]) -> set[tuple[str, int]]:
    """(cell key, request index) of every request already recorded."""
    return {(Cell(**r["cell"]).key, r["index"]) for r in records if r.get("kind") == "request"}


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class CellSummary:
    """The measured numbers of one cell."""

    cell: Cell
    requests: int
    output_tokens: int
    output_tok_s: float
    decode_tok_s: float | None  # steady state: tokens after each request's first over the time after it, x c
    tau_mean: float | None
    ttft_p50_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    taus: list[float] = field(default_factory=list)
    speedup: float | None = None  # over AR of the same profile, concurrency, temperature, prompts
    over_dflash: float | None = None  # DDTREE: over DFLASH, likewise


def _summary(cell: Cell, rows: list[dict[str, Any]]) -> CellSummary:
    sessions: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sessions[row.get("session", ""), row.get("turn")].append(row)
    # Wall time per bench invocation (and per --interleave turn), so a resumed cell does not count
    # the time between runs, nor an interleaved one the other servers' turns.
    wall = sum(max(r["end"] for r in rs) - min(r["start"] for r in rs) for rs in sessions.values())
    tokens = sum(r["completion_tokens"] for r in rows)
    taus = [r["tau"] for r in rows if r.get("tau") is not None]
    # Inter-token latency per token: a chunk of k tokens after a gap g counts as k gaps of g/k.
    itl = [gap / n for r in rows for gap, n in r.get("chunks", []) for _ in range(n)]
    # Steady-state decode: the first token's wait (prefill, queueing; TTFT) left out; c requests at once.
    decode_s = sum(gap for r in rows for gap, _ in r.get("chunks", []))
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    return CellSummary(
        cell=cell, requests=len(rows), output_tokens=tokens,
        output_tok_s=tokens / wall if wall > 0 else 0.0,
        decode_tok_s=cell.concurrency * len(itl) / decode_s if decode_s > 0 else None,
        tau_mean=sum(taus) / len(taus) if taus else None,
        ttft_p50_ms=ms(percentile([r["ttft_s"] for r in rows], 50)),
        itl_p50_ms=ms(percentile(itl, 50)), itl_p99_ms=ms(percentile(itl, 99)), taus=taus,
    )


def summarize(records: Iterable[dict[str, Any]]) -> list[CellSummary]:
    """One summary per cell, sorted for reading, with its speedup over the matching AR cell and a
    DDTREE cell's over the DFLASH one: from the runs that served both side by side where there are
    any (AR's via DFLASH's where a run served DFLASH and not AR), else from the pooled cells."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    cells: dict[str, Cell] = {}
    for r in records:
        if r.get("kind") == "request":
            cell = Cell(**r["cell"])
            cells.setdefault(cell.key, cell)
            by_cell.setdefault(cell.key, []).append(r)
    summaries = sorted(
        (_summary(cells[k], rows) for k, rows in by_cell.items()),
        key=lambda s: (s.cell.profile, s.cell.prompts, s.cell.temperature,
                       label_order(s.cell.label), s.cell.concurrency))
    pooled = {s.cell.key: s.output_tok_s for s in summaries}
    in_session = _session_tok_s(by_cell, cells)
    for s in summaries:
        ar = replace(s.cell, algorithm="AR", budget=None, schedule=None).key
        dflash = replace(s.cell, algorithm="DFLASH", budget=None, schedule=None).key
        dflash_over_ar = _side_by_side(dflash, ar, in_session)
        through = (dflash, dflash_over_ar) if dflash_over_ar else None
        s.speedup = _either(_side_by_side(s.cell.key, ar, in_session, through=through), s.output_tok_s, pooled.get(ar))
        if s.cell.algorithm == "DDTREE":
            s.over_dflash = _either(_side_by_side(s.cell.key, dflash, in_session), s.output_tok_s, pooled.get(dflash))
    return summaries


def _either(matched: float | None, tok_s: float, pooled_base: float | None) -> float | None:
    """The side-by-side ratio, else the ratio of the pooled cells (runs that never served both)."""
    if matched is not None:
        return matched
    return tok_s / pooled_base if pooled_base else None


def _session_tok_s(by_cell: dict[str, list[dict[str, Any]]],
                   cells: dict[str, Cell]) -> dict[str, dict[str, tuple[float, int]]]:
    """{cell key: {bench session: (tok/s, requests)}}: each cell as each ``repro bench`` run served it."""
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for key, rows in by_cell.items():
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[row.get("session", "")].append(row)
        out[key] = {session: (_summary(cells[key], rs).output_tok_s, len(rs)) for session, rs in groups.items()}
    return out


def _side_by_side(key: str, base: str, in_session: dict[str, dict[str, tuple[float, int]]], *,
                  through: tuple[str, float] | None = None) -> float | None:
    """A cell's tok/s over a baseline cell's, from the runs that served both (the GPU machine drifts
    between runs; within one, ``--interleave`` serves them in turns), the runs weighted by requests.
    ``through`` (another cell, and its ratio over the baseline measured side by side elsewhere):
    a run without the baseline counts through that cell instead. None if no run served both."""
    total = weight = 0.0
    for session, (tok_s, n) in in_session.get(key, {}).items():
        got, scale = in_session.get(base, {}).get(session), 1.0
        if not got and through is not None:
            got, scale = in_session.get(through[0], {}).get(session), through[1]
        if got and got[0] > 0:
            total, weight = total + n * tok_s / got[0] * scale, weight + n
    return total / weight if weight else None


HEADERS = ("profile", "algorithm", "c", "T", "n", "tok/s", "decode tok/s", "tau", "TTFT p50 ms", "ITL p50 ms",
           "ITL p99 ms", "speedup", "x DFLASH")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table_rows(summaries: Iterable[CellSummary]) -> list[list[str]]:
    """Summary rows as strings, in :data:`HEADERS` order."""
    return [[s.cell.profile, s.cell.label, str(s.cell.concurrency), f"{s.cell.temperature:g}",
             str(s.requests), _fmt(s.output_tok_s), _fmt(s.decode_tok_s), _fmt(s.tau_mean, 2), _fmt(s.ttft_p50_ms),
             _fmt(s.itl_p50_ms, 2), _fmt(s.itl_p99_ms, 2),
             "-" if s.speedup is None else f"{s.speedup:.2f}x",
             "-" if s.over_dflash is None else f"{s.over_dflash:.2f}x"]
            for s in summaries]


def format_table(headers: Iterable[str], rows: list[list[str]], *, markdown: bool) -> str:
    """A plain aligned text table, or a Markdown one."""
    headers = list(headers)
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths]), *map(fmt, rows)])
