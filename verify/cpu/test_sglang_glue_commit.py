"""Tests for `repro.sglang_glue.commit`: the verify window and commit along the accepted path."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import NOT_ACCEPTED, build_trees, emitted_tokens, kv_slots_to_keep, walk
from repro.sglang_glue.commit import commit_order, commit_window, path_hidden, path_tokens, window_slots
from verify.strategies import logits_and_budget


def _round(logits: torch.Tensor, budget: int, seed: int):
    """A tree over ``logits`` and a walk with target tokens that often follow a branch."""
    g = torch.Generator().manual_seed(seed)
    bs, _, vocab = logits.shape
    roots = torch.randint(0, vocab, (bs,), generator=g)
    tree = build_trees(logits, budget, roots)
    # target token per node: a random child's token half the time, else a random token
    child_tok = torch.where(tree.tokens < 0, 0, tree.tokens)
    perm = torch.randint(0, tree.n, tree.tokens.shape, generator=g)
    pick = torch.gather(child_tok, 1, perm)
    target = torch.where(torch.rand(tree.tokens.shape, generator=g) < 0.5, pick,
                         torch.randint(0, vocab, tree.tokens.shape, generator=g))
    return tree, walk(tree, target)


def _pool(bs: int, n: int, prefix: torch.Tensor, seed: int):
    """A req_to_token table with distinct slots, and shuffled request rows."""
    g = torch.Generator().manual_seed(seed)
    width = int(prefix.max()) + n + 3
    table = torch.randperm(10 * bs * width, generator=g)[: (bs + 2) * width].view(bs + 2, width).int()
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    return table, rows


class TestCommit:
    @given(logits_and_budget(), st.integers(0, 9999))
    def test_window_keeps_the_accepted_slots_first_in_path_order(self, lb, seed):
        """After commit, positions prefix..prefix+tau-1 hold the accepted nodes' slots, in order,
        and the window still holds exactly the slots it had."""
        logits, budget = lb
        tree, res = _round(logits, budget, seed)
        bs, n = tree.bs, tree.n
        prefix = torch.randint(0, 7, (bs,), generator=torch.Generator().manual_seed(seed))
        table, rows = _pool(bs, n, prefix, seed)
        slots = window_slots(table, rows, prefix, n)
        before = table.clone()
        new = commit_window(table, rows, prefix, slots, commit_order(res, n))
        keep = kv_slots_to_keep(slots.reshape(-1), res, n)
        for b in range(bs):
            tau = int(res.accept_len[b])
            row, p = int(rows[b]), int(prefix[b])
            assert table[row, p : p + tau].tolist() == keep[b, :tau].tolist()
            assert sorted(table[row, p : p + n].tolist()) == sorted(before[row, p : p + n].tolist())
            assert torch.equal(table[row, :p], before[row, :p])
            assert torch.equal(table[row, p + n :], before[row, p + n :])
            assert new[b].tolist() == table[row, p : p + n].tolist()

    @given(logits_and_budget(), st.integers(0, 9999))
    def test_order_is_a_permutation_with_the_rest_ascending(self, lb, seed):
        """commit_order lists the path first, then every other node once, ascending."""
        logits, budget = lb
        tree, res = _round(logits, budget, seed)
        order = commit_order(res, tree.n)
        for b in range(tree.bs):
            tau = int(res.accept_len[b])
            path = res.accept_index[b, :tau].tolist()
            assert order[b, :tau].tolist() == path
            rest = order[b, tau:].tolist()
            assert rest == sorted(set(range(tree.n)) - set(path))

    @given(logits_and_budget(), st.integers(0, 9999))
    def test_hidden_rows_and_tokens_follow_the_path(self, lb, seed):
        """path_hidden gathers the rows of the accepted nodes; path_tokens is the emission, 0-padded."""
        logits, budget = lb
        tree, res = _round(logits, budget, seed)
        bs, n = tree.bs, tree.n
        width = min(n, tree.horizon + 1)
        hidden = torch.arange(bs * n, dtype=torch.float32)[:, None].repeat(1, 3)
        got = path_hidden(hidden, res, n, width).view(bs, width, 3)
        toks = path_tokens(emitted_tokens(tree, res), width)
        emitted = emitted_tokens(tree, res)
        for b in range(bs):
            tau = int(res.accept_len[b])
            assert got[b, :tau, 0].tolist() == [float(b * n + i) for i in res.accept_index[b, :tau].tolist()]
            assert toks[b, :tau].tolist() == emitted[b, :tau].tolist()
            assert (toks[b, tau:] == 0).all()
            assert (res.accept_index[b, tau:] == NOT_ACCEPTED).all()

    def test_window_slots_read_the_request_rows(self):
        """window_slots returns req_to_token[req, prefix + j] for j < n."""
        table = torch.arange(40).view(4, 10).int()
        got = window_slots(table, torch.tensor([2, 0]), torch.tensor([3, 5]), 4)
        assert got.tolist() == [[23, 24, 25, 26], [5, 6, 7, 8]]
