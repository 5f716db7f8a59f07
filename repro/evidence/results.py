"""Benchmark results: the crash-safe JSONL file and the per-cell summaries built from it.

Every line is one JSON record with a ``kind``: ``run`` (a bench invocation: argv, stack
fingerprint, profiles), ``server`` (a server's ``/server_info`` snapshot) or ``request`` (one
finished request, or a failed one with its ``error``). Lines are appended, flushed and fsynced one
at a time, so a crash loses at most the line being written; readers drop a torn last line and
resume cuts it away (a complete last record that only lacks its newline is kept). Every record
read is checked (:mod:`repro.evidence.records`).
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from repro.algorithms import AR, DDTREE, DFLASH, budgeted
from repro.errors import UsageError
from repro.evidence import intervals
from repro.evidence.latency import Samples, Spread, e2e_s, itl_s, rate_text, samples
from repro.evidence.records import ALGORITHM_ORDER, KINDS, OPTIONAL_CELL_FIELDS, check_record
from repro.files import parse_json, read_text


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
    api: str | None = None  # measured through: None for SGLang's native /generate, "openai" for /v1/completions

    @property
    def key(self) -> str:
        """The cell as canonical JSON, to match records against cells (the optional fields only
        when set, so a cell keeps the key it had before they existed)."""
        fields = {k: v for k, v in asdict(self).items() if v is not None or k not in OPTIONAL_CELL_FIELDS}
        return json.dumps(fields, sort_keys=True)

    @property
    def label(self) -> str:
        """The algorithm, with the budget or schedule for DDTREE (``"DDTREE B=16"``, ``"DDTREE S=1:63,16:15"``)."""
        if not budgeted(self.algorithm):
            return self.algorithm
        return f"{self.algorithm} S={self.schedule}" if self.schedule is not None else f"{self.algorithm} B={self.budget}"

    @property
    def load(self) -> str:
        """How the cell loads its server: ``c=4`` (closed loop) or ``rate=2/s c<=16`` (open loop, capped),
        through the API named after ``via`` where it is not the native one."""
        load = f"c={self.concurrency}" if self.request_rate is None else f"rate={self.request_rate:g}/s c<={self.concurrency}"
        return load + (f" via {self.api}" if self.api else "")

    @property
    def source(self) -> str:
        """The profile, with the API where it is not the native one (``"p via openai"``): a table's profile column."""
        return self.profile + (f" via {self.api}" if self.api else "")


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


def _other_kind(path: Path) -> bool:
    """True for a JSONL file whose first record is a JSON object of a kind results files do not
    hold (an acceptance recording); a file :func:`read_records` must judge gives False."""
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8")) as f:
            row = parse_json(next((line for line in f if line.strip()), ""))
    except (OSError, EOFError, ValueError, zlib.error):
        return False
    return isinstance(row, dict) and row.get("kind") not in KINDS


