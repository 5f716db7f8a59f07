"""Tests for `repro.evidence.results`: the crash-safe JSONL file, resume bookkeeping and cell summaries."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.evidence.latency import Spread
from repro.evidence.results import (
    HEADERS,
    Cell,
    ResultsWriter,
    finished,
    format_table,
    label_order,
    load_records,
    read_records,
    scan_results,
    summarize,
    table_rows,
)
from verify.benchdata import cell, request


class TestWriter:
    def test_appended_records_are_read_back(self, tmp_path: Path) -> None:
        """Each append is one JSON line, readable at once (flushed and fsynced)."""
        writer = ResultsWriter(tmp_path / "r.jsonl", resume=False)
        writer.append({"kind": "run", "n": 1})
        writer.append(request(cell(), 0))
        assert [r["kind"] for r in read_records(tmp_path / "r.jsonl")] == ["run", "request"]
        writer.close()

    def test_existing_results_need_resume(self, tmp_path: Path) -> None:
        """A non-empty output file is never appended to without --resume."""
        path = tmp_path / "r.jsonl"
        path.write_text('{"kind": "run"}\n')
        with pytest.raises(UsageError, match=r"already holds results \(pass --resume"):
            ResultsWriter(path, resume=False)

    def test_torn_last_line_is_dropped_and_repaired(self, tmp_path: Path) -> None:
        """A crash mid-line loses only that line: readers skip it, resume cuts it away."""
        path = tmp_path / "r.jsonl"
        path.write_text(json.dumps(request(cell(), 0)) + "\n" + '{"kind": "requ')
        assert len(read_records(path)) == 1
        writer = ResultsWriter(path, resume=True)
        writer.append(request(cell(), 1))
        writer.close()
        assert [r["index"] for r in read_records(path)] == [0, 1]

    def test_bad_line_in_the_middle_is_an_error(self, tmp_path: Path) -> None:
        """Corruption anywhere but the tail is reported with its line number."""
        path = tmp_path / "r.jsonl"
        path.write_text('{"kind": "run"}\nnot json\n{"kind": "run"}\n')
        with pytest.raises(UsageError, match=r"r\.jsonl:2: not a JSON record"):
            read_records(path)

    def test_directories_stand_for_their_jsonl_files(self, tmp_path: Path) -> None:
        """load_records reads every *.jsonl and gzipped *.jsonl.gz file of a directory."""
        for name in ("a", "b"):
            (tmp_path / f"{name}.jsonl").write_text('{"kind": "run"}\n')
        (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"kind": "run"}\n{"kind": "run"}\n'))
        (tmp_path / "d.txt").write_text("ignored")
        assert len(load_records([tmp_path])) == 4

    def test_a_directory_skips_recordings_and_other_files(self, tmp_path: Path) -> None:
        """Of a directory, a JSONL file whose first record is another kind (an acceptance recording)
        is skipped with the non-JSONL files; a JSONL file that is not JSON stays, for read_records
        to name its problem; a file named explicitly is never skipped."""
        (tmp_path / "a.jsonl").write_text('{"kind": "run"}\n')
        (tmp_path / "rec.jsonl.gz").write_bytes(gzip.compress(b'{"kind": "recording", "schema": 1}\n'))
        (tmp_path / "bad.jsonl").write_text("not json\n")
        (tmp_path / "fig.png").write_bytes(b"\x89PNG")
        files, skipped = scan_results([tmp_path])
        assert [f.name for f in files] == ["a.jsonl", "bad.jsonl"]
        assert [f.name for f in skipped] == ["fig.png", "rec.jsonl.gz"]
        assert scan_results([tmp_path / "rec.jsonl.gz"]) == ([tmp_path / "rec.jsonl.gz"], [])


class TestSummaries:
    def test_finished_lists_cell_and_index(self) -> None:
        """Resume skips exactly the (cell, index) pairs already recorded."""
        records = [request(cell(), 3), {"kind": "run"}]
        assert finished(records) == {(cell().key, 3)}

    def test_spreads_interpolate_in_milliseconds(self) -> None:
        """A spread's percentiles interpolate linearly between order statistics, in ms; none of no values."""
        assert Spread.of([0.001, 0.002, 0.003, 0.004]) == Spread(2.5, 2.5, pytest.approx(3.7), pytest.approx(3.97))
        assert Spread.of([0.005]) == Spread(5.0, 5.0, 5.0, 5.0) and Spread.of([]) is None

    def test_throughput_ignores_the_gap_between_sessions(self) -> None:
        """A resumed cell counts each session's wall time, not the pause in between."""
        rows = [request(cell(), 0, start=0, end=1), request(cell(), 1, start=100, end=101,
                                                            session="s2")]
        (summary,) = summarize(rows)
        assert summary.output_tok_s == pytest.approx(128 / 2)

    def test_speedup_and_tau_against_ar(self) -> None:
        """Speedup divides by AR's tok/s at the same concurrency; tau averages per request."""
        rows = [request(cell(), 0, end=2.0),
                request(cell("DDTREE", 32), 0, end=0.5, verify=16),
                request(cell("DDTREE", 32), 1, end=0.5, verify=32)]
        ar, tree = summarize(rows)
        assert ar.speedup == 1.0 and ar.tau_mean is None
        assert tree.speedup == pytest.approx((128 / 0.5) / (64 / 2.0))
        assert tree.tau_mean == pytest.approx((4 + 2) / 2)

    def test_ratios_come_from_the_runs_that_served_both_cells(self) -> None:
        """Two runs of one machine that drifted: run a served AR, DFLASH and B 16 (DFLASH 4x AR, B 16
        1.25x DFLASH), run b, 20% slower, DFLASH and B 64 (1.5x DFLASH). B 64's ratios are its run's,
        its speedup over AR run b's 1.5x times run a's DFLASH over AR; the pooled DFLASH cell (both
        runs) would have put B 64 at 1.38x DFLASH."""
        def rows(c, session, seconds):
            return [request(c, i, end=seconds, session=session) for i in range(2)]
        records = (rows(cell(), "a", 4.0) + rows(cell("DFLASH"), "a", 1.0) + rows(cell("DDTREE", 16), "a", 0.8)
                   + rows(cell("DFLASH"), "b", 1.2) + rows(cell("DDTREE", 64), "b", 0.8))
        by = {s.cell.label: s for s in summarize(records)}
        assert by["DFLASH"].speedup == pytest.approx(4.0) and by["DFLASH"].over_dflash is None
        assert by["DDTREE B=16"].over_dflash == pytest.approx(1.25) and by["DDTREE B=16"].speedup == pytest.approx(5.0)
        assert by["DDTREE B=64"].over_dflash == pytest.approx(1.5)
        assert by["DDTREE B=64"].speedup == pytest.approx(6.0)
        assert by["DDTREE B=64"].output_tok_s / by["DFLASH"].output_tok_s == pytest.approx(1.375)

    def test_runs_that_never_served_both_cells_compare_pooled(self) -> None:
        """AR and DDTREE from separate runs: the speedup is the pooled cells' ratio."""
        records = [request(cell(), 0, end=2.0, session="a"), request(cell("DDTREE", 8), 0, end=0.5, session="b")]
        _, tree = summarize(records)
        assert tree.speedup == pytest.approx(4.0) and tree.over_dflash is None

    def test_itl_spreads_a_chunk_over_its_tokens(self) -> None:
        """A chunk of k tokens after gap g counts as k inter-token gaps of g/k."""
        (s,) = summarize([request(cell(), 0)])
        assert s.itl_ms.p50 == pytest.approx(1.0) and s.itl_ms.p99 == pytest.approx(3.94)

    def test_decode_throughput_leaves_the_first_token_out(self) -> None:
        """decode tok/s: the tokens after each request's first over the gaps before them, times c;
        a slower first token lowers tok/s but not the decode rate."""
        fast, slow = cell(concurrency=4), cell(concurrency=4, profile="other")
        rows = [request(fast, i, end=1.0) | {"chunks": [[0.010, 5], [0.010, 5]]} for i in range(4)]
        rows += [request(slow, i, end=1.5) | {"ttft_s": 0.51, "chunks": [[0.010, 5], [0.010, 5]]}
                 for i in range(4)]
        by_profile = {s.cell.profile: s for s in summarize(rows)}
        assert by_profile[fast.profile].decode_tok_s == pytest.approx(4 * 10 / 0.020)
        assert by_profile["other"].decode_tok_s == pytest.approx(by_profile[fast.profile].decode_tok_s)
        assert by_profile["other"].output_tok_s < by_profile[fast.profile].output_tok_s
        assert summarize([request(cell(), 0) | {"chunks": []}])[0].decode_tok_s is None

    def test_summaries_sort_ar_dflash_then_budgets(self) -> None:
        """Cells sort AR, DFLASH, then DDTREE by numeric budget."""
        rows = [request(cell("DDTREE", 64), 0), request(cell("DDTREE", 8), 0),
                request(cell("DFLASH"), 0), request(cell(), 0)]
        assert [s.cell.label for s in summarize(rows)] == ["AR", "DFLASH", "DDTREE B=8",
                                                           "DDTREE B=64"]
        assert label_order("DDTREE B=16") < label_order("DDTREE B=64") < label_order("DDTREE S=1:63,16:15")


