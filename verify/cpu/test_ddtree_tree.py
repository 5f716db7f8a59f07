"""Tests for `repro.ddtree.tree`: the batched builder against the spec and the heap oracle."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.ddtree import build_trees, build_trees_from_topk, topk_logprobs, walk
from repro.ddtree.reference import build_tree_reference
from repro.ddtree.types import DraftTree
from verify.strategies import draft_logits, logits_and_budget

WORKED = torch.tensor([[0.05, 0.60, 0.25, 0.07, 0.03], [0.50, 0.04, 0.10, 0.30, 0.06], [0.08, 0.70, 0.12, 0.06, 0.04]]).log()


def assert_same_tree(a: DraftTree, b: DraftTree, row_a: int = 0, row_b: int = 0) -> None:
    """Assert row ``row_a`` of ``a`` and row ``row_b`` of ``b`` are the same tree."""
    for name in ("tokens", "parents", "depths", "scores"):
        assert torch.equal(getattr(a, name)[row_a], getattr(b, name)[row_b]), name
    assert int(a.num_nodes[row_a]) == int(b.num_nodes[row_b])


class TestWorkedExample:
    @pytest.mark.parametrize(
        ("budget", "tokens", "depths", "parents", "probs"),
        [
            (1, [1], [1], [-1, 0], [0.6]),
            (3, [1, 0, 2], [1, 2, 1], [-1, 0, 1, 0], [0.6, 0.3, 0.25]),
            (6, [1, 0, 2, 1, 3, 1], [1, 2, 1, 3, 2, 3], [-1, 0, 1, 0, 2, 1, 5], [0.6, 0.3, 0.25, 0.21, 0.18, 0.126]),
        ],
    )
    def test_spec_table(self, budget, tokens, depths, parents, probs):
        """The spec §6 table reproduces exactly: tokens, depths, parents, prefix probabilities."""
        tree = build_trees(WORKED[None], budget, torch.tensor([42]))
        assert tree.tokens[0].tolist() == [42, *tokens]
        assert tree.depths[0].tolist() == [0, *depths]
        assert tree.parents[0].tolist() == parents
        assert [math.exp(s) for s in tree.scores[0, 1:].tolist()] == pytest.approx(probs, rel=1e-6)


class TestAgainstReference:
    @settings(max_examples=500)
    @given(logits_and_budget())
    def test_batched_equals_heap(self, case):
        """The batched path builds exactly the heap oracle's tree for every request."""
        x, budget = case
        tree = build_trees(x, budget)
        for b in range(x.shape[0]):
            assert_same_tree(tree, build_tree_reference(x[b], budget), b, 0)

    @given(logits_and_budget(max_vocab=6, max_horizon=4))
    def test_tree_is_top_b_prefixes(self, case):
        """The tree is the B best prefixes by score, ties by rank tuple, in best-first order."""
        x, budget = case
        tree = build_trees(x, budget)
        for b in range(x.shape[0]):
            assert _node_paths(tree, b) == _brute_force_top(x[b], budget)


