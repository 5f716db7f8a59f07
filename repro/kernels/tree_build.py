"""GPU-resident DDTree construction: one Triton program per request builds the whole tree.

``build_trees_fused(topk, budget, root_tokens) -> DraftTree`` returns exactly what
``repro.ddtree.build_trees_from_topk`` returns (same float64 scores, same tie rule, same node
order), in two launches with no host synchronisation (capturable in a CUDA graph at fixed
(bs, B)):

1. ``enum_kernel`` (``_tree_enum_triton``) enumerates, depth by depth, every node scoring above a floor that stays below
   the B-th best score found so far (a running histogram of the kept scores gives it), with no
   per-depth sort: a parent's kept children are a prefix of its ranks, found by binary search.
   The few finalists are sorted once. A depth of at most ``NARROW`` parents and children (a
   confident drafter's deep depths) runs in one warp from registers, with no barrier, and the
   floor is re-read only after B / 8 new nodes (a stale floor is lower: still exact). It needs
   K = B ranks per depth (V >= B); a request whose kept set outgrows its buffers (tie-heavy rows)
   is flagged instead.
2. ``tree_kernel`` (``_tree_frontier_triton``) builds the flagged requests (every request when V < B) by the per-depth
   frontier algorithm of ``repro/ddtree/tree.py``: each depth's best candidates are sorted and
   merged into the best ``B`` so far; candidates below that (less a rounding margin) are dropped.
   Its programs for unflagged requests return at once.

The trees' verify inputs come from one launch each: ``verify_tensors_fused`` (every verify
tensor, ``_verify_tensors_triton``) and ``tree_inputs_fused`` (a serving verify's input ids,
positions and mask blocks, ``_tree_inputs_triton``).

Triton is imported on the first call; ``TRITON_INTERPRET=1`` runs it on CPU.

Sorting uses a bitonic network over (score desc, rank-tuple code asc) pairs carrying a payload
index (``_common_triton``); candidate sets are padded to powers of two with entries that sort last.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from repro.ddtree.tree import check_code_room, check_topk, child_pairs, child_pairs_host, root_column, root_only_tree
from repro.ddtree.types import DraftTree, TopK, VerifyTensors

MAX_BUDGET = 256
"""Largest budget the fused kernel takes: its candidate sort holds next_pow2(B ln B) entries
in registers (2048 at B = 256); larger budgets use ``build_trees_from_topk``."""


VERIFY_ROWS_PER_PROGRAM = 32
"""Verify-tensor rows per program (power of two): a request's rows spread over ceil(N / 32)
programs, so bs 32 at B 256 runs 288 programs, two or three per SM of an H200. Work that every
warp repeats (the ancestor walk of the rows) argues for more rows, balance over SMs for fewer."""

VERIFY_COLUMNS = 32
"""Nodes the verify kernel compares with its rows per step when it looks for first children and
next siblings: 32 keeps each row's minimum inside one warp (no shared-memory reduction)."""


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


