"""``enum_kernel`` of ``repro.kernels.tree_build``: a request's tree by enumeration above a floor,
with no per-depth sort (imported lazily: needs triton). Depth 1 and the finalists are here, each
later depth is ``_tree_enum_depth_triton.enum_depth``."""

import triton
import triton.language as tl

from repro.kernels._common_triton import INT64_MAX, best, rank_code
from repro.kernels._tree_enum_depth_triton import DEPTH, LEX, PARENT, RANK, SCORE, enum_depth, hist_floor, score_bins


@triton.jit
def _finalists(pool_cols, finalist_ptr, tree_slot_ptr, b, pool, q, n_pool, floor, CH: tl.constexpr, LOG_F: tl.constexpr):
    """List (up to 2 * FP) the kept nodes at or above the final floor and clear their tree slots;
    return how many there are."""
    n_final: tl.constexpr = 2 << LOG_F
    cnt = n_pool * 0
    for u0 in range(0, n_pool, CH):
        u = u0 + q
        m = u < n_pool
        keep = m & (tl.load(pool_cols[SCORE] + pool + u, mask=m, other=float("-inf")) >= floor)
        at = cnt + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(finalist_ptr + b * n_final + at, u, mask=keep & (at < n_final))
        tl.store(tree_slot_ptr + pool + u, tl.zeros([CH], tl.int32), mask=m)
        cnt += tl.sum(keep.to(tl.int32), 0)
    return cnt


@triton.jit
def _write_tree(pool_cols, finalist_ptr, tree_slot_ptr, ids_ptr, roots_ptr, tokens_ptr, parents_ptr, depths_ptr,
                scores_ptr, nodes_ptr, b, pool, cnt, KT, L, B, LOG_F: tl.constexpr):
    """Sort the ``cnt`` finalists once; the best B are request b's tree, parents through the
    pool's tree slots (``tree_slot_ptr``: pool index -> tree position, 0 if not in the tree)."""
    n_final: tl.constexpr = 2 << LOG_F
    w = tl.arange(0, n_final)
    u = tl.load(finalist_ptr + b * n_final + w, mask=w < cnt, other=0)
    score = tl.load(pool_cols[SCORE] + pool + u, mask=w < cnt, other=float("-inf"))
    lex = tl.load(pool_cols[LEX] + pool + u, mask=w < cnt, other=INT64_MAX)
    score, lex, u = best(score, lex, u, LOG_F + 1, LOG_F)
    f = tl.arange(0, 1 << LOG_F)
    chosen = f < B
    tl.store(tree_slot_ptr + pool + u, f + 1, mask=chosen)
    tl.debug_barrier()
    depth = tl.load(pool_cols[DEPTH] + pool + u, mask=chosen, other=1)
    rank = tl.load(pool_cols[RANK] + pool + u, mask=chosen, other=0)
    up = tl.load(pool_cols[PARENT] + pool + u, mask=chosen, other=0)
    parent = tl.load(tree_slot_ptr + pool + up, mask=chosen & (depth > 1), other=0)
    token = tl.load(ids_ptr + b * L * KT + (depth - 1) * KT + rank, mask=chosen, other=-1)
    col = b * (B + 1) + 1 + f
    tl.store(tokens_ptr + col, token, mask=chosen)
    tl.store(parents_ptr + col, parent.to(tl.int64), mask=chosen)
    tl.store(depths_ptr + col, depth.to(tl.int64), mask=chosen)
    tl.store(scores_ptr + col, score, mask=chosen)
    tl.store(tokens_ptr + b * (B + 1), tl.load(roots_ptr + b))
    tl.store(parents_ptr + b * (B + 1), -1)
    tl.store(depths_ptr + b * (B + 1), 0)
    tl.store(scores_ptr + b * (B + 1), 0.0)
    tl.store(nodes_ptr + b, B + 1)