def _brute_force_top(x: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
    """Enumerate every prefix (as token paths), score it, sort by (-score, rank tuple)."""
    horizon, vocab = x.shape
    xf = x.float()
    lse = torch.logsumexp(xf, -1).tolist()
    order = torch.sort(xf, dim=-1, descending=True, stable=True).indices.tolist()
    k = min(budget, vocab)
    cands = []
    for depth in range(1, horizon + 1):
        for ranks in itertools.product(range(k), repeat=depth):
            s, c = 0.0, 0.0
            for d, r in enumerate(ranks):
                s += float(xf[d, order[d][r]])
                c += lse[d]
            cands.append((-(s - c), ranks, tuple(order[d][r] for d, r in enumerate(ranks))))
    cands.sort(key=lambda t: (t[0], t[1]))
    return [path for _, _, path in cands[:budget]]


def _node_paths(tree: DraftTree, b: int) -> list[tuple[int, ...]]:
    toks, parents = tree.tokens[b].tolist(), tree.parents[b].tolist()
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for i in range(1, int(tree.num_nodes[b])):
        paths[i] = paths[parents[i]] + (toks[i],)
    return [paths[i] for i in range(1, int(tree.num_nodes[b]))]


class TestStructure:
    @given(logits_and_budget())
    def test_parent_precedes_child_and_scores_never_increase(self, case):
        """parent[i] < i for real nodes, and prefix scores never increase along the node list."""
        x, budget = case
        tree = build_trees(x, budget)
        for b in range(x.shape[0]):
            n = int(tree.num_nodes[b])
            parents = tree.parents[b, 1:n]
            assert bool((parents < torch.arange(1, n)).all()) and bool((parents >= 0).all())
            scores = tree.scores[b, :n]
            assert bool((scores[1:] <= scores[:-1]).all())

    @given(logits_and_budget())
    def test_padding_rows_are_isolated(self, case):
        """Rows past num_nodes have no token, no parent, depth 0 and score -inf."""
        x, budget = case
        tree = build_trees(x, budget)
        for b in range(x.shape[0]):
            n = int(tree.num_nodes[b])
            assert (tree.tokens[b, n:] == -1).all() and (tree.parents[b, n:] == -1).all()
            assert (tree.depths[b, n:] == 0).all() and torch.isinf(tree.scores[b, n:]).all()

    def test_node_count_is_min_of_budget_and_all_prefixes(self):
        """A tree holds min(B, V + V^2 + ... + V^L) nodes, so small vocabularies pad."""
        for vocab, horizon, budget in [(1, 4, 10), (2, 3, 20), (3, 2, 5), (5, 1, 9)]:
            tree = build_trees(torch.randn(2, horizon, vocab), budget)
            total = sum(vocab**d for d in range(1, horizon + 1))
            assert tree.num_nodes.tolist() == [1 + min(budget, total)] * 2

    def test_budget_zero_is_root_only(self):
        """B = 0 gives one row per request: the root, with no parent."""
        tree = build_trees(torch.randn(3, 5, 7), 0, torch.tensor([4, 5, 6]))
        assert tree.tokens.tolist() == [[4], [5], [6]] and tree.parents.tolist() == [[-1]] * 3
        assert tree.num_nodes.tolist() == [1, 1, 1]

    def test_ties_break_by_ascending_token_id(self):
        """Equal logits inside one depth are ranked by ascending token id."""
        tree = build_trees(torch.tensor([[[0.0, 1.0, 1.0, 0.5, 1.0]]]), 3)
        assert tree.tokens[0, 1:].tolist() == [1, 2, 4]

    def test_prefix_precedes_its_extension_on_equal_score(self):
        """A certain token (probability 1) ties parent and child; the parent comes first."""
        x = torch.tensor([[[0.0, 0.0], [200.0, 0.0]]])  # depth 2: token 0 has q = 1.0 in float32
        tree = build_trees(x, 4)
        assert tree.tokens[0, 1:].tolist() == [0, 0, 1, 0]
        assert tree.parents[0].tolist() == [-1, 0, 1, 0, 3]

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
    def test_any_float_dtype(self, dtype):
        """Logits in any float dtype give the tree of their float32 values."""
        x = (torch.round(torch.randn(2, 6, 50) * 8) / 8).to(dtype)
        assert_same_tree(build_trees(x, 40), build_trees(x.float(), 40))
        assert_same_tree(build_trees(x, 40), build_trees(x.float(), 40), 1, 1)


class TestChainAndMonotonicity:
    @given(st.integers(1, 15), st.integers(0, 2**31 - 1))
    def test_peaked_drafter_with_small_budget_gives_the_dflash_chain(self, horizon, seed):
        """With B <= L and a peaked drafter the tree is the argmax chain, and the walk accepts
        exactly what chain DFlash accepts (leading matches, bonus after them)."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3, horizon, 40, generator=g)
        x.scatter_add_(2, torch.randint(0, 40, (3, horizon, 1), generator=g), torch.full((3, horizon, 1), 30.0))
        budget = int(torch.randint(1, horizon + 1, (), generator=g))
        tree = build_trees(x, budget, torch.zeros(3, dtype=torch.int64))
        chain = x.argmax(-1)[:, :budget]
        assert torch.equal(tree.tokens[:, 1:], chain)
        assert tree.parents[:, 1:].tolist() == [list(range(budget))] * 3
        target = torch.where(torch.rand(3, budget + 1, generator=g) < 0.8,
                             torch.cat([chain, chain[:, :1]], 1), torch.randint(0, 40, (3, budget + 1), generator=g))
        result = walk(tree, target)
        matches = torch.cumprod((chain == target[:, :-1]).long(), 1).sum(1)  # DFlash's accept rule
        assert torch.equal(result.accept_len, matches + 1)
        assert torch.equal(result.bonus, target.gather(1, matches[:, None])[:, 0])

    @given(draft_logits(max_bs=2, max_horizon=6, max_vocab=8), st.integers(0, 2**31 - 1))
    def test_tau_never_decreases_with_budget(self, x, seed):
        """On one drafter pass, tau is non-decreasing in B (trees for larger B contain smaller)."""
        g = torch.Generator().manual_seed(seed)
        vocab = x.shape[-1]
        intended = torch.randint(0, vocab, (x.shape[0], x.shape[1] + 1), generator=g)
        last = None
        for budget in range(3 * vocab + 3):
            tree = build_trees(x, budget, torch.zeros(x.shape[0], dtype=torch.int64))
            tau = walk(tree, _path_target(tree, intended, vocab)).accept_len
            if last is not None:
                assert bool((tau >= last).all())
            last = tau


def _path_target(tree: DraftTree, intended: torch.Tensor, vocab: int) -> torch.Tensor:
    """A target whose token at a node depends only on the node's path: it continues the
    ``intended`` sequence while the path follows it, else a hash of the path."""
    out = torch.empty_like(tree.tokens)
    for b in range(tree.bs):
        toks, parents = tree.tokens[b].tolist(), tree.parents[b].tolist()
        paths: dict[int, tuple[int, ...]] = {0: ()}
        for i in range(tree.n):
            if i > 0:
                paths[i] = paths[parents[i]] + (toks[i],) if parents[i] >= 0 else (-1,)
            p = paths[i]
            on_track = list(p) == intended[b, : len(p)].tolist()
            out[b, i] = intended[b, len(p)] if on_track else hash(p) % vocab
    return out


class TestFromTopK:
    def test_matches_build_trees(self):
        """Building from a precomputed TopK gives the same tree as from the logits."""
        x = torch.randn(2, 7, 300)
        assert_same_tree(build_trees_from_topk(topk_logprobs(x, 64), 64), build_trees(x, 64))

    def test_extra_ranks_are_ignored(self):
        """A TopK with more ranks than the budget needs builds the same tree."""
        x = torch.randint(-2, 3, (1, 5, 30)).float()
        assert_same_tree(build_trees_from_topk(topk_logprobs(x, 30), 8), build_trees(x, 8))

    def test_too_few_ranks_is_an_error(self):
        """K below min(B, V) cannot give the exact tree and raises ValueError."""
        with pytest.raises(ValueError, match=r"K >= min\(budget, V\) = 16 ranks per depth \(got K=8\)"):
            build_trees_from_topk(topk_logprobs(torch.randn(1, 3, 100), 8), 16)


class TestBadInput:
    @pytest.mark.parametrize(
        ("x", "budget", "message"),
        [
            (torch.randn(3, 4), 4, r"shape \[bs, L, V\] \(got rank 2"),
            (torch.randn(1, 2, 3, 4), 4, r"shape \[bs, L, V\] \(got rank 4"),
            (torch.zeros(0, 3, 5), 4, r"bs >= 1"),
            (torch.zeros(1, 0, 5), 4, r"L >= 1"),
            (torch.zeros(1, 3, 0), 4, r"V >= 1"),
            (torch.ones(1, 2, 3, dtype=torch.int64), 4, r"float tensor \(got torch.int64\)"),
            (torch.tensor([[[0.0, float("nan")]]]), 4, r"finite \(NaN or inf at \[bs, L, V\] index \[0, 0, 1\]\)"),
            (torch.tensor([[[float("inf"), 0.0]]]), 4, r"finite"),
            (torch.randn(1, 2, 3), -1, r"budget must be >= 0 \(got -1\)"),
            (torch.randn(1, 2, 3), 2.5, r"budget must be an int >= 0 \(got 2.5\)"),
            ([[1.0]], 4, r"must be a torch.Tensor \(got list\)"),
        ],
    )
    def test_one_clear_value_error(self, x, budget, message):
        """Each kind of bad input raises a ValueError naming the problem."""
        with pytest.raises(ValueError, match=message):
            build_trees(x, budget)

    def test_root_tokens_shape_checked(self):
        """root_tokens must be [bs]."""
        with pytest.raises(ValueError, match=r"root_tokens must have shape \[bs\] = \(2,\) \(got \(3,\)\)"):
            build_trees(torch.randn(2, 3, 4), 2, torch.zeros(3, dtype=torch.int64))


def test_make_dummy_is_a_valid_chain():
    """DraftTree.make_dummy gives a chain the walk can run on (warm-up / graph capture)."""
    tree = DraftTree.make_dummy(bs=2, budget=6, horizon=4)
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 3, -1, -1]
    assert walk(tree, torch.tensor([[1, 2, 3, 4, 9, 0, 0]] * 2)).accept_len.tolist() == [5, 5]
