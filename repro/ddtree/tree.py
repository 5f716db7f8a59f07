"""Batched DDTree construction: the best ``B`` prefixes over all depths (docs/SPEC.md §2).

Tensor formulation of the reference best-first heap, with no per-request Python loop and no
host synchronisation (every shape depends only on ``bs``, ``L``, ``K`` and ``B``):

1. Depth 1 holds ranks ``0..min(B, K)-1``.
2. Depth ``d`` keeps the best ``B`` children of depth ``d-1``'s kept nodes (the best ``B``
   prefixes of a depth are always children of the best ``B`` of the depth above). A child
   ``(parent position i, token rank r)`` can only make it if ``(i+1)(r+1) <= B``: the ``i+1``
   parents at or before ``i`` each have ``r+1`` children at least as good.
3. The tree is the best ``B`` of the union, ordered best first. Ties between equal scores go to
   the lexicographically smaller rank tuple, a strict prefix first (§2.3).

Rank tuples compare through one int64 per node (``lex_code``): each rank ``r`` is appended as
an order-preserving, prefix-free code of ``r + 1`` and the codes are left-aligned, so integer
order is tuple order with a prefix first. A node can only be in the tree if the product of its
``r_i + 1`` is at most ``B`` (that many nodes of its depth are at least as good), which bounds
the code to ``2L + 2 log2 B`` bits: 50 for L = 15, B = 1024; entries past the bound are pruned.

Scores are ``sum(logit) - sum(lse)`` accumulated in float64 in depth order, which is
``sum_d log q_d`` exactly for the float32 inputs. ``reference.py`` computes the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from repro.ddtree.topk import check_budget, check_draft_logits, topk_logprobs
from repro.ddtree.types import NO_PARENT, NO_TOKEN, DraftTree, TopK

_LAST = torch.iinfo(torch.int64).max  # sort key of invalid entries: after every real one


def build_trees(
    draft_logits: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor | None = None,
    *,
    check_finite: bool = True,
) -> DraftTree:
    """Build one draft tree per request from drafter logits [bs, L, V] (any float dtype/device).

    ``check_finite`` rejects NaN/inf logits with a ValueError at the cost of one host sync;
    hot paths that trust their input pass False.
    """
    if root_tokens is not None and not isinstance(root_tokens, torch.Tensor):
        msg = f"root_tokens must be a torch.Tensor [bs] or None (got {type(root_tokens).__name__})"
        raise TypeError(msg)
    check_draft_logits(draft_logits, check_finite=check_finite)
    check_budget(budget)
    topk = topk_logprobs(draft_logits, max(1, min(budget, draft_logits.shape[-1])))
    return build_trees_from_topk(topk, budget, root_tokens)


def check_topk(topk: TopK, budget: int) -> tuple[int, int, int]:
    """Validate ``budget`` against ``topk``; return (bs, horizon, ranks used per depth).

    Shared with the fused builder (``repro.kernels.tree_build``), which takes the same inputs."""
    check_budget(budget)
    bs, horizon, k = topk.ids.shape
    kb = min(budget, topk.vocab_size)
    if k < kb:
        msg = f"topk must keep K >= min(budget, V) = {kb} ranks per depth (got K={k})"
        raise ValueError(msg)
    return bs, horizon, kb


def build_trees_from_topk(
    topk: TopK, budget: int, root_tokens: torch.Tensor | None = None
) -> DraftTree:
    """Build the trees from per-depth top-K (needs K >= min(budget, V))."""
    bs, horizon, kb = check_topk(topk, budget)
    k = topk.ids.shape[-1]
    roots = root_column(root_tokens, bs, topk.ids.device)
    if budget == 0:
        return root_only_tree(roots, horizon, has_root=root_tokens is not None)

    check_code_room(horizon, budget)
    levels = _frontiers(topk.logits[..., :kb].double(), _lse_cumsum(topk.lse), budget)
    union = _Union.of(levels)
    best = _best_first(union.score, union.lex)[:, :budget]  # [bs, <=B] union indices

    m = union.score.shape[1]
    pos = torch.full((bs, m + 1), -1, dtype=torch.int64, device=roots.device)
    pos.scatter_(1, best, torch.arange(1, best.shape[1] + 1, device=roots.device).expand_as(best))
    pos[:, m] = 0  # the root's slot: parents of depth-1 entries point here
    take = lambda t: torch.gather(t, 1, best)  # noqa: E731
    valid = take(union.valid)
    depth = take(union.depth)
    token = torch.gather(topk.ids.reshape(bs, -1), 1, (depth - 1).clamp(min=0) * k + take(union.rank))
    parent = torch.gather(pos, 1, take(union.parent))

    pad = budget - best.shape[1]
    row = lambda fill, real: _pad(torch.where(valid, real, fill), pad, fill)  # noqa: E731
    return DraftTree(
        tokens=torch.cat([roots[:, None], row(NO_TOKEN, token)], 1),
        parents=torch.cat([roots.new_full((bs, 1), NO_PARENT), row(NO_PARENT, parent)], 1),
        depths=torch.cat([roots.new_zeros((bs, 1)), row(0, depth)], 1),
        num_nodes=1 + valid.sum(1),
        scores=torch.cat(
            [union.score.new_zeros((bs, 1)), row(float("-inf"), take(union.score))], 1
        ),
        budget=budget,
        horizon=horizon,
        has_root=root_tokens is not None,
    )


@dataclass(frozen=True)
class _Level:
    """The kept nodes of one depth, best first. ``slot`` indexes the level above (-1: root)."""

    x: torch.Tensor  # [bs, F] float64, sum of logits along the path
    score: torch.Tensor  # [bs, F] float64, -inf for invalid entries
    lex: torch.Tensor  # [bs, F] int64, left-aligned rank-tuple code; _LAST for invalid entries
    bits: torch.Tensor  # [bs, F] int64, bits of ``lex`` in use
    prod: torch.Tensor  # [bs, F] int64, product of (rank + 1) along the path
    rank: torch.Tensor  # [bs, F] int64, token rank at this depth
    slot: torch.Tensor  # [bs, F] int64, parent's position in the level above
    valid: torch.Tensor  # [bs, F] bool


_CODE_BITS = 63  # int64 without its sign bit: signed order is code order


def _rank_code(n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(code, length) of n = rank + 1 >= 1: '1', m ones, '0', then n's m low bits (m = floor log2 n).

    Order-preserving and prefix-free; the leading '1' puts a prefix before its extensions.
    """
    pow2 = lambda e: torch.bitwise_left_shift(torch.ones_like(n), e)  # noqa: E731
    m = torch.floor(torch.log2(n.double())).long()
    m = m - (pow2(m) > n).long() + (pow2(m + 1) <= n).long()  # exact even if log2 rounds
    code = torch.bitwise_left_shift(pow2(m + 2) - 2, m) | (n - pow2(m))
    return code, 2 * m + 2