_TABLES: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _tables(budget: int, kb: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 (parent slot, rank) pairs for every depth (parents < B), cached per device."""
    key = (budget, kb, str(device))
    if key not in _TABLES:
        slot, rank = child_pairs(budget, kb, budget, device)
        _TABLES[key] = (slot.to(torch.int32), rank.to(torch.int32))
    return _TABLES[key]


def _pairs_host_for(budget: int) -> torch.Tensor:
    """The largest pair table a budget can need (K = B): sizes the candidate sort."""
    return child_pairs_host(budget, budget, budget)[0]


@cache
def _kernel() -> Any:
    from repro.kernels._tree_frontier_triton import tree_kernel

    return tree_kernel


@cache
def _verify_kernel() -> Any:
    from repro.kernels._verify_tensors_triton import verify_kernel

    return verify_kernel


def tree_kernel_constants(budget: int, horizon: int) -> dict[str, int]:
    """The tree kernel's compile-time sizes for a budget >= 1 and horizon L.

    They depend only on next_pow2(B) and next_pow2(min(L, B)): few variants compile.
    """
    fp = max(2, _pow2(budget))  # frontier slots per level (>= B; >= 2: a 1-wide bitonic network does not compile)
    return {
        "FP": fp,
        "LOG_F": fp.bit_length() - 1,
        "LOG_P": max(1, (len(_pairs_host_for(fp)) - 1).bit_length()),
        "LOG_U": max(1, (_pow2(min(horizon, budget)) * fp - 1).bit_length()),
    }


@cache
def _enum_kernel() -> Any:
    from repro.kernels._tree_enum_triton import enum_kernel

    return enum_kernel


ENUM_BINS = 1024
"""Histogram bins of the enumeration floor: the floor sits at most |theta_1| * 1.0625 / 1024 below
the B-th best score (theta_1: depth 1's B-th score), so few nodes are kept that cannot make it."""


NARROW = 32
"""Width of the enumeration kernel's narrow path: one warp, so a depth of at most this many
parents and children runs on warp shuffles alone (a 32-wide tile is replicated across the warps)."""


def enum_kernel_constants(budget: int) -> dict[str, int]:
    """The enumeration kernel's compile-time sizes for a budget in [1, MAX_BUDGET]."""
    fp = max(2, _pow2(budget))
    return {
        "CH": 2 * fp,  # parents or children held in registers at a time
        "CAP": 16 * fp,  # kept nodes of every depth
        "LOG_F": fp.bit_length() - 1,
        "NB": ENUM_BINS,
        "SEARCH_K": budget.bit_length(),  # binary search over ranks [0, B]
        "W": NARROW,
        "SEARCH_W": NARROW.bit_length(),  # binary searches over [0, W]
    }


def build_trees_fused(
    topk: TopK, budget: int, root_tokens: torch.Tensor | None = None, num_warps: int = 8,
    out: DraftTree | None = None,
) -> DraftTree:
    """``build_trees_from_topk`` in two Triton launches (budget <= MAX_BUDGET); same results.

    ``out`` (a tree of preallocated tensors with room for ``bs`` requests, budget >= 1) receives
    the tree; views of its first ``bs`` rows are returned.
    """
    return _build_trees_fused_flagged(topk, budget, root_tokens, num_warps, out)[0]


def _build_trees_fused_flagged(
    topk: TopK, budget: int, root_tokens: torch.Tensor | None = None, num_warps: int = 8,
    out: DraftTree | None = None,
) -> tuple[DraftTree, torch.Tensor | None]:
    """``build_trees_fused`` and which requests the frontier kernel built (``[bs]`` int32,
    non-zero: flagged; None when only the frontier kernel ran, budget 0 or V < B). Tests and
    ``verify/bench/bench_tree.py`` read the flags to see which kernel built a tree."""
    bs, horizon, kb = check_topk(topk, budget)
    kt = topk.ids.shape[-1]
    if budget > MAX_BUDGET:
        msg = f"build_trees_fused takes budget <= {MAX_BUDGET} (got {budget}); use build_trees_from_topk"
        raise ValueError(msg)
    dev = topk.ids.device
    roots = root_column(root_tokens, bs, dev)
    if budget == 0:
        return root_only_tree(roots, horizon, has_root=root_tokens is not None), None
    check_code_room(horizon, budget)
    depth = min(horizon, budget)
    slot, rank = _tables(budget, kb, dev)
    n_pairs = slot.numel()
    sizes = tree_kernel_constants(budget, horizon)
    fp, log_u = sizes["FP"], sizes["LOG_U"]
    f64 = {"dtype": torch.float64, "device": dev}
    i64 = {"dtype": torch.int64, "device": dev}
    i32 = {"dtype": torch.int32, "device": dev}
    scratch = (
        torch.empty(bs * depth * fp, **f64), torch.empty(bs * depth * fp, **f64), torch.empty(bs * depth * fp, **i64),
        torch.empty(bs * depth * fp, **i64), torch.empty(bs * depth * fp, **i64), torch.empty(bs * depth * fp, **i32),
        torch.empty(bs * depth * fp, **i32), torch.empty(bs * (1 << log_u), **i32),
        torch.empty(bs * fp, **f64), torch.empty(bs * fp, **i64), torch.empty(bs * fp, **i32),  # compaction
    )
    n = budget + 1
    if out is None:
        tokens, parents, depths = (torch.empty(bs, n, **i64) for _ in range(3))
        scores = torch.empty(bs, n, **f64)
        nodes = torch.empty(bs, **i64)
    else:
        tokens, parents, depths, scores, nodes = (
            t[:bs] for t in (out.tokens, out.parents, out.depths, out.scores, out.num_nodes))
    logits, ids, lse = topk.logits.contiguous(), topk.ids.contiguous(), topk.lse.contiguous()
    outputs = (tokens, parents, depths, scores, nodes, kt, horizon, kb, depth, budget)
    enum = kb == budget
    if enum:
        flags = torch.empty(bs, **i32)
        e = enum_kernel_constants(budget)
        cap, s = e["CAP"], 2 * fp
        pool = (torch.empty(bs * cap, **f64), torch.empty(bs * cap, **f64), torch.empty(bs * cap, **i64),
                *(torch.empty(bs * cap, **i32) for _ in range(5)))
        _enum_kernel()[(bs,)](
            logits, ids, lse, roots, *pool, torch.empty(bs * cap, **i32), torch.empty(bs * s, **i32),
            torch.empty(bs * cap, **i32), torch.empty(bs * ENUM_BINS, **i32), flags, *outputs, **e,
            num_warps=num_warps,
        )
    else:
        flags = torch.ones(bs, **i32)
    _kernel()[(bs,)](
        logits, ids, lse, roots, slot, rank, n_pairs, *scratch, flags, *outputs, **sizes, num_warps=num_warps,
    )
    tree = DraftTree(tokens, parents, depths, nodes, scores, budget, horizon, root_tokens is not None)
    return tree, flags if enum else None


def verify_kernel_constants(bs: int, budget: int, num_warps: int) -> dict[str, int]:
    """The verify kernel's compile-time sizes (FILL: bytes of one 16-byte store per thread)."""
    return {
        "N": budget + 1,
        "BS_P": min(_pow2(bs), 1024),
        "RB": VERIFY_ROWS_PER_PROGRAM,
        "CW": VERIFY_COLUMNS,
        "FILL": 16 * 32 * num_warps,
    }


def verify_tensors_fused(
    tree: DraftTree, prefix_lens: torch.Tensor, prefix_lens_sum: int, pad_token: int = 0, num_warps: int = 4
) -> VerifyTensors:
    """``repro.ddtree.verify_tensors`` in one Triton launch that writes every byte of every output
    (no memset); same tensors and layouts, and the same contract for ``prefix_lens_sum`` (an upper
    bound leaves a True tail)."""
    if not tree.has_root:
        msg = "verify_tensors needs a tree built with root_tokens (got a tree without roots)"
        raise ValueError(msg)
    bs, n = tree.tokens.shape
    dev = tree.device
    lens = prefix_lens.to(device=dev, dtype=torch.int64).contiguous()
    i64 = {"dtype": torch.int64, "device": dev}
    ids, pos, index, first, sibling = (torch.empty(bs * n, **i64) for _ in range(5))
    anc = torch.empty(bs, n, n, dtype=torch.bool, device=dev)
    full = torch.empty(n * prefix_lens_sum + bs * n * n, dtype=torch.bool, device=dev)
    _verify_kernel()[(bs, -(-n // VERIFY_ROWS_PER_PROGRAM))](
        tree.tokens.contiguous(), tree.parents.contiguous(), tree.depths.contiguous(), lens, bs, prefix_lens_sum,
        min(tree.horizon, tree.budget), pad_token, ids, pos, anc, full, index, first, sibling,
        **verify_kernel_constants(bs, tree.budget, num_warps), num_warps=num_warps,
    )
    view = lambda t: t.view(bs, n)  # noqa: E731
    return VerifyTensors(ids, pos, anc, full, view(index), view(first), view(sibling))


@cache
def _inputs_kernel() -> Any:
    from repro.kernels._tree_inputs_triton import tree_inputs_kernel

    return tree_inputs_kernel


TREE_INPUT_TILE = 4096
"""Mask cells one tree-inputs program holds (rows x next_pow2(N)): N 33 fits a request in one
program, N 257 spreads it over 33."""


def tree_inputs_fused(
    tree: DraftTree,
    prefix_lens: torch.Tensor,
    mask_out: torch.Tensor,
    pad_token: int = 0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``repro.ddtree.tree_inputs`` in one launch: (input_ids, positions) [bs*N] int64 and the
    ancestor blocks written into ``mask_out``; ``out`` gives preallocated (ids, positions) of at
    least bs*N elements (views of the first bs*N are returned)."""
    if not tree.has_root:
        msg = "tree_inputs needs a tree built with root_tokens (got a tree without roots)"
        raise ValueError(msg)
    bs, n = tree.tokens.shape
    dev = tree.device
    if out is None:
        ids, pos = (torch.empty(bs * n, dtype=torch.int64, device=dev) for _ in range(2))
    else:
        ids, pos = (t[: bs * n] for t in out)
    np2 = _pow2(max(2, n))
    rb = max(1, min(64, TREE_INPUT_TILE // np2))
    _inputs_kernel()[(bs, -(-n // rb))](
        tree.tokens, tree.parents, tree.depths, prefix_lens, min(tree.horizon, tree.budget), pad_token,
        ids, pos, mask_out, N=n, NP=np2, RB=rb, CHUNK=64,
    )
    return ids, pos
