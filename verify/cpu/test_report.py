"""Tests for `repro report`: Markdown, JSON and PNGs from bench results and verify-tier JUnit files."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from repro import cli
from repro.evidence.results import summarize
from repro.handoff import plots, report
from repro.handoff.report import read_tiers
from repro.serving.profiles import get_profile
from repro.stack import pins
from verify.benchdata import cell, request

JUNIT = Path(__file__).parents[1] / "fixtures" / "junit"
PNG = b"\x89PNG\r\n\x1a\n"


def results_file(path: Path) -> Path:
    """A results file of a TP and a TP+EP test profile: AR, DFLASH, DDTREE at 3 budgets, c 1/4."""
    tp = get_profile("test-h200-moe-tp2")
    ep = get_profile("test-h200-moe-ep2")
    lines = [{"kind": "run", "session": "s1", "fingerprint": {"gpus": [{"index": 0,
              "name": "NVIDIA H200", "capability": "9.0"}], "driver": "580.159",
              "git": {"revision": "abc", "dirty": False}}, "topology": {"interconnect": "nvlink"},
              "profiles": {p.name: p.to_dict() for p in (tp, ep)}}]
    for profile, speed in ((tp, 1.0), (ep, 1.25)):
        for conc in (1, 4):
            ends = {("AR", None): 2.0, ("DFLASH", None): 1.0, ("DDTREE", 8): 0.8,
                    ("DDTREE", 32): 0.6, ("DDTREE", 128): 0.7}
            for (algorithm, budget), end in ends.items():
                verify = None if algorithm == "AR" else int(64 / (2 + (budget or 0) ** 0.3))
                for i in range(4):
                    c = cell(algorithm, budget, conc, profile.name)
                    lines.append(request(c, i, end=end / speed, verify=verify and verify + i))
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


class TestReport:
    def test_writes_markdown_json_and_three_pngs(self, tmp_path: Path, capsys) -> None:
        """A TP/EP sweep gives every section, the verdicts and three real PNG plots."""
        out = tmp_path / "rep"
        results = results_file(tmp_path / "r.jsonl")
        rc = cli.main(["report", str(results), "-o", str(out),
                       "--tiers", str(JUNIT / "tests.xml"), str(JUNIT / "bench.xml")])
        assert rc == 0 and "report:" in capsys.readouterr().out
        md = (out / "report.md").read_text()
        assert f"from 1 results file(s), 80 recorded requests: `{results}`." in md  # what it was written from
        command = f"`repro report {results} -o {out} --tiers {JUNIT / 'tests.xml'} {JUNIT / 'bench.xml'}`"
        assert f"by {command} at commit {pins.git_revision()['revision'][:12]}" in md
        for row in ("| GPUs | 1 x NVIDIA H200 (sm 9.0) |", "| driver | 580.159 |", "| commit | abc |",
                    "| topology | nvlink |"):
            assert row in md  # the fingerprint is a table
        for heading in ("## Verify tiers", "## Stack fingerprint", "## Verdicts", "## Benchmarks",
                        "## TP vs TP+EP", "## Plots"):
            assert heading in md
        for name in ("speedup_vs_budget.png", "tau_vs_budget.png", "tp_vs_ep_throughput.png"):
            assert f"]({name})" in md
            data = (out / name).read_bytes()
            assert data.startswith(PNG) and len(data) > 10_000
        data = json.loads((out / "report.json").read_text())
        assert data["requests"] == 2 * 2 * 5 * 4
        assert data["fingerprints"][0]["fingerprint"]["driver"] == "580.159"
        assert {p["label"] for p in data["tp_vs_ep"]} >= {"AR", "DDTREE B=128"}
        ratio = next(p for p in data["tp_vs_ep"] if p["label"] == "AR" and p["concurrency"] == 1)
        assert ratio["ratio"] == pytest.approx(0.8)

    def test_failed_verdict_is_shouted(self, tmp_path: Path) -> None:
        """A verdict below its floor is marked FAIL in the Markdown."""
        path = tmp_path / "r.jsonl"
        tp = get_profile("test-h200-tp1")
        rows = [{"kind": "run", "session": "s", "profiles": {tp.name: tp.to_dict()}},
                request(cell("AR", profile=tp.name), 0),
                request(cell("DDTREE", 32, profile=tp.name), 0, verify=64)]  # tau 1 < 3.3
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert cli.main(["report", str(path), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        assert "| tau | test-h200-tp1 DDTREE B=32 c=1 T=0 | 1 | >= 3.3 | FAIL |" in md
        assert "- TP vs TP+EP output throughput vs concurrency: not drawn" in md

    def test_cells_pooled_across_commits_are_named(self, tmp_path: Path) -> None:
        """A cell whose requests came from runs at two commits is listed with both (a dirty tree
        marked); a cell from one commit, or from runs without a fingerprint, is not."""
        tp = get_profile("test-h200-tp1")

        def run(session: str, revision: str, *, dirty: bool) -> dict:
            return {"kind": "run", "session": session, "profiles": {tp.name: tp.to_dict()},
                    "fingerprint": {"git": {"revision": revision, "dirty": dirty}}}

        ar, dd = cell("AR", profile=tp.name), cell("DDTREE", 32, profile=tp.name)
        rows = [run("a", "1111111aaaa", dirty=False), run("b", "2222222bbbb", dirty=True), {"kind": "run", "session": "c"},
                request(dd, 0, verify=8, session="a"), request(dd, 1, verify=8, session="b"),
                request(ar, 0, session="a"), request(ar, 1, session="c")]
        path = tmp_path / "r.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert cli.main(["report", str(path), "-o", str(tmp_path / "rep")]) == 0
        data = json.loads((tmp_path / "rep" / "report.json").read_text())
        assert data["pooled_revisions"] == {"test-h200-tp1 DDTREE B=32 c=1 T=0": ["1111111", "2222222+dirty"]}
        md = (tmp_path / "rep" / "report.md").read_text()
        assert "- test-h200-tp1 DDTREE B=32 c=1 T=0: 1111111, 2222222+dirty" in md

    def test_two_prompt_sets_get_a_table_each(self, tmp_path: Path) -> None:
        """Cells served on humaneval and on humaneval-distinct (a planted target's lockstep fix) are
        two tables, each headed by its set, and a pooled cell names its set."""
        tp = get_profile("test-h200-tp1")
        runs = [{"kind": "run", "session": s, "profiles": {tp.name: tp.to_dict()},
                 "fingerprint": {"git": {"revision": rev, "dirty": False}}} for s, rev in (("a", "1" * 8), ("b", "2" * 8))]
        plain, distinct = cell("AR", profile=tp.name), replace(cell("AR", profile=tp.name), prompts="humaneval-distinct")
        rows = [*runs, request(plain, 0, session="a"), request(plain, 1, session="b"),
                request(distinct, 0, end=2.0, session="b")]
        path = tmp_path / "r.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert cli.main(["report", str(path), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        plain_at, distinct_at = md.index("Prompts `humaneval`:"), md.index("Prompts `humaneval-distinct`:")
        assert plain_at < md.index("| test-h200-tp1 | AR | 1 | - | 0 | 2 |") < distinct_at
        assert md.index("| test-h200-tp1 | AR | 1 | - | 0 | 1 | 32.0 |") > distinct_at
        assert "- test-h200-tp1 AR c=1 T=0 prompts=humaneval: 1111111, 2222222" in md

    def test_tiers_only_report_uses_this_machines_fingerprint(self, tmp_path: Path,
                                                              monkeypatch) -> None:
        """With no results (make verify on a CPU box) the report still lists the tiers."""
        monkeypatch.setattr(pins, "fingerprint", lambda: {"python": "3.12", "gpus": []})
        out = tmp_path / "rep"
        assert cli.main(["report", "-o", str(out), "--tiers", str(JUNIT / "tests.xml")]) == 0
        md = (out / "report.md").read_text()
        assert "No benchmark results" in md and "the machine that wrote this report" in md
        assert "| gpu | skipped | 0 | 0 | 1 | [gpu tier] no CUDA GPU" in md

    def test_a_directory_with_recordings_and_other_files_is_read(self, tmp_path: Path) -> None:
        """Of a results directory the bench results are read; a recording and a figure beside them
        are named in one note, in the Markdown and the JSON."""
        results = results_file(tmp_path / "r.jsonl")
        (tmp_path / "rec.jsonl").write_text('{"kind": "recording", "schema": 1}\n')
        (tmp_path / "fig.png").write_bytes(PNG)
        assert cli.main(["report", str(tmp_path), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        assert f"from 1 results file(s), 80 recorded requests: `{results}`." in md
        skipped = [str(tmp_path / "fig.png"), str(tmp_path / "rec.jsonl")]
        assert f"Skipped 2 file(s) of the results directories that are not bench results: `{skipped[0]}`, `{skipped[1]}`." in md
        assert json.loads((tmp_path / "rep" / "report.json").read_text())["skipped"] == skipped

    def test_without_matplotlib_the_report_is_written_without_plots(self, tmp_path: Path, monkeypatch, capsys) -> None:
        """No matplotlib: one line on stderr, report.md with every plot "not drawn", and no PNG."""
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
        out = tmp_path / "rep"
        assert cli.main(["report", str(results_file(tmp_path / "r.jsonl")), "-o", str(out)]) == 0
        assert capsys.readouterr().err == "report: no plots: matplotlib is not installed (`pip install matplotlib`)\n"
        md = (out / "report.md").read_text()
        assert md.count("not drawn, matplotlib is not installed") == len(report.PLOTS)
        assert not list(out.glob("*.png"))

    def test_needs_results_or_tiers(self, tmp_path: Path, capsys) -> None:
        """Nothing to report, or a missing file, is a usage error."""
        assert cli.main(["report", "-o", str(tmp_path)]) == 2
        assert cli.main(["report", str(tmp_path / "none.jsonl"), "-o", str(tmp_path)]) == 2
        assert "none.jsonl does not exist" in capsys.readouterr().err


class TestSpeedupPlot:
    @staticmethod
    def summaries(algorithms: list[tuple[str, int | None, float]]) -> list:
        """Summaries of one profile at c 1 and 4: (algorithm, budget, wall seconds of 4 requests)."""
        rows = [request(cell(a, b, conc), i, end=end, verify=16 if a != "AR" else None)
                for a, b, end in algorithms for conc in (1, 4) for i in range(4)]
        return summarize(rows)

    def test_without_ar_the_panel_is_over_dflash(self, tmp_path: Path, monkeypatch) -> None:
        """DFLASH and DDTREE cells only (a full-size target's tune run): DDTREE over DFLASH is drawn."""
        drawn = []
        monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(
            [([float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()])
             for line in fig.axes[0].lines if line.get_marker() == "o"]))
        rows = self.summaries([("DFLASH", None, 1.0), ("DDTREE", 16, 0.5), ("DDTREE", 64, 2.0)])
        assert plots.speedup_vs_budget(rows, tmp_path / "s.png") is None
        assert drawn[0] == [([16.0, 64.0], [2.0, 0.5])] * 2  # c 1 and c 4: 1 s / 0.5 s, 1 s / 2 s

    def test_ar_is_the_baseline_when_present(self, tmp_path: Path) -> None:
        """With AR cells the y axis is the speedup over AR; the figure is closed once written."""
        import matplotlib.pyplot as plt

        rows = self.summaries([("AR", None, 2.0), ("DFLASH", None, 1.0), ("DDTREE", 16, 0.5)])
        before = set(plt.get_fignums())
        assert plots.speedup_vs_budget(rows, tmp_path / "s.png") is None
        assert (tmp_path / "s.png").read_bytes().startswith(PNG)
        assert set(plt.get_fignums()) <= before

    def test_each_prompt_set_is_a_panel_of_its_own(self, tmp_path: Path, monkeypatch) -> None:
        """Cells on two prompt sets are two panels, each over its own baseline, titled by their set."""
        drawn = []
        monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(
            {ax.get_title(): [float(y) for line in ax.lines if line.get_marker() == "o" for y in line.get_ydata()]
             for ax in fig.axes if ax.lines}))
        rows = self.summaries([("DFLASH", None, 1.0), ("DDTREE", 16, 0.5)])
        other = [replace(s, cell=replace(s.cell, prompts="humaneval-distinct")) for s in
                 self.summaries([("DFLASH", None, 1.0), ("DDTREE", 16, 2.0)])]
        assert plots.speedup_vs_budget(rows + other, tmp_path / "s.png") is None
        assert drawn == [{"p (humaneval), T=0: DDTREE solid, DFLASH = 1 (no AR cell)": [2.0, 2.0],
                          "p (humaneval-distinct), T=0: DDTREE solid, DFLASH = 1 (no AR cell)": [0.5, 0.5]}]

    def test_close_budgets_do_not_overlap_their_labels(self, tmp_path: Path, monkeypatch) -> None:
        """B 17 beside B 16 keeps its tick but no label; B 32 and 48 keep theirs."""
        drawn = []
        monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(
            [t.get_text() for t in fig.axes[0].get_xticklabels()]))
        rows = self.summaries([("DFLASH", None, 1.0)] + [("DDTREE", b, 1.0) for b in (16, 17, 32, 48)])
        assert plots.speedup_vs_budget(rows, tmp_path / "s.png") is None
        assert drawn == [["16", "", "32", "48"]]

    def test_no_baseline_says_why(self, tmp_path: Path) -> None:
        """DDTREE alone has nothing to be a speedup over."""
        note = plots.speedup_vs_budget(self.summaries([("DDTREE", 16, 0.5)]), tmp_path / "s.png")
        assert note == "no DDTREE cell has an AR or DFLASH baseline to compute a speedup from"
        assert not (tmp_path / "s.png").exists()


