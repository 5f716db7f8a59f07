"""The faithful oracle: one request at a time, a best-first heap, plain Python loops.

Imported only by tests and by ``repro golden``; never on a hot path. Each function follows
docs/SPEC.md literally so that the batched code in tree.py / tensors.py / walk.py can be
checked against it.
"""

from __future__ import annotations

import heapq

import torch

from repro.ddtree.types import NO_CHILD, NO_PARENT, NO_SIBLING, NO_TOKEN, DraftTree


def build_tree_reference(draft_logits: torch.Tensor, budget: int, root_token: int | None = None) -> DraftTree:
    """One request's tree from its drafter logits [L, V] by the best-first heap (spec §2).

    Ranks per depth: float32 logit descending, ties by ascending token id (a stable sort).
    """
    x = draft_logits.detach().float().cpu()
    k = min(budget, x.shape[1])
    top = torch.sort(x, dim=-1, descending=True, stable=True)
    lse = torch.logsumexp(x, dim=-1)
    return heap_tree(top.values[:, :k].tolist(), top.indices[:, :k].tolist(), lse.tolist(), budget, root_token)


def heap_tree(
    logits: list[list[float]], ids: list[list[int]], lse: list[float], budget: int, root_token: int | None = None
) -> DraftTree:
    """The best-first heap over per-depth ranked (logit, id) lists [L][K] and each depth's lse.

    Score of a prefix: float64 sum of its logits minus the float64 sum of the depths' lse.
    """
    horizon, k = len(logits), min(budget, len(logits[0]))
    lse_cum = [lse[0]]
    for d in range(1, horizon):
        lse_cum.append(lse_cum[-1] + lse[d])
    tokens, parents, depths, scores = [NO_TOKEN if root_token is None else root_token], [NO_PARENT], [0], [0.0]
    # heap entry: (-score, rank tuple, parent node, depth, rank, sum of logits along the path)
    heap = [(-(logits[0][0] - lse_cum[0]), (0,), 0, 1, 0, logits[0][0])] if budget > 0 else []
    parent_sum = {0: 0.0}
    while heap and len(tokens) <= budget:
        neg, ranks, parent, depth, rank, path_sum = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        scores.append(-neg)
        parent_sum[node] = path_sum
        if rank + 1 < k:  # next sibling: same parent, next rank at this depth
            s = parent_sum[parent] + logits[depth - 1][rank + 1]
            heapq.heappush(heap, (-(s - lse_cum[depth - 1]), (*ranks[:-1], rank + 1), parent, depth, rank + 1, s))
        if depth < horizon:  # first child: best rank one depth down
            s = path_sum + logits[depth][0]
            heapq.heappush(heap, (-(s - lse_cum[depth]), (*ranks, 0), node, depth + 1, 0, s))

    pad = budget + 1 - len(tokens)
    as_row = lambda vals, fill, dtype: torch.tensor([vals + [fill] * pad], dtype=dtype)  # noqa: E731
    return DraftTree(
        tokens=as_row(tokens, NO_TOKEN, torch.int64),
        parents=as_row(parents, NO_PARENT, torch.int64),
        depths=as_row(depths, 0, torch.int64),
        num_nodes=torch.tensor([len(tokens)]),
        scores=as_row(scores, float("-inf"), torch.float64),
        budget=budget,
        horizon=horizon,
        has_root=root_token is not None,
    )


def ancestor_mask_reference(parents: list[int]) -> list[list[bool]]:
    """M[i][j] iff j is i or an ancestor of i, by the spec's recurrence (padding sees itself)."""
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        p = parents[i]
        if p != NO_PARENT:
            mask[i][:i] = mask[p][:i]
        mask[i][i] = True
    return mask


def pointers_reference(parents: list[int]) -> tuple[list[int], list[int]]:
    """Left-child / right-sibling pointers with children linked in node order."""
    n = len(parents)
    first_child, next_sibling, last_child = [NO_CHILD] * n, [NO_SIBLING] * n, {}
    for i in range(1, n):
        p = parents[i]
        if p == NO_PARENT:
            continue
        if p in last_child:
            next_sibling[last_child[p]] = i
        else:
            first_child[p] = i
        last_child[p] = i
    return first_child, next_sibling


def walk_reference(tokens: list[int], parents: list[int], target: list[int]) -> tuple[list[int], int]:
    """The spec §4 walk with per-node child maps: (accepted path root first, bonus)."""
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tokens)):
        if parents[i] != NO_PARENT:
            children.setdefault(parents[i], {})[tokens[i]] = i
    path, cur = [0], 0
    while target[cur] in children.get(cur, {}):
        cur = children[cur][target[cur]]
        path.append(cur)
    return path, target[cur]


def full_mask_reference(mask: list[list[bool]], prefix_len: int) -> list[bool]:
    """One request's flattened FULL mask: N rows of [prefix all True | ancestor row]."""
    return [v for row in mask for v in [True] * prefix_len + row]
