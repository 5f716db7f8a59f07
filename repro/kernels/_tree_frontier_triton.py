"""``tree_kernel`` of ``repro.kernels.tree_build``: the per-depth frontier algorithm of
``repro/ddtree/tree.py`` for the requests ``enum_kernel`` hands over (imported lazily: needs triton).

Each depth's children come from a static (parent slot, rank) pair table; the best ``FP`` of them
go to the depth's frontier in scratch (``front_*`` columns, ``FP`` slots per depth) and are merged
into the best ``B`` so far.
"""

import triton
import triton.language as tl

from repro.kernels._common_triton import INT64_MAX, best, merge_best, rank_code


@triton.jit
def _prune_below(best_s, q, B, c):
    """Scores below this can never reach the best ``B``: the B-th best of ``best_s`` so far, less a
    margin far above float64 rounding along a path (-inf until ``B`` entries are known)."""
    bth = tl.max(tl.where(q == B - 1, best_s, float("-inf")), 0)
    return bth - 1e-6 * (1.0 + tl.abs(bth) + tl.abs(c))


@triton.jit
def _first_depth(b, lrow, frow, q, lse_ptr, front_logit_sum_ptr, front_score_ptr, front_lex_ptr, front_bits_ptr,
                 front_prod_ptr, front_rank_ptr, front_slot_ptr, L, KB, FP: tl.constexpr):
    """Depth 1 (ranks 0..KB-1, already best first) into its frontier; returns the lse sum so far
    and the best entries (score, code, frontier index) as the running best."""
    ok = q < KB
    c = tl.load(lse_ptr + b * L).to(tl.float64)
    x = tl.load(lrow + q, mask=ok, other=0.0).to(tl.float64)
    code, bits = rank_code(q.to(tl.int64) + 1)
    best_s = tl.where(ok, x - c, float("-inf"))
    best_l = tl.where(ok, code << (63 - bits), INT64_MAX)
    best_i = q
    tl.store(front_logit_sum_ptr + frow + q, x)
    tl.store(front_score_ptr + frow + q, best_s)
    tl.store(front_lex_ptr + frow + q, code << (63 - bits))
    tl.store(front_bits_ptr + frow + q, bits)
    tl.store(front_prod_ptr + frow + q, q.to(tl.int64) + 1)
    tl.store(front_rank_ptr + frow + q, q)
    tl.store(front_slot_ptr + frow + q, tl.full([FP], -1, tl.int32))
    return c, best_s, best_l, best_i


@triton.jit
def _candidates(b, d, lrow, frow, lse_ptr, c, best_s, q, slot, rank, in_p, code, clen, front_logit_sum_ptr,
                front_score_ptr, front_lex_ptr, front_bits_ptr, front_prod_ptr, KT, L, B, FP: tl.constexpr):
    """Depth d's children of every (parent slot, rank) pair: the lse sum so far, then (valid,
    score, code) with invalid and pruned children scored -inf and coded last, and how many are
    valid."""
    c += tl.load(lse_ptr + b * L + d).to(tl.float64)
    floor = _prune_below(best_s, q, B, c)
    prev = frow + (d - 1) * FP + slot
    pscore = tl.load(front_score_ptr + prev)
    prod = tl.load(front_prod_ptr + prev) * (rank.to(tl.int64) + 1)
    cx = tl.load(front_logit_sum_ptr + prev) + tl.load(lrow + d * KT + rank, mask=in_p, other=0.0).to(tl.float64)
    cand_s = cx - c
    valid = in_p & (pscore > float("-inf")) & (prod <= B) & (cand_s >= floor)
    n_valid = tl.sum(valid.to(tl.int32), 0)
    used = tl.load(front_bits_ptr + prev) + clen
    cand_l = tl.load(front_lex_ptr + prev) | (code << tl.maximum(63 - used, 0))
    cand_s = tl.where(valid, cand_s, float("-inf"))
    cand_l = tl.where(valid, cand_l, INT64_MAX)
    return c, valid, cand_s, cand_l, n_valid


