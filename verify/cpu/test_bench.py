"""Tests for `repro bench` against the fake SGLang server (verify/fake_sglang.py).

The servers are real processes started from a test profiles file, on 127.0.0.1 with a bounded
lifetime; each run is a few dozen short requests. Two tests kill a process mid-run (the server,
then the bench itself) and check that the JSONL is intact and `--resume` completes the run.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from repro import cli
from repro.evidence import bench, load
from repro.evidence.results import Cell, read_records, summarize
from repro.serving.sglang_client import Client
from repro.serving.sglang_server import free_port
from repro.tuning.recording import prompts_of
from verify.benchrun import bench_args, check_complete, requests_of, wait_for_requests, workspace
from verify.fake_sglang import subprocess_env


@pytest.fixture
def work(tmp_path: Path, monkeypatch) -> Path:
    """A directory with test models and a profiles file; the tests run inside it."""
    return workspace(tmp_path, monkeypatch)


class TestRun:
    def test_sweep_records_every_request_and_prints_the_summary(self, work: Path,
                                                                capsys) -> None:
        """AR, DFLASH and two DDTREE budgets at c=1,2 record 32 requests, each with its own id, and
        the summary's speedup over AR."""
        rc = cli.main(bench_args("fake", "--budgets", "4,16", "--concurrency", "1,2",
                                 "--num-prompts", "4"))
        assert rc == 0
        records = read_records(work / "out.jsonl")
        kinds = collections.Counter(r["kind"] for r in records)
        assert kinds == {"run": 1, "server": 4, "request": 32}
        requests = [r for r in records if r["kind"] == "request"]
        assert [r["rid"] for r in requests] == [load.request_id(Cell(**r["cell"]), r["session"], r["index"])
                                                for r in requests]
        assert len({r["rid"] for r in requests}) == 32  # one id per request: a recording keys rounds by it
        assert {prompts_of(r["rid"], "?") for r in requests} == {requests[0]["cell"]["prompts"]}
        run = records[0]
        assert run["profiles"]["fake"]["launch_module"] == "verify.fake_sglang"
        assert "fingerprint" in run and "topology" in run
        summaries = summarize(records)
        tree, ar = (next(s for s in summaries if s.cell.label == label and s.cell.concurrency == 1)
                    for label in ("DDTREE B=16", "AR"))
        assert tree.tau_mean and tree.tau_mean > 3  # the fake's law; its wall-clock speedup is not (CI load)
        assert tree.speedup == pytest.approx(tree.output_tok_s / ar.output_tok_s)
        out = capsys.readouterr()
        assert "DDTREE B=16" in out.out and "speedup" in out.out
        assert "bench: starting fake (AR)" in out.err and "32/32" in out.err

    def test_a_schedule_is_a_server_of_its_own(self, work: Path, capsys) -> None:
        """--schedules runs a DDTREE server per schedule beside --budgets; its cells carry the
        schedule (no budget), its log name is a plain file name, and /server_info agrees."""
        rc = cli.main(bench_args("fake", "--algorithms", "DDTREE", "--budgets", "4", "--schedules", "1:16,2:4",
                                 '{"1": 8}', "--concurrency", "1", "--num-prompts", "2", "--log-dir", "logs"))
        assert rc == 0
        records = read_records(work / "out.jsonl")
        labels = {Cell(**r["cell"]).label for r in records if r["kind"] == "request"}
        assert labels == {"DDTREE B=4", "DDTREE S=1:16,2:4", "DDTREE S=1:8"}
        infos = [r["server_info"] for r in records if r["kind"] == "server"]
        assert {i["speculative_ddtree_budget_schedule"] for i in infos} == {None, "1:16,2:4", "1:8"}
        logs = [p.name for p in (work / "logs").iterdir()]
        assert any(name.startswith("fake-DDTREE-S1-16-2-4-") for name in logs)
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in logs)
        assert "DDTREE S=1:16,2:4" in capsys.readouterr().out

    def test_resume_of_a_finished_run_starts_nothing(self, work: Path, capsys) -> None:
        """A second run with --resume finds every request done and starts no server."""
        args = bench_args("fake", "--algorithms", "AR", "--concurrency", "1", "--num-prompts", "2")
        assert cli.main(args) == 0
        capsys.readouterr()
        assert cli.main([*args, "--resume"]) == 0
        assert "starting" not in capsys.readouterr().err
        check_complete(work / "out.jsonl", 2)

    def test_existing_results_need_resume(self, work: Path, capsys) -> None:
        """Without --resume an existing results file is refused with exit 2."""
        (work / "out.jsonl").write_text('{"kind": "run"}\n')
        assert cli.main(bench_args("fake", "--concurrency", "1")) == 2
        assert "pass --resume" in capsys.readouterr().err

    def test_time_limit_stops_cleanly_then_resume_finishes(self, work: Path, capsys) -> None:
        """--time-limit exits 3 with the work so far recorded; --resume completes it."""
        args = bench_args("fake-slow", "--algorithms", "AR,DDTREE", "--concurrency", "1",
                          "--num-prompts", "3")
        # two server starts (0.2 s each) and 6 requests of 24 tokens at 5 ms take > 0.5 s
        assert cli.main([*args, "--time-limit", "0.5"]) == 3
        assert "rerun the same command with --resume" in capsys.readouterr().err
        assert len(requests_of(work / "out.jsonl")) < 6
        assert cli.main([*args, "--resume"]) == 0
        check_complete(work / "out.jsonl", 6)

    def test_url_mode_benches_the_running_server(self, work: Path) -> None:
        """--url measures a running server, labelled with the algorithm it reports."""
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "verify.fake_sglang", "--model-path", "models/target",
             "--port", str(port), "--speculative-algorithm", "DDTREE",
             "--speculative-ddtree-budget", "8", "--fake-max-lifetime-s", "60"],
            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = Client(f"http://127.0.0.1:{port}")
            while not client.healthy(timeout=1):
                time.sleep(0.05)
            assert cli.main(bench_args("fake", "--url", client.url, "--concurrency", "1,2",
                                       "--num-prompts", "2")) == 0
        finally:
            proc.kill()
            proc.wait()
        labels = {s.cell.label for s in summarize(read_records(work / "out.jsonl"))}
        assert labels == {"DDTREE B=8"}


