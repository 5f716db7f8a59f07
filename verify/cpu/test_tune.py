"""Tests for `repro tune` and `repro.tuning.recommend` on synthetic recordings and bench results with known costs,
plus the sweep against the fake SGLang server and the report's tuning section."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pytest

from repro.cli import main as cli
from repro.evidence.results import summarize
from repro.evidence.verdicts import FAIL, NOT_MEASURED, PASS
from repro.schedule import BudgetSchedule
from repro.tuning import tune
from repro.tuning.acceptance import read_recordings
from repro.tuning.costs import cell_costs, predict_tok_s
from repro.tuning.recommend import analyze, cell_requests, pick_recording, render
from verify.fake_sglang import REPO, make_models, write_profiles
from verify.tunedata import bench_records, linear_round_ms, write_recording

FIT, HOLDOUT, CONC = [8, 32, 128], [16, 64], [1, 4, 8]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A B = 128 recording and bench results whose round times are linear in B (exactly interpolable)."""
    root = tmp_path_factory.mktemp("tune")
    taus = write_recording(root / "rec.jsonl")
    records = bench_records(taus, linear_round_ms, budgets=FIT + HOLDOUT, concurrency=CONC)
    return root, taus, records


def _analyze(world, records=None, holdout=HOLDOUT):
    root, _, default = world
    recording = pick_recording(read_recordings(root / "rec.jsonl"))
    return analyze(records or default, recording, profile="p", temperature=0.0, holdout=set(holdout))


