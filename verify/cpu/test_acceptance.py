"""Tests for `repro.tuning.acceptance`: the budget-prefix property it rests on, the recording reader and
the tau estimates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import build_trees, walk
from repro.errors import UsageError
from repro.tuning.acceptance import (
    Recording,
    Round,
    budget_taus,
    budgets_run,
    chain_estimate,
    prompt_sets,
    ratio_estimates,
    read_recordings,
    tau_at,
)
from verify.strategies import draft_logits


class TestBudgetPrefix:
    @given(draft_logits(max_bs=2, max_horizon=5, max_vocab=10), st.integers(0, 40))
    def test_smaller_budget_tree_is_the_first_rows(self, x, budget):
        """The tree of every B' <= B is rows 0..B' of the tree of B (ties included, padding too)."""
        big = build_trees(x, budget, torch.zeros(x.shape[0], dtype=torch.int64))
        for small in range(budget + 1):
            tree = build_trees(x, small, torch.zeros(x.shape[0], dtype=torch.int64))
            for name in ("tokens", "parents", "depths", "scores"):
                assert torch.equal(getattr(tree, name), getattr(big, name)[:, : small + 1]), (name, small)
            assert torch.equal(tree.num_nodes, big.num_nodes.clamp(max=small + 1))

    @given(draft_logits(max_bs=3, max_horizon=6, max_vocab=10), st.integers(1, 40), st.integers(0, 2**31 - 1))
    def test_walk_on_a_smaller_budget_accepts_the_path_nodes_up_to_it(self, x, budget, seed):
        """With the target's token per node fixed, the walk at B' accepts 1 + #(path ids <= B')."""
        big = build_trees(x, budget, torch.zeros(x.shape[0], dtype=torch.int64))
        g = torch.Generator().manual_seed(seed)
        target = torch.where(torch.rand(big.tokens.shape, generator=g) < 0.7, big.tokens.roll(-1, 1).clamp(min=0),
                             torch.randint(0, x.shape[-1], big.tokens.shape, generator=g))
        result = walk(big, target)
        paths = [result.accept_index[b, 1 : int(result.accept_len[b])].tolist() for b in range(x.shape[0])]
        for small in range(budget + 1):
            tree = build_trees(x, small, torch.zeros(x.shape[0], dtype=torch.int64))
            got = walk(tree, target[:, : small + 1]).accept_len.tolist()
            assert got == [tau_at(p, small) for p in paths]


def _round(req: str, path: tuple[int, ...], **kw) -> Round:
    return Round(step=kw.get("step", 0), req=req, prompts=kw.get("prompts", "-"), bs=1, path=path,
                 rank0=kw.get("rank0"), chain=kw.get("chain"), budget=kw.get("budget"))


class TestEstimates:
    def test_budget_taus_average_tau_at_over_rounds(self):
        """Tau(B') is the mean over rounds of 1 + #(ids <= B'), for every B' up to the budget."""
        rounds = [_round("a", (1, 3)), _round("a", (2, 5, 9)), _round("b", ()), _round("b", (4,))]
        taus = budget_taus(rounds, 9)
        for b in range(10):
            assert taus[b].value == pytest.approx(sum(tau_at(r.path, b) for r in rounds) / 4)
        assert (taus[9].rounds, taus[9].requests) == (4, 2)

    def test_mixed_budgets_count_only_the_rounds_that_reach_b(self):
        """With a schedule's rounds at several budgets, tau(B') averages the rounds of budget >= B'."""
        rounds = [_round("a", (1, 3), budget=3), _round("a", (2, 5, 9), budget=9), _round("b", (4,), budget=4)]
        taus = budget_taus(rounds, 9)
        for b in range(10):
            reach = [r for r in rounds if r.budget >= b]
            assert taus[b].value == pytest.approx(sum(tau_at(r.path, b) for r in reach) / len(reach))
            assert taus[b].rounds == len(reach)
        assert (taus[9].requests, taus[4].requests, taus[3].requests) == (1, 2, 2)
        assert budgets_run(rounds) == {3: 1, 4: 1, 9: 1}

    def test_interval_is_the_cluster_ratio_interval(self):
        """The 95% interval is R +- 1.96 sqrt(sum (y - R x)^2 / (n (n-1))) / xbar over requests."""
        y = np.array([[6.0], [2.0], [7.0]])
        x = np.array([2.0, 1.0, 3.0])
        (est,) = ratio_estimates(y, x)
        r = 15 / 6
        half = 1.959964 * np.sqrt(((6 - 2 * r) ** 2 + (2 - r) ** 2 + (7 - 3 * r) ** 2) / 6) / 2
        assert est.value == pytest.approx(r)
        assert (est.low, est.high) == (pytest.approx(r - half), pytest.approx(r + half))

    def test_one_request_has_no_interval(self):
        """With a single request the interval collapses to the point (nothing to compare with)."""
        (est,) = ratio_estimates(np.array([[5.0]]), np.array([2.0]))
        assert est.low == est.value == est.high == 2.5

    def test_chain_estimate_brackets_censored_rounds(self):
        """Censored rounds count 1 + j for the low and 1 + L for the high figure."""
        rounds = [_round("a", (1, 2), rank0=(1, 0), chain=3),  # left the chain: 2
                  _round("a", (1,), rank0=(1,), chain=1),  # censored: 2..5
                  _round("b", (1, 2, 3, 4), rank0=(1, 1, 1, 1), chain=4)]  # whole chain: 5
        est = chain_estimate(rounds, 4)
        assert est.censored == 1
        assert (est.low.value, est.high.value) == (pytest.approx(9 / 3), pytest.approx(12 / 3))

    def test_no_chain_fields_no_chain_estimate(self):
        """Rounds recorded without chain fields give no chain figure."""
        assert chain_estimate([_round("a", (1,))], 4) is None

    def test_prompt_sets_pool_when_several(self):
        """Rounds split by prompt set, with an 'all' pool only when there are several sets."""
        one = [_round("a", (1,), prompts="x")]
        assert list(prompt_sets(Recording("r", "DDTREE", 8, 3, "d", {}, one))) == ["x"]
        rec = Recording("r", "DDTREE", 8, 3, "d", {}, [*one, _round("b", (), prompts="y")])
        assert {k: len(v) for k, v in prompt_sets(rec).items()} == {"x": 1, "y": 1, "all": 2}