class TestInterleave:
    ARGS = ("fake-shared", "--interleave", "--algorithms", "AR,DFLASH,DDTREE", "--budgets", "8",
            "--concurrency", "1,2", "--num-prompts", "4")

    def test_servers_take_turns_of_one_wave(self, work: Path) -> None:
        """Three servers at once, each start timed from its own launch; within each cell position
        the servers alternate wave by wave (c requests a turn), the first of a turn rotating; every
        request recorded once, with its turn."""
        assert cli.main(bench_args(*self.ARGS)) == 0
        records = read_records(work / "out.jsonl")
        assert collections.Counter(r["kind"] for r in records) == {"run": 1, "server": 3, "request": 24}
        # started together, each server counts its start from its own launch (the fake takes 0.2 s)
        assert all(r["start_s"] >= 0.2 for r in records if r["kind"] == "server")
        requests = sorted((r for r in records if r["kind"] == "request"), key=lambda r: r["start"])
        for c in (1, 2):
            wave = [r for r in requests if r["cell"]["concurrency"] == c]
            turns = [(r["turn"], Cell(**r["cell"]).label) for r in wave]
            assert [t for t, _ in turns] == sorted(t for t, _ in turns)  # turn k ends before turn k + 1
            firsts = [label for (turn, label), prev in zip(turns, [None, *turns], strict=False)
                      if prev is None or prev[0] != turn]
            assert len(firsts) == 4 // c and len(set(firsts)) == min(3, 4 // c)  # rotation
            assert collections.Counter(turns) == {(t, label): c for t in range(4 // c)
                                                  for label in ("AR", "DFLASH", "DDTREE B=8")}
        check_complete(work / "out.jsonl", 24)

    def test_capped_kv_caches_share_whatever_their_fractions(self, work: Path) -> None:
        """Profiles that cap their KV cache (max-total-tokens) run together although their
        mem-fraction-static sum past 0.9 (SGLang takes each of the memory free at its own start)."""
        args = bench_args("fake-capped", "--interleave", "--algorithms", "AR,DFLASH,DDTREE", "--budgets", "4,8",
                          "--concurrency", "1", "--num-prompts", "2")
        assert cli.main(args) == 0
        check_complete(work / "out.jsonl", 8)

    def test_throughput_counts_only_the_cells_own_turns(self, work: Path) -> None:
        """A cell's tok/s is its tokens over the sum of its turns' wall times, not the span that
        holds the other servers' turns too."""
        assert cli.main(bench_args(*self.ARGS)) == 0
        records = read_records(work / "out.jsonl")
        for s in summarize(records):
            rows = [r for r in records if r["kind"] == "request" and Cell(**r["cell"]) == s.cell]
            by_turn = collections.defaultdict(list)
            for r in rows:
                by_turn[r["turn"]].append(r)
            wall = sum(max(r["end"] for r in g) - min(r["start"] for r in g) for g in by_turn.values())
            span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
            assert s.output_tok_s == pytest.approx(s.output_tokens / wall)
            assert wall < span

    def test_time_limit_then_resume_finishes_interleaved(self, work: Path, capsys) -> None:
        """--time-limit stops between turns (exit 3); --resume finishes the same cells. The limit
        leaves the three servers seconds to start on a busy machine; the requests take longer."""
        args = bench_args(*self.ARGS, "--max-new-tokens", "240")
        assert cli.main([*args, "--time-limit", "3.0"]) == 3
        assert 0 < len(requests_of(work / "out.jsonl")) < 24
        capsys.readouterr()
        assert cli.main([*args, "--resume"]) == 0
        check_complete(work / "out.jsonl", 24)

    @pytest.mark.parametrize(("extra", "message"), [
        (["fake", "--interleave", "--concurrency", "1"],
         r"--interleave runs 3 servers on the same GPUs at once: profile 'fake' needs a max-total-tokens or a mem-"),
        (["fake-shared", "--interleave", "--algorithms", "AR,DFLASH,DDTREE", "--budgets", "4,8",
          "--concurrency", "1"], r"their mem-fraction-static sum to 1.20 \(at most 0.9\)"),
        (["fake-shared", "--interleave", "--url", "http://127.0.0.1:1"], r"--interleave .* cannot take --url"),
    ])
    def test_usage_errors(self, work: Path, capsys, extra: list[str], message: str) -> None:
        """Servers that cannot share the GPUs, or --url, are refused before anything starts."""
        assert cli.main(bench_args(*extra)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
        assert not (work / "out.jsonl").exists()


class TestErrors:
    @pytest.mark.parametrize(("extra", "message"), [
        (["fake", "--concurrency", "1,16", "--num-prompts", "8"],
         r"--num-prompts must be >= the largest --concurrency \(16\) \(got 8\)"),
        (["nope"], r"PROFILE must be one of .* \(got 'nope'\)"),
        (["fake-ar-only", "--algorithms", "DFLASH"], r"DFLASH needs a 'drafter' key"),
        (["fake", "fake-slow", "--url", "http://127.0.0.1:1"], r"--url takes exactly one PROFILE"),
        (["fake", "--prompts", "gsm8k"], r"no PyPI package ships GSM8K"),
        (["fake", "--budgets", "-2"], r"--budgets: must be a comma list of integers >= 0"),
        (["fake", "--max-concurrency", "2"], r"--max-concurrency caps open-loop cells: it needs --request-rate"),
        (["fake", "--request-rate", "2", "--max-concurrency", "16", "--num-prompts", "8"],
         r"--num-prompts must be >= the largest --max-concurrency \(16\) \(got 8\)"),
        (["fake", "--request-rate", "2,inf"], r"--request-rate: must be a comma list of finite numbers > 0"),
    ])
    def test_usage_errors_exit_2_with_one_line(self, work: Path, capsys, extra: list[str],
                                               message: str) -> None:
        """Bad arguments exit 2 with a one-line message naming the parameter."""
        assert cli.main(bench_args(*extra)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        assert re.search(message, err), err

    def test_server_dying_at_start_quotes_its_log(self, work: Path, capsys) -> None:
        """A server that exits while starting ends the bench with exit 1 and the log's tail."""
        assert cli.main(bench_args("fake-dead", "--concurrency", "1")) == 1
        err = capsys.readouterr().err
        assert "exited with code 3" in err and "| RuntimeError: fake failure" in err


class TestCrashes:
    def _spawn(self, work: Path, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "repro.cli", *bench_args(
            "fake-slow", "--algorithms", "AR,DDTREE", "--concurrency", "1", "--num-prompts", "8",
            "--max-new-tokens", "64", *extra)]
        env = subprocess_env(FAKE_SGLANG_PIDFILE=str(work / "server.pid"))
        return subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def test_killed_server_leaves_intact_results_and_resume_completes(self, work: Path) -> None:
        """SIGKILL of the server mid-bench: exit 1 with the log tail, then --resume finishes."""
        proc = self._spawn(work)
        wait_for_requests(work / "out.jsonl", 3, proc)
        os.kill(int((work / "server.pid").read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        assert b"exited with code -9" in err and b"last lines of" in err
        done = len(requests_of(work / "out.jsonl"))
        assert 3 <= done < 16
        check_complete(work / "out.jsonl", done)
        resumed = self._spawn(work, "--resume")
        _, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
        check_complete(work / "out.jsonl", 16)

    def test_killed_bench_loses_nothing_and_resume_completes(self, work: Path) -> None:
        """SIGKILL of the bench itself: its server goes too, a torn line is cut, resume finishes."""
        proc = self._spawn(work)
        wait_for_requests(work / "out.jsonl", 3, proc)
        proc.kill()
        proc.communicate(timeout=30)
        server = int((work / "server.pid").read_text())
        deadline = time.monotonic() + 10
        while _alive(server):  # the server got SIGTERM when its parent died
            assert time.monotonic() < deadline, "the orphaned server is still running"
            time.sleep(0.05)
        done = len(requests_of(work / "out.jsonl"))
        with (work / "out.jsonl").open("a") as f:
            f.write('{"kind": "request", "cell": {"prof')  # a line torn by the crash
        resumed = self._spawn(work, "--resume")
        _, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
        assert done >= 3
        check_complete(work / "out.jsonl", 16)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited as far as we care
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


class _CountingClient:
    """A client stub that records the prompt index and how many requests were in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.widths: list[int] = []
        self.indices: list[int] = []

    def generate(self, payload: dict) -> dict:
        with self.lock:
            self.in_flight += 1
            self.indices.append(payload["index"])
        time.sleep(0.05)  # long enough for every thread of a round to be in flight at once
        with self.lock:
            self.widths.append(self.in_flight)
            self.in_flight -= 1
        return {}


class _IndexJob:
    """A job whose request bodies carry only their prompt index."""

    def payload(self, index: int, _temperature: float, _max_new: int) -> dict:
        return {"index": index}


@pytest.mark.parametrize(("profile", "prompts", "concurrency", "noted"), [
    ("test-h200-tp1", "humaneval", [1, 4], True), ("test-h200-tp1", "humaneval-distinct", [1, 4], False),
    ("test-h200-tp1", "humaneval", [1], False), ("k26-h200-tp8", "humaneval", [4], False)])
def test_prompts_that_all_end_on_one_token_are_noted_for_a_planted_target(profile, prompts, concurrency, noted) -> None:
    """A server without a tokenizer at c > 1 on prompts ending on one token (humaneval's newline)
    gets a note naming humaneval-distinct; distinct ends, c 1 alone, or a real tokenizer get none."""
    from repro.evidence.prompts import load_prompts, request_input
    from repro.serving.profiles import get_profile

    served = get_profile(profile)
    inputs = [request_input(p, tokenizer=served.tokenizer, vocab_size=4096, max_tokens=1024)
              for p in load_prompts("humaneval").prompts]
    if prompts == "humaneval-distinct":
        inputs = [request_input(p, tokenizer="none", vocab_size=4096, max_tokens=1024)
                  for p in load_prompts(prompts).prompts]
    args = argparse.Namespace(concurrency=concurrency, request_rate=[], num_prompts=16, prompts=prompts)
    note = bench.lockstep_note([load.Job(served, [], inputs, {})], args)
    assert (note is not None) is noted
    if noted:
        assert note == (f"bench: note: every prompt of humaneval ends on token 10, and {profile} has no tokenizer: a "
                        "planted target's requests decode one sequence in lockstep at c > 1 (--prompts "
                        "humaneval-distinct ends each on its own)")


def test_a_payload_carries_its_request_id_only_when_given() -> None:
    """The measured requests' bodies name their id (SGLang's ``rid``); warm-up bodies do not."""
    job = load.Job(None, [], [{"input_ids": [1, 2]}], {})
    assert job.payload(3, 0.0, 8, "p/x-1")["rid"] == "p/x-1"
    assert "rid" not in job.payload(3, 0.0, 8)


class TestWarmUp:
    def test_warm_up_runs_every_concurrency_on_unmeasured_prompts(self) -> None:
        """Two rounds at each of c=1 and c=4 send 10 requests, 4 at once, from index 16 on."""
        client = _CountingClient()
        load.warm_up(client, _IndexJob(), 2, [4, 1, 4], 16)
        assert len(client.widths) == 10 and max(client.widths) == 4
        assert min(client.indices) == 16 and max(client.indices) == 19