@triton.jit
def _best_children(b, valid, cand_s, cand_l, n_valid, p, q, compact_score_ptr, compact_lex_ptr, compact_pair_ptr,
                   FP: tl.constexpr, LOG_F: tl.constexpr, LOG_P: tl.constexpr):
    """The best FP children (score, code, pair index), best first: few survivors are compacted
    (``compact_*`` scratch, FP entries per request) and FP entries sorted, else every pair is."""
    score = tl.full([FP], float("-inf"), tl.float64)
    lex = tl.full([FP], INT64_MAX, tl.int64)
    order = q
    if n_valid <= FP:  # compact the survivors, sort FP entries
        at = tl.cumsum(valid.to(tl.int32), 0) - 1
        tl.store(compact_score_ptr + b * FP + at, cand_s, mask=valid)
        tl.store(compact_lex_ptr + b * FP + at, cand_l, mask=valid)
        tl.store(compact_pair_ptr + b * FP + at, p, mask=valid)
        tl.debug_barrier()
        kept = q < n_valid
        score = tl.load(compact_score_ptr + b * FP + q, mask=kept, other=float("-inf"))
        lex = tl.load(compact_lex_ptr + b * FP + q, mask=kept, other=INT64_MAX)
        order = tl.load(compact_pair_ptr + b * FP + q, mask=kept, other=(1 << LOG_P) - 1)
        score, lex, order = best(score, lex, order, LOG_F, LOG_F)
        tl.debug_barrier()  # the compaction buffer is reused at the next depth
    else:
        score, lex, order = best(cand_s, cand_l, p, LOG_P, LOG_F)
    return score, lex, order


@triton.jit
def _store_frontier(d, lrow, frow, q, score, lex, order, pair_slot_ptr, pair_rank_ptr, n_pairs,
                    front_logit_sum_ptr, front_score_ptr, front_lex_ptr, front_bits_ptr, front_prod_ptr,
                    front_rank_ptr, front_slot_ptr, KT, FP: tl.constexpr):
    """Depth d's frontier: the children of pair indices ``order`` with their (score, code)."""
    s2 = tl.load(pair_slot_ptr + order, mask=order < n_pairs, other=0)
    r2 = tl.load(pair_rank_ptr + order, mask=order < n_pairs, other=0)
    prev2 = frow + (d - 1) * FP + s2
    _c2, l2 = rank_code(r2.to(tl.int64) + 1)
    out = frow + d * FP + q
    tl.store(front_logit_sum_ptr + out, tl.load(front_logit_sum_ptr + prev2) + tl.load(lrow + d * KT + r2).to(tl.float64))
    tl.store(front_score_ptr + out, score)
    tl.store(front_lex_ptr + out, lex)
    tl.store(front_bits_ptr + out, tl.load(front_bits_ptr + prev2) + l2)
    tl.store(front_prod_ptr + out, tl.load(front_prod_ptr + prev2) * (r2.to(tl.int64) + 1))
    tl.store(front_rank_ptr + out, r2)
    tl.store(front_slot_ptr + out, s2)


@triton.jit
def _write_tree(b, best_s, best_i, q, ids_ptr, roots_ptr, frow, front_rank_ptr, front_slot_ptr, tree_slot_ptr,
                tokens_ptr, parents_ptr, depths_ptr, scores_ptr, nodes_ptr, KT, L, D, B,
                FP: tl.constexpr, LOG_U: tl.constexpr):
    """The best B of every depth, best first, as request b's tree; parents through an inverse map
    (``tree_slot_ptr``: frontier index -> tree position, -1 if not in the tree)."""
    score, order = best_s, best_i
    inv = tree_slot_ptr + b * (1 << LOG_U)
    for u0 in range(0, D * FP, FP):
        tl.store(inv + u0 + q, tl.full([FP], -1, tl.int32))
    tl.debug_barrier()
    chosen = (q < B) & (score > float("-inf"))
    tl.store(inv + order, q.to(tl.int32) + 1, mask=chosen)
    tl.debug_barrier()
    level = order // FP
    rank = tl.load(front_rank_ptr + frow + order, mask=chosen, other=0)
    pslot = tl.load(front_slot_ptr + frow + order, mask=chosen, other=0)
    parent = tl.where(level == 0, 0, tl.load(inv + (level - 1) * FP + pslot, mask=chosen & (level > 0), other=0))
    token = tl.load(ids_ptr + b * L * KT + level * KT + rank, mask=chosen, other=-1)
    col = b * (B + 1) + 1 + q
    row_ok = q < B
    tl.store(tokens_ptr + col, tl.where(chosen, token, -1), mask=row_ok)
    tl.store(parents_ptr + col, tl.where(chosen, parent.to(tl.int64), -1), mask=row_ok)
    tl.store(depths_ptr + col, tl.where(chosen, level.to(tl.int64) + 1, 0), mask=row_ok)
    tl.store(scores_ptr + col, tl.where(chosen, score, float("-inf")), mask=row_ok)
    tl.store(tokens_ptr + b * (B + 1), tl.load(roots_ptr + b))
    tl.store(parents_ptr + b * (B + 1), -1)
    tl.store(depths_ptr + b * (B + 1), 0)
    tl.store(scores_ptr + b * (B + 1), 0.0)
    tl.store(nodes_ptr + b, 1 + tl.sum(chosen.to(tl.int64), 0))


