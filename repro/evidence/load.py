"""The load a bench cell puts on a server, and the record of every request it sends.

A cell's requests are released in index order, each at its arrival time, and sent as soon as fewer
than the cell's ``concurrency`` are in flight (one that arrives at a full cell waits for a slot).
Closed loop, every request arrives at once, so ``c`` clients each send the next request when their
last one ends. Open loop (``request_rate``), arrivals are a Poisson process drawn as SGLang's
``bench_serving --request-rate`` draws it: the first request at 0, then exponential gaps of mean
1/rate from numpy's legacy generator seeded with ``--seed`` (so every algorithm at a rate sees the
same arrivals, and ``bench_serving --seed`` the same ones too); ``concurrency`` caps the requests in
flight as its ``--max-concurrency`` does. A request that fails (an HTTP error,
a refusal, a timeout) is recorded with its error and counted, and the cell goes on; a server that
died stops the run, with its log's tail.
"""

from __future__ import annotations

import hashlib
import math
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from repro.errors import ReproError, UsageError
from repro.evidence.results import Cell, ResultsWriter
from repro.serving.profiles import Profile
from repro.serving.sglang_client import Client, Completion
from repro.serving.sglang_server import SGLangServer

DEATH_WAIT_S = 5.0  # after a failed request: how long a started server has to show it died


@dataclass(frozen=True)
class Job:
    """One server's work: the profile as served, its cells, the request inputs per prompt, the
    digests of what it runs (``repro.evidence.runconfig``) and, for ``--url``, the server's info."""

    profile: Profile
    cells: list[Cell]
    inputs: list[dict[str, Any]]
    config: dict[str, str]
    info: dict[str, Any] | None = None

    def payload(self, index: int, temperature: float, max_new: int, rid: str | None = None) -> dict[str, Any]:
        """The ``/generate`` body of prompt ``index`` (prompts repeat past the set's end), with
        the request id ``rid`` when given."""
        return {**self.inputs[index % len(self.inputs)], **({"rid": rid} if rid else {}), "sampling_params": {
            "temperature": temperature, "max_new_tokens": max_new, "ignore_eos": True}}


def request_id(cell: Cell, session: str, index: int) -> str:
    """The id a measured request is sent with: ``PROMPTS/SESSION-CELL-INDEX``. An acceptance
    recording keys its rounds by it (the prompt set before the ``/``, :func:`repro.recording.prompts_of`),
    so `repro tune` keeps only the rounds of the cells it analyses (not warm-up, not another T)."""
    digest = hashlib.sha256(cell.key.encode()).hexdigest()[:10]
    return f"{cell.prompts.replace('/', '_')}/{session[:12]}-{digest}-{index}"


def arrival_offsets(count: int, rate: float | None, seed: int) -> list[float]:
    """Seconds from a cell's first request to the arrival of each of its first ``count``: all 0 in
    closed loop (``rate`` None), else cumulative exponential gaps of mean 1/``rate``, the numbers
    ``bench_serving`` sleeps between its requests after ``np.random.seed(seed)``."""
    if rate is None:
        return [0.0] * count
    gaps = np.random.RandomState(seed).exponential(1.0 / rate, max(count - 1, 0))  # bench_serving's generator
    return [0.0, *np.cumsum(gaps).tolist()][:count]


def check_arrivals(records: list[dict[str, Any]], planned: dict[str, Cell], seed: int, path: Path) -> None:
    """A UsageError when a planned open-loop cell (key -> cell) holds requests that arrived on
    another schedule than ``seed`` draws (its ``arrival_s``): a resume must not mix two."""
    for r in records:
        cell = planned.get(Cell(**r["cell"]).key) if r["kind"] == "request" and "arrival_s" in r else None
        if cell is None or cell.request_rate is None:
            continue
        if not math.isclose(arrival_offsets(r["index"] + 1, cell.request_rate, seed)[-1], r["arrival_s"],
                            rel_tol=1e-9, abs_tol=1e-9):
            msg = (f"--resume: {path} holds {cell.profile} {cell.label} {cell.load} T={cell.temperature:g} results "
                   f"whose arrivals another --seed drew; pass the --seed that wrote them, or write to a new -o file")
            raise UsageError(msg)


def progress_bar(total: int, done: int) -> tqdm:
    """The bench's progress on stderr: requests done of ``total``, ``done`` of them by an earlier run
    (tqdm; every 30 s where stderr is not a terminal)."""
    return tqdm(total=total, initial=done, unit="req", desc="bench", mininterval=0.1 if sys.stderr.isatty() else 30)


@dataclass
class _CellRun:
    """One cell's run in progress: its free slots, its stop signal and a dead server's error."""

    slots: threading.Semaphore
    stop: threading.Event
    deaths: list[ReproError]


