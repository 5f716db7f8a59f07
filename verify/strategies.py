"""Hypothesis strategies for DDTree inputs: drafter logits with forced ties, peaked, flat and
certain rows, and budgets from 0 past the vocabulary size."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

FAMILIES = ("ties", "peaked", "flat", "random", "certain", "float")


@st.composite
def draft_logits(draw, max_bs: int = 3, max_horizon: int = 6, max_vocab: int = 24) -> torch.Tensor:
    """A [bs, L, V] float32 tensor from one of the families; small values make ties likely."""
    bs = draw(st.integers(1, max_bs))
    horizon = draw(st.integers(1, max_horizon))
    vocab = draw(st.integers(1, max_vocab))
    family = draw(st.sampled_from(FAMILIES))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shape = (bs, horizon, vocab)
    if family == "ties":
        return torch.randint(-2, 3, shape, generator=g).float()
    if family == "flat":
        return torch.zeros(shape)
    if family == "peaked":
        hot = torch.randint(0, vocab, shape[:2], generator=g)
        x = torch.round(torch.randn(shape, generator=g) * 4) / 4
        return x.scatter_add(2, hot[..., None], torch.full((*shape[:2], 1), 6.0))
    if family == "certain":
        x = torch.randint(-1, 2, shape, generator=g).float()
        rows = torch.rand(shape[:2], generator=g) < 0.5
        return torch.where(rows[..., None] & (torch.arange(vocab) == 0), 150.0, x)
    if family == "float":
        return torch.randn(shape, generator=g) * 2
    return torch.round(torch.randn(shape, generator=g) * 8) / 8


@st.composite
def logits_and_budget(draw, **kwargs) -> tuple[torch.Tensor, int]:
    """Drafter logits and a budget in 0..2V+2 (past V exercises padding and K = V)."""
    x = draw(draft_logits(**kwargs))
    return x, draw(st.integers(0, 2 * x.shape[-1] + 2))
