"""Tests for `repro bench --request-rate` against the fake SGLang server: open-loop cells, the cap on requests
in flight, failed requests and resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro import cli
from repro.evidence import load
from repro.evidence.results import read_records, summarize
from verify.benchrun import bench_args, check_complete, requests_of, workspace


@pytest.fixture
def work(tmp_path: Path, monkeypatch) -> Path:
    """A directory with test models and a profiles file; the tests run inside it."""
    return workspace(tmp_path, monkeypatch)


class TestOpenLoop:
    def test_latency_grows_with_the_rate_on_a_batching_server(self, work: Path, capsys) -> None:
        """--request-rate alone: one open-loop cell per rate, capped at --num-prompts, each request
        sent at its seeded Poisson arrival; on a server whose rounds slow with the batch, the higher
        rate keeps more requests in flight and each token takes longer."""
        args = bench_args("fake-busy", "--algorithms", "AR", "--request-rate", "2,1000", "--num-prompts", "8")
        assert cli.main(args) == 0
        records = read_records(work / "out.jsonl")
        requests = [r for r in records if r["kind"] == "request"]
        assert {(r["cell"]["request_rate"], r["cell"]["concurrency"]) for r in requests} == {(2.0, 8), (1000.0, 8)}
        for rate in (2.0, 1000.0):
            mine = sorted((r for r in requests if r["cell"]["request_rate"] == rate), key=lambda r: r["index"])
            assert [r["arrival_s"] for r in mine] == load.arrival_offsets(8, rate, 1)
            # paced, not sent at once: none leaves before its arrival (less the first one's start delay,
            # up to a few hundred ms on a loaded CI machine)
            assert all(r["start"] - mine[0]["start"] >= r["arrival_s"] - mine[0]["arrival_s"] - 0.3 for r in mine)
        slow, fast = summarize(records)
        assert (slow.cell.request_rate, fast.cell.request_rate) == (2.0, 1000.0)
        assert fast.in_flight > 2 * slow.in_flight and fast.tpot_ms.p50 > 2 * slow.tpot_ms.p50
        out = capsys.readouterr().out
        assert "in flight" in out and "1000/s" in out

    def test_max_concurrency_caps_the_requests_in_flight(self, work: Path) -> None:
        """Arrivals far faster than the server: never more than --max-concurrency requests overlap."""
        assert cli.main(bench_args("fake", "--algorithms", "AR", "--request-rate", "1000", "--max-concurrency", "2",
                                   "--num-prompts", "6")) == 0
        spans = [(r["start"], r["end"]) for r in read_records(work / "out.jsonl") if r["kind"] == "request"]
        assert len(spans) == 6
        assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) == 2  # in flight as each request starts

    def test_a_refused_request_is_recorded_and_the_cell_goes_on(self, work: Path, capsys) -> None:
        """A request the server refuses (HTTP 503) is a record with its error, counted as failed; the
        cell finishes, and --resume does not send it again."""
        args = bench_args("fake-refusing", "--algorithms", "AR", "--concurrency", "2", "--num-prompts", "4")
        assert cli.main(args) == 0
        requests = [r for r in read_records(work / "out.jsonl") if r["kind"] == "request"]
        assert sorted(r["index"] for r in requests) == [0, 1, 2, 3]
        (failed,) = [r for r in requests if "error" in r]
        assert failed["index"] == 2 and "returned HTTP 503" in failed["error"]
        (s,) = summarize(read_records(work / "out.jsonl"))
        assert (s.requests, s.failed) == (3, 1)
        capsys.readouterr()
        assert cli.main([*args, "--resume"]) == 0
        assert "starting" not in capsys.readouterr().err
        check_complete(work / "out.jsonl", 4)

    def test_resume_with_another_seed_is_refused(self, work: Path, capsys) -> None:
        """Open-loop results drawn with one --seed are not continued with another."""
        args = bench_args("fake", "--algorithms", "AR", "--request-rate", "200", "--num-prompts", "3")
        assert cli.main(args) == 0
        capsys.readouterr()
        assert cli.main([*args, "--resume", "--seed", "2"]) == 2
        assert "arrivals another --seed drew" in capsys.readouterr().err

    def test_time_limit_then_resume_finishes_open_loop_cells(self, work: Path, capsys) -> None:
        """--time-limit stops between arrivals (exit 3); --resume sends the rest at their own arrivals."""
        args = bench_args("fake-slow", "--algorithms", "AR,DDTREE", "--request-rate", "30", "--num-prompts", "6")
        assert cli.main([*args, "--time-limit", "0.5"]) == 3
        assert len(requests_of(work / "out.jsonl")) < 12
        capsys.readouterr()
        assert cli.main([*args, "--resume"]) == 0
        check_complete(work / "out.jsonl", 12)

    def test_interleaved_open_loop_cells_are_one_turn(self, work: Path) -> None:
        """--interleave runs an open-loop cell whole, one turn per server; closed-loop cells keep their waves."""
        assert cli.main(bench_args("fake-shared", "--interleave", "--algorithms", "AR,DFLASH", "--concurrency", "1",
                                   "--request-rate", "500", "--num-prompts", "4")) == 0
        requests = [r for r in read_records(work / "out.jsonl") if r["kind"] == "request"]
        assert {r["turn"] for r in requests if r["cell"].get("request_rate")} == {0}
        assert {r["turn"] for r in requests if not r["cell"].get("request_rate")} == {0, 1, 2, 3}
        check_complete(work / "out.jsonl", 16)