def test_tau_vs_budget_is_a_panel_a_prompt_set_with_95_intervals(tmp_path: Path, monkeypatch) -> None:
    """A panel per prompt set; per temperature, DDTREE's mean tau at each budget (pooled over
    concurrency) with mean +- 1.96 standard errors over requests, DFLASH's mean as a level."""
    drawn = []

    def save(fig, path):
        for ax in fig.axes:
            bars = [c for c in ax.containers if hasattr(c, "lines")]  # errorbar containers
            line, _, (segments,) = bars[0].lines
            drawn.append((ax.get_title(), [t.get_text() for t in ax.get_legend().get_texts()],
                          list(line.get_xdata()), list(line.get_ydata()), [tuple(s[:, 1]) for s in segments.get_segments()]))

    monkeypatch.setattr(plots, "_save", save)
    rows = [request(cell("DFLASH"), i, verify=16) for i in range(4)]
    for budget, verifies in ((8, (10, 12, 14, 16)), (32, (8, 8, 10, 12))):
        rows += [request(cell("DDTREE", budget, conc), i, verify=v) for conc in (1, 4) for i, v in enumerate(verifies)]
    rows += [request(replace(cell("DDTREE", 8), prompts="humaneval-distinct"), i, verify=8) for i in range(2)]
    assert plots.tau_vs_budget(summarize(rows), tmp_path / "t.png") is None
    plain, distinct = drawn
    assert plain[:2] == ("p (humaneval): mean and 95% interval", ["DFLASH T=0", "DDTREE T=0"])
    assert plain[2] == [8, 32]
    for budget, verifies, y, (low, high) in zip((8, 32), ((10, 12, 14, 16), (8, 8, 10, 12)), plain[3], plain[4],
                                                strict=True):
        taus = np.array([64 / v for v in verifies] * 2)  # c = 1 and c = 4 pooled
        half = 1.959964 * taus.std(ddof=1) / np.sqrt(len(taus))
        assert y == pytest.approx(taus.mean()) and (low, high) == pytest.approx((taus.mean() - half, taus.mean() + half)), budget
    assert distinct[:4] == ("p (humaneval-distinct): mean and 95% interval", ["DDTREE T=0"], [8], [8.0])