class TestAnalyze:
    def test_held_out_cells_are_predicted(self, world):
        """With linear costs every held-out (B, c) cell is predicted within 1% (the rounding of
        rounds per request), and the prediction check passes."""
        result = _analyze(world)
        held = [c for c in result["checks"] if not c["fit"]]
        assert len(held) == len(HOLDOUT) * len(CONC)
        assert max(abs(c["error"]) for c in held) < 0.01
        (prediction, *_) = result["verdicts"]
        assert (prediction["check"], prediction["status"]) == ("tune prediction", PASS)

    def test_recommendation_is_the_argmax_of_the_model(self, world):
        """The recommended budget maximises c M / (TTFT + (M - 1)/tau(B) T_round(c, B)) over 8..128."""
        _, taus, _ = world
        result = _analyze(world)
        for row in result["concurrency"]:
            c = row["concurrency"]
            want = max(range(8, 129), key=lambda b: predict_tok_s(c, 128, 20.0, linear_round_ms("DDTREE", b, c), taus[b]))
            assert row["budget"] == want
            assert row["tok_s"] == pytest.approx(predict_tok_s(c, 128, 20.0, linear_round_ms("DDTREE", want, c), taus[want]))
            assert [b for b, _ in row["curve"]] == list(range(8, 129))

    def test_the_schedule_takes_each_batch_sizes_best_budget(self, world):
        """At a measured concurrency the schedule's budget is that concurrency's recommendation; between
        two it is the argmax with T_round interpolated linearly in c; equal neighbours merge."""
        _, taus, _ = world
        result = analyze(world[2], pick_recording(read_recordings(world[0] / "rec.jsonl")), profile="p",
                         temperature=0.0, holdout=set(HOLDOUT), captured=(1, 2, 4, 8, 16))
        plan, per_c = result["schedule"], {r["concurrency"]: r["budget"] for r in result["concurrency"]}
        rows = {r["bs"]: r for r in plan["rows"]}
        assert set(rows) == {1, 2, 4, 8, 16}
        for bs, row in rows.items():
            # past the measured concurrencies a batch size takes the nearest one's costs
            lo, hi = max(c for c in CONC if c <= bs), min([c for c in CONC if c >= bs], default=max(CONC))
            def cost(b, lo=lo, hi=hi, bs=bs):
                ends = [linear_round_ms("DDTREE", b, c) for c in (lo, hi)]
                return ends[0] if lo == hi else ends[0] + (ends[1] - ends[0]) * (bs - lo) / (hi - lo)
            want = max(range(8, 129), key=lambda b, bs=bs, cost=cost: predict_tok_s(bs, 128, 20.0, cost(b), taus[b]))
            assert row["budget"] == want == per_c.get(bs, want)
        schedule = BudgetSchedule.parse(plan["text"])
        assert all(schedule.budget(bs) == row["budget"] for bs, row in rows.items())
        assert all(a != b for a, b in itertools.pairwise(schedule.budgets))  # equal neighbours merged

    def test_neighbours_without_a_shared_budget_take_the_nearer_ones_costs(self, world):
        """Between two concurrencies measured at disjoint budgets a batch size takes the nearer one's
        costs (the lower on a tie), so every captured batch size still gets a budget."""
        root, taus, _ = world
        low = bench_records(taus, linear_round_ms, budgets=[8, 32], concurrency=[1, 4])
        high = [r for r in bench_records(taus, linear_round_ms, budgets=[64, 128], concurrency=[8])
                if r["kind"] == "request"]
        result = analyze(low + high, pick_recording(read_recordings(root / "rec.jsonl")), profile="p",
                         temperature=0.0, holdout=set(), captured=(1, 2, 6, 7, 8))
        rows = {r["bs"]: r["from_concurrency"] for r in result["schedule"]["rows"]}
        assert rows == {1: [1], 2: [1, 4], 6: [4], 7: [8], 8: [8]}

    def test_dflash_and_drafter(self, world):
        """DFLASH is the measured cell; the drafter cost is T_round(c, 0) - T_AR(c), extrapolated."""
        result = _analyze(world)
        for row in result["concurrency"]:
            c = row["concurrency"]
            assert row["dflash_source"] == "measured"
            assert row["beats_dflash"] == (row["tok_s"] > row["dflash_tok_s"])
            assert row["drafter_ms"] == pytest.approx(2.0 + 0.5 * c)
            assert row["drafter_extrapolated"] is True

    def test_dflash_predicted_from_the_chain_without_a_dflash_cell(self, world):
        """Without DFLASH cells its throughput comes from the chain's tau low bound and T_round(c, L)."""
        records = [r for r in world[2] if r.get("cell", {}).get("algorithm") != "DFLASH"]
        result = _analyze(world, records)
        low = result["chain"]["low"]
        for row in result["concurrency"]:
            c = row["concurrency"]
            assert row["dflash_source"].startswith("predicted")
            assert row["dflash_tok_s"] == pytest.approx(predict_tok_s(c, 128, 20.0, linear_round_ms("DDTREE", 15, c), low))

    def test_no_dflash_figure_is_said_not_counted_as_a_loss(self, world):
        """No DFLASH cell and no budget at or below the horizon: no DFLASH figure at any c, and the
        text says so instead of "beats DFLASH at c = none"; with a DFLASH cell it names the c."""
        _, taus, _ = world
        records = [r for r in bench_records(taus, linear_round_ms, budgets=[16, 32, 64, 128], concurrency=CONC)
                   if r.get("cell", {}).get("algorithm") != "DFLASH"]
        result = _analyze(world, records, holdout=[32])
        assert {row["beats_dflash"] for row in result["concurrency"]} == {None}
        text = render(result, markdown=False)
        assert "DDTREE against DFLASH: no DFLASH figure" in text and "beats DFLASH" not in text
        measured = _analyze(world)
        wins = [str(r["concurrency"]) for r in measured["concurrency"] if r["beats_dflash"]]
        assert f"DDTREE beats DFLASH at c = {', '.join(wins) or 'none'}" in render(measured, markdown=False)

    def test_slow_held_out_cells_fail_the_check(self, world):
        """Held-out cells 25% slower than the costs say are off by more than 10%: none close, fail."""
        _, taus, _ = world
        slow = bench_records(taus, linear_round_ms, budgets=FIT + HOLDOUT, concurrency=CONC,
                             scale=lambda a, b, c: 1.25 if b in HOLDOUT else 1.0)
        (prediction, *_) = _analyze(world, slow)["verdicts"]
        assert prediction["status"] == FAIL and prediction["value"] == 0
        assert "within 10% of 6 (worst |error| 2" in prediction["subject"]

    @pytest.mark.parametrize(("slow_cells", "close", "status"), [
        ({(16, 1), (16, 4), (16, 8)}, 3, PASS),  # three of six held-out cells close: the bar
        ({(16, 1), (16, 4), (16, 8), (64, 1)}, 2, FAIL),
    ])
    def test_three_close_held_out_cells_pass(self, world, slow_cells, close, status):
        """The check counts the held-out cells predicted within 10%; at least three pass it."""
        _, taus, _ = world
        records = bench_records(taus, linear_round_ms, budgets=FIT + HOLDOUT, concurrency=CONC,
                                scale=lambda a, b, c: 1.25 if (b, c) in slow_cells else 1.0)
        (prediction, *_) = _analyze(world, records)["verdicts"]
        assert (prediction["value"], prediction["status"]) == (close, status)

    def test_too_few_held_out_cells_is_not_measured(self, world):
        """Fewer than three held-out cells cannot judge the predictions."""
        _, taus, _ = world
        records = bench_records(taus, linear_round_ms, budgets=[8, 16, 128], concurrency=[1, 4])
        (prediction, *_) = _analyze(world, records, holdout=[16])["verdicts"]
        assert prediction["status"] == NOT_MEASURED

    def test_recommendation_check_against_the_best_measured_budget(self, world):
        """Where the recommended budget was measured, it must reach 97% of the best measured budget."""
        _, taus, _ = world
        best = _analyze(world)["concurrency"][0]["budget"]
        records = bench_records(taus, linear_round_ms, budgets=sorted({*FIT, *HOLDOUT, best}), concurrency=[1])
        result = _analyze(world, records, holdout=[*HOLDOUT, best])
        check = result["verdicts"][1]
        assert check["status"] == PASS and check["value"] == pytest.approx(1.0)
        slower = bench_records(taus, linear_round_ms, budgets=sorted({*FIT, *HOLDOUT, best}), concurrency=[1],
                               scale=lambda a, b, c: 1.1 if b == best else 1.0)
        assert _analyze(world, slower, holdout=[*HOLDOUT, best])["verdicts"][1]["status"] == FAIL


