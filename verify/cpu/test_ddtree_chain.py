"""Tests for `repro.ddtree.chain` and `repro.tuning.acceptance.chain_tau`: the DFLASH chain on a DDTree round's rows.

The oracle is a real chain verify: the chain of rank-0 tokens walked against a target whose token
at a node depends only on the node's path, the same target the tree was walked against.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import DraftTree, build_trees, chain_fields, topk_logprobs, walk
from repro.tuning.acceptance import Round, chain_tau
from verify.strategies import logits_and_budget

Q = torch.tensor([[.05, .60, .25, .07, .03], [.50, .04, .10, .30, .06], [.08, .70, .12, .06, .04]])


class PathTarget:
    """A target whose token after a path (root excluded) depends on that path only: it follows
    ``plan`` while the path does, and is a hash of the path once the path leaves it."""

    def __init__(self, plan: list[int], vocab: int) -> None:
        self.plan, self.vocab = plan, vocab

    def token(self, path: tuple[int, ...]) -> int:
        """The target's token after ``path``."""
        if list(path) == self.plan[: len(path)] and len(path) < len(self.plan):
            return self.plan[len(path)]
        return hash(path) % self.vocab

    def on_tree(self, tree: DraftTree, b: int) -> list[int]:
        """The target's token at every node of request b's tree."""
        toks, parents = tree.tokens[b].tolist(), tree.parents[b].tolist()
        paths: list[tuple[int, ...]] = [()]
        for i in range(1, tree.n):
            paths.append(paths[parents[i]] + (toks[i],) if parents[i] >= 0 else (-1, i))
        return [self.token(p) for p in paths]


def _chain_accepts(rank0_ids: list[int], target: PathTarget) -> int:
    """Drafts DFLASH accepts on the chain of rank-0 tokens (leading matches)."""
    j = 0
    while j < len(rank0_ids) and target.token(tuple(rank0_ids[:j])) == rank0_ids[j]:
        j += 1
    return j


def _plan(rank0_ids: list[int], vocab: int, g: torch.Generator) -> list[int]:
    """A continuation that mostly follows the rank-0 chain, sometimes another token."""
    follow = torch.rand(len(rank0_ids) + 1, generator=g) < 0.75
    other = torch.randint(0, vocab, (len(rank0_ids) + 1,), generator=g).tolist()
    return [r if f else o for r, f, o in zip([*rank0_ids, -1], follow.tolist(), other, strict=True)]


class TestChainFields:
    def test_worked_example(self):
        """Spec §6, B = 6: the chain 1, 0, 1 is nodes 1, 2, 4; path [0 1 5 6] holds 1, 3, 1."""
        tree = build_trees(Q.log()[None], 6, torch.tensor([0]))
        result = walk(tree, torch.tensor([[1, 3, 9, 9, 9, 1, 4]]))
        fields = chain_fields(tree, torch.tensor([[1, 0, 1]]), result)
        assert fields.in_tree.tolist() == [3]
        assert fields.rank0.tolist() == [[True, False, True]]

    def test_budget_zero(self):
        """A root-only tree holds no chain node and no path node."""
        tree = build_trees(Q.log()[None], 0, torch.tensor([0]))
        fields = chain_fields(tree, torch.tensor([[1, 0, 1]]), walk(tree, torch.tensor([[1]])))
        assert fields.in_tree.tolist() == [0] and fields.rank0.tolist() == [[False] * 3]

    def test_shape_is_checked(self):
        """rank0_ids must be [bs, L]."""
        tree = build_trees(Q.log()[None], 3, torch.tensor([0]))
        result = walk(tree, torch.zeros(1, 4, dtype=torch.int64))
        with pytest.raises(ValueError, match=r"^rank0_ids must have shape \[bs, L\] = \(1, 3\) \(got \(1, 2\)\)$"):
            chain_fields(tree, torch.tensor([[1, 0]]), result)

    @given(logits_and_budget(max_bs=3, max_horizon=6, max_vocab=12), st.integers(0, 2**31 - 1))
    def test_equals_following_the_chain_node_by_node(self, case, seed):
        """in_tree is how far the rank-0 chain can be followed child by child; rank0 marks path
        nodes holding their depth's rank-0 token."""
        x, budget = case
        tree = build_trees(x, budget, torch.zeros(x.shape[0], dtype=torch.int64))
        rank0_ids = topk_logprobs(x, 1).ids[..., 0]
        g = torch.Generator().manual_seed(seed)
        target = torch.where(torch.rand(tree.tokens.shape, generator=g) < 0.7, tree.tokens.roll(-1, 1).clamp(min=0),
                             torch.randint(0, x.shape[-1], tree.tokens.shape, generator=g))
        result = walk(tree, target)
        fields = chain_fields(tree, rank0_ids, result)
        for b in range(x.shape[0]):
            toks, parents, first = tree.tokens[b].tolist(), tree.parents[b].tolist(), rank0_ids[b].tolist()
            node, depth = 0, 0
            while depth < len(first):
                child = [i for i in range(1, tree.n) if parents[i] == node and toks[i] == first[depth]]
                if not child:
                    break
                node, depth = child[0], depth + 1
            assert int(fields.in_tree[b]) == depth
            path = result.accept_index[b, 1 : int(result.accept_len[b])].tolist()
            want = [toks[a] == first[d] for d, a in enumerate(path)]
            assert fields.rank0[b].tolist() == want + [False] * (len(first) - len(path))


