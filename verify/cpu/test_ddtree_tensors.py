"""Tests for `repro.ddtree.tensors`: positions, ancestor and FULL masks, SGLang's pointers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import ancestor_mask, build_trees, positions, tree_pointers, verify_tensors
from repro.ddtree.reference import ancestor_mask_reference, full_mask_reference, pointers_reference
from verify.strategies import logits_and_budget


class TestAncestorMask:
    @given(logits_and_budget())
    def test_rows_are_exactly_the_ancestor_sets(self, case):
        """Row i is true at i and its ancestors only; padding rows see only themselves."""
        x, budget = case
        tree = build_trees(x, budget)
        mask = ancestor_mask(tree)
        for b in range(x.shape[0]):
            assert mask[b].tolist() == ancestor_mask_reference(tree.parents[b].tolist())

    def test_worked_example_rows(self):
        """The spec §6 mask rows for B = 6."""
        q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])
        mask = ancestor_mask(build_trees(q.log()[None], 6))
        rows = ["".join(str(int(v)) for v in r) for r in mask[0].tolist()]
        assert rows == ["1000000", "1100000", "1110000", "1001000", "1110100", "1100010", "1100011"]


class TestFullMask:
    @given(logits_and_budget(), st.data())
    def test_layout_per_request_prefix_then_ancestors(self, case, data):
        """The flat FULL mask is, per request, N rows of [S_b x True | ancestor row], concatenated."""
        x, budget = case
        bs = x.shape[0]
        lens = torch.tensor(data.draw(st.lists(st.integers(0, 9), min_size=bs, max_size=bs)))
        tree = build_trees(x, budget, torch.zeros(bs, dtype=torch.int64))
        vt = verify_tensors(tree, lens, int(lens.sum()))
        expected = []
        for b in range(bs):
            expected += full_mask_reference(ancestor_mask_reference(tree.parents[b].tolist()), int(lens[b]))
        assert vt.full_mask.tolist() == expected


class TestPointers:
    @given(logits_and_budget())
    def test_match_the_reference_linking(self, case):
        """First child and next sibling link children in node order, -1 where none."""
        x, budget = case
        tree = build_trees(x, budget)
        index, first, sibling = tree_pointers(tree)
        n = tree.n
        for b in range(x.shape[0]):
            ref_first, ref_sibling = pointers_reference(tree.parents[b].tolist())
            assert first[b].tolist() == ref_first and sibling[b].tolist() == ref_sibling
            assert index[b].tolist() == list(range(b * n, (b + 1) * n))

    @given(logits_and_budget())
    def test_left_child_right_sibling_walk_equals_parent_array(self, case):
        """Walking first-child/next-sibling pointers from the root recovers exactly parents[]."""
        x, budget = case
        tree = build_trees(x, budget)
        _, first, sibling = tree_pointers(tree)
        for b in range(x.shape[0]):
            rebuilt = [-1] * tree.n
            stack = [0]
            while stack:
                p = stack.pop()
                c = int(first[b, p])
                while c != -1:
                    rebuilt[c] = p
                    stack.append(c)
                    c = int(sibling[b, c])
            assert rebuilt == tree.parents[b].tolist()


class TestVerifyTensors:
    def test_positions_are_prefix_plus_depth(self):
        """positions = committed length + depth; siblings share one."""
        q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])
        tree = build_trees(q.log()[None], 6, torch.tensor([3]))
        assert positions(tree, torch.tensor([10])).tolist() == [[10, 11, 12, 11, 13, 12, 13]]

    def test_input_ids_root_first_and_padding_replaced(self):
        """input_ids hold the root then the nodes; padding rows carry pad_token."""
        tree = build_trees(torch.tensor([[[0.0, 1.0]]]), 4, torch.tensor([7]))
        vt = verify_tensors(tree, torch.tensor([0]), 0, pad_token=5)
        assert vt.input_ids.tolist() == [7, 1, 0, 5, 5]

    def test_needs_root_tokens(self):
        """A tree built without root tokens cannot be verified."""
        tree = build_trees(torch.randn(1, 2, 3), 2)
        with pytest.raises(ValueError, match="root_tokens"):
            verify_tensors(tree, torch.tensor([0]), 0)
