"""The tensors DDTree passes between its steps, with their shapes written down.

Shapes: ``bs`` requests, ``L`` draft positions (the horizon, block size - 1), ``V`` vocabulary,
``K`` ranks kept per depth, ``B`` budget (non-root nodes), ``N = B + 1`` verify rows per request.
Node 0 of every tree is the root (the previous round's bonus token); nodes are in best-first pop
order, so ``parents[b, i] < i`` for every real node (docs/SPEC.md §2.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NO_PARENT = -1  # parents[] of the root and of padding rows
NO_TOKEN = -1  # tokens[] of padding rows (and of the root when no root token was given)
NO_CHILD = -1  # retrive_next_token[] of a leaf
NO_SIBLING = -1  # retrive_next_sibling[] of a last child
NOT_ACCEPTED = -1  # accept_index[] / accepted_rows[] padding past tau


@dataclass(frozen=True)
class TopK:
    """The top-K tokens of every drafter row, ordered by logit descending, ties by ascending id.

    log q_d(token) = logits - lse (docs/SPEC.md §2.1). ``ids`` are global vocabulary ids, also
    when the rows came from a vocabulary shard.
    """

    logits: torch.Tensor  # [bs, L, K] float32, non-increasing along K
    ids: torch.Tensor  # [bs, L, K] int64
    lse: torch.Tensor  # [bs, L] float32, logsumexp of the whole row
    vocab_size: int  # V of the full (unsharded) vocabulary

    def __post_init__(self) -> None:
        assert self.logits.shape == self.ids.shape, (self.logits.shape, self.ids.shape)
        assert self.lse.shape == self.logits.shape[:2], (self.lse.shape, self.logits.shape)

    @property
    def k(self) -> int:
        """Ranks kept per depth."""
        return self.logits.shape[-1]


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees, one per request, padded to ``N = budget + 1`` rows."""

    tokens: torch.Tensor  # [bs, N] int64; col 0 = root token (NO_TOKEN if not given)
    parents: torch.Tensor  # [bs, N] int64; NO_PARENT for the root and padding rows
    depths: torch.Tensor  # [bs, N] int64; 0 for the root and padding rows
    num_nodes: torch.Tensor  # [bs] int64; real nodes, root included
    scores: torch.Tensor  # [bs, N] float64; prefix log-probability, root 0, padding -inf
    budget: int  # B, non-root node slots
    horizon: int  # L, the deepest possible depth
    has_root: bool  # whether tokens[:, 0] holds real root tokens

    def __post_init__(self) -> None:
        n = self.budget + 1
        for name in ("tokens", "parents", "depths", "scores"):
            shape = tuple(getattr(self, name).shape)
            assert shape == (self.bs, n), f"{name}: {shape} != {(self.bs, n)}"

    @property
    def bs(self) -> int:
        """Requests in the batch."""
        return self.tokens.shape[0]

    @property
    def n(self) -> int:
        """Verify rows per request, N = B + 1."""
        return self.budget + 1

    @property
    def device(self) -> torch.device:
        """Where every tensor of the tree lives."""
        return self.tokens.device

    @classmethod
    def make_dummy(cls, bs: int, budget: int, horizon: int, device: str = "cpu") -> DraftTree:
        """A valid chain-shaped tree of fixed shape, for warm-up and CUDA-graph capture."""
        n = budget + 1
        idx = torch.arange(n, device=device).expand(bs, n)
        depth = torch.clamp(idx, max=horizon)
        real = idx <= horizon
        return cls(
            tokens=torch.where(real, idx, NO_TOKEN).contiguous(),
            parents=torch.where(real & (idx > 0), idx - 1, NO_PARENT).contiguous(),
            depths=torch.where(real, depth, 0).contiguous(),
            num_nodes=torch.full((bs,), min(n, horizon + 1), device=device),
            scores=torch.where(real, -idx.double(), float("-inf")).contiguous(),
            budget=budget,
            horizon=horizon,
            has_root=True,
        )


@dataclass(frozen=True)
class VerifyTensors:
    """What the target's verify forward consumes, in SGLang's layouts (docs/SPEC.md §3)."""

    input_ids: torch.Tensor  # [bs*N] int64; padding rows carry pad_token
    positions: torch.Tensor  # [bs*N] int64; prefix_len + depth
    ancestor_mask: torch.Tensor  # [bs, N, N] bool; row i sees i and its ancestors
    full_mask: torch.Tensor  # [sum_b N*(S_b+N)] bool; per request [prefix all True | ancestors]
    retrive_index: torch.Tensor  # [bs, N] int64; b*N + i
    retrive_next_token: torch.Tensor  # [bs, N] int64; first child or NO_CHILD
    retrive_next_sibling: torch.Tensor  # [bs, N] int64; next sibling or NO_SIBLING


@dataclass(frozen=True)
class WalkResult:
    """The accepted path of every request (docs/SPEC.md §4)."""

    accept_index: torch.Tensor  # [bs, L+1] int64; node ids root first, NOT_ACCEPTED padded
    accept_len: torch.Tensor  # [bs] int64; tau = accepted drafts + 1
    bonus: torch.Tensor  # [bs] int64; the target's token at the last accepted node
