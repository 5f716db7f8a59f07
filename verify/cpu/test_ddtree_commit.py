"""Tests for `repro.ddtree.commit`: emitted tokens and the hidden rows that feed the drafter."""

from __future__ import annotations

import torch

from repro.ddtree import build_trees, emitted_tokens, walk
from repro.ddtree.commit import accepted_rows

Q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])


def _worked_batch():
    """Two requests on the spec tree (B = 6): walks [0 3] + bonus 9 and [0 1 5 6] + bonus 4."""
    tree = build_trees(Q.log().expand(2, 3, 5), 6, torch.tensor([8, 8]))
    return tree, walk(tree, torch.tensor([[2, 0, 9, 9, 9, 9, 9], [1, 3, 9, 9, 9, 1, 4]]))


class TestCommit:
    def test_emitted_is_accepted_drafts_then_bonus(self):
        """Request 0 emits node 3's token (2) and bonus 9; request 1 emits 1, 3, 1 and bonus 4."""
        tree, result = _worked_batch()
        assert emitted_tokens(tree, result).tolist() == [[2, 9, -1, -1], [1, 3, 1, 4]]

    def test_accepted_rows_are_global_verify_rows_at_the_accepted_nodes(self):
        """Hidden states come from rows b*N + node, not from the first tau rows."""
        _, result = _worked_batch()
        assert accepted_rows(result, 7).tolist() == [[0, 3, -1, -1], [7, 8, 12, 13]]
