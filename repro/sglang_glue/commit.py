"""Commit side: verify KV slots of a request window and the accepted path's bookkeeping.

SGLang's overlap-capable DFlash worker over-allocates each request's ``req_to_token`` row ahead
of time; the verify forward writes node ``i`` of request ``b`` to slot ``window[b, i]`` =
``req_to_token[req_b, prefix_b + i]``. Committing a tree keeps the accepted path's entries
(ddtree-spec.md §5). Instead of copying KV data we reorder the window's slots so the accepted
nodes' slots come first, in path order: positions ``prefix .. prefix + tau - 1`` then point at
exactly the KV a chain decode would have written, the other slots stay allocated past the
committed length (reused next round), and the same holds for every KV pool that shares the
row (target, drafter, MLA or MHA) without touching their buffers.
"""

from __future__ import annotations

import torch

from repro.ddtree import NOT_ACCEPTED, WalkResult, accepted_rows


def window_slots(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, n: int
) -> torch.Tensor:
    """[bs, n] slots ``req_to_token[req, prefix + j]`` for j < n: where verify row j writes KV."""
    cols = prefix_lens.to(torch.int64)[:, None] + torch.arange(n, device=prefix_lens.device)
    return req_to_token[req_pool_indices.to(torch.int64)[:, None], cols].to(torch.int64)


def commit_order(result: WalkResult, n: int) -> torch.Tensor:
    """[bs, n] a permutation of the node ids: the accepted path in path order, then the rest.

    Stable and sync-free: node ``i`` gets sort key ``k`` if it is the k-th node of the path,
    else ``n + i``.
    """
    idx = result.accept_index
    bs, width = idx.shape
    dev = idx.device
    key = torch.arange(n, device=dev).expand(bs, n) + n
    key = torch.cat([key, key.new_zeros(bs, 1)], 1)  # column n absorbs the padding
    target_col = torch.where(idx == NOT_ACCEPTED, n, idx)
    key.scatter_(1, target_col, torch.arange(width, device=dev).expand(bs, width).contiguous())
    return torch.argsort(key[:, :n], dim=1, stable=True)


def commit_window(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    slots: torch.Tensor,
    order: torch.Tensor,
) -> torch.Tensor:
    """Rewrite each request's window with ``slots`` reordered by ``order``; return the new [bs, n].

    In place on ``req_to_token``; the set of slots in each window is unchanged.
    """
    _, n = slots.shape
    new = torch.gather(slots, 1, order)
    cols = prefix_lens.to(torch.int64)[:, None] + torch.arange(n, device=slots.device)
    req_to_token[req_pool_indices.to(torch.int64)[:, None], cols] = new.to(req_to_token.dtype)
    return new


def path_hidden(hidden: torch.Tensor, result: WalkResult, n: int, width: int) -> torch.Tensor:
    """[bs * width, H] target hidden states at the accepted nodes in path order.

    ``hidden`` is the verify forward's [bs * n, H]; rows past tau repeat the request's root row
    (the caller writes only the first tau rows of each request).
    """
    rows = accepted_rows(result, n)[:, :width]
    root = torch.arange(rows.shape[0], device=rows.device)[:, None] * n
    rows = torch.where(rows == NOT_ACCEPTED, root, rows)
    return hidden.index_select(0, rows.reshape(-1))


def path_tokens(emitted: torch.Tensor, width: int) -> torch.Tensor:
    """[bs, width] emitted tokens (accepted drafts then bonus) with padding replaced by 0."""
    out = emitted[:, :width]
    return torch.where(out == NOT_ACCEPTED, 0, out)
