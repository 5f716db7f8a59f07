"""Verification tensors of a tree in SGLang's layouts (docs/SPEC.md §3, docs/SGLANG-DESIGN.md).

Every function is batched and sync-free; variable-length outputs take their total length from
the caller (SGLang knows ``seq_lens_sum`` on the host), never from a device read.
"""

from __future__ import annotations

import torch

from repro.ddtree.types import NO_CHILD, NO_PARENT, NO_SIBLING, NO_TOKEN, DraftTree, VerifyTensors


def positions(tree: DraftTree, prefix_lens: torch.Tensor) -> torch.Tensor:
    """[bs, N] position ids: committed length (root excluded) + depth; siblings share one."""
    return prefix_lens.to(tree.depths)[:, None] + tree.depths


def ancestor_mask(tree: DraftTree) -> torch.Tensor:
    """[bs, N, N] bool: row i is true at i and at every ancestor of i (padding sees itself)."""
    bs, n = tree.parents.shape
    mask = torch.zeros(bs, n, n + 1, dtype=torch.bool, device=tree.device)  # col n: discard
    rows = torch.arange(n, device=tree.device).expand(bs, n)
    mask.scatter_(2, rows[..., None], True)
    cur = tree.parents
    for _ in range(min(tree.horizon, tree.budget)):  # depth <= min(L, B): that many hops
        up = torch.where(cur == NO_PARENT, n, cur)
        mask.scatter_(2, up[..., None], True)
        cur = torch.where(cur == NO_PARENT, NO_PARENT, torch.gather(tree.parents, 1, cur.clamp(min=0)))
    return mask[..., :n]


def tree_mask_index(prefix_lens: torch.Tensor, n: int) -> torch.Tensor:
    """[bs, N, N] int64 offsets of each request's ancestor block in the flat FULL mask.

    Request b's N rows of ``S_b + N`` columns start after every earlier request's rows; the
    block sits in the last N columns of each row (after the S_b prefix columns).
    """
    lens = prefix_lens.to(torch.int64)
    row_len = lens + n
    start = torch.cumsum(n * row_len, 0) - n * row_len  # first element of each request
    ar = torch.arange(n, device=lens.device)
    return (start + lens)[:, None, None] + ar[None, :, None] * row_len[:, None, None] + ar[None, None, :]


def full_mask(anc: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_sum: int) -> torch.Tensor:
    """Flattened FULL mask [sum_b N*(S_b+N)] bool: per request, N rows of [S_b x True | anc row].

    ``prefix_lens_sum`` sizes the output without a device read. It may be an upper bound of
    ``prefix_lens.sum()`` (an overlap scheduler knows only that much on the host): the requests'
    blocks come first, at the same offsets, and the unused tail is all True.
    """
    bs, n, _ = anc.shape
    out = torch.ones(n * prefix_lens_sum + bs * n * n, dtype=torch.bool, device=anc.device)
    out[tree_mask_index(prefix_lens.to(anc.device), n).reshape(-1)] = anc.reshape(-1)
    return out


def tree_pointers(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's (retrive_index, retrive_next_token, retrive_next_sibling), each [bs, N] int64.

    Children are linked in node order: first child via next_token, the rest via next_sibling.
    """
    bs, n = tree.parents.shape
    dev = tree.device
    nodes = torch.arange(n, device=dev).expand(bs, n)
    real_child = tree.parents != NO_PARENT
    parent_or_discard = torch.where(real_child, tree.parents, n)

    first = torch.full((bs, n + 1), n, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, parent_or_discard, nodes, "amin")
    next_token = torch.where(first[:, :n] == n, NO_CHILD, first[:, :n])

    # siblings sorted by (parent, node): each node's successor in that order, if same parent
    key = parent_or_discard * (n + 1) + nodes
    order = torch.argsort(key, dim=1)
    sorted_parent = torch.gather(parent_or_discard, 1, order)
    succ = torch.cat([order[:, 1:], order.new_full((bs, 1), NO_SIBLING)], 1)
    same = torch.cat([sorted_parent[:, 1:] == sorted_parent[:, :-1], sorted_parent.new_zeros((bs, 1), dtype=torch.bool)], 1)
    succ = torch.where(same & (sorted_parent != n), succ, NO_SIBLING)
    next_sibling = torch.empty_like(succ).scatter_(1, order, succ)

    retrive_index = nodes + torch.arange(bs, device=dev)[:, None] * n
    return retrive_index.contiguous(), next_token, next_sibling


def verify_tensors(
    tree: DraftTree, prefix_lens: torch.Tensor, prefix_lens_sum: int, pad_token: int = 0
) -> VerifyTensors:
    """Everything a verify forward needs, flattened in request order.

    Padding rows carry ``pad_token`` (any valid id: they are never linked, so never accepted).
    """
    if not tree.has_root:
        msg = "verify_tensors needs a tree built with root_tokens (got a tree without roots)"
        raise ValueError(msg)
    anc = ancestor_mask(tree)
    index, next_token, next_sibling = tree_pointers(tree)
    return VerifyTensors(
        input_ids=torch.where(tree.tokens == NO_TOKEN, pad_token, tree.tokens).reshape(-1),
        positions=positions(tree, prefix_lens).reshape(-1),
        ancestor_mask=anc,
        full_mask=full_mask(anc, prefix_lens, prefix_lens_sum),
        retrive_index=index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
    )


def tree_inputs(
    tree: DraftTree, prefix_lens: torch.Tensor, mask_out: torch.Tensor, pad_token: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a serving verify forward reads: (input_ids [bs*N], positions [bs*N]) int64, and each
    request's ancestor block written into ``mask_out`` (a flat FULL mask, any dtype) in place.

    Only the blocks are written: an attention kernel that skips the prefix columns (SGLang's
    triton extend attention does) never reads the rest, so it is left as it was.
    """
    if not tree.has_root:
        msg = "tree_inputs needs a tree built with root_tokens (got a tree without roots)"
        raise ValueError(msg)
    index = tree_mask_index(prefix_lens.to(tree.device), tree.n).reshape(-1)
    mask_out[index] = ancestor_mask(tree).reshape(-1).to(mask_out.dtype)
    ids = torch.where(tree.tokens == NO_TOKEN, pad_token, tree.tokens).reshape(-1)
    return ids, positions(tree, prefix_lens).reshape(-1)