class TestChainTau:
    @given(logits_and_budget(max_bs=3, max_horizon=7, max_vocab=10), st.integers(0, 2**31 - 1))
    def test_decided_rounds_equal_a_chain_verify_and_censored_ones_bound_it(self, case, seed):
        """On the same rows and the same path-only target, chain_tau equals what the chain
        accepts when it decides, and brackets it when the round is censored."""
        x, budget = case
        bs, horizon, vocab = x.shape
        tree = build_trees(x, budget, torch.zeros(bs, dtype=torch.int64))
        rank0_ids = topk_logprobs(x, 1).ids[..., 0]
        g = torch.Generator().manual_seed(seed)
        targets = [PathTarget(_plan(rank0_ids[b].tolist(), vocab, g), vocab) for b in range(bs)]
        result = walk(tree, torch.tensor([t.on_tree(tree, b) for b, t in enumerate(targets)]))
        fields = chain_fields(tree, rank0_ids, result)
        for b in range(bs):
            tau = int(result.accept_len[b])
            r = Round(0, "r", "-", bs, tuple(result.accept_index[b, 1:tau].tolist()),
                      tuple(int(v) for v in fields.rank0[b, : tau - 1]), int(fields.in_tree[b]))
            low, high = chain_tau(r, horizon)
            truth = 1 + _chain_accepts(rank0_ids[b].tolist(), targets[b])
            assert low <= truth <= high
            if low < high:  # censored: the path ran along the whole chain the tree held
                assert r.chain == len(r.path) == low - 1 < horizon
            else:
                assert truth == low

    def test_full_chain(self):
        """A path along the whole chain to depth L decides tau = 1 + L."""
        assert chain_tau(Round(0, "r", "-", 1, (1, 2, 3), (1, 1, 1), 3), 3) == (4, 4)

    def test_left_the_chain(self):
        """A path that leaves the chain after one node decides tau = 2, whatever the tree holds."""
        assert chain_tau(Round(0, "r", "-", 1, (1, 5), (1, 0), 1), 4) == (2, 2)

    def test_next_chain_node_in_tree_but_not_taken(self):
        """The path stops at a chain node whose chain child is in the tree: tau = 1 + j."""
        assert chain_tau(Round(0, "r", "-", 1, (1,), (1,), 2), 4) == (2, 2)

    def test_censored(self):
        """The tree holds the chain exactly as deep as the path went: only 1 + j <= tau <= 1 + L."""
        assert chain_tau(Round(0, "r", "-", 1, (1,), (1,), 1), 4) == (2, 5)