@triton.jit
def tree_kernel(
    logits_ptr, ids_ptr, lse_ptr, roots_ptr, pair_slot_ptr, pair_rank_ptr, n_pairs,
    front_logit_sum_ptr, front_score_ptr, front_lex_ptr, front_bits_ptr, front_prod_ptr, front_rank_ptr,
    front_slot_ptr, tree_slot_ptr,
    compact_score_ptr, compact_lex_ptr, compact_pair_ptr, handoff_ptr,
    tokens_ptr, parents_ptr, depths_ptr, scores_ptr, nodes_ptr,
    KT, L, KB, D, B,
    FP: tl.constexpr, LOG_F: tl.constexpr, LOG_P: tl.constexpr, LOG_U: tl.constexpr,
):
    """One request's tree, if ``handoff_ptr[b]`` asks for it (the requests ``enum_kernel`` handed
    over): per-depth best-FP frontiers in scratch, merged into the best B so far.

    Candidates scoring below the running B-th best (less a rounding margin) cannot be in the tree,
    nor can their descendants (a child scores at most its parent), so they are dropped: a depth
    with few survivors sorts FP compacted entries instead of every pair, and the first depth with
    none ends the search. Kept entries keep the positions the full frontier gives them.
    """
    b = tl.program_id(0)
    if tl.load(handoff_ptr + b) == 0:
        return
    lrow = logits_ptr + b * L * KT
    frow = b * D * FP
    q = tl.arange(0, FP)
    c, best_s, best_l, best_i = _first_depth(
        b, lrow, frow, q, lse_ptr, front_logit_sum_ptr, front_score_ptr, front_lex_ptr, front_bits_ptr,
        front_prod_ptr, front_rank_ptr, front_slot_ptr, L, KB, FP)
    tl.debug_barrier()

    # depth d: children (parent position, rank) from the static pair table, best FP kept
    p = tl.arange(0, 1 << LOG_P)
    in_p = p < n_pairs
    slot = tl.load(pair_slot_ptr + p, mask=in_p, other=0)
    rank = tl.load(pair_rank_ptr + p, mask=in_p, other=0)
    code, clen = rank_code(rank.to(tl.int64) + 1)
    alive = KB > 0
    for d in range(1, D):
        if alive:
            c, valid, cand_s, cand_l, n_valid = _candidates(
                b, d, lrow, frow, lse_ptr, c, best_s, q, slot, rank, in_p, code, clen, front_logit_sum_ptr,
                front_score_ptr, front_lex_ptr, front_bits_ptr, front_prod_ptr, KT, L, B, FP)
            score, lex, order = _best_children(b, valid, cand_s, cand_l, n_valid, p, q, compact_score_ptr,
                                               compact_lex_ptr, compact_pair_ptr, FP, LOG_F, LOG_P)
            _store_frontier(d, lrow, frow, q, score, lex, order, pair_slot_ptr, pair_rank_ptr, n_pairs,
                            front_logit_sum_ptr, front_score_ptr, front_lex_ptr, front_bits_ptr, front_prod_ptr,
                            front_rank_ptr, front_slot_ptr, KT, FP)
            best_s, best_l, best_i = merge_best(best_s, best_l, best_i, score, lex, d * FP + q, LOG_F)
            alive = n_valid > 0
            tl.debug_barrier()
    _write_tree(b, best_s, best_i, q, ids_ptr, roots_ptr, frow, front_rank_ptr, front_slot_ptr, tree_slot_ptr,
                tokens_ptr, parents_ptr, depths_ptr, scores_ptr, nodes_ptr, KT, L, D, B, FP, LOG_U)
