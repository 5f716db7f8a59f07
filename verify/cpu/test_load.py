"""Tests for `repro.evidence.load`: Poisson arrivals, the cap on requests in flight, failed requests and dead servers."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from repro.errors import ReproError, UsageError
from repro.evidence.load import Job, Runner, arrival_offsets, check_arrivals, progress_bar
from repro.evidence.results import Cell, ResultsWriter, read_records
from repro.serving.sglang_client import Completion
from verify.benchdata import cell

OPEN = replace(cell("DFLASH", concurrency=8), request_rate=50.0)


class _Client:
    """A client stub: each request takes ``seconds``, the listed indices fail; it counts what is in flight."""

    def __init__(self, seconds: float = 0.02, failing: tuple[int, ...] = (), *, healthy: bool = True) -> None:
        self.seconds, self.failing, self.alive = seconds, failing, healthy
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.sent: dict[int, float] = {}

    def generate(self, payload: dict) -> Completion:
        index = int(payload["rid"].rsplit("-", 1)[1])
        with self.lock:
            self.sent[index] = time.monotonic()
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(self.seconds)
        with self.lock:
            self.in_flight -= 1
        if index in self.failing:
            msg = "POST /generate returned HTTP 503: b'busy'"
            raise ReproError(msg)
        return Completion(prompt_tokens=3, completion_tokens=4, spec_verify_ct=2, ttft_s=0.005,
                          latency_s=self.seconds, chunks=[(0.005, 3)])

    def healthy(self) -> bool:
        return self.alive


class _DeadServer:
    """A started server stub that has exited."""

    def wait_exit(self, _timeout: float) -> int:
        return -9

    def failure(self, what: str) -> ReproError:
        return ReproError(f"server {what}; last lines of its log")


def run(tmp_path: Path, client: _Client, c: Cell, count: int, server: object = None, seed: int = 1) -> list[dict]:
    """Run ``count`` requests of ``c`` through a Runner; the request records written."""
    writer = ResultsWriter(tmp_path / "r.jsonl", resume=True)
    job = Job(None, [c], [{"input_ids": [1, 2, 3]}], {"command": "x", "models": "y", "prompts": "z"})
    progress = progress_bar(count, 0)
    try:
        Runner(writer, "s" * 32, progress, None, seed).run_cell(client, job, c, list(range(count)), server)
    finally:
        writer.close()
        progress.close()
    records = [r for r in read_records(tmp_path / "r.jsonl") if r["kind"] == "request"]
    assert progress.n == len(records)  # the bar counted every recorded request once
    return records


class TestArrivals:
    def test_closed_loop_arrives_at_once(self) -> None:
        """Without a rate every request arrives at 0."""
        assert arrival_offsets(3, None, 1) == [0.0, 0.0, 0.0]

    def test_poisson_gaps_are_seeded_and_scale_with_the_rate(self) -> None:
        """The first request at 0, then exponential gaps of mean 1/rate: one seed draws the same
        arrivals (rate 4's are rate 1's over 4), another seed others."""
        one, four = arrival_offsets(2000, 1.0, 7), arrival_offsets(2000, 4.0, 7)
        assert one[0] == 0.0 and np.all(np.diff(one) > 0)
        assert np.allclose(np.asarray(one) / 4, four)
        assert arrival_offsets(2000, 1.0, 7) == one != arrival_offsets(2000, 1.0, 8)
        assert np.mean(np.diff(one)) == pytest.approx(1.0, rel=0.1)
        assert arrival_offsets(5, 1.0, 7) == one[:5]  # fewer prompts: the same first arrivals

    def test_the_gaps_are_bench_servings(self) -> None:
        """The gaps are the numbers SGLang's bench_serving sleeps between requests at that seed: after
        ``np.random.seed(seed)``, one ``np.random.exponential(1 / rate)`` per request after the first."""
        legacy = np.random.RandomState(42)
        gaps = [legacy.exponential(1 / 6.0) for _ in range(9)]
        assert arrival_offsets(10, 6.0, 42) == [0.0, *np.cumsum(gaps).tolist()]

    def test_a_resume_with_another_seed_is_refused(self, tmp_path: Path) -> None:
        """Recorded open-loop arrivals that another --seed drew are refused naming --seed."""
        records = run(tmp_path, _Client(0.001), OPEN, 3, seed=1)
        check_arrivals(records, {OPEN.key: OPEN}, 1, tmp_path)
        with pytest.raises(UsageError, match=r"arrivals another --seed drew; pass the --seed"):
            check_arrivals(records, {OPEN.key: OPEN}, 2, tmp_path)


class TestRunCell:
    def test_open_loop_sends_each_request_at_its_arrival(self, tmp_path: Path) -> None:
        """Each request is sent at its arrival (seconds after the cell starts), not before and not
        long after, and its record keeps the arrival."""
        client, began = _Client(0.01), time.monotonic()
        records = run(tmp_path, client, OPEN, 12)
        offsets = arrival_offsets(12, OPEN.request_rate, 1)
        assert [r["arrival_s"] for r in records if r["index"] == 5] == [offsets[5]]
        for i in range(12):
            assert offsets[i] <= client.sent[i] - began < offsets[i] + 0.2

    def test_the_cap_holds_requests_in_flight(self, tmp_path: Path) -> None:
        """At a rate far above what the server serves, no more than the cap are in flight at once."""
        client = _Client(0.02)
        records = run(tmp_path, client, replace(OPEN, request_rate=10_000.0, concurrency=3), 12)
        assert client.most == 3 and len(records) == 12

    def test_closed_loop_keeps_c_in_flight(self, tmp_path: Path) -> None:
        """c clients: c requests in flight at once, never more."""
        client = _Client(0.02)
        records = run(tmp_path, client, cell("AR", concurrency=3), 9)
        assert client.most == 3 and len(records) == 9 and "arrival_s" not in records[0]

    def test_a_failed_request_is_recorded_and_the_cell_goes_on(self, tmp_path: Path) -> None:
        """A refused request on a live server is a record with its error and no figures; the others run."""
        records = run(tmp_path, _Client(0.005, failing=(1,)), cell("AR", concurrency=2), 4)
        failed = [r for r in records if "error" in r]
        assert len(records) == 4 and [r["index"] for r in failed] == [1]
        assert "HTTP 503" in failed[0]["error"] and "completion_tokens" not in failed[0]

    def test_a_dead_server_stops_the_run_unrecorded(self, tmp_path: Path) -> None:
        """A request that fails because the server died raises with the server's log, and is not recorded."""
        with pytest.raises(ReproError, match=r"exited with code -9 during request 1 of AR c=1; last lines"):
            run(tmp_path, _Client(0.001, failing=(1,)), cell("AR"), 4, server=_DeadServer())
        assert [r["index"] for r in read_records(tmp_path / "r.jsonl")] == [0]

    def test_a_url_server_that_stops_answering_health_stops_the_run(self, tmp_path: Path) -> None:
        """With --url (no process to watch) a failure and an unhealthy /health end the run."""
        with pytest.raises(ReproError, match=r"request 0 of AR c=1 failed and the server at --url no longer answers"):
            run(tmp_path, _Client(0.001, failing=(0,), healthy=False), cell("AR"), 2)