def _profiles(path: Path) -> Path:
    return write_profiles(path, {"p": {"sglang": {"fake-step-ms": 3}}})


def _with_rids(records: list[dict], rid=lambda r: f"humaneval/{r['index']}") -> list[dict]:
    """The records with the request ids `repro bench` sends (here: those of the recording's requests)."""
    return [{**r, "rid": rid(r)} if r["kind"] == "request" else r for r in records]


class TestRecordedRequests:
    def test_only_the_named_requests_rounds_are_pooled(self, world):
        """pick_recording keeps the rounds of the given request ids: 2 of the recording's 40
        requests, 10 rounds each."""
        root, _, _ = world
        picked = pick_recording(read_recordings(root / "rec.jsonl"), {"humaneval/0", "humaneval/1"})
        assert len(picked.rounds) == 20
        assert {r.req.split(":", 1)[1] for r in picked.rounds} == {"humaneval/0", "humaneval/1"}

    def test_cell_requests_are_the_ddtree_cells_at_the_temperature(self, world):
        """The ids of profile p's DDTREE requests at T 0: not AR's or DFLASH's, not T 1's, not
        another profile's; None for results written without ids."""
        _, _, records = world
        hot = [{**r, "cell": {**r["cell"], "temperature": 1.0}} for r in records if r["kind"] == "request"]
        other = [{**r, "cell": {**r["cell"], "profile": "q"}} for r in records if r["kind"] == "request"]
        tagged = _with_rids(records, lambda r: f"h/{r['cell']['algorithm']}{r['cell']['budget']}-{r['index']}") + \
            _with_rids(hot, lambda r: f"hot/{r['index']}") + _with_rids(other, lambda r: f"q/{r['index']}")
        want = {f"h/DDTREE{b}-{i}" for b in FIT + HOLDOUT for i in range(8)}
        assert cell_requests(tagged, "p", 0.0) == want
        assert cell_requests(records, "p", 0.0) is None

    def test_tune_reads_tau_from_the_results_requests_only(self, world, tmp_path, capsys):
        """Results whose DDTREE requests are 8 of the recording's 40: τ comes from those 8
        requests' rounds; when the ids name no recorded request (a recording of another run), from
        all 40, with a note."""
        root, _, records = world
        results, out = tmp_path / "bench.jsonl", tmp_path / "out"
        args = ["tune", "p", "--profile-file", str(_profiles(tmp_path / "profiles.toml")), "--results", str(results),
                "--recording", str(root / "rec.jsonl"), "-o", str(out)]
        results.write_text("".join(json.dumps(r) + "\n" for r in _with_rids(records)))
        assert cli(args) == 0, capsys.readouterr().out
        (record,) = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
        assert record["recording"]["requests"] == 8 and record["recording"]["rounds"] == 80
        results.write_text("".join(json.dumps(r) + "\n" for r in _with_rids(records, lambda r: "elsewhere/1")))
        assert cli(args) == 0
        assert "holds no round of the results' DDTREE requests at T=0; tau(B) from all its rounds" in \
            capsys.readouterr().err
        record = json.loads((out / "tune.jsonl").read_text().splitlines()[-1])
        assert record["recording"]["requests"] == 40 and record["recording"]["rounds"] == 400


