"""Tests for `repro.ddtree.topk`: exact per-depth ranks, lse, and the vocabulary-shard merge."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import merge_topk, topk_logprobs
from repro.ddtree.topk import order_keys
from verify.strategies import draft_logits


class TestTopkLogprobs:
    @given(draft_logits(max_vocab=40), st.integers(1, 50))
    def test_matches_a_stable_descending_sort(self, x, k):
        """Ranks are logit descending, equal logits by ascending id: a stable sort's first K."""
        top = topk_logprobs(x, k)
        ref = torch.sort(x.float(), dim=-1, descending=True, stable=True)
        kk = min(k, x.shape[-1])
        assert torch.equal(top.ids, ref.indices[..., :kk])
        assert torch.equal(top.logits, ref.values[..., :kk])
        assert torch.equal(top.lse, torch.logsumexp(x.float(), -1))
        assert top.vocab_size == x.shape[-1]

    def test_negative_zero_ties_with_zero(self):
        """-0.0 and +0.0 are the same logit, so they tie and order by id."""
        x = torch.tensor([[[-0.0, 0.0, -1.0]]])
        assert topk_logprobs(x, 2).ids.tolist() == [[[0, 1]]]

    def test_order_keys_are_distinct_and_ordered(self):
        """order_keys sorts by value then by ascending id, across signs and magnitudes."""
        vals = torch.tensor([-3.0, 1e-30, -1e-30, 5.0, 5.0, -0.0, float("3e38")])
        ids = torch.arange(7)
        order = torch.argsort(order_keys(vals, ids), descending=True).tolist()
        assert order == [6, 3, 4, 1, 5, 2, 0]


class TestMergeTopk:
    @given(draft_logits(max_vocab=40), st.integers(1, 45), st.integers(1, 5))
    def test_merged_shards_equal_the_whole(self, x, k, shards):
        """Per-shard top-K with global ids, merged, equals the top-K of the whole vocabulary."""
        vocab = x.shape[-1]
        bounds = torch.linspace(0, vocab, shards + 1).round().long().tolist()
        parts = []
        for lo, hi in itertools.pairwise(bounds):
            if hi > lo:
                p = topk_logprobs(x[..., lo:hi], k)
                parts.append(type(p)(p.logits, p.ids + lo, p.lse, vocab))
        merged, whole = merge_topk(parts, k), topk_logprobs(x, k)
        assert torch.equal(merged.ids, whole.ids) and torch.equal(merged.logits, whole.logits)
        assert torch.allclose(merged.lse, whole.lse, atol=1e-5)

    def test_no_shards_is_an_error(self):
        """Merging nothing raises ValueError."""
        with pytest.raises(ValueError, match="at least one shard"):
            merge_topk([], 4)
