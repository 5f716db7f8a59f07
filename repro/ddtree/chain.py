"""What the DFLASH chain would have accepted on a DDTree round's drafter rows.

DFLASH drafts the rank-0 token of every depth, ``ids[:, d-1, 0]`` of the round's top-K (the
argmax; ties go to the smaller id, as ``torch.argmax`` and docs/SPEC.md §2.1 agree). That chain
is the tree path of rank tuple ``(0, 0, ...)``; the tree holds its first ``in_tree`` nodes. The
target's token at a node depends only on the node's path, so two per-round fields decide, or
bound, the chain's acceptance (the rule is ``repro.tuning.acceptance.chain_tau``):

- ``rank0[b, d-1]``: the accepted path's node at depth ``d`` holds that depth's rank-0 token
  (False past the path's end). The leading run of True is where the path follows the chain.
- ``in_tree[b]``: how many depths of the all-rank-0 chain the tree contains (0..min(L, B)).

A node is on the chain iff its token is its depth's rank-0 token and its parent is on the chain
(the root is): top-K ids are distinct within a depth, so the token fixes the rank. A kernel
computes the same in one pass over the nodes, since ``parents[i] < i`` (§2.4)::

    on_chain[0] = 1
    on_chain[i] = tokens[i] == rank0_ids[depths[i] - 1] and on_chain[parents[i]]    (i >= 1, real)
    in_tree     = sum(on_chain[1:])
    rank0[d-1]  = tokens[accept_index[d]] == rank0_ids[d - 1]          (1 <= d < accept_len)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.ddtree.types import NO_PARENT, NOT_ACCEPTED, DraftTree, WalkResult


@dataclass(frozen=True)
class ChainFields:
    """Per request, what the round says about the rank-0 chain (module docstring)."""

    rank0: torch.Tensor  # [bs, L] bool; accepted node at depth d+1 holds depth d+1's rank-0 token
    in_tree: torch.Tensor  # [bs] int64; depths of the all-rank-0 chain present in the tree


def chain_fields(tree: DraftTree, rank0_ids: torch.Tensor, result: WalkResult) -> ChainFields:
    """The chain fields of a batch; batched, sync-free.

    ``rank0_ids`` [bs, L] int64 is the rank-0 token of every depth (``TopK.ids[:, :, 0]``);
    ``result`` is the walk of ``tree``.
    """
    horizon = tree.horizon
    if rank0_ids.shape != (tree.bs, horizon):
        msg = f"rank0_ids must have shape [bs, L] = {(tree.bs, horizon)} (got {tuple(rank0_ids.shape)})"
        raise ValueError(msg)
    first = rank0_ids.to(tree.tokens)
    real = tree.parents != NO_PARENT
    depth_first = torch.gather(first, 1, (tree.depths - 1).clamp(min=0))  # [bs, N]
    is_rank0 = real & (tree.tokens == depth_first)
    parent = tree.parents.clamp(min=0)
    on_chain = is_rank0.clone()
    on_chain[:, 0] = True
    for _ in range(min(horizon, tree.budget)):  # the chain is at most min(L, B) nodes deep
        on_chain = on_chain & torch.gather(on_chain, 1, parent)
        on_chain[:, 0] = True
    in_tree = (on_chain & real).sum(1)

    path = result.accept_index[:, 1:]  # [bs, L] accepted nodes by depth, NOT_ACCEPTED padded
    accepted = path != NOT_ACCEPTED
    rank0 = accepted & torch.gather(is_rank0, 1, path.clamp(min=0))
    return ChainFields(rank0=rank0, in_tree=in_tree)