class TestPromptSets:
    @staticmethod
    def _mixed(world, tmp_path) -> tuple[list[str], Path]:
        """Results on two prompt sets: humaneval's requests are the recording's, the distinct set's
        rounds take twice as long, under ids the recording never saw."""
        root, taus, records = world
        slow = bench_records(taus, lambda a, b, c: 2 * linear_round_ms(a, b, c), budgets=FIT + HOLDOUT,
                             concurrency=CONC)
        distinct = [{**r, "cell": {**r["cell"], "prompts": "humaneval-distinct"}} for r in slow if r["kind"] == "request"]
        results = tmp_path / "bench.jsonl"
        results.write_text("".join(json.dumps(r) + "\n" for r in
                                   [*_with_rids(records), *_with_rids(distinct, lambda r: f"distinct/{r['index']}")]))
        out = tmp_path / "out"
        return ["tune", "p", "--profile-file", str(_profiles(tmp_path / "profiles.toml")), "--results", str(results),
                "--recording", str(root / "rec.jsonl"), "-o", str(out)], out

    def test_several_sets_need_prompts(self, world, tmp_path, capsys):
        """Results on two prompt sets without --prompts: one line naming them, exit 2."""
        args, _ = self._mixed(world, tmp_path)
        assert cli(args) == 2
        assert capsys.readouterr().err.strip() == ("repro tune: --results hold p cells on 2 prompt sets "
                                                   "(humaneval, humaneval-distinct): choose one with --prompts")

    def test_a_set_the_results_lack_is_named(self, world, tmp_path, capsys):
        """--prompts naming a set the results do not hold: one line listing those they do, exit 2."""
        args, _ = self._mixed(world, tmp_path)
        assert cli([*args, "--prompts", "gsm8k"]) == 2
        assert capsys.readouterr().err.strip() == ("repro tune: --prompts gsm8k: the results hold no p cell on it "
                                                   "(they hold humaneval, humaneval-distinct)")

    def test_the_chosen_set_is_fitted_with_tau_from_any_set(self, world, tmp_path, capsys):
        """--prompts picks the cells fitted and measured (the distinct set's rounds are twice as long), while
        tau(B) still comes from the recorded rounds of the results' DDTREE requests, whichever set
        ran them (here the humaneval cells' 8 requests). The report shows each set's latest tune."""
        args, out = self._mixed(world, tmp_path)
        fast, slow = [], []
        for prompts, rows in (("humaneval", fast), ("humaneval-distinct", slow)):
            assert cli([*args, "--prompts", prompts]) == 0, capsys.readouterr().out
            record = json.loads((out / "tune.jsonl").read_text().splitlines()[-1])
            assert record["recording"]["requests"] == 8
            rows += [row["best_measured_tok_s"] for row in record["concurrency"]]
        assert "tau(B) from all its rounds" not in capsys.readouterr().err
        assert all(0.5 < s / f < 0.6 for s, f in zip(slow, fast, strict=True)), (slow, fast)
        assert cli(["report", args[args.index("--results") + 1], str(out / "tune.jsonl"), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        assert md.count("tune p at T=0 on humaneval, ") == 1 and md.count("tune p at T=0 on humaneval-distinct, ") == 1


class TestCli:
    def test_results_mode_prints_and_records(self, world, tmp_path, capsys):
        """--results: the table, the checks, the server arguments and a tune record; exit 0."""
        root, _, records = world
        results = tmp_path / "bench.jsonl"
        results.write_text("".join(json.dumps(r) + "\n" for r in records))
        rc = cli(["tune", "p", "--profile-file", str(_profiles(tmp_path / "profiles.toml")), "--results", str(results),
                  "--recording", str(root / "rec.jsonl"), "-o", str(tmp_path / "out")])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert "DDTREE beats DFLASH at c =" in out and "pass: tune prediction" in out
        assert "c=1 alone: --speculative-algorithm DDTREE --speculative-ddtree-budget" in out
        plan = json.loads((tmp_path / "out" / "tune.jsonl").read_text())["schedule"]
        assert f"--speculative-ddtree-budget-schedule {plan['text']}" in out
        assert f"profile key: {plan['toml']}" in out and "command: python -m verify.fake_sglang" in out
        (record,) = [json.loads(line) for line in (tmp_path / "out" / "tune.jsonl").read_text().splitlines()]
        assert record["kind"] == "tune" and record["fingerprint"] == {"gpus": [{"name": "Fake GPU"}]}

    def test_failed_check_exits_1(self, world, tmp_path, capsys):
        """A failed prediction check is exit 1."""
        root, taus, _ = world
        slow = bench_records(taus, linear_round_ms, budgets=FIT + HOLDOUT, concurrency=CONC,
                             scale=lambda a, b, c: 1.25 if b in HOLDOUT else 1.0)
        results = tmp_path / "bench.jsonl"
        results.write_text("".join(json.dumps(r) + "\n" for r in slow))
        assert cli(["tune", "p", "--profile-file", str(_profiles(tmp_path / "profiles.toml")), "--results",
                    str(results), "--recording", str(root / "rec.jsonl"), "-o", str(tmp_path / "out")]) == 1
        assert "fail: tune prediction" in capsys.readouterr().out

    @pytest.mark.parametrize(("args", "message"), [
        (["--results", "{root}/rec.jsonl"], "--results needs --recording (the acceptance recording of the budgets to predict)"),
        (["--results", "{root}/nope.jsonl", "--recording", "{root}/rec.jsonl"], "{root}/nope.jsonl does not exist"),
        (["--url", "http://127.0.0.1:1", "--confirm"], "--confirm starts servers; it cannot be combined with --url"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1 (got 0)"),
        (["--concurrency", "0"], "--budgets and --concurrency must list values (concurrency >= 1) (got [8, 32, 128], [0])"),
        (["--results", "{bench}", "--recording", "{bench}"],
         "{bench}:1: a record must be an object of kind 'recording' or 'round'"),
    ])
    def test_usage_errors_are_one_line_exit_2(self, world, tmp_path, capsys, args, message):
        """Each user mistake is `repro tune: <message>`, exit 2."""
        root, _, records = world
        bench = tmp_path / "bench.jsonl"
        bench.write_text("".join(json.dumps(r) + "\n" for r in records))
        fill = {"root": root, "bench": bench}
        argv = ["tune", "p", "--profile-file", str(_profiles(tmp_path / "profiles.toml")), "-o", str(tmp_path / "o"),
                *(a.format(**fill) for a in args)]
        assert cli(argv) == 2
        assert capsys.readouterr().err.strip() == f"repro tune: {message.format(**fill)}"

    def test_unknown_profile(self, tmp_path, capsys):
        """An unknown PROFILE lists the known ones."""
        assert cli(["tune", "nope", "--profile-file", str(_profiles(tmp_path / "profiles.toml"))]) == 2
        assert capsys.readouterr().err.strip() == "repro tune: PROFILE must be one of p (got 'nope')"


class TestSweep:
    def test_measures_with_repro_bench_then_confirms(self, world, tmp_path, monkeypatch, capsys):
        """Without --results, tune runs `repro bench` (AR, DFLASH, DDTREE at the fitted and held-out
        budgets) against the fake server, then --confirm measures the recommended budgets."""
        root, _, _ = world
        make_models(tmp_path / "models")
        _profiles(tmp_path / "profiles.toml")
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("PYTHONPATH", str(REPO))
        rc = cli(["tune", "p", "--profile-file", "profiles.toml", "--models-dir", "models", "--budgets", "8,32",
                  "--holdout", "16", "--concurrency", "1,2", "--num-prompts", "4", "--max-new-tokens", "24",
                  "--warmup", "1", "--recording", str(root / "rec.jsonl"), "--confirm", "-o", "out"])
        out = capsys.readouterr().out
        assert rc in (0, 1), out  # the fake server's tau is not the recording's: the checks may fail
        (result,) = [json.loads(line) for line in Path("out/tune.jsonl").read_text().splitlines()]
        measured = {(c["algorithm"], c["budget"]) for c in result["costs"]}
        recommended = {row["budget"] for row in result["concurrency"]}
        assert measured >= {("AR", None), ("DFLASH", None), ("DDTREE", 8), ("DDTREE", 16), ("DDTREE", 32)}
        assert {("DDTREE", b) for b in recommended} <= measured
        assert all(row["measured_tok_s"] is not None for row in result["concurrency"])
        assert result["holdout_budgets"] == sorted({16, *recommended} - {8, 32})

    @pytest.mark.parametrize("interleave", [False, True])
    def test_interleave_measures_in_waves_as_an_interleaved_grid_did(self, monkeypatch, interleave):
        """--interleave reaches the repro bench that tune runs (a confirm cell then ends each wave with its
        slowest request, as the grid's cells did); without it the bench refills as requests finish. Its servers'
        logs go beside tune's output (not to the working folder's results/)."""
        seen = []
        monkeypatch.setattr("repro.tuning.tune.subprocess.run",
                            lambda argv, env, check: seen.append(argv) or type("Done", (), {"returncode": 0}))
        parser = argparse.ArgumentParser()
        tune.add_arguments(parser)
        args = parser.parse_args(["p", "--confirm", *(["--interleave"] if interleave else [])])
        tune._bench(args, Path("o/out.jsonl"), ["--budgets", "27"], None)
        (argv,) = seen
        assert ("--interleave" in argv) is interleave and argv[argv.index("--budgets") + 1] == "27"
        assert argv[argv.index("--log-dir") + 1] == str(Path("o/logs"))  # server logs beside tune's output

    def test_sweep_without_a_recording_says_the_servers_did_not_record(self, tmp_path, monkeypatch, capsys):
        """The fake server does not record: tune says which file is missing and why, exit 1."""
        make_models(tmp_path / "models")
        write_profiles(tmp_path / "profiles.toml", {"p": {"algorithm": "AR", "budget": None, "drafter": None}})
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("PYTHONPATH", str(REPO))
        monkeypatch.setattr("repro.tuning.tune._bench", lambda args, out, extra, recording: None)
        assert cli(["tune", "p", "--profile-file", "profiles.toml", "-o", "out"]) == 1
        err = capsys.readouterr().err.strip()
        assert err == ("repro tune: out/p-recording.jsonl was not written: the DDTREE servers did not record "
                       "(is the installed sglang's DDTREE worker wired to $REPRO_DDTREE_RECORD?)")


def test_report_has_the_tuning_section_and_plot(world, tmp_path, capsys):
    """`repro report` over a directory with bench and tune records shows the section and draws the plot."""
    root, _, records = world
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli(["tune", "p", "--profile-file", str(_profiles(tmp_path / "profiles.toml")), "--results",
                str(results / "bench.jsonl"), "--recording", str(root / "rec.jsonl"), "-o", str(results)]) == 0
    assert cli(["report", str(results), "-o", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Budget tuning (`repro tune`)" in md and "| c | best B | predicted tok/s |" in md
    assert "![repro tune: predicted vs measured DDTREE throughput](tune_predicted_vs_measured.png)" in md
    assert (tmp_path / "rep" / "tune_predicted_vs_measured.png").read_bytes().startswith(b"\x89PNG")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["tune"][0]["profile"] == "p"


def test_measured_throughput_is_littles_law_not_a_waves_wall_time():
    """A cell run in waves (bench --interleave) ends each wave with its slowest request; tune's measured
    tok/s is c * tokens / sum(latency) (what c refilling clients get), not tokens over that wall time."""
    records = bench_records([0.0] * 17 + [4.0], linear_round_ms, budgets=[17], concurrency=[2], requests=4)
    wave_start = 0.0
    for r in (r for r in records if r["kind"] == "request" and r["cell"]["algorithm"] == "DDTREE"):
        if r["index"] % 2:  # every wave's second request takes twice as long; the next wave waits for it
            r["latency_s"] *= 2
        r["start"], r["end"] = wave_start, wave_start + r["latency_s"]
        wave_start += r["latency_s"] if r["index"] % 2 else 0.0
    (cost,) = [c for c in cell_costs(records, "p", 0.0) if c.algorithm == "DDTREE"]
    latency = sum(r["latency_s"] for r in records if r["kind"] == "request" and r["cell"]["algorithm"] == "DDTREE")
    assert cost.tok_s == pytest.approx(2 * 4 * 128 / latency)
    (summary,) = [s for s in summarize(records) if s.cell.algorithm == "DDTREE"]
    assert cost.tok_s > 1.1 * summary.output_tok_s  # the waves' wall time counts the stragglers' wait
