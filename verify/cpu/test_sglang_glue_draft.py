"""Tests for `repro.sglang_glue.draft`: top-K from a vocabulary-parallel LM head."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import topk_logprobs
from repro.sglang_glue.draft import vocab_parallel_topk


def _shards(vocab: int, ranks: int) -> list[tuple[int, int]]:
    """(start, size) of each rank's contiguous vocabulary shard, the last ones possibly smaller."""
    per = -(-vocab // ranks)
    return [(s, min(per, vocab - s)) for s in range(0, vocab, per)]


class TestVocabParallelTopk:
    @given(st.integers(1, 3), st.integers(1, 5), st.integers(2, 40), st.integers(1, 4), st.integers(1, 50), st.integers(0, 9999))
    def test_shards_give_the_full_vocabulary_topk(self, bs, horizon, vocab, ranks, k, seed):
        """Gathering every shard's top-K equals the top-K of the unsharded logits."""
        g = torch.Generator().manual_seed(seed)
        hidden = torch.randn(bs, horizon, 8, generator=g)
        # quantised weights make exact logit ties across shards likely
        weight = torch.round(torch.randn(vocab, 8, generator=g) * 2) / 2
        shards = _shards(vocab, ranks)
        # the reference sees the shards' own float32 logits (a full matmul may round differently)
        full = topk_logprobs(torch.cat([hidden @ weight[s : s + n].T for s, n in shards], -1), k)
        parts = [vocab_parallel_topk(hidden, weight[s : s + n], num_org=n, org_vocab_start=s,
                                     vocab_size=vocab, k=k) for s, n in shards]
        fields = [[p.logits for p in parts], [p.ids for p in parts], [p.lse for p in parts]]
        calls = iter(fields)
        got = vocab_parallel_topk(hidden, weight[: shards[0][1]], num_org=shards[0][1], org_vocab_start=0,
                                  vocab_size=vocab, k=k, all_gather=lambda t: next(calls))
        assert torch.equal(got.ids, full.ids)
        assert torch.equal(got.logits, full.logits)
        torch.testing.assert_close(got.lse, full.lse)
        assert got.vocab_size == vocab

    def test_padding_rows_past_num_org_are_ignored(self):
        """LM-head rows past num_org (vocabulary padding) never become candidates."""
        hidden = torch.ones(1, 2, 4)
        weight = torch.cat([torch.zeros(3, 4), torch.full((2, 4), 9.0)])  # rows 3, 4: padding
        got = vocab_parallel_topk(hidden, weight, num_org=3, org_vocab_start=10, vocab_size=13, k=5)
        assert got.ids.max() < 13 and got.ids.min() >= 10
        assert got.k == 3
