"""Tests for `repro.round`: the path choice (REPRO_DDTREE_KERNELS), the draft tail (top-K of
vocabulary shards -> tree -> verify inputs) on both paths, and the round's composition over an
engine; plus the SGLang adapters it is fed by (`repro.sglang_glue.draft`, `.slots`)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.ddtree import build_trees_from_topk, topk_logprobs, tree_inputs, verify_tensors
from repro.round import KERNELS_ENV, AcceptBuffers, DraftBuffers, DraftTail, kernels_mode
from repro.sglang_glue.draft import HeadShard, head_shard, shard_logits
from repro.sglang_glue.slots import window_slots
from verify.kernel_cases import interpret


class TestMode:
    def test_default_is_auto(self, monkeypatch):
        """Without the variable each step chooses per device."""
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        assert kernels_mode() == "auto"

    def test_bad_value_names_the_variable(self, monkeypatch):
        """A typo is one ValueError naming the variable and the choices."""
        monkeypatch.setenv(KERNELS_ENV, "fast")
        with pytest.raises(ValueError, match=r"REPRO_DDTREE_KERNELS must be one of auto, fused, torch \(got 'fast'\)"):
            kernels_mode()


def _shards(vocab: int, ranks: int) -> list[tuple[int, int]]:
    """(start, size) of each rank's contiguous vocabulary shard, the last ones possibly smaller."""
    per = -(-vocab // ranks)
    return [(s, min(per, vocab - s)) for s in range(0, vocab, per)]


class TestDraftTail:
    @pytest.mark.parametrize("mode", ["auto", "torch"])
    def test_cpu_tail_is_the_reference_tree_and_inputs(self, monkeypatch, mode):
        """On CPU the tail gives build_trees_from_topk's tree and verify_tensors' ids, positions
        and FULL-mask blocks (prefix columns left as they were)."""
        monkeypatch.setenv(KERNELS_ENV, mode)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(-2, 3, (3, 5, 40), generator=g).float()
        roots, lens = torch.tensor([3, 4, 9]), torch.tensor([7, 0, 2])
        tail = DraftTail(16, 5, 40)
        mask = torch.full((17 * 9 + 3 * 17 * 17,), 5, dtype=torch.uint8)
        got = tail(x, roots, lens, mask)
        ref = build_trees_from_topk(topk_logprobs(x, 16), 16, roots)
        for name in ("tokens", "parents", "depths", "num_nodes", "scores"):
            assert torch.equal(getattr(got.tree, name), getattr(ref, name)), name
        vt = verify_tensors(ref, lens, 9)
        assert torch.equal(got.input_ids, vt.input_ids) and torch.equal(got.positions, vt.positions)
        written = mask != 5
        assert torch.equal(mask[written].bool(), vt.full_mask[written])
        assert int(written.sum()) == 3 * 17 * 17  # the ancestor blocks, nothing else

    def test_static_buffers_receive_the_outputs(self, monkeypatch):
        """With ``out`` the tail writes its tree and inputs into the preallocated buffers."""
        monkeypatch.setenv(KERNELS_ENV, "torch")
        x = torch.randn(2, 4, 30, generator=torch.Generator().manual_seed(1))
        roots, lens = torch.tensor([1, 2]), torch.tensor([3, 5])
        tail, bufs = DraftTail(8, 4, 30), DraftBuffers.empty(5, 8, 4, "cpu")
        mask = torch.zeros(9 * 8 + 2 * 81, dtype=torch.uint8)
        got = tail(x, roots, lens, mask, out=bufs)
        ref = tail(x, roots, lens, mask.clone())
        assert got.tree.tokens.data_ptr() == bufs.tree.tokens.data_ptr()
        assert got.input_ids.data_ptr() == bufs.input_ids.data_ptr()
        assert torch.equal(got.tree.tokens, ref.tree.tokens) and torch.equal(got.positions, ref.positions)
        again = bufs.drafted(2, mask)
        assert again is bufs.drafted(2, mask)  # the views are made once per batch size
        assert torch.equal(again.tree.tokens, ref.tree.tokens) and torch.equal(again.input_ids, ref.input_ids)

    def test_rank0_out_receives_each_depths_argmax(self, monkeypatch):
        """``rank0_out`` gets the drafter's rank-0 token per depth (what a recording's chain needs)."""
        monkeypatch.setenv(KERNELS_ENV, "torch")
        x = torch.randn(3, 4, 30, generator=torch.Generator().manual_seed(2))
        rank0 = torch.full((5, 4), -1, dtype=torch.int64)
        DraftTail(8, 4, 30)(x, torch.tensor([1, 2, 3]), torch.tensor([3, 5, 7]), torch.zeros(2000, dtype=torch.uint8),
                            rank0_out=rank0)
        assert torch.equal(rank0[:3], x.argmax(-1)) and bool((rank0[3:] == -1).all())

    @given(st.integers(1, 3), st.integers(1, 5), st.integers(2, 40), st.integers(1, 4), st.integers(1, 50),
           st.integers(0, 9999))
    def test_shards_give_the_full_vocabulary_topk(self, bs, horizon, vocab, ranks, k, seed):
        """Every rank's shard top-K, merged through all_gather, equals the unsharded top-K."""
        g = torch.Generator().manual_seed(seed)
        hidden = torch.randn(bs, horizon, 8, generator=g)
        weight = torch.round(torch.randn(vocab, 8, generator=g) * 2) / 2  # exact ties across shards
        shards = [HeadShard(weight[s : s + n], n, s) for s, n in _shards(vocab, ranks)]
        rows = [shard_logits(hidden, sh) for sh in shards]
        full = topk_logprobs(torch.cat(rows, -1), k)
        tail = DraftTail(k, horizon, vocab)
        parts = [tail.topk(r, id_offset=sh.start) for r, sh in zip(rows, shards, strict=True)]
        calls = iter([[p.logits for p in parts], [p.ids for p in parts], [p.lse for p in parts]])
        got = tail.topk(rows[0], id_offset=0, all_gather=lambda t: next(calls))
        want_k = min(k, vocab)
        assert torch.equal(got.ids, full.ids[..., :want_k]) and torch.equal(got.logits, full.logits[..., :want_k])
        torch.testing.assert_close(got.lse, full.lse)
        assert got.vocab_size == vocab

    def test_tree_inputs_are_verify_tensors_subset(self):
        """tree_inputs writes exactly verify_tensors' ancestor blocks into a FULL-layout buffer."""
        g = torch.Generator().manual_seed(2)
        x = torch.randn(2, 3, 12, generator=g) * 2
        tree = build_trees_from_topk(topk_logprobs(x, 6), 6, torch.tensor([0, 1]))
        lens = torch.tensor([4, 1])
        mask = torch.ones(7 * 5 + 2 * 49, dtype=torch.bool)
        ids, pos = tree_inputs(tree, lens, mask)
        vt = verify_tensors(tree, lens, 5)
        assert torch.equal(mask, vt.full_mask) and torch.equal(ids, vt.input_ids) and torch.equal(pos, vt.positions)


class TestAcceptBuffers:
    def test_sets_alternate_and_each_gives_the_views_next_hands_out(self):
        """next(bs) alternates the two sets, one cached view per (set, bs); each(bs) returns those
        same views (what the worker captures its commit graphs on) without taking a turn."""
        buffers = AcceptBuffers(3, 32, 15, device="cpu", seq_dtype=torch.int64, slots=True)
        first, second = buffers.each(2)
        assert first.accept_len.data_ptr() != second.accept_len.data_ptr()
        handed = [buffers.next(2) for _ in range(3)]
        assert [h is w for h, w in zip(handed, (first, second, first), strict=True)] == [True] * 3
        again = buffers.each(2)
        assert again[0] is first and again[1] is second
        assert buffers.next(2) is second  # each() took no turn
        assert first.rows.shape == first.path_slots.shape == (2, 16)
        assert buffers.next(4) is None
        with pytest.raises(ValueError, match="bs 4 exceeds the accept buffers' capacity 3"):
            buffers.each(4)


class TestSglangAdapters:
    def test_head_shard_reads_the_vocab_parallel_indices(self):
        """head_shard takes SGLang's shard_indices; added vocabulary is refused in one line."""
        weight = torch.zeros(6, 4)
        plain = head_shard(SimpleNamespace(weight=weight))
        assert (plain.num_org, plain.start) == (6, 0)
        idx = SimpleNamespace(num_org_elements=5, org_vocab_start_index=10, num_added_elements=0)
        sharded = head_shard(SimpleNamespace(weight=weight, shard_indices=idx))
        assert (sharded.num_org, sharded.start) == (5, 10)
        added = SimpleNamespace(num_org_elements=5, org_vocab_start_index=10, num_added_elements=2)
        with pytest.raises(ValueError, match="added vocabulary"):
            head_shard(SimpleNamespace(weight=weight, shard_indices=added))

    def test_shard_logits_ignore_padding_rows_and_keep_the_dtype(self):
        """Rows past num_org never become logits; the matmul stays in the weight's dtype."""
        weight = torch.cat([torch.ones(3, 4), torch.full((2, 4), 9.0)]).bfloat16()
        got = shard_logits(torch.ones(1, 2, 4), HeadShard(weight, 3, 10))
        assert got.shape == (1, 2, 3) and got.dtype == torch.bfloat16 and (got == 4).all()

    def test_shard_logits_is_one_gemm_of_the_strided_block_rows(self, monkeypatch):
        """The drafter's rows past the root (a strided [bs, L, H] view) reach the head as one 2D
        GEMM of bs * L rows: handed over as 3D they ran as bs batched GEMMs, each reading the
        whole head (4.4 ms a round at bs 16 on the H200); and the logits are those rows'."""
        hidden = torch.randn(3, 16, 8)[:, 1:, :]
        weight = torch.randn(11, 8)
        shapes, matmul = [], torch.matmul
        monkeypatch.setattr(torch, "matmul", lambda a, b: shapes.append(tuple(a.shape)) or matmul(a, b))
        got = shard_logits(hidden, HeadShard(weight, 10, 0))
        assert shapes == [(45, 8)]
        assert got.shape == (3, 15, 10) and torch.allclose(got, hidden @ weight[:10].T, atol=1e-5)

    def test_window_slots_read_the_request_rows(self):
        """window_slots returns req_to_token[req, prefix + j] for j < n, flat, int64."""
        table = torch.arange(40).view(4, 10).int()
        got = window_slots(table, torch.tensor([2, 0]), torch.tensor([3, 5]), 4)
        assert got.dtype == torch.int64 and got.tolist() == [23, 24, 25, 26, 5, 6, 7, 8]
        out = torch.full((12,), -1)
        window_slots(table, torch.tensor([2, 0]), torch.tensor([3, 5]), 4, out=out)
        assert out[:8].tolist() == got.tolist() and out[8:].tolist() == [-1] * 4


SCRIPT = r"""
import torch
from verify.kernel_cases import _fix_interpreter_for_numpy_2_4
_fix_interpreter_for_numpy_2_4()
import os
from repro.round import DraftBuffers, DraftTail
g = torch.Generator().manual_seed(0)
for case in range(8):
    bs, L, V = 1 + case % 3, 1 + case % 5, 20 + 7 * case
    budget = [1, 4, 9, 16][case % 4]
    x = (torch.randn(bs, L, V, generator=g) * 3).to([torch.float32, torch.bfloat16][case % 2])
    roots, lens = torch.randint(0, V, (bs,), generator=g), torch.randint(0, 9, (bs,), generator=g)
    n = budget + 1
    size = n * int(lens.sum()) + bs * n * n
    tail = DraftTail(budget, L, V)
    outs = []
    for mode in ("torch", "fused"):
        os.environ["REPRO_DDTREE_KERNELS"] = mode
        mask = torch.full((size,), 3, dtype=torch.uint8)
        got = tail(x, roots, lens, mask, out=DraftBuffers.empty(bs + 1, budget, L, "cpu"))
        outs.append((got, mask))
    (a, ma), (b, mb) = outs
    for name in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(a.tree, name), getattr(b.tree, name)), (case, name)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.positions, b.positions), case
    assert torch.equal(ma, mb), case
print("fused tail ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_tail_equals_the_torch_tail_under_the_interpreter():
    """REPRO_DDTREE_KERNELS=fused (top-K, tree and inputs kernels, interpreted) equals torch."""
    assert "fused tail ok" in interpret(SCRIPT)