HEADER = {"kind": "recording", "schema": 1, "rec": "r1", "algorithm": "DDTREE", "budget": 8, "horizon": 3,
          "digest": "d", "config": {}, "stack": {}, "prompts": "-", "source": "test", "created": 0}


def _line(**kw) -> dict:
    return {"kind": "round", "rec": "r1", "step": 0, "req": "p/0", "prompts": "p", "bs": 1, "path": [1, 4],
            "rank0": [1, 0], "chain": 2, **kw}


def _write(tmp_path, *records, tail: str = "") -> object:
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


class TestReadRecordings:
    def test_reads_rounds_in_order(self, tmp_path):
        """Headers and rounds come back as recordings; a torn last line is dropped."""
        other = {**HEADER, "rec": "r2", "budget": 2}
        path = _write(tmp_path, HEADER, _line(), other, _line(rec="r2", path=[2], rank0=[0], chain=0),
                      _line(step=1), tail='{"kind": "rou')
        first, second = read_recordings(path)
        assert (first.budget, second.budget) == (8, 2)
        assert [r.step for r in first.rounds] == [0, 1]
        assert first.rounds[0] == Round(0, "p/0", "p", 1, (1, 4), (1, 0), 2, budget=8)  # a line without one: the header's
        assert second.rounds[0].path == (2,)

    def test_rounds_carry_their_own_budget(self, tmp_path):
        """A schedule's rounds name their budget (at most the header's, bounding the path) and graph flag."""
        path = _write(tmp_path, HEADER, _line(budget=4, graph=True), _line(step=1, path=[7], rank0=[0], chain=0))
        (rec,) = read_recordings(path)
        assert [(r.budget, r.graph) for r in rec.rounds] == [(4, True), (8, None)]
        for bad, message in (({"budget": 9}, "at most the recording's 8"), ({"budget": 4, "path": [5]}, "in 1..4"),
                             ({"graph": 1}, "'graph' must be true or false")):
            with pytest.raises(UsageError, match=message):
                read_recordings(_write(tmp_path, HEADER, _line(**bad)))

    @pytest.mark.parametrize(("record", "message"), [
        ({**HEADER, "schema": 2}, "schema 2 is not supported (this reader knows 1)"),
        ({**HEADER, "budget": -1}, "key 'budget' must be >= 0 (got -1)"),
        ({"kind": "other"}, "a record must be an object of kind 'recording' or 'round'"),
        (_line(rec="zz"), "round of recording 'zz' comes before that recording's header"),
        (_line(path=[4, 1]), r"'path' must be at most 3 increasing node ids in 1..8 (got [4, 1])"),
        (_line(path=[1, 9]), r"'path' must be at most 3 increasing node ids in 1..8 (got [1, 9])"),
        (_line(path=[1, 2, 3, 4], rank0=[0, 0, 0, 0]), "'path' must be at most 3 increasing node ids"),
        (_line(rank0=[1]), r"'rank0' must be one 0/1 per path node (2) (got [1])"),
        (_line(chain=None), "'rank0' and 'chain' come together or not at all"),
        (_line(rank0=[1, 1], chain=1), "'chain' must be an integer in 2..3 (got 1)"),
        (_line(step="0"), "key 'step' must be int (got '0')"),
    ])
    def test_bad_lines_are_one_error_naming_the_line(self, tmp_path, record, message):
        """Every malformed record is a UsageError 'FILE:LINE: what was expected'."""
        records = [record] if record.get("kind") == "recording" else [HEADER, record]
        path = _write(tmp_path, *records)
        with pytest.raises(UsageError) as err:
            read_recordings(path)
        assert str(err.value).startswith(f"{path}:{len(records)}: ")
        assert message in str(err.value)

    def test_bad_json_in_the_middle(self, tmp_path):
        """A line that is not JSON (and not the torn last one) is an error."""
        path = _write(tmp_path, HEADER, tail="{not json\n" + json.dumps(_line()) + "\n")
        with pytest.raises(UsageError, match=r"rec.jsonl:2: not a JSON record$"):
            read_recordings(path)

    def test_no_header(self, tmp_path):
        """A file without a recording header says so."""
        path = _write(tmp_path)
        with pytest.raises(UsageError, match=r"holds no recording \(no line of kind 'recording'"):
            read_recordings(path)

    def test_missing_file(self, tmp_path):
        """A missing file is one line naming it."""
        with pytest.raises(UsageError, match=r"^RECORDING: .*nope.jsonl does not exist"):
            read_recordings(tmp_path / "nope.jsonl")
