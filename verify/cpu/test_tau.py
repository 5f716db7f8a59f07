"""Tests for `repro tau` (and `repro demo --record`, which writes what it reads)."""

from __future__ import annotations

import json

import pytest

from repro.cli import main as cli
from repro.tuning.acceptance import read_recordings, tau_at
from verify.tunedata import bench_records, write_recording


@pytest.fixture(scope="module")
def demo_recording(tmp_path_factory):
    """A `repro demo --record` file with a B = 4 and a B = 32 recording."""
    path = tmp_path_factory.mktemp("tau") / "demo.jsonl"
    assert cli(["demo", "--budgets", "4,32", "--new-tokens", "24", "--batch", "3", "--show-rounds", "0",
                "--record", str(path)]) == 0
    return path


def test_demo_records_each_budget(demo_recording):
    """The demo appends one recording per budget, every request's every round, ids naming 'toy'."""
    small, large = read_recordings(demo_recording)
    assert (small.budget, large.budget, large.horizon) == (4, 32, 15)
    assert {r.req for r in large.rounds} == {"toy/0", "toy/1", "toy/2"}
    assert {r.prompts for r in large.rounds} == {"toy"}
    assert all(r.rank0 is not None for r in large.rounds)
    # tokens emitted per request: the prefill's first token plus tau per round, at least 24
    for req in ("toy/0", "toy/1", "toy/2"):
        assert 1 + sum(tau_at(r.path, 32) for r in large.rounds if r.req == req) >= 24


def test_json_gives_every_budget_and_the_chain(demo_recording, capsys):
    """--json lists tau for B' = 0..B of each recording, matching the rounds, and the chain figure."""
    assert cli(["tau", str(demo_recording), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    small, large = data["recordings"]
    (group,) = large["groups"]
    assert [t["budget"] for t in group["tau"]] == list(range(33))
    rounds = read_recordings(demo_recording)[1].rounds
    for t in group["tau"]:
        assert t["tau"] == pytest.approx(sum(tau_at(r.path, t["budget"]) for r in rounds) / len(rounds))
        assert t["low"] <= t["tau"] <= t["high"]
    assert group["tau"][0]["tau"] == 1.0
    assert [t["budget"] for t in small["groups"][0]["tau"]] == list(range(5))
    chain = group["chain"]
    assert chain["low"] <= chain["high"] and 0 <= chain["censored"] <= chain["rounds"] == len(rounds)


def test_table_lists_the_asked_budgets(demo_recording, capsys):
    """The plain table shows one row per listed budget, for recordings that reach it."""
    assert cli(["tau", str(demo_recording), "--budgets", "1,16"]) == 0
    out = capsys.readouterr().out
    assert out.count("recording ") == 2 and "prompts toy:" in out
    rows = [line.split()[0] for line in out.splitlines() if line[:2] in ("1 ", "16")]
    assert rows == ["1", "1", "16"]  # B = 4 has no B' = 16
    assert "DFLASH chain (L=15) on the same rows: tau" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--budgets", "x"], "--budgets must be comma-separated integers >= 0 (got 'x')"),
    (["--budgets", "-1"], "--budgets must be comma-separated integers >= 0 (got '-1')"),
    (["--budgets", "64"], "--budgets: 64 is above every recorded budget in {path} (largest 32)"),
])
def test_bad_budgets_are_one_line_exit_2(demo_recording, capsys, args, message):
    """A bad --budgets is `repro tau: <message>` and exit 2."""
    assert cli(["tau", str(demo_recording), *args]) == 2
    assert capsys.readouterr().err.strip() == f"repro tau: {message.format(path=demo_recording)}"


def test_bad_file_is_one_line_exit_2(tmp_path, capsys):
    """A file that is not a recording is one line naming it, exit 2."""
    path = tmp_path / "bench.jsonl"
    path.write_text('{"kind": "request"}\n')
    assert cli(["tau", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"repro tau: {path}:1: a record must be an object of kind 'recording' or 'round'")


@pytest.fixture
def bench_recording(tmp_path):
    """A B = 128 recording of 40 requests and bench results naming 8 of them DDTREE requests at
    T = 0 (humaneval/0..7) and 8 at T = 1 (humaneval/8..15): a recording a bench run wrote."""
    write_recording(tmp_path / "rec.jsonl")
    records = []
    for temperature, first in ((0.0, 0), (1.0, 8)):
        for r in bench_records([2.0] * 129, lambda a, b, c: 1.0, budgets=[16], concurrency=[1]):
            ddtree = r["kind"] == "request" and r["cell"]["algorithm"] == "DDTREE"
            records.append(r if r["kind"] != "request" else {
                **r, "cell": {**r["cell"], "temperature": temperature},
                "rid": f"humaneval/{first + r['index']}" if ddtree else f"x/{r['index']}"})
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


@pytest.mark.parametrize(("temperature", "first"), [(None, 0), ("1", 8)])
def test_results_keep_only_that_temperatures_requests(bench_recording, capsys, temperature, first):
    """--results: tau(B') and the chain come from the rounds of the bench's DDTREE requests at
    --temperature (default 0) alone, not from the whole recording."""
    rec, bench = bench_recording / "rec.jsonl", bench_recording / "bench.jsonl"
    args = ["tau", str(rec), "--budgets", "16,128", "--json", "--results", str(bench)]
    assert cli([*args, *(["--temperature", temperature] if temperature else [])]) == 0
    (group,) = json.loads(capsys.readouterr().out)["recordings"][0]["groups"]
    (recording,) = read_recordings(rec)
    kept = [r for r in recording.rounds if r.req in {f"humaneval/{i}" for i in range(first, first + 8)}]
    assert group["requests"] == 8 and group["rounds"] == len(kept) < len(recording.rounds)
    for t in group["tau"]:
        assert t["tau"] == pytest.approx(sum(tau_at(r.path, t["budget"]) for r in kept) / len(kept))


@pytest.mark.parametrize(("edit", "extra", "message"), [
    (None, ["--temperature", "1"], "--temperature selects cells of --results; pass the bench JSONL with --results"),
    ("drop rids", [], "--results: no DDTREE request at T=0 with a request id in {bench}"),
    ("other ids", [], "--results: the recording holds no round of its 8 DDTREE requests at T=0"),
])
def test_results_that_select_nothing_are_one_line_exit_2(bench_recording, capsys, edit, extra, message):
    """--temperature without --results, results without request ids, or ids the recording never
    saw: one line, exit 2."""
    rec, bench = bench_recording / "rec.jsonl", bench_recording / "bench.jsonl"
    rows = [json.loads(line) for line in bench.read_text().splitlines()]
    if edit == "drop rids":
        rows = [{k: v for k, v in r.items() if k != "rid"} for r in rows]
    if edit == "other ids":
        rows = [{**r, "rid": f"elsewhere/{r['index']}"} if "rid" in r else r for r in rows]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli(["tau", str(rec), *(["--results", str(bench)] if edit else []), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"repro tau: {message.format(bench=bench)}"), err