def scan_results(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(results files, skipped): the files named, and of each directory its ``*.jsonl`` and gzipped
    ``*.jsonl.gz`` files; the directory's other files (recordings, JSON, figures) are skipped."""
    files: list[Path] = []
    skipped: list[Path] = []
    for p in paths:
        if not p.is_dir():
            files.append(p)
            continue
        for f in sorted(p.iterdir()):
            results = f.is_file() and f.name.endswith((".jsonl", ".jsonl.gz")) and not _other_kind(f)
            (files if results else skipped).append(f)
    return files, skipped


def results_files(paths: Iterable[Path]) -> list[Path]:
    """The results files of :func:`scan_results`."""
    return scan_results(paths)[0]


def load_records(paths: Iterable[Path], what: str = "RESULTS") -> list[dict[str, Any]]:
    """Records of every results file of :func:`results_files`."""
    return [r for f in results_files(paths) for r in read_records(f, what)]


def finished(records: Iterable[dict[str, Any]]) -> set[tuple[str, int]]:
    """(cell key, request index) of every request already recorded (a failed one too: its failure is measured)."""
    return {(Cell(**r["cell"]).key, r["index"]) for r in records if r.get("kind") == "request"}


@dataclass
class CellSummary:
    """The measured numbers of one cell (figures over its completed requests; ``failed`` counts the others)."""

    cell: Cell
    requests: int  # completed
    failed: int
    output_tokens: int
    output_tok_s: float
    request_s: float  # completed requests per second of wall time
    decode_tok_s: float | None  # steady state: tokens after each request's first over the time after it, x c
    tau_mean: float | None
    in_flight: float | None  # mean requests in flight: request-seconds over wall time (Little's law)
    ttft_ms: Spread | None
    tpot_ms: Spread | None
    itl_ms: Spread | None
    e2e_ms: Spread | None
    samples: Samples
    taus: list[float] = field(default_factory=list)
    speedup: float | None = None  # over AR of the same profile, load, temperature, prompts
    over_dflash: float | None = None  # DDTREE: over DFLASH, likewise
    speedup_interval: tuple[float, float] | None = None  # closed loop: 95%, bootstrap over requests
    over_dflash_interval: tuple[float, float] | None = None


def completed(record: dict[str, Any]) -> bool:
    """True for the record of a request that finished (not one recorded with its ``error``)."""
    return record.get("kind") == "request" and "error" not in record


def _summary(cell: Cell, rows: list[dict[str, Any]]) -> CellSummary:
    sessions: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sessions[row.get("session", ""), row.get("turn")].append(row)
    # Wall time per bench invocation (and per --interleave turn), so a resumed cell does not count
    # the time between runs, nor an interleaved one the other servers' turns.
    wall = sum(max(r["end"] for r in rs) - min(r["start"] for r in rs) for rs in sessions.values())
    done = [r for r in rows if completed(r)]
    per = samples(done)
    taus = [r["tau"] for r in done if r.get("tau") is not None]
    itl = itl_s(done)
    in_flight = sum(e2e_s(r) for r in rows) / wall if wall > 0 else None
    # Steady-state decode: the first token's wait (prefill, queueing; TTFT) left out; c requests at once
    # (open loop: as many as were in flight on average).
    decode_s = sum(gap for r in done for gap, _ in r.get("chunks", []))
    width = cell.concurrency if cell.request_rate is None else in_flight or 0.0
    return CellSummary(
        cell=cell, requests=len(done), failed=len(rows) - len(done), output_tokens=sum(per.tokens),
        output_tok_s=sum(per.tokens) / wall if wall > 0 else 0.0, request_s=len(done) / wall if wall > 0 else 0.0,
        decode_tok_s=width * len(itl) / decode_s if decode_s > 0 else None,
        tau_mean=sum(taus) / len(taus) if taus else None, in_flight=in_flight,
        ttft_ms=Spread.of([r["ttft_s"] for r in done]), tpot_ms=Spread.of(per.tpot_s), itl_ms=Spread.of(itl),
        e2e_ms=Spread.of(per.e2e_s), samples=per, taus=taus,
    )


def summarize(records: Iterable[dict[str, Any]]) -> list[CellSummary]:
    """One summary per cell, sorted for reading, with its speedup over the matching AR cell and a
    DDTREE cell's over the DFLASH one: from the runs that served both side by side where there are
    any (AR's via DFLASH's where a run served DFLASH and not AR), else from the pooled cells; closed
    loop, each with its 95% interval (bootstrap over the two cells' requests)."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    cells: dict[str, Cell] = {}
    for r in records:
        if r.get("kind") == "request":
            cell = Cell(**r["cell"])
            cells.setdefault(cell.key, cell)
            by_cell.setdefault(cell.key, []).append(r)
    summaries = sorted(
        (_summary(cells[k], rows) for k, rows in by_cell.items()),
        key=lambda s: (s.cell.profile, s.cell.prompts, s.cell.temperature, label_order(s.cell.label),
                       s.cell.request_rate is not None, s.cell.request_rate or 0, s.cell.concurrency))
    pooled = {s.cell.key: s for s in summaries}
    in_session = _session_tok_s(by_cell, cells)
    for s in summaries:
        ar = replace(s.cell, algorithm=AR, budget=None, schedule=None).key
        dflash = replace(s.cell, algorithm=DFLASH, budget=None, schedule=None).key
        dflash_over_ar = _side_by_side(dflash, ar, in_session)
        through = (dflash, dflash_over_ar) if dflash_over_ar else None
        s.speedup = _either(_side_by_side(s.cell.key, ar, in_session, through=through), s, pooled.get(ar))
        s.speedup_interval = _interval(s, s.speedup, pooled.get(ar))
        if s.cell.algorithm == DDTREE:
            s.over_dflash = _either(_side_by_side(s.cell.key, dflash, in_session), s, pooled.get(dflash))
            s.over_dflash_interval = _interval(s, s.over_dflash, pooled.get(dflash))
    return summaries


def _either(matched: float | None, s: CellSummary, pooled_base: CellSummary | None) -> float | None:
    """The side-by-side ratio, else the ratio of the pooled cells (runs that never served both)."""
    if matched is not None:
        return matched
    return s.output_tok_s / pooled_base.output_tok_s if pooled_base and pooled_base.output_tok_s else None


def _interval(s: CellSummary, value: float | None, base: CellSummary | None) -> tuple[float, float] | None:
    """The 95% interval of a closed-loop cell's throughput ratio ``value`` over ``base``: each
    cell's tokens per request-second, bootstrapped over its requests (none for a cell over itself)."""
    if value is None or base is None or base is s or s.cell.request_rate is not None:
        return None
    per = [list(zip(x.samples.tokens, x.samples.e2e_s, strict=True)) for x in (s, base)]
    got = intervals.ratio(value, per[0], per[1], intervals.throughput)
    return None if got.low is None or got.high is None else (got.low, got.high)


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


HEADERS = ("profile", "algorithm", "c", "rate", "T", "n", "tok/s", "decode tok/s", "tau", "TTFT p50 ms",
           "ITL p50 ms", "ITL p99 ms", "speedup", "x DFLASH")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio_text(value: float | None, interval: tuple[float, float] | None) -> str:
    return "-" if value is None else intervals.Ratio(value, *(interval or (None, None))).text("x")


def table_rows(summaries: Iterable[CellSummary]) -> list[list[str]]:
    """Summary rows as strings, in :data:`HEADERS` order (a ratio with its 95% interval where it has one)."""
    return [[s.cell.source, s.cell.label, str(s.cell.concurrency), rate_text(s.cell.request_rate),
             f"{s.cell.temperature:g}", str(s.requests), _fmt(s.output_tok_s), _fmt(s.decode_tok_s), _fmt(s.tau_mean, 2),
             _fmt(s.ttft_ms and s.ttft_ms.p50), _fmt(s.itl_ms and s.itl_ms.p50, 2), _fmt(s.itl_ms and s.itl_ms.p99, 2),
             _ratio_text(s.speedup, s.speedup_interval), _ratio_text(s.over_dflash, s.over_dflash_interval)]
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
