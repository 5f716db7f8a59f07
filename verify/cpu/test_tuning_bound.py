"""CPU checks of repro.tuning.bound (what τ and a verify-cost curve allow) and of its section in
`repro report --verify-cost`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from repro import cli
from repro.errors import UsageError
from repro.serving.profiles import get_profile
from repro.testmodels import fullsize
from repro.tuning import bound
from verify.bench import verify_cost
from verify.benchdata import cell, request

TAUS = {"dflash": 4.0, "16": 5.0, "32": 6.0, "64": 6.5}
PNG = b"\x89PNG\r\n\x1a\n"


def _rows(cost) -> list[dict]:
    return [{"bs": bs, "n": n, "wall_ms": 1.0, "gpu_busy_ms": cost(bs, n), "kernels": 500}
            for bs in (1, 4) for n in verify_cost.TOKENS]


def _row(rows, bs, algorithm, budget=None):
    return next(r for r in rows if (r["bs"], r["algorithm"], r["budget"]) == (bs, algorithm, budget))


class TestBound:
    def test_a_flat_verify_cost_and_a_free_drafter_give_the_tau_ratio(self):
        """Verify costing the same at every N, no drafter: DDTREE / DFLASH is the τ ratio and
        DFLASH / AR is DFLASH's τ."""
        rows = bound.bound(_rows(lambda bs, n: 5.0), TAUS, block=16, draft_ms=0.0)
        assert _row(rows, 1, "DDTREE", 64)["over_dflash"] == pytest.approx(6.5 / 4.0)
        assert _row(rows, 4, "DFLASH")["over_ar"] == pytest.approx(4.0)
        assert {r["n"] for r in rows if r["algorithm"] == "DDTREE"} == {17, 33, 65}

    def test_a_rising_cost_moves_the_best_budget_down(self):
        """Verify cost 1 ms + 0.02 ms a token, drafter 1 ms: B 32 (6 / 2.66 ms) beats B 16
        (5 / 2.34) and B 64 (6.5 / 3.3); the rounds are drafter + verify(B + 1)."""
        rows = bound.bound(_rows(lambda bs, n: 1.0 + 0.02 * n), TAUS, block=16, draft_ms=1.0)
        ddtree = [r for r in rows if r["bs"] == 1 and r["algorithm"] == "DDTREE"]
        assert [round(r["round_ms"], 6) for r in ddtree] == [2.34, 2.66, 3.3]
        assert max(ddtree, key=lambda r: r["tok_per_ms"])["budget"] == 32
        assert _row(rows, 1, "DFLASH")["round_ms"] == pytest.approx(1.0 + 1.0 + 0.32)

    def test_a_full_row_tile_makes_the_budget_below_a_power_of_two_win(self):
        """A verify that steps up once N passes 64 (a second row tile, as the dense target's does):
        B 63 (N 64) beats B 64 (N 65) although its τ is a little lower."""
        taus = {"dflash": 4.0, "63": 6.45, "64": 6.5}
        rows = bound.bound(_rows(lambda bs, n: 5.0 if n <= 64 else 5.5), taus, block=16, draft_ms=0.5)
        ddtree = [r for r in rows if r["bs"] == 1 and r["algorithm"] == "DDTREE"]
        assert [(r["budget"], r["n"]) for r in ddtree] == [(63, 64), (64, 65)]
        assert max(ddtree, key=lambda r: r["tok_per_ms"])["budget"] == 63

    def test_the_fit_record_has_each_budget_and_the_one_below_it(self):
        """drafter_profiles_fit.json's τ, which the bound reads, covers B and B - 1 for every budget
        of the paper profile (16..512), and B - 1 accepts no more than B."""
        model = fullsize.load_model("qwen3-8b")
        tau = json.loads((Path(bound.__file__).parents[1] / "data" / "drafter_profiles_fit.json").read_text())[
            "profiles"][model.hook_profile]["check"]["tau"]
        budgets = [16, 32, 64, 128, 256, 512]
        assert set(tau) == {"dflash", *(str(b) for b in budgets), *(str(b - 1) for b in budgets)}
        assert all(tau[str(b - 1)] <= tau[str(b)] for b in budgets)

    def test_a_curve_short_of_the_budget_is_an_error(self):
        """Rows that stop before N = B + 1 name the batch size and the span."""
        rows = [{"bs": 1, "n": n, "gpu_busy_ms": 1.0} for n in (1, 16, 33)]
        with pytest.raises(ValueError, match="bs 1 do not reach N = 65"):
            bound.bound(rows, TAUS, block=16, draft_ms=0.0)

    def test_drafter_floor_is_its_bytes_and_the_heads_over_the_copy_rate(self):
        """qwen3-8b: the drafter's weights plus the 151936 x 4096 bf16 head at 4.2 TB/s."""
        model = fullsize.load_model("qwen3-8b")
        want = (fullsize.weight_bytes(model.drafter) + 151936 * 4096 * 2) / 4.2e12 * 1e3
        assert bound.drafter_ms(model, 4.2) == pytest.approx(want)

    def test_a_file_that_is_not_a_full_size_result_is_one_usage_line(self, tmp_path):
        """An unknown model: exit 2 from `repro report`, one line naming the file."""
        path = tmp_path / "x.json"
        path.write_text(json.dumps({"model": "no-such-model", "rows": []}))
        with pytest.raises(UsageError, match=f"--verify-cost: {path} is not a verify_cost result"):
            bound.allowed(path)


