"""Tests for `repro.sglang_glue.test_hook`: the controlled drafter distributions."""

from __future__ import annotations

import json

import pytest
import torch

from repro.sglang_glue.test_hook import DrafterTestHook

V = 64


def _hook(tmp_path, probs=(0.5, 0.3, 0.1), horizon=6):
    succ = [(5 * t + 3) % V for t in range(V)]
    path = tmp_path / "hook.json"
    path.write_text(json.dumps({"successor": succ, "rank_probs": list(probs), "seed": 3}))
    return DrafterTestHook.from_file(path, horizon=horizon, vocab_size=V, device="cpu"), succ


class TestDrafterTestHook:
    def test_correct_token_sits_at_the_drawn_rank(self, tmp_path):
        """At every depth the planted continuation has the rank the hook drew (absent at R)."""
        hook, succ = _hook(tmp_path)
        roots, prefix = torch.arange(20) % V, torch.arange(20) * 3
        logits = hook.logits(roots, prefix)
        ranks = hook.ranks(roots, prefix)
        order = torch.argsort(logits, dim=-1, descending=True, stable=True)
        for b in range(20):
            tok = int(roots[b])
            for d in range(hook.horizon):
                tok = succ[tok]
                r = int(ranks[b, d])
                if r < 3:
                    assert int(order[b, d, r]) == tok
                    assert float(logits[b, d, tok]) == -r
                else:
                    assert float(logits[b, d, tok]) == -30.0

    def test_rank_frequencies_follow_rank_probs(self, tmp_path):
        """Over many (root, prefix) pairs the drawn ranks match rank_probs within 2%."""
        hook, _ = _hook(tmp_path, probs=(0.6, 0.25, 0.1))
        n = 20000
        ranks = hook.ranks(torch.arange(n) % V, torch.arange(n))
        freq = torch.bincount(ranks.flatten(), minlength=4).double() / ranks.numel()
        assert torch.allclose(freq, torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64), atol=0.02)

    def test_draws_are_deterministic(self, tmp_path):
        """The same (root, prefix) always gets the same rows: identical on every TP rank."""
        hook, _ = _hook(tmp_path)
        a = hook.logits(torch.tensor([1, 2]), torch.tensor([7, 9]))
        assert torch.equal(a, hook.logits(torch.tensor([1, 2]), torch.tensor([7, 9])))

    def test_rejects_a_wrong_size_successor_table(self, tmp_path):
        """A successor table of the wrong length is one ValueError naming the field."""
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"successor": [0, 1], "rank_probs": [0.5]}))
        with pytest.raises(ValueError, match="'successor' must list 64 token ids"):
            DrafterTestHook.from_file(path, horizon=3, vocab_size=V, device="cpu")

    def test_rejects_rank_probs_above_one(self, tmp_path):
        """rank_probs summing past 1 is one ValueError naming the field."""
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"successor": list(range(V)), "rank_probs": [0.8, 0.5]}))
        with pytest.raises(ValueError, match="'rank_probs' must be non-negative and sum to <= 1"):
            DrafterTestHook.from_file(path, horizon=3, vocab_size=V, device="cpu")
