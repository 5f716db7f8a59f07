"""Commit after the walk (ddtree-spec.md §5): what to emit, which KV slots and hidden rows to keep.

The batched helpers return padded [bs, L+1] tensors (NOT_ACCEPTED past tau) and never sync;
``finish_host`` is the one host-side step: it cuts emissions at stop tokens and max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from repro.ddtree.types import NOT_ACCEPTED, DraftTree, WalkResult


def accepted_rows(result: WalkResult, n: int) -> torch.Tensor:
    """[bs, L+1] global verify rows ``b*N + i`` of the accepted path, root first.

    These are the rows to gather target hidden states from for the drafter's next context:
    the rows *at the accepted node indices*, not the first tau rows.
    """
    bs = result.accept_index.shape[0]
    base = torch.arange(bs, device=result.accept_index.device)[:, None] * n
    idx = result.accept_index
    return torch.where(idx == NOT_ACCEPTED, NOT_ACCEPTED, base + idx)


def kv_slots_to_keep(out_cache_loc: torch.Tensor, result: WalkResult, n: int) -> torch.Tensor:
    """[bs, L+1] KV-cache slots of the accepted path in path order (NOT_ACCEPTED padded).

    ``out_cache_loc`` [bs*N] holds the slot each verify row wrote; the kept slots are exactly
    the entries a chain decode of the accepted tokens would have written. Free the others.
    """
    slots = out_cache_loc.reshape(-1, n)
    idx = result.accept_index
    return torch.where(idx == NOT_ACCEPTED, NOT_ACCEPTED, torch.gather(slots, 1, idx.clamp(min=0)))


def emitted_tokens(tree: DraftTree, result: WalkResult) -> torch.Tensor:
    """[bs, L+1] tokens to emit: the accepted drafts, then the bonus; tau of them per request."""
    idx = result.accept_index
    drafts = torch.gather(tree.tokens, 1, idx[:, 1:].clamp(min=0))
    out = torch.cat([drafts, drafts[:, :1]], 1)
    out.scatter_(1, (result.accept_len - 1)[:, None], result.bonus[:, None])
    cols = torch.arange(out.shape[1], device=out.device)
    return torch.where(cols < result.accept_len[:, None], out, NOT_ACCEPTED)


@dataclass(frozen=True)
class Emission:
    """What one request emits this round, after stop tokens and max_new_tokens."""

    tokens: list[int]
    finished: bool  # a stop token was emitted or max_new_tokens reached


def finish_host(
    emitted: torch.Tensor,
    accept_len: torch.Tensor,
    stop_ids: Collection[int],
    remaining: list[int],
) -> list[Emission]:
    """Cut each request's emission at its first stop token (kept) and at ``remaining`` tokens.

    The tree is never pruned at EOS; the cut happens here, after the round. The mask token is
    an ordinary id: a genuine emission of it is kept. Reads the device (``_host``).
    """
    rows, lens = emitted.tolist(), accept_len.tolist()
    out = []
    for row, n, left in zip(rows, lens, remaining, strict=True):
        toks = row[:n]
        stop = next((i for i, t in enumerate(toks) if t in stop_ids), None)
        if stop is not None:
            toks = toks[: stop + 1]
        finished = stop is not None and stop < left
        toks = toks[:left]
        out.append(Emission(toks, finished or len(toks) >= left))
    return out