class TestTables:
    def test_markdown_and_text_tables(self) -> None:
        """The same rows render as a Markdown table or an aligned text table."""
        rows = table_rows(summarize([request(cell(), 0)]))
        md = format_table(HEADERS, rows, markdown=True).splitlines()
        assert md[0].startswith("| profile | algorithm") and md[1].startswith("|---")
        text = format_table(HEADERS, rows, markdown=False).splitlines()
        assert text[0].startswith("profile") and set(text[1]) <= {"-", " "}


class TestOptionalCellFields:
    def test_a_cell_without_them_keeps_its_key(self):
        """The schedule, request-rate and api fields enter a cell's key only when set."""
        plain = cell("DDTREE", 16)
        fields = {k: v for k, v in asdict(plain).items() if k not in ("schedule", "request_rate", "api")}
        assert plain.key == json.dumps(fields, sort_keys=True)
        assert replace(plain, request_rate=2.0).key != plain.key != replace(plain, api="openai").key

    def test_schedule_cells_are_checked(self, tmp_path: Path):
        """A DDTREE schedule cell has no budget; a schedule on another algorithm, or a malformed
        one, is refused naming the key; records written before the fields existed still read."""
        sched = replace(cell("DDTREE", None), schedule="1:63,16:15")
        old = request(cell("DDTREE", 8), 0)
        old["cell"] = {k: v for k, v in old["cell"].items() if k not in ("schedule", "request_rate")}
        good = [request(sched, 0), old, request(replace(cell(), request_rate=1.5), 0)]
        path = tmp_path / "r.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in good))
        assert [Cell(**r["cell"]).label for r in read_records(path)] == [
            "DDTREE S=1:63,16:15", "DDTREE B=8", "AR"]
        bad_cells = ((replace(sched, budget=63), "cell.budget"), (replace(cell("DFLASH"), schedule="1:4"), "cell.schedule"),
                     (replace(sched, schedule="4:31"), "cell.schedule"), (replace(cell(), request_rate=0.0), "cell.request_rate"))
        for bad, key in bad_cells:
            path.write_text(json.dumps(request(bad, 0)) + "\n")
            with pytest.raises(UsageError, match=key):
                read_records(path)