def test_tau_vs_budget_needs_a_ddtree_cell_of_a_fixed_budget(tmp_path: Path) -> None:
    """DFLASH alone has no budget axis: a note, and no file."""
    note = plots.tau_vs_budget(summarize([request(cell("DFLASH"), 0, verify=16)]), tmp_path / "t.png")
    assert note == "no DDTREE cell of a fixed budget reported spec_verify_ct, so there is no tau to plot against B"
    assert not (tmp_path / "t.png").exists()


class TestTiers:
    def test_tiers_merge_runs_and_keep_skip_reasons(self) -> None:
        """A benchmark skipped by --benchmark-skip but run under --benchmark-only counts as run."""
        tiers = read_tiers([JUNIT / "tests.xml", JUNIT / "bench.xml"])
        assert tiers["cpu"] == {"passed": 2, "failed": 0, "skipped": 0, "reasons": {},
                                "status": "ran"}
        assert tiers["bench"]["status"] == "ran" and tiers["bench"]["passed"] == 1
        assert list(tiers["bench"]["reasons"]) == [
            "[gpu tier] no CUDA GPU on this machine (gpu tier runs on the GPU machine)"]
        assert tiers["sglang"]["status"] == "skipped"

    def test_failure_marks_the_tier_failed(self, tmp_path: Path) -> None:
        """One failing test makes its tier 'failed'."""
        path = tmp_path / "j.xml"
        path.write_text('<testsuite><testcase classname="verify.gpu.test_x" name="t">'
                        '<failure message="boom"/></testcase></testsuite>')
        assert read_tiers([path])["gpu"]["status"] == "failed"