def _append(lex: torch.Tensor, bits: torch.Tensor, rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append ``rank`` to left-aligned codes; entries that would overflow are for invalid nodes."""
    code, length = _rank_code(rank + 1)
    used = bits + length
    shift = (_CODE_BITS - used).clamp(min=0)
    return lex | torch.bitwise_left_shift(code, shift), used


def check_code_room(horizon: int, budget: int) -> None:
    """The rank-tuple code of every possible tree node fits in 63 bits."""
    need = 2 * min(horizon, budget) + 2 * (budget.bit_length() - 1)  # sum of floor(log2(r+1)) <= log2 B
    if need > _CODE_BITS:
        msg = f"budget {budget} is too large for horizon {horizon}: tree keys need {need} > 63 bits"
        raise ValueError(msg)


def _frontiers(x: torch.Tensor, lse_cum: torch.Tensor, budget: int) -> list[_Level]:
    """Per-depth best-``B`` frontiers for depths 1..min(L, B)."""
    bs, horizon, kb = x.shape
    dev = x.device
    rank = torch.arange(kb, device=dev).expand(bs, kb)
    lex, bits = _append(torch.zeros_like(rank), torch.zeros_like(rank), rank)
    first = x[:, 0, :]
    levels = [
        _Level(first, first - lse_cum[:, :1], lex, bits, rank + 1, rank, torch.full_like(rank, -1),
               torch.ones_like(rank, dtype=torch.bool))
    ]
    for d in range(1, min(horizon, budget)):
        prev = levels[-1]
        slot, r = child_pairs(prev.x.shape[1], kb, budget, dev)
        cx = prev.x[:, slot] + x[:, d, r]
        prod = prev.prod[:, slot] * (r + 1)
        valid = prev.valid[:, slot] & (prod <= budget)
        lex, bits = _append(prev.lex[:, slot], prev.bits[:, slot], r.expand_as(cx))
        score = torch.where(valid, cx - lse_cum[:, d : d + 1], float("-inf"))
        lex = torch.where(valid, lex, _LAST)
        keep = _best_first(score, lex)[:, :budget]
        cols = [torch.gather(t, 1, keep) for t in (cx, score, lex, bits, prod)]
        levels.append(_Level(*cols, rank=r[keep], slot=slot[keep], valid=torch.gather(valid, 1, keep)))
    return levels


@dataclass(frozen=True)
class _Union:
    """All levels concatenated; ``parent`` indexes the union, ``m`` (one past the end) = root."""

    score: torch.Tensor  # [bs, M] float64
    lex: torch.Tensor  # [bs, M] int64
    rank: torch.Tensor  # [bs, M] int64
    depth: torch.Tensor  # [bs, M] int64
    parent: torch.Tensor  # [bs, M] int64
    valid: torch.Tensor  # [bs, M] bool

    @classmethod
    def of(cls, levels: list[_Level]) -> _Union:
        sizes = [lv.score.shape[1] for lv in levels]
        offsets = [0]
        for s in sizes[:-1]:
            offsets.append(offsets[-1] + s)
        parents = [torch.full_like(levels[0].slot, sum(sizes))]
        parents += [lv.slot + offsets[i] for i, lv in enumerate(levels[1:])]
        cat = lambda name: torch.cat([getattr(lv, name) for lv in levels], 1)  # noqa: E731
        return cls(
            score=cat("score"),
            lex=cat("lex"),
            rank=cat("rank"),
            depth=torch.cat([torch.full_like(lv.rank, d + 1) for d, lv in enumerate(levels)], 1),
            parent=torch.cat(parents, 1),
            valid=cat("valid"),
        )


def _best_first(score: torch.Tensor, tiekey: torch.Tensor) -> torch.Tensor:
    """Indices ordering each row by score descending, then ``tiekey`` ascending."""
    by_tie = torch.argsort(tiekey, dim=1, stable=True)
    by_score = torch.argsort(torch.gather(score, 1, by_tie), dim=1, descending=True, stable=True)
    return torch.gather(by_tie, 1, by_score)


def _lse_cumsum(lse: torch.Tensor) -> torch.Tensor:
    """[bs, L] float64 running sum of per-depth lse, accumulated in depth order like the heap."""
    cols = [lse[:, 0].double()]
    for d in range(1, lse.shape[1]):
        cols.append(cols[-1] + lse[:, d].double())
    return torch.stack(cols, 1)


_CHILD_PAIRS: dict[tuple[int, int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def child_pairs(parents: int, ranks: int, budget: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(parent position, token rank) pairs that can reach the best ``budget``; cached per device.

    The cache is filled on the first (eager) call, so CUDA-graph capture never copies from host.
    """
    key = (parents, ranks, budget, str(device))
    if key not in _CHILD_PAIRS:
        slot, rank = child_pairs_host(parents, ranks, budget)
        _CHILD_PAIRS[key] = (slot.to(device), rank.to(device))
    return _CHILD_PAIRS[key]


@cache
def child_pairs_host(parents: int, ranks: int, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``child_pairs`` on the host: parent ``i`` pairs with ranks ``0 .. min(ranks, budget // (i + 1)) - 1``."""
    slots, rks = [], []
    for i in range(parents):
        n = min(ranks, budget // (i + 1))
        slots.extend([i] * n)
        rks.extend(range(n))
    return torch.tensor(slots, dtype=torch.int64), torch.tensor(rks, dtype=torch.int64)


def root_column(root_tokens: torch.Tensor | None, bs: int, device: torch.device) -> torch.Tensor:
    """The trees' column 0: ``root_tokens`` [bs] as contiguous int64 on ``device`` (NO_TOKEN without them)."""
    if root_tokens is None:
        return torch.full((bs,), NO_TOKEN, dtype=torch.int64, device=device)
    if root_tokens.shape != (bs,):
        msg = f"root_tokens must have shape [bs] = ({bs},) (got {tuple(root_tokens.shape)})"
        raise ValueError(msg)
    return root_tokens.to(device=device, dtype=torch.int64).contiguous()  # kernels index it flat


def root_only_tree(roots: torch.Tensor, horizon: int, *, has_root: bool) -> DraftTree:
    """The budget-0 trees: the root column alone."""
    col = roots[:, None]
    return DraftTree(
        tokens=col.clone(),
        parents=torch.full_like(col, NO_PARENT),
        depths=torch.zeros_like(col),
        num_nodes=torch.ones_like(roots),
        scores=torch.zeros(col.shape, dtype=torch.float64, device=col.device),
        budget=0,
        horizon=horizon,
        has_root=has_root,
    )


def _pad(t: torch.Tensor, n: int, fill: float) -> torch.Tensor:
    if n == 0:
        return t
    return torch.cat([t, t.new_full((t.shape[0], n), fill)], 1)
