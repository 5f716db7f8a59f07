"""Tests for `repro.ddtree.commit`: emitted tokens, kept KV slots / hidden rows, stop handling."""

from __future__ import annotations

import torch

from repro.ddtree import accepted_rows, build_trees, emitted_tokens, finish_host, kv_slots_to_keep, walk

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

    def test_kv_slots_follow_the_path_order(self):
        """Kept KV slots are the accepted rows' slots, root first, in path order."""
        _, result = _worked_batch()
        out_cache_loc = torch.arange(100, 114)
        assert kv_slots_to_keep(out_cache_loc, result, 7).tolist() == [[100, 103, -1, -1], [107, 108, 112, 113]]


class TestFinishHost:
    def test_stop_token_cuts_after_itself_including_the_bonus(self):
        """The first stop token is kept and ends the request, even when it is the bonus."""
        emitted = torch.tensor([[5, 2, 6, 7], [5, 6, 7, 2]])
        out = finish_host(emitted, torch.tensor([4, 4]), {2}, [10, 10])
        assert [e.tokens for e in out] == [[5, 2], [5, 6, 7, 2]]
        assert [e.finished for e in out] == [True, True]

    def test_max_new_tokens_truncates_the_round(self):
        """A round may overshoot max_new_tokens; the emission is cut to what remains."""
        out = finish_host(torch.tensor([[1, 2, 3, 4]]), torch.tensor([4]), set(), [2])
        assert out[0].tokens == [1, 2] and out[0].finished

    def test_unfinished_request_keeps_everything(self):
        """No stop and room left: all tau tokens are emitted and the request goes on."""
        out = finish_host(torch.tensor([[1, 2, -1, -1]]), torch.tensor([2]), {9}, [5])
        assert out[0].tokens == [1, 2] and not out[0].finished

    def test_mask_token_is_an_ordinary_emission(self):
        """A genuine emission of the drafter's mask token id is kept (the reference's bug)."""
        mask_id = 4095
        out = finish_host(torch.tensor([[mask_id, 3]]), torch.tensor([2]), {0}, [8])
        assert out[0].tokens == [mask_id, 3]
