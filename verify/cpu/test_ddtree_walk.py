"""Tests for `repro.ddtree.walk`: the acceptance walk and the target's per-node sampler."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chisquare

from repro.ddtree import build_trees, greedy_tokens, sample_target_tokens, walk
from repro.ddtree.reference import walk_reference
from verify.strategies import logits_and_budget

Q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])


class TestWalk:
    @pytest.mark.parametrize(
        ("target", "path", "bonus"), [([2, 0, 9, 9, 9, 9, 9], [0, 3], 9), ([1, 3, 9, 9, 9, 1, 4], [0, 1, 5, 6], 4)]
    )
    def test_worked_example(self, target, path, bonus):
        """The spec §6 walks: accepted path, bonus and tau."""
        tree = build_trees(Q.log()[None], 6, torch.tensor([0]))
        result = walk(tree, torch.tensor([target]))
        assert result.accept_index[0].tolist() == path + [-1] * (4 - len(path))
        assert result.accept_len.tolist() == [len(path)] and result.bonus.tolist() == [bonus]

    @given(logits_and_budget(), st.integers(0, 2**31 - 1))
    def test_equals_child_map_walk(self, case, seed):
        """The batched walk equals the spec's child-map walk on random target tokens."""
        x, budget = case
        tree = build_trees(x, budget, torch.zeros(x.shape[0], dtype=torch.int64))
        g = torch.Generator().manual_seed(seed)
        # bias target tokens towards children so walks go deep
        target = torch.where(torch.rand(tree.tokens.shape, generator=g) < 0.6,
                             tree.tokens.roll(-1, 1).clamp(min=0), torch.randint(0, x.shape[-1], tree.tokens.shape, generator=g))
        result = walk(tree, target)
        for b in range(x.shape[0]):
            path, bonus = walk_reference(tree.tokens[b].tolist(), tree.parents[b].tolist(), target[b].tolist())
            assert result.accept_index[b, : len(path)].tolist() == path
            assert (result.accept_index[b, len(path):] == -1).all()
            assert int(result.accept_len[b]) == len(path) and int(result.bonus[b]) == bonus

    def test_padding_rows_are_never_accepted(self):
        """A padding row whose token equals the target's choice is still not accepted."""
        tree = build_trees(torch.tensor([[[0.0, 1.0]]]), 4, torch.tensor([0]))
        result = walk(tree, torch.tensor([[-1, 5, 5, 5, 5]]))
        assert result.accept_len.tolist() == [1] and result.bonus.tolist() == [-1]

    def test_shape_mismatch_is_an_error(self):
        """target_tokens must be [bs, N]."""
        tree = build_trees(torch.randn(1, 3, 5), 3, torch.tensor([0]))
        with pytest.raises(ValueError, match=r"target_tokens must have shape \[bs, N\] = \(1, 4\) \(got \(1, 3\)\)"):
            walk(tree, torch.zeros(1, 3, dtype=torch.int64))


class TestSampler:
    def _rule(self, bs, t, k, p):
        return (torch.full((bs,), t), torch.full((bs,), k), torch.full((bs,), p))

    def test_temperature_zero_is_argmax(self):
        """T = 0 picks the argmax whatever top-k/top-p say."""
        x = torch.randn(3, 4, 50)
        assert torch.equal(sample_target_tokens(x, *self._rule(3, 0.0, 5, 0.5)), greedy_tokens(x))

    def test_top_k_one_is_argmax(self):
        """top_k = 1 leaves only the argmax to sample."""
        x = torch.randn(2, 5, 30)
        assert torch.equal(sample_target_tokens(x, *self._rule(2, 1.3, 1, 1.0)), x.argmax(-1))

    def test_seeded_generator_reproduces(self):
        """The same generator seed gives the same samples."""
        x = torch.randn(2, 3, 40)
        run = lambda: sample_target_tokens(x, *self._rule(2, 1.0, 0, 1.0), torch.Generator().manual_seed(5))  # noqa: E731
        assert torch.equal(run(), run())

    def test_top_p_keeps_the_smallest_covering_set(self):
        """top_p = 0.7 over probabilities .5 .3 .2 keeps tokens 0 and 1 only."""
        x = torch.tensor([0.5, 0.3, 0.2]).log().expand(1, 2000, 3)
        got = sample_target_tokens(x, *self._rule(1, 1.0, 0, 0.7), torch.Generator().manual_seed(0))
        assert set(got.unique().tolist()) == {0, 1}

    def test_samples_follow_the_tempered_distribution(self):
        """Chi-square (alpha 0.001, fixed seed) of 20000 draws against softmax(x / T)."""
        x = torch.tensor([1.0, 0.2, -0.5, 0.0, 2.0])
        draws = sample_target_tokens(x.expand(1, 20000, 5), *self._rule(1, 0.8, 0, 1.0), torch.Generator().manual_seed(1))
        counts = torch.bincount(draws[0], minlength=5).double()
        expected = torch.softmax(x.double() / 0.8, -1) * 20000
        assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3

    def test_chunked_rows_keep_each_requests_rule(self, monkeypatch):
        """Forced into many small chunks, rows still follow their own request's rule: request 0
        (greedy) gives the argmax everywhere, request 1 (T = 0.8) passes the chi-square test."""
        import importlib

        walk_module = importlib.import_module("repro.ddtree.walk")  # the package re-exports walk()
        monkeypatch.setattr(walk_module, "_SAMPLER_BYTES", 5 * 24 * 7)  # 7 rows per chunk
        x = torch.tensor([1.0, 0.2, -0.5, 0.0, 2.0]).expand(2, 20000, 5)
        rule = (torch.tensor([0.0, 0.8]), torch.zeros(2, dtype=torch.int64), torch.ones(2))
        draws = sample_target_tokens(x, *rule, torch.Generator().manual_seed(2))
        assert (draws[0] == 4).all()
        counts = torch.bincount(draws[1], minlength=5).double()
        expected = torch.softmax(x[0, 0].double() / 0.8, -1) * 20000
        assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3

    def test_rule_shape_checked(self):
        """temperature/top_k/top_p must be [bs]."""
        with pytest.raises(ValueError, match=r"temperature must have shape \[bs\] = \(2,\)"):
            sample_target_tokens(torch.randn(2, 3, 4), torch.ones(3), torch.zeros(2), torch.ones(2))