class Runner:
    """Drives the cells of one server and records every request."""

    def __init__(self, writer: ResultsWriter, session: str, progress: tqdm,
                 deadline: float | None, seed: int, *, flush: bool = False) -> None:
        self.writer, self.session, self.progress, self.deadline = writer, session, progress, deadline
        self.seed = seed  # of the open-loop arrivals
        self.flush = flush  # empty the server's prefix cache before each cell (its first turn)
        self.stopped = False  # set once the time limit is reached
        self.slowest_start = 0.0  # seconds the slowest server took to become healthy

    def out_of_time(self, margin: float = 0.0) -> bool:
        """True when less than ``margin`` seconds are left before the time limit."""
        return self.deadline is not None and time.monotonic() + margin > self.deadline

    def run_cell(self, client: Client, job: Job, cell: Cell, indices: list[int],
                 server: SGLangServer | None, turn: int | None = None) -> None:
        """Send ``indices`` of ``cell`` at their arrival times (from the first of them on), at most
        ``cell.concurrency`` in flight, and record each (``turn``: which of the cell's
        ``--interleave`` turns they are, kept in each record); none is sent past the time limit."""
        if self.flush and not turn:
            client.flush_cache()
        offsets = arrival_offsets(max(indices) + 1, cell.request_rate, self.seed)
        run = _CellRun(threading.Semaphore(cell.concurrency), threading.Event(), [])
        origin = time.monotonic() - offsets[indices[0]]
        threads = []
        try:
            for index in indices:
                if run.stop.wait(max(0.0, origin + offsets[index] - time.monotonic())):
                    break
                run.slots.acquire()
                self.stopped = self.stopped or self.out_of_time()
                if run.stop.is_set() or self.stopped:
                    break
                arrival = offsets[index] if cell.request_rate is not None else None
                thread = threading.Thread(target=self._request, daemon=True,
                                          args=(client, job, cell, index, server, run, turn, arrival))
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()
        finally:
            run.stop.set()
        if run.deaths:
            raise run.deaths[0]

    def _request(self, client: Client, job: Job, cell: Cell, index: int, server: SGLangServer | None,
                 run: _CellRun, turn: int | None, arrival: float | None) -> None:
        """Send one request, free its slot, and record it, failed or not, unless the server died."""
        start, rid = time.time(), request_id(cell, self.session, index)
        done: Completion | ReproError
        try:
            done = client.generate(job.payload(index, cell.temperature, cell.max_new_tokens, rid))
        except ReproError as exc:
            done = exc
        finally:
            end = time.time()
            run.slots.release()
        record = {"kind": "request", "session": self.session, "cell": asdict(cell), "index": index, "rid": rid,
                  "start": start, "end": end, "config": job.config,
                  **({} if turn is None else {"turn": turn}), **({} if arrival is None else {"arrival_s": arrival})}
        if isinstance(done, ReproError):
            death = _death(client, server, f"request {index} of {cell.label} {cell.load}", done)
            if death is not None:
                run.deaths.append(death)
                run.stop.set()
                return
            record["error"] = str(done)
        else:
            record.update(prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                          spec_verify_ct=done.spec_verify_ct, tau=done.tau, ttft_s=done.ttft_s,
                          latency_s=done.latency_s, chunks=done.chunks, finish_reason=done.finish_reason)
        self.writer.append(record)
        with self.progress.get_lock():  # requests end on several threads
            self.progress.set_postfix_str(f"{cell.profile} {cell.label} {cell.load} T={cell.temperature:g}", refresh=False)
            self.progress.update()


def _death(client: Client, server: SGLangServer | None, what: str, exc: ReproError) -> ReproError | None:
    """The error that ends the run when the server died with ``what`` in flight, else None (the
    request failed on a live server: it is recorded as failed)."""
    if server is None:
        if client.healthy():
            return None
        msg = f"{what} failed and the server at --url no longer answers /health: {exc}"
        return ReproError(msg)
    code = server.wait_exit(DEATH_WAIT_S)
    if code is None:
        return None
    msg = f"exited with code {code} during {what}"
    return server.failure(msg)


def warm_up(client: Client, job: Job, rounds: int, widths: list[int], first: int) -> None:
    """Unrecorded short requests, ``rounds`` times at every concurrency in ``widths``: batch sizes
    the timed cells will reach compile and allocate here, not inside a measured request. Prompts
    are taken from index ``first`` on (past the measured ones where the set is large enough, so
    the radix cache does not shorten measured prefills)."""
    for width in sorted(set(widths)):
        for _ in range(rounds):
            errors: list[ReproError] = []

            def one(i: int) -> None:
                try:
                    client.generate(job.payload(first + i, 0.0, 16))
                except ReproError as exc:
                    errors.append(exc)  # noqa: B023 - the threads are joined within this iteration

            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(width)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