def sequential(c, seconds: list[float], *, session: str = "s1") -> list[dict]:
    """Requests of ``c`` one after the other, taking ``seconds`` each."""
    return [request(c, i, start=sum(seconds[:i]), end=sum(seconds[: i + 1]), verify=16, session=session)
            | {"latency_s": d} for i, d in enumerate(seconds)]


def write_results(path: Path, rows: list[dict], profile=None) -> Path:
    """A results file of ``rows``, after a run record naming ``profile`` when given."""
    run = {"kind": "run", "session": "s1", "profiles": {} if profile is None else {profile.name: profile.to_dict()}}
    path.write_text("".join(json.dumps(r) + "\n" for r in [run, *rows]))
    return path


class TestLoadAndIntervals:
    def test_open_loop_cells_get_latency_and_ratio_tables(self, tmp_path: Path) -> None:
        """Open-loop DFLASH and DDTREE cells at one rate: the latency table lists both with the rate,
        and the open-loop section sets DDTREE's median and p90 TPOT and E2E over DFLASH's with intervals."""
        opened = {a: replace(cell(a, b, 8), request_rate=2.0) for a, b in (("DFLASH", None), ("DDTREE", 16))}
        rows = sequential(opened["DFLASH"], [1.0, 1.1, 0.9, 1.0]) + sequential(opened["DDTREE"], [0.5, 0.55, 0.45, 0.5])
        assert cli.main(["report", str(write_results(tmp_path / "r.jsonl", rows)), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        assert "| p | DDTREE B=16 | 8 | 2/s | 0 | 4 | 0 |" in md  # latency table: n 4, none failed
        assert re.search(r"\| p \| DDTREE B=16 \| DFLASH \| 8 \| 2/s \| 0 \| 0\.\d\dx \[0\.\d\d, 0\.\d\d\] \|", md), md
        data = json.loads((tmp_path / "rep" / "report.json").read_text())
        assert data["latency_ratios"][0]["figures"]["E2E p50"]["value"] == pytest.approx(0.5)
        assert "samples" not in data["summaries"][0]

    def test_a_floor_inside_the_interval_is_inconclusive_not_failed(self, tmp_path: Path, capsys) -> None:
        """DDTREE 1.05x DFLASH with requests that vary widely, against a 1.1 floor: the verdict reads
        inconclusive with its interval, and the report counts no failure."""
        (tmp_path / "t.toml").write_text('[sets.t]\nat = { concurrency = 1, temperature = 0.0 }\n'
                                         '[sets.t.speedup-floor]\nDDTREE-over-DFLASH = 1.1\nsource = "a test floor"\n')
        profile = replace(get_profile("test-h200-tp1"), thresholds="t", budget=16)
        noisy = [0.4, 1.6, 0.7, 1.3, 1.0, 1.0]
        rows = sequential(cell("DFLASH", profile=profile.name), noisy)
        rows += sequential(cell("DDTREE", 16, profile=profile.name), [x / 1.05 for x in noisy[::-1]])
        path = write_results(tmp_path / "r.jsonl", rows, profile)
        assert cli.main(["report", str(path), "-o", str(tmp_path / "rep"), "--thresholds-file", str(tmp_path / "t.toml")]) == 0
        assert "(1 verdicts, 0 failed, 1 inconclusive)" in capsys.readouterr().out
        md = (tmp_path / "rep" / "report.md").read_text()
        assert re.search(r"\| DDTREE/DFLASH \| test-h200-tp1 B=16 c=1 T=0 \| 1\.05 \[0\.\d\d, 1\.\d\d\] \| >= 1\.1 \| "
                         r"inconclusive \|", md), md

    def test_baseline_compares_cell_by_cell(self, tmp_path: Path) -> None:
        """--baseline sets each cell measured on both sides, figure by figure, after over before with its
        interval, lists the cells of one side, and keeps the baseline out of the other tables."""
        before = write_results(tmp_path / "before.jsonl", sequential(cell("DDTREE", 16), [1.0, 1.1, 0.9, 1.0])
                               + sequential(cell("DDTREE", 64), [1.0, 1.0]))
        (tmp_path / "after").mkdir()
        after = write_results(tmp_path / "after" / "a.jsonl", sequential(cell("DDTREE", 16), [0.8, 0.88, 0.72, 0.8]))
        assert cli.main(["report", str(after), "--baseline", str(before), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        assert "## Against the baseline" in md and f"Baseline (before): `{before}`" in md
        row = r"\| p \| humaneval \| DDTREE B=16 \| 1 \| - \| 0 \| tok/s \| 64 \| 80 \| 1\.25x \[1\.\d\d, 1\.\d\d\] \|"
        assert re.search(row, md), md
        assert "Measured before only:\n\n- p DDTREE B=64 c=1 T=0 humaneval" in md and "Measured after only" not in md
        assert "| p | DDTREE B=64 |" not in md.split("## Against the baseline")[0]  # not pooled
        data = json.loads((tmp_path / "rep" / "report.json").read_text())
        assert data["baseline"]["only_before"] == ["p DDTREE B=64 c=1 T=0 humaneval"] and data["baseline"]["only_after"] == []

    @pytest.mark.parametrize(("extra", "message"), [
        (["--baseline", "r.jsonl", "--tiers", str(JUNIT / "tests.xml")], "--baseline compares RESULTS with it"),
        (["r.jsonl", "--baseline", "none"], "none does not exist")])
    def test_baseline_needs_results_and_an_existing_path(self, tmp_path: Path, monkeypatch, capsys, extra, message) -> None:
        """--baseline without RESULTS, or naming nothing, is one usage line."""
        monkeypatch.chdir(tmp_path)
        write_results(tmp_path / "r.jsonl", [request(cell(), 0)])
        assert cli.main(["report", "-o", "rep", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