class TestFailedRequests:
    def test_a_failed_request_is_a_record_without_figures(self, tmp_path: Path) -> None:
        """A record with an error needs no tokens or TTFT; a completed one does; an empty error is refused."""
        failed = {k: v for k, v in request(cell(), 1).items() if k not in ("completion_tokens", "ttft_s", "chunks")}
        path = tmp_path / "r.jsonl"
        path.write_text(json.dumps(request(cell(), 0)) + "\n" + json.dumps({**failed, "error": "HTTP 503"}) + "\n")
        assert [r.get("error") for r in read_records(path)] == [None, "HTTP 503"]
        for bad, key in ((failed, "completion_tokens"), ({**failed, "error": ""}, "error")):
            path.write_text(json.dumps(bad) + "\n")
            with pytest.raises(UsageError, match=f"key '{key}'"):
                read_records(path)

    def test_failed_requests_are_counted_apart_and_count_as_done(self) -> None:
        """Figures come from the completed requests; the failed one is counted, and resume skips it."""
        failed = {"kind": "request", "session": "s1", "cell": asdict(cell()), "index": 2, "start": 0.0, "end": 3.0,
                  "error": "timed out"}
        (s,) = summarize([request(cell(), 0), request(cell(), 1), failed])
        assert (s.requests, s.failed, s.output_tokens) == (2, 1, 128)
        assert s.output_tok_s == pytest.approx(128 / 3.0) and s.request_s == pytest.approx(2 / 3.0)
        assert (cell().key, 2) in finished([failed])