@triton.jit
def enum_kernel(
    logits_ptr, ids_ptr, lse_ptr, roots_ptr,
    node_logit_sum_ptr, node_score_ptr, node_lex_ptr, node_bits_ptr, node_prod_ptr, node_rank_ptr, node_parent_ptr,
    node_depth_ptr, child_offset_ptr, finalist_ptr, tree_slot_ptr, score_hist_ptr, handoff_ptr,
    tokens_ptr, parents_ptr, depths_ptr, scores_ptr, nodes_ptr,
    KT, L, KB, D, B,
    CH: tl.constexpr, CAP: tl.constexpr, LOG_F: tl.constexpr, NB: tl.constexpr,
    SEARCH_K: tl.constexpr, W: tl.constexpr, SEARCH_W: tl.constexpr,
):
    """One request's tree by enumeration above a floor: no per-depth sort (needs KB = B).

    The tree is the best B of all nodes whose rank product is at most B (tree.py). A floor F,
    always below the B-th best score so far (a histogram of every node kept, binned over
    [1.0625 * theta_1, 0] where theta_1 is depth 1's B-th score), bounds the search: a node is
    kept if it scores at least F, and a parent's kept children are a prefix of its ranks (the
    logits are sorted), found by binary search; a prefix sum lays them out. Kept nodes go to a
    pool of CAP entries (the ``node_*`` columns); at the end the nodes at or above the final floor
    (at least B) are sorted once. A pool past CAP or more than 2 * FP finalists (ties) sets
    ``handoff_ptr[b]`` and leaves the request to ``tree_kernel``.

    Two paths per depth. Wide: parents and children go through the pool and registers CH at a
    time. Narrow (at most W parents, children and kept ranks: one warp, the confident drafter's
    deep depths): parents stay in registers from the depth before and every step is a warp
    shuffle, with no barrier and no read of global memory. The next depth's lse and logits load
    while a depth runs. F is re-read only after B / 8 new nodes (and once at the end): a stale F
    is lower, so it only keeps more nodes and stays exact.
    """
    b = tl.program_id(0)
    lrow = logits_ptr + b * L * KT
    pool = b * CAP
    q = tl.arange(0, CH)
    kr = tl.arange(0, CH // 2)  # ranks: KB <= CH // 2
    lane = tl.arange(0, W)
    pool_cols = (node_logit_sum_ptr, node_score_ptr, node_lex_ptr, node_bits_ptr, node_prod_ptr, node_rank_ptr,
                 node_parent_ptr, node_depth_ptr)

    nxt = D > 1  # depth 2's lse and logits load while depth 1 runs
    lse_n = tl.load(lse_ptr + b * L + 1, mask=nxt, other=0.0)
    xrow_n = tl.load(lrow + KT + kr, mask=(kr < KB) & nxt, other=0.0)
    xw_n = tl.load(lrow + KT + lane, mask=(lane < KB) & nxt, other=0.0)
    ok = q < KB  # depth 1: every rank
    c = tl.load(lse_ptr + b * L).to(tl.float64)
    x = tl.load(lrow + q, mask=ok, other=0.0).to(tl.float64)
    code, bits = rank_code(q.to(tl.int64) + 1)
    tl.store(node_logit_sum_ptr + pool + q, x, mask=ok)
    tl.store(node_score_ptr + pool + q, x - c, mask=ok)
    tl.store(node_lex_ptr + pool + q, code << (63 - bits), mask=ok)
    tl.store(node_bits_ptr + pool + q, bits.to(tl.int32), mask=ok)
    tl.store(node_prod_ptr + pool + q, q + 1, mask=ok)
    tl.store(node_rank_ptr + pool + q, q, mask=ok)
    tl.store(node_parent_ptr + pool + q, tl.full([CH], -1, tl.int32), mask=ok)
    tl.store(node_depth_ptr + pool + q, tl.full([CH], 1, tl.int32), mask=ok)
    theta = tl.load(lrow + B - 1).to(tl.float64) - c  # depth 1's B-th score
    span = tl.maximum(-theta, 1e-6) * 1.0625
    inv_w = NB / span
    # the histogram lives in global memory: relaxed atomics, then an L2 read after a barrier
    # (tl.histogram's shared-memory atomics took half the kernel's time on the H200). A read that
    # races later atomics still counts real nodes only, so any F read off it is valid.
    hist_row = score_hist_ptr + b * NB
    nb = tl.arange(0, NB)
    tl.store(hist_row + nb, tl.zeros([NB], tl.int32))
    tl.debug_barrier()
    tl.atomic_add(hist_row + score_bins(x - c, inv_w, NB), 1, mask=ok, sem="relaxed")
    tl.debug_barrier()
    floor = hist_floor(tl.load(hist_row + nb, cache_modifier=".cg"), B, span, c, NB)
    n_pool, par0 = KB, KB * 0  # nodes in the pool; the first parent of the depth
    over = (theta == float("-inf")).to(tl.int32)  # fewer than B finite logits: the frontier kernel's case
    npar = tl.where(over == 0, n_pool, 0)
    # since: nodes kept since F was read (when 0, a barrier followed every write to the pool and
    # offsets); resident: 1 when the narrow tile (rx, rp, rl, rb: the parents' logit sums, rank
    # products, codes and code bits) holds this depth's parents
    since, resident = n_pool * 0, n_pool * 0
    rx, rp, rl, rb = tl.zeros([W], tl.float64), tl.full([W], 1, tl.int32), tl.zeros([W], tl.int64), tl.zeros([W], tl.int32)
    for d in range(1, D):
        if npar > 0:
            (nxt, lse_n, xrow_n, xw_n, c, code, floor, n_pool, par0, over, npar, since, resident,
             rx, rp, rl, rb) = enum_depth(
                pool_cols, child_offset_ptr, hist_row, nb, lse_ptr, lrow, b, d, pool, q, kr, lane, span, inv_w, lse_n,
                xrow_n, xw_n, c, code, floor, n_pool, par0, over, npar, since, resident, rx, rp, rl, rb, KT, L, KB, D,
                B, CH, CAP, NB, SEARCH_K, W, SEARCH_W)

    # finalists: every kept node at or above the final floor (at least B of them), sorted once
    if since > 0:  # the last nodes kept are not in F yet: a tighter F means fewer finalists
        tl.debug_barrier()
        floor = hist_floor(tl.load(hist_row + nb, cache_modifier=".cg"), B, span, c, NB)
    cnt = _finalists(pool_cols, finalist_ptr, tree_slot_ptr, b, pool, q, n_pool, floor, CH, LOG_F)
    over += (cnt > (2 << LOG_F)).to(tl.int32)
    tl.store(handoff_ptr + b, over)
    if over == 0:
        tl.debug_barrier()
        _write_tree(pool_cols, finalist_ptr, tree_slot_ptr, ids_ptr, roots_ptr, tokens_ptr, parents_ptr, depths_ptr,
                    scores_ptr, nodes_ptr, b, pool, cnt, KT, L, B, LOG_F)
