"""Benchmark results: the crash-safe JSONL file and the per-cell summaries built from it.

Every line is one JSON record with a ``kind``: ``run`` (a bench invocation: argv, stack
fingerprint, profiles), ``server`` (a server's ``/server_info`` snapshot) or ``request`` (one
finished request). Lines are appended, flushed and fsynced one at a time, so a crash loses at
most the line being written; readers drop a torn last line and resume rewrites it away.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.errors import UsageError


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

    @property
    def key(self) -> str:
        """The cell as canonical JSON, to match records against cells."""
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def label(self) -> str:
        """The algorithm, with the budget for DDTREE (``"DDTREE B=16"``)."""
        return f"{self.algorithm} B={self.budget}" if self.algorithm == "DDTREE" else self.algorithm


ALGORITHM_ORDER = {"AR": 0, "DFLASH": 1, "DDTREE": 2}


def label_order(label: str) -> tuple[int, int]:
    """Sort key of a cell label: AR, DFLASH, then DDTREE by budget (``"DDTREE B=16"``)."""
    algorithm, _, budget = label.partition(" B=")
    return ALGORITHM_ORDER.get(algorithm, 3), int(budget or 0)


class ResultsWriter:
    """Append-only, fsync-per-line JSONL writer, safe to call from several threads."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        if path.exists() and path.stat().st_size and not resume:
            msg = (
                f"-o: {path} already holds results (pass --resume to continue it, "
                f"or choose another file)"
            )
            raise UsageError(msg)
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(path)
        self.path = path
        self._file = path.open("a")
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one JSON line and fsync it."""
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a crash left without its newline."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def read_records(path: Path) -> list[dict[str, Any]]:
    """All records of one results file; a torn last line is dropped, any other bad line is an error."""
    try:
        lines = path.read_text().split("\n")
    except OSError as exc:
        msg = f"cannot read results file {path} ({exc.strerror})"
        raise UsageError(msg) from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # torn tail: no newline after it
                break
            msg = f"{path}:{number}: not a JSON record"
            raise UsageError(msg) from None
    return records


def results_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, a directory standing for the ``*.jsonl`` files in it."""
    return [f for p in paths for f in (sorted(p.glob("*.jsonl")) if p.is_dir() else [p])]


def load_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Records of every results file of :func:`results_files`."""
    return [r for f in results_files(paths) for r in read_records(f)]


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
    tau_mean: float | None
    ttft_p50_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    taus: list[float] = field(default_factory=list)
    speedup: float | None = None  # over AR of the same profile, concurrency, temperature, prompts


def _summary(cell: Cell, rows: list[dict[str, Any]]) -> CellSummary:
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sessions[row.get("session", "")].append(row)
    # Wall time per bench invocation, so a resumed cell does not count the time between runs.
    wall = sum(max(r["end"] for r in rs) - min(r["start"] for r in rs) for rs in sessions.values())
    tokens = sum(r["completion_tokens"] for r in rows)
    taus = [r["tau"] for r in rows if r.get("tau") is not None]
    # Inter-token latency per token: a chunk of k tokens after a gap g counts as k gaps of g/k.
    itl = [gap / n for r in rows for gap, n in r.get("chunks", []) for _ in range(n)]
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    return CellSummary(
        cell=cell, requests=len(rows), output_tokens=tokens,
        output_tok_s=tokens / wall if wall > 0 else 0.0,
        tau_mean=sum(taus) / len(taus) if taus else None,
        ttft_p50_ms=ms(percentile([r["ttft_s"] for r in rows], 50)),
        itl_p50_ms=ms(percentile(itl, 50)), itl_p99_ms=ms(percentile(itl, 99)), taus=taus,
    )


def summarize(records: Iterable[dict[str, Any]]) -> list[CellSummary]:
    """One summary per cell, sorted for reading, with speedups over the matching AR cell."""
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
    baseline = {(s.cell.profile, s.cell.concurrency, s.cell.temperature, s.cell.prompts,
                 s.cell.max_new_tokens): s.output_tok_s
                for s in summaries if s.cell.algorithm == "AR"}
    for s in summaries:
        ar = baseline.get((s.cell.profile, s.cell.concurrency, s.cell.temperature, s.cell.prompts,
                           s.cell.max_new_tokens))
        s.speedup = s.output_tok_s / ar if ar else None
    return summaries


HEADERS = ("profile", "algorithm", "c", "T", "n", "tok/s", "tau", "TTFT p50 ms", "ITL p50 ms",
           "ITL p99 ms", "speedup")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table_rows(summaries: Iterable[CellSummary]) -> list[list[str]]:
    """Summary rows as strings, in :data:`HEADERS` order."""
    return [[s.cell.profile, s.cell.label, str(s.cell.concurrency), f"{s.cell.temperature:g}",
             str(s.requests), _fmt(s.output_tok_s), _fmt(s.tau_mean, 2), _fmt(s.ttft_p50_ms),
             _fmt(s.itl_p50_ms, 2), _fmt(s.itl_p99_ms, 2),
             "-" if s.speedup is None else f"{s.speedup:.2f}x"]
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