class TestLatency:
    def test_tpot_e2e_and_requests_in_flight(self) -> None:
        """TPOT = (latency - TTFT) / (tokens - 1) per request; E2E its latency; in flight the
        request-seconds over the wall time."""
        rows = [request(cell(), 0, end=1.0) | {"latency_s": 0.64, "ttft_s": 0.01},
                request(cell(), 1, start=0.5, end=1.5, tokens=1) | {"latency_s": 0.9}]
        (s,) = summarize(rows)
        assert s.tpot_ms.p50 == pytest.approx((0.64 - 0.01) / 63 * 1e3)  # the 1-token request has none
        assert s.e2e_ms.mean == pytest.approx((640 + 900) / 2)
        assert s.in_flight == pytest.approx((0.64 + 0.9) / 1.5)

    def test_open_loop_decode_counts_the_requests_in_flight(self) -> None:
        """An open-loop cell's decode tok/s multiplies the per-request rate by the mean in flight, not its cap."""
        opened = replace(cell(concurrency=16), request_rate=2.0)
        rows = [request(opened, i, start=i * 0.5, end=i * 0.5 + 1.0) | {"chunks": [[0.010, 5]]} for i in range(4)]
        (s,) = summarize(rows)
        assert s.in_flight == pytest.approx(4 / 2.5)
        assert s.decode_tok_s == pytest.approx(s.in_flight * 5 / 0.010)

    def test_closed_loop_cells_sort_before_open_loop_ones(self) -> None:
        """Within an algorithm, closed-loop cells by concurrency, then open-loop ones by rate."""
        cells = [replace(cell(concurrency=8), request_rate=4.0), replace(cell(concurrency=8), request_rate=1.0),
                 cell(concurrency=4), cell()]
        assert [(s.cell.concurrency, s.cell.request_rate) for s in summarize([request(c, 0) for c in cells])] == [
            (1, None), (4, None), (8, 1.0), (8, 4.0)]


class TestIntervals:
    @staticmethod
    def rows(c, seconds: list[float]) -> list[dict]:
        """Requests of 64 tokens one after the other, taking ``seconds`` each."""
        starts = [sum(seconds[:i]) for i in range(len(seconds))]
        return [request(c, i, start=t, end=t + d) for i, (t, d) in enumerate(zip(starts, seconds, strict=True))]

    def test_closed_loop_ratios_carry_a_bootstrap_interval(self) -> None:
        """DDTREE twice as fast as DFLASH and AR four times slower: each ratio with a 95% interval around it."""
        noise = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0]
        ar = self.rows(cell(), [4 * x for x in noise])
        dflash = self.rows(cell("DFLASH"), noise)
        tree = self.rows(cell("DDTREE", 8), [x / 2 for x in noise[::-1]])
        by = {s.cell.label: s for s in summarize(ar + dflash + tree)}
        tree, dflash = by["DDTREE B=8"], by["DFLASH"]
        assert tree.over_dflash == pytest.approx(2.0) and dflash.speedup == pytest.approx(4.0)
        assert 1.5 < tree.over_dflash_interval[0] < 2.0 < tree.over_dflash_interval[1]
        assert dflash.speedup_interval[0] < 4.0 < dflash.speedup_interval[1]
        assert by["AR"].speedup == 1.0 and by["AR"].speedup_interval is None  # AR over itself

    def test_open_loop_and_single_requests_have_none(self) -> None:
        """An open-loop throughput ratio (the offered load) and a one-request cell carry no interval."""
        opened = replace(cell(), request_rate=1.0)
        rows = self.rows(opened, [1.0, 1.0]) + self.rows(replace(opened, algorithm="DFLASH"), [0.5, 0.6])
        rows += [request(cell(), 0), request(cell("DFLASH"), 0)]
        assert all(s.speedup_interval is None for s in summarize(rows))
