"""Commit after the walk (docs/SPEC.md §5): what to emit, and which hidden rows feed the drafter.

Both return padded [bs, L+1] tensors (NOT_ACCEPTED past tau) and never sync; ``repro.ddtree.accept``
builds the commit from them (and keeps the path's KV slots). Stop tokens and max_new_tokens are
the engine's: it cuts what a round emits, as it does for any decode step.
"""

from __future__ import annotations

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


def emitted_tokens(tree: DraftTree, result: WalkResult) -> torch.Tensor:
    """[bs, L+1] tokens to emit: the accepted drafts, then the bonus; tau of them per request."""
    idx = result.accept_index
    drafts = torch.gather(tree.tokens, 1, idx[:, 1:].clamp(min=0))
    out = torch.cat([drafts, drafts[:, :1]], 1)
    out.scatter_(1, (result.accept_len - 1)[:, None], result.bonus[:, None])
    cols = torch.arange(out.shape[1], device=out.device)
    return torch.where(cols < result.accept_len[:, None], out, NOT_ACCEPTED)
