"""Tests for `repro.ddtree.accept` (walk + commit, the reference) and `repro.kernels.accept` (the
one-launch kernel, under the Triton interpreter): the KV window reorder, the emission, the rows
and lengths, and bit-for-bit equality of the two."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import NOT_ACCEPTED, SlotTable, accept, build_trees, emitted_tokens, walk
from repro.ddtree.accept import window_order
from verify.kernel_cases import interpret
from verify.strategies import logits_and_budget


def _round(logits: torch.Tensor, budget: int, seed: int):
    """A tree over ``logits`` and target tokens that often follow a branch (long paths)."""
    g = torch.Generator().manual_seed(seed)
    bs, _, vocab = logits.shape
    roots = torch.randint(0, vocab, (bs,), generator=g)
    tree = build_trees(logits, budget, roots)
    child_tok = torch.where(tree.tokens < 0, 0, tree.tokens)
    pick = torch.gather(child_tok, 1, torch.randint(0, tree.n, tree.tokens.shape, generator=g))
    # a node's first child's token most of the time: the walk goes deep
    first = torch.full_like(tree.tokens, -1)
    for b in range(bs):
        for i in range(tree.n - 1, 0, -1):
            p = int(tree.parents[b, i])
            if p >= 0:
                first[b, p] = int(tree.tokens[b, i])
    u = torch.rand(tree.tokens.shape, generator=g)
    target = torch.where((u < 0.7) & (first >= 0), first, torch.where(u < 0.85, pick, torch.randint(
        0, vocab, tree.tokens.shape, generator=g)))
    return tree, target


def _pool(bs: int, n: int, prefix: torch.Tensor, seed: int):
    """A req_to_token table with distinct slots, and shuffled request rows."""
    g = torch.Generator().manual_seed(seed)
    width = int(prefix.max()) + n + 3
    table = torch.randperm(10 * bs * width, generator=g)[: (bs + 2) * width].view(bs + 2, width).int()
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    return table, rows


class TestAccept:
    @given(logits_and_budget(), st.integers(0, 9999))
    def test_window_keeps_the_accepted_slots_first_in_path_order(self, lb, seed):
        """After accept, positions prefix..prefix+tau-1 hold the accepted nodes' slots, in order,
        the window still holds exactly the slots it had, and path_slots is its first W slots."""
        logits, budget = lb
        tree, target = _round(logits, budget, seed)
        bs, n = tree.bs, tree.n
        prefix = torch.randint(0, 7, (bs,), generator=torch.Generator().manual_seed(seed))
        table, rows = _pool(bs, n, prefix, seed)
        before = table.clone()
        cols = prefix[:, None] + torch.arange(n)
        slots = before[rows[:, None], cols].long()
        got = accept(tree, target, prefix, SlotTable(table, rows))
        path = walk(tree, target).accept_index
        width = got.tokens.shape[1]
        for b in range(bs):
            tau = int(got.accept_len[b])
            row, p = int(rows[b]), int(prefix[b])
            assert table[row, p : p + tau].tolist() == slots[b, path[b, :tau]].tolist()  # the path's own slots
            assert sorted(table[row, p : p + n].tolist()) == sorted(before[row, p : p + n].tolist())
            assert torch.equal(table[row, :p], before[row, :p])
            assert torch.equal(table[row, p + n :], before[row, p + n :])
            assert got.path_slots[b].tolist() == table[row, p : p + width].tolist()

    def test_worked_example_keeps_the_path_slots_in_path_order(self):
        """Spec §6, B = 6: paths [0 3] and [0 1 5 6] keep slots 100, 103 and 107, 108, 112, 113
        first (the slots a chain decode of the accepted tokens would have written)."""
        q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])
        tree = build_trees(q.log().expand(2, 3, 5), 6, torch.tensor([8, 8]))
        target = torch.tensor([[2, 0, 9, 9, 9, 9, 9], [1, 3, 9, 9, 9, 1, 4]])
        table = torch.arange(100, 114).view(2, 7)
        accept(tree, target, torch.zeros(2, dtype=torch.int64), SlotTable(table, torch.tensor([0, 1])))
        assert table[0, :2].tolist() == [100, 103]
        assert table[1, :4].tolist() == [107, 108, 112, 113]

    @given(logits_and_budget(), st.integers(0, 9999))
    def test_emission_rows_and_lengths_follow_the_walk(self, lb, seed):
        """tokens = accepted drafts then the bonus (0 past tau), rows = b*N + path node (the
        root's row past tau), positions = prefix + k, new lengths = prefix + tau."""
        logits, budget = lb
        tree, target = _round(logits, budget, seed)
        prefix = torch.randint(0, 50, (tree.bs,), generator=torch.Generator().manual_seed(seed))
        res, got = walk(tree, target), accept(tree, target, prefix)
        emitted = emitted_tokens(tree, res)
        width = min(tree.horizon, tree.budget) + 1
        assert got.tokens.shape == (tree.bs, width)
        for b in range(tree.bs):
            tau = int(res.accept_len[b])
            path = res.accept_index[b, :tau].tolist()
            assert int(got.accept_len[b]) == tau and got.accept_len.dtype == torch.int32
            assert got.accept_index[b, :tau].tolist() == path
            assert (got.accept_index[b, tau:] == NOT_ACCEPTED).all()
            assert got.tokens[b, :tau].tolist() == emitted[b, :tau].tolist()
            assert (got.tokens[b, tau:] == 0).all()
            assert got.rows[b].tolist() == [b * tree.n + i for i in path] + [b * tree.n] * (width - tau)
            assert got.positions[b].tolist() == [int(prefix[b]) + k for k in range(width)]
            assert int(got.new_seq_lens[b]) == int(prefix[b]) + tau
            assert int(got.bonus[b]) == int(target[b, path[-1]])

    @given(logits_and_budget(), st.integers(0, 9999))
    def test_window_order_is_the_path_then_the_rest_ascending(self, lb, seed):
        """window_order lists the path first, then every other node once, ascending."""
        logits, budget = lb
        tree, target = _round(logits, budget, seed)
        res = walk(tree, target)
        order = window_order(res, tree.n)
        for b in range(tree.bs):
            tau = int(res.accept_len[b])
            path = res.accept_index[b, :tau].tolist()
            assert order[b, :tau].tolist() == path
            assert order[b, tau:].tolist() == sorted(set(range(tree.n)) - set(path))


SCRIPT = r"""
import torch
from verify.kernel_cases import _fix_interpreter_for_numpy_2_4
_fix_interpreter_for_numpy_2_4()
from repro.ddtree import SlotTable, accept
from repro.kernels.accept import accept_fused, empty_accepted
from verify.cpu.test_ddtree_accept import _pool, _round
g = torch.Generator().manual_seed(0)
FIELDS = ("accept_index", "accept_len", "bonus", "tokens", "rows", "positions", "new_seq_lens", "path_slots")
long_paths = 0
for case in range(48):
    bs, L, V = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 4), (1, 8), (2, 14)))
    budget = [0, 1, 3, 16, 40][case % 5]
    logits = [torch.randn(bs, L, V, generator=g) * 3, torch.zeros(bs, L, V)][case % 7 == 0]
    tree, target = _round(logits, budget, case)
    prefix = torch.randint(0, 6, (bs,), generator=g).to([torch.int64, torch.int32][case % 2])
    table, rows = _pool(bs, tree.n, prefix, case)
    t1, t2 = table.clone(), table.clone()
    want = accept(tree, target, prefix, SlotTable(t1, rows))
    out = empty_accepted(bs + 2, want.tokens.shape[1], device="cpu", seq_dtype=prefix.dtype, slots=True)
    for t in (out.accept_index, out.tokens, out.rows, out.positions, out.path_slots):
        t.fill_(-77)  # the kernel must write every element it returns
    got = accept_fused(tree, target, prefix, SlotTable(t2, rows), out=out)
    for name in FIELDS:
        a, b = getattr(want, name), getattr(got, name)
        assert a.dtype == b.dtype and torch.equal(a, b), (case, name, a, b)
    assert torch.equal(t1, t2), case
    plain = accept_fused(tree, target, prefix)
    assert plain.path_slots is None and torch.equal(plain.tokens, want.tokens)
    long_paths += int((want.accept_len >= 3).sum())
assert long_paths >= 20, long_paths
print("accept kernel ok", long_paths)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_accept_equals_the_reference_under_the_interpreter():
    """accept_fused writes exactly accept's outputs and table rewrite, with and without a table."""
    assert "accept kernel ok" in interpret(SCRIPT)