def test_a_served_round_is_c_times_tau_over_the_decode_rate():
    """AR counts τ 1; at c 4 the cell's decode tok/s is four requests' (3 tokens in 6 ms each)."""
    from repro.evidence.results import summarize

    (ar,) = summarize([request(cell("AR", None, 4), i) for i in range(4)])
    (tree,) = summarize([request(cell("DDTREE", 16, 4), i, verify=16) for i in range(4)])
    assert bound.served_round_ms(ar) == pytest.approx(2.0)
    assert bound.served_round_ms(tree) == pytest.approx(4 * 4.0 * 1e3 / 2000)


def _bench(path: Path) -> Path:
    """Served cells of the qwen3-8b profile at c 1, T 0: DFLASH 2 s, DDTREE B 32 1.6 s a request
    (1.25x), and a T 1 DDTREE cell that must not count."""
    p = get_profile("full-h200-qwen3-8b")
    lines = [{"kind": "run", "session": "s1", "profiles": {p.name: p.to_dict()}}]
    for algorithm, budget, end, temp in (("DFLASH", None, 2.0, 0.0), ("DDTREE", 32, 1.6, 0.0), ("DDTREE", 64, 0.1, 1.0)):
        lines += [request(cell(algorithm, budget, 1, p.name, temp), i, end=end, verify=8) for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


class TestReportSection:
    def test_bound_beside_the_measured_ratio_with_the_figure(self, tmp_path, capsys):
        """`repro report RESULTS --verify-cost JSON`: the target's bound table, the served
        DDTREE / DFLASH at c = bs and T 0 beside it with its share of the bound, and the figure."""
        cost = tmp_path / "verify_cost_qwen3-8b.json"
        cost.write_text(json.dumps({"model": "qwen3-8b", "device": "NVIDIA H200",
                                    "rows": _rows(lambda bs, n: 5.0)}))
        out = tmp_path / "rep"
        assert cli.main(["report", str(_bench(tmp_path / "b.jsonl")), "--verify-cost", str(cost), "-o", str(out)]) == 0
        capsys.readouterr()
        data = json.loads((out / "report.json").read_text())
        (section,) = data["verify_cost"]
        b32 = _row(section["rows"], 1, "DDTREE", 32)
        assert b32["measured_over_dflash"] == pytest.approx(1.25)
        assert _row(section["rows"], 1, "DDTREE", 64)["measured_over_dflash"] is None  # only T 1 measured
        # served round: c x τ (64 / 8) over 3 tokens in 6 ms of decode; none where nothing was served
        assert b32["served_round_ms"] == pytest.approx(16.0)
        assert _row(section["rows"], 1, "DFLASH")["served_round_ms"] == pytest.approx(16.0)
        assert _row(section["rows"], 1, "DDTREE", 64)["served_round_ms"] is None
        assert _row(section["rows"], 1, "AR")["served_round_ms"] is None
        md = (out / "report.md").read_text()
        share = f"{1.25 / b32['over_dflash']:.0%}"
        assert f"| 1 | DDTREE B 32 | 33 | {b32['tau']:.2f} | {b32['round_ms']:.2f} | 16.00 |" in md
        assert f"| 1.25x | {share} |" in md
        assert "](verify_cost_qwen3-8b.png)" in md
        assert (out / "verify_cost_qwen3-8b.png").read_bytes().startswith(PNG)
        assert f"From `{cost}` (NVIDIA H200, random tokens: on an MoE target an upper bound" in md  # no "tokens": random

    @pytest.mark.parametrize(("prompts", "says"), [
        ("humaneval-distinct", "each request's tokens the tree the hook drafts);"),
        (None, "each request's tokens the tree the hook drafts on a humaneval prompt: every one ends on the same token")])
    def test_the_section_names_tree_tokens(self, tmp_path, capsys, prompts, says):
        """A verify_cost result of --tree-tokens says its costs are of the hook's trees, and, when
        they were drafted on humaneval (no "prompts": before humaneval-distinct), that a batch's
        trees shared one root."""
        cost = tmp_path / "c.json"
        cost.write_text(json.dumps({"model": "k26-tp8", "device": "GPU", "tokens": "tree",
                                    **({"prompts": prompts} if prompts else {}),
                                    "rows": _rows(lambda bs, n: 3.0 + n / 50)}))
        assert cli.main(["report", "--verify-cost", str(cost), "-o", str(tmp_path / "rep")]) == 0
        assert f"From `{cost}` (GPU, {says}" in (tmp_path / "rep" / "report.md").read_text()

    def test_verify_cost_alone_makes_a_report(self, tmp_path, capsys):
        """No bench results: the bound alone, no measured column filled."""
        cost = tmp_path / "c.json"
        cost.write_text(json.dumps({"model": "k26-tp8", "rows": _rows(lambda bs, n: 3.0 + n / 50)}))
        assert cli.main(["report", "--verify-cost", str(cost), "-o", str(tmp_path / "rep")]) == 0
        md = (tmp_path / "rep" / "report.md").read_text()
        assert "### k26-tp8" in md and "the bound's best budget is" in md
        assert "No benchmark results." in md

    @pytest.mark.parametrize(("prompts", "taken", "marked"), [("humaneval-distinct", 1.25, 64),
                                                              (None, 0.8, None)])
    def test_the_served_cell_batches_as_the_cost_did(self, tmp_path, capsys, prompts, taken, marked):
        """A cell served on humaneval and on humaneval-distinct is compared with a tree cost from the
        set its batches match (distinct roots: humaneval-distinct; one root: humaneval); at bs > 1 a
        row served only on the other set is marked, at bs 1 (no batch) none is."""
        p = get_profile("full-h200-k26-tp8")
        lines = [{"kind": "run", "session": "s1", "profiles": {p.name: p.to_dict()}}]
        for algorithm, budget, end, c, on in (("DFLASH", None, 2.0, 4, "humaneval"), ("DDTREE", 32, 2.5, 4, "humaneval"),
                                              ("DDTREE", 64, 4.0, 4, "humaneval"), ("DFLASH", None, 2.0, 1, "humaneval"),
                                              ("DDTREE", 32, 2.0, 1, "humaneval"),
                                              ("DFLASH", None, 2.0, 4, "humaneval-distinct"),
                                              ("DDTREE", 32, 1.6, 4, "humaneval-distinct")):
            here = replace(cell(algorithm, budget, c, p.name), prompts=on)
            lines += [request(here, i, end=end, verify=8) for i in range(4)]
        bench = tmp_path / "b.jsonl"
        bench.write_text("".join(json.dumps(r) + "\n" for r in lines))
        cost = tmp_path / "c.json"
        cost.write_text(json.dumps({"model": "k26-tp8", "device": "GPU", "tokens": "tree",
                                    **({"prompts": prompts} if prompts else {}), "rows": _rows(lambda bs, n: 3.0 + n / 50)}))
        out = tmp_path / "rep"
        assert cli.main(["report", str(bench), "--verify-cost", str(cost), "-o", str(out)]) == 0
        capsys.readouterr()
        (section,) = json.loads((out / "report.json").read_text())["verify_cost"]
        assert _row(section["rows"], 4, "DDTREE", 32)["measured_over_dflash"] == pytest.approx(taken)
        md = (out / "report.md").read_text()
        rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| 4 | DDTREE B")}
        assert [name for name, line in rows.items() if "†" in line] == ([f"DDTREE B {marked}"] if marked else [])
        assert not any("†" in line for line in md.splitlines() if line.startswith("| 1 |"))
        assert ("†: served on `humaneval` only" in md) is bool(marked)
