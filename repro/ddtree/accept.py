"""Accept and commit after the target's verify (docs/SPEC.md §4-5), the reference of one launch.

``accept`` walks every tree with the target's tokens and returns, per request, what an engine
commits: the accepted path, tau, the bonus, the emitted tokens, the verify rows whose hidden
states feed the drafter, the new sequence lengths and, given a KV slot table, the table's
verify window reordered so the accepted path's slots come first. ``repro.kernels.accept`` does
the same in one Triton launch; this is its specification (the tests compare them bit for bit).

The slot table is SGLang's ``req_to_token`` layout: row ``req`` maps positions to KV slots, and
verify row ``i`` of a request with committed length ``s`` wrote slot ``table[req, s + i]``.
Reordering the window ``table[req, s : s + N]`` so that the path's slots come first, in path
order, makes positions ``s .. s + tau - 1`` point at exactly the KV a chain decode would have
written; the other slots stay allocated past the committed length (no copy, nothing freed), for
every KV pool that shares the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.ddtree.commit import accepted_rows, emitted_tokens
from repro.ddtree.types import NOT_ACCEPTED, DraftTree, WalkResult
from repro.ddtree.walk import walk


@dataclass(frozen=True)
class SlotTable:
    """A KV slot table and the row of each request in it (SGLang: req_to_token, req_pool_indices)."""

    table: torch.Tensor  # [rows, max_len] int32 or int64, rewritten in place by ``accept``
    rows: torch.Tensor  # [bs] the table row of each request


@dataclass(frozen=True)
class Accepted:
    """What one round commits, per request; ``W = min(L, B) + 1`` is the widest commit."""

    accept_index: torch.Tensor  # [bs, W] int64 node ids of the path, root first, NOT_ACCEPTED padded
    accept_len: torch.Tensor  # [bs] int32 tau = accepted drafts + 1
    bonus: torch.Tensor  # [bs] int64 the target's token at the last accepted node
    tokens: torch.Tensor  # [bs, W] int64 emitted: accepted drafts then the bonus, 0 past tau
    rows: torch.Tensor  # [bs, W] int64 verify rows b*N + node of the path; past tau the root's row
    positions: torch.Tensor  # [bs, W] int64 prefix + k: the path's positions
    new_seq_lens: torch.Tensor  # [bs] prefix + tau, in prefix_lens' dtype
    path_slots: torch.Tensor | None  # [bs, W] int64 the reordered window's first W slots (None: no table)

    def head(self, bs: int) -> Accepted:
        """The first ``bs`` requests' rows (views of these tensors)."""
        return Accepted(*(None if t is None else t[:bs] for t in (
            self.accept_index, self.accept_len, self.bonus, self.tokens, self.rows, self.positions,
            self.new_seq_lens, self.path_slots)))


def commit_width(tree: DraftTree) -> int:
    """W = min(L, B) + 1: the longest path a tree of this budget and horizon can accept."""
    return min(tree.horizon, tree.budget) + 1


def window_order(result: WalkResult, n: int) -> torch.Tensor:
    """[bs, n] a permutation of the node ids: the accepted path in path order, then the rest.

    Node ``i`` gets sort key ``k`` if it is the k-th node of the path, else ``n + i``.
    """
    idx = result.accept_index
    bs, width = idx.shape
    dev = idx.device
    key = torch.arange(n, device=dev).expand(bs, n) + n
    key = torch.cat([key, key.new_zeros(bs, 1)], 1)  # column n absorbs the padding
    target_col = torch.where(idx == NOT_ACCEPTED, n, idx)
    key.scatter_(1, target_col, torch.arange(width, device=dev).expand(bs, width).contiguous())
    return torch.argsort(key[:, :n], dim=1, stable=True)


def _reorder_window(slots: SlotTable, prefix_lens: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rewrite each request's window ``table[row, prefix : prefix + n]`` in ``order``; return it."""
    n = order.shape[1]
    cols = prefix_lens.to(torch.int64)[:, None] + torch.arange(n, device=order.device)
    rows = slots.rows.to(torch.int64)[:, None]
    new = torch.gather(slots.table[rows, cols], 1, order)
    slots.table[rows, cols] = new
    return new.to(torch.int64)


def accept(
    tree: DraftTree, target_tokens: torch.Tensor, prefix_lens: torch.Tensor, slots: SlotTable | None = None
) -> Accepted:
    """Walk, then everything the commit needs (see ``Accepted``); batched and sync-free.

    ``target_tokens`` [bs, N] is the target's token at every node; ``prefix_lens`` [bs] the
    committed lengths (root excluded). With ``slots`` the verify windows are reordered in place.
    """
    n, width = tree.n, commit_width(tree)
    result = walk(tree, target_tokens)
    index = result.accept_index[:, :width].contiguous()
    tokens = emitted_tokens(tree, result)[:, :width]
    rows = accepted_rows(result, n)[:, :width]
    root_row = torch.arange(tree.bs, device=tree.device)[:, None] * n
    k = torch.arange(width, device=tree.device)
    path_slots = None
    if slots is not None:
        path_slots = _reorder_window(slots, prefix_lens, window_order(result, n))[:, :width].contiguous()
    return Accepted(
        accept_index=index,
        accept_len=result.accept_len.to(torch.int32),
        bonus=result.bonus,
        tokens=torch.where(tokens == NOT_ACCEPTED, 0, tokens),
        rows=torch.where(rows == NOT_ACCEPTED, root_row, rows),
        positions=prefix_lens.to(torch.int64)[:, None] + k,
        new_seq_lens=prefix_lens + result.accept_len.to(prefix_lens.dtype),
        path_slots=path_slots,
    )
