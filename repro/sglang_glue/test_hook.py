"""Test-only drafter hook: drafter distributions with a controlled rank for the correct token.

Off by default. The patched DFLASH and DDTREE workers build it only when the environment
variable ``SGLANG_DDTREE_TEST_DRAFTER`` names a JSON file (written by ``repro.testmodels``)::

    {"successor": [V ints], "rank_probs": [p0, p1, ...], "seed": 0}

``successor[t]`` is the planted target's greedy next token after ``t`` (its greedy continuation
of a root ``r`` is ``succ(r), succ(succ(r)), ...``). At depth d the hook's drafter row ranks the
correct token ``succ^d(root)`` at rank ``j`` with probability ``p_j`` (absent with the rest),
fills the other ranks with decoys, and gives rank ``j`` the logit ``-j`` (everything else -30).
The rank is a deterministic hash of (seed, root, prefix length, depth): identical on every TP
rank, with no generator state. DFLASH proposes the argmax (rank 0), DDTREE builds its tree from
the same rows, so side branches really get accepted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

ENV_VAR = "SGLANG_DDTREE_TEST_DRAFTER"
OFF_LOGIT = -30.0
_MASK24 = (1 << 24) - 1


@dataclass(frozen=True)
class DrafterTestHook:
    """Controlled drafter rows [bs, L, V] for the planted target (see module docstring)."""

    successor: torch.Tensor  # [V] int64
    rank_cdf: torch.Tensor  # [R] float64, cumulative rank probabilities
    seed: int
    horizon: int

    @classmethod
    def from_env(cls, *, horizon: int, vocab_size: int, device: torch.device | str) -> DrafterTestHook:
        """Load the hook named by ``SGLANG_DDTREE_TEST_DRAFTER``; ValueError if it is malformed."""
        return cls.from_file(Path(os.environ[ENV_VAR]), horizon=horizon, vocab_size=vocab_size, device=device)

    @classmethod
    def from_file(
        cls, path: Path, *, horizon: int, vocab_size: int, device: torch.device | str
    ) -> DrafterTestHook:
        """Load a hook file; one ValueError naming the field for each malformed entry."""
        spec = json.loads(Path(path).read_text())
        succ = spec.get("successor")
        if not isinstance(succ, list) or len(succ) != vocab_size:
            got = len(succ) if isinstance(succ, list) else type(succ).__name__
            msg = f"{path}: 'successor' must list {vocab_size} token ids (got {got})"
            raise ValueError(msg)
        probs = spec.get("rank_probs")
        if not probs or any(p < 0 for p in probs) or sum(probs) > 1 + 1e-9:
            msg = f"{path}: 'rank_probs' must be non-negative and sum to <= 1 (got {probs})"
            raise ValueError(msg)
        if len(probs) + 1 >= vocab_size:
            msg = f"{path}: 'rank_probs' needs fewer than {vocab_size - 1} entries (got {len(probs)})"
            raise ValueError(msg)
        return cls(
            successor=torch.tensor(succ, dtype=torch.int64, device=device),
            rank_cdf=torch.tensor(probs, dtype=torch.float64, device=device).cumsum(0),
            seed=int(spec.get("seed", 0)),
            horizon=horizon,
        )

    def correct_tokens(self, roots: torch.Tensor) -> torch.Tensor:
        """[bs, L] the planted target's greedy continuation of each root."""
        out, cur = [], roots.to(torch.int64)
        for _ in range(self.horizon):
            cur = self.successor[cur]
            out.append(cur)
        return torch.stack(out, 1)

    def ranks(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L] rank of the correct token at each depth; R (= len(rank_probs)) means absent."""
        depth = torch.arange(1, self.horizon + 1, device=roots.device, dtype=torch.int64)
        h = roots.to(torch.int64)[:, None] * 1_000_003 + prefix_lens.to(torch.int64)[:, None] * 7_919
        h = h + depth * 104_729 + self.seed * 15_485_863
        for mult in (0x45D9F3B, 0x2C1B3C6D):  # integer mixing (wraps mod 2^64, deterministic)
            h = (h ^ (h >> 16)) * mult
        u = ((h >> 20) & _MASK24).double() / float(1 << 24)
        return (u[..., None] >= self.rank_cdf).sum(-1)

    def logits(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L, V] float32 drafter logits for roots [bs] at committed lengths [bs]."""
        vocab = self.successor.shape[0]
        n_ranks = self.rank_cdf.shape[0]
        correct = self.correct_tokens(roots)  # [bs, L]
        rank = self.ranks(roots, prefix_lens)  # [bs, L]
        j = torch.arange(n_ranks, device=roots.device)
        decoys = (correct[..., None] + 1 + j) % vocab  # [bs, L, R], never the correct token
        tokens = torch.where(j == rank[..., None], correct[..., None], decoys)
        out = torch.full((*correct.shape, vocab), OFF_LOGIT, dtype=torch.float32, device=roots.device)
        out.scatter_(2, tokens, (-j.float()).expand_as(tokens).contiguous())
        return out

    def rows(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """The drafter rows [bs, L, V] the round's tail takes (``logits``)."""
        return self.logits(roots, prefix_lens)

    def top1(self, roots: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[bs, L] int64 each row's argmax: the correct token where its rank is 0, else rank 0's decoy."""
        correct = self.correct_tokens(roots)
        decoy = (correct + 1) % self.successor.shape[0]
        best = torch.where(self.ranks(roots, prefix_lens) == 0, correct, decoy)
        return best if out is None else out.copy_(best)
