"""Triton kernel of repro.kernels.tree_build (imported lazily: CPU-only installs never load it)."""

import triton
import triton.language as tl

INT64_MAX = tl.constexpr(9223372036854775807)

@triton.jit
def _rank_code(n):
    """(code, bits) of n = rank + 1: '1', m ones, '0', n's m low bits (as tree._rank_code)."""
    m = tl.floor(tl.log2(n.to(tl.float64))).to(tl.int64)
    one = tl.full(n.shape, 1, tl.int64)
    m = m - ((one << m) > n).to(tl.int64) + ((one << (m + 1)) <= n).to(tl.int64)
    code = (((one << (m + 2)) - 2) << m) | (n - (one << m))
    return code, 2 * m + 2

# Selection (score desc, code asc, index asc: a strict order) by bitonic networks on a
# [2] * n "hypercube" view: a compare-exchange partner is one xor-reduction along a size-2 axis,
# which stays in registers and warp shuffles (the layout trick of Triton's own tl.sort), and the
# best 2**k of 2**n come from sorting blocks of 2**k and halving (bitonic top-k).

@triton.jit
def _better(s1, l1, i1, s2, l2, i2):
    return (s1 > s2) | ((s1 == s2) & ((l1 < l2) | ((l1 == l2) & (i1 < i2))))


@triton.jit
def _keep_better(s1, l1, i1, s2, l2, i2):
    b = _better(s1, l1, i1, s2, l2, i2)
    return tl.where(b, s1, s2), tl.where(b, l1, l2), tl.where(b, i1, i2)


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _bit(n_dims: tl.constexpr, j: tl.constexpr):
    """Bit j of the flat index, shaped to broadcast over the hypercube."""
    return tl.reshape(tl.arange(0, 2), [1] * (n_dims - j - 1) + [2] + [1] * j)


@triton.jit
def _partner(x, n_dims: tl.constexpr, j: tl.constexpr):
    """Each element's partner across bit j (x ^ (x ^ partner))."""
    return x ^ tl.reduce(x, n_dims - 1 - j, _xor, keep_dims=True)


@triton.jit
def _exchange(s, lx, i, flip, n_dims: tl.constexpr, j: tl.constexpr):
    ps = _partner(s.to(tl.int64, bitcast=True), n_dims, j).to(tl.float64, bitcast=True)
    pl = _partner(lx, n_dims, j)
    pi = _partner(i, n_dims, j)
    keep = _better(s, lx, i, ps, pl, pi) != ((flip ^ _bit(n_dims, j)) == 1)
    return tl.where(keep, s, ps), tl.where(keep, lx, pl), tl.where(keep, i, pi)


@triton.jit
def _merge(s, lx, i, stage: tl.constexpr, alternate: tl.constexpr):
    """Bitonic merge of blocks of 2**stage: best first, or alternating block directions."""
    n_dims: tl.constexpr = len(s.shape)
    if alternate:
        flip = _bit(n_dims, stage)
    else:
        flip = tl.zeros([1] * n_dims, tl.int32)
    for jj in tl.static_range(stage):
        s, lx, i = _exchange(s, lx, i, flip, n_dims, stage - 1 - jj)
    return s, lx, i


@triton.jit
def _best(score, lex, idx, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """The best 2**LOG_K of 2**LOG_N entries, best first (bitonic sort of blocks, then halving)."""
    if LOG_K == 0:  # just the best one
        s, lx, i = tl.reduce((score, lex, idx), 0, _keep_better)
        return tl.zeros([1], s.dtype) + s, tl.zeros([1], lx.dtype) + lx, tl.zeros([1], i.dtype) + i
    s = tl.reshape(score, [2] * LOG_N)
    lx = tl.reshape(lex, [2] * LOG_N)
    i = tl.reshape(idx, [2] * LOG_N)
    for st in tl.static_range(1, LOG_K + 1):
        s, lx, i = _merge(s, lx, i, st, st < LOG_N)
    for h in tl.static_range(LOG_K + 1, LOG_N + 1):
        s, lx, i = tl.reduce((s, lx, i), LOG_N - h, _keep_better)  # the better of each block pair
        s, lx, i = _merge(s, lx, i, LOG_K, h < LOG_N)
    k: tl.constexpr = 1 << LOG_K
    return tl.reshape(s, [k]), tl.reshape(lx, [k]), tl.reshape(i, [k])


@triton.jit
def _merge_best(s1, l1, i1, s2, l2, i2, LOG_F: tl.constexpr):
    """The best 2**LOG_F of two best-first lists of that length, best first (bitonic merge)."""
    f: tl.constexpr = 1 << LOG_F
    s, lx, i = _keep_better(s1, l1, i1, tl.flip(s2, 0), tl.flip(l2, 0), tl.flip(i2, 0))
    s, lx, i = _merge(tl.reshape(s, [2] * LOG_F), tl.reshape(lx, [2] * LOG_F), tl.reshape(i, [2] * LOG_F), LOG_F, False)
    return tl.reshape(s, [f]), tl.reshape(lx, [f]), tl.reshape(i, [f])


@triton.jit
def _prune_below(best_s, q, B, c):
    """Scores below this can never reach the best ``B``: the B-th best of ``best_s`` so far, less a
    margin far above float64 rounding along a path (-inf until ``B`` entries are known)."""
    bth = tl.max(tl.where(q == B - 1, best_s, float("-inf")), 0)
    return bth - 1e-6 * (1.0 + tl.abs(bth) + tl.abs(c))


@triton.jit
def tree_kernel(  # noqa: PLR0915 - one fused launch builds the whole tree
    logits_ptr, ids_ptr, lse_ptr, roots_ptr, slot_tab, rank_tab, P,
    fx_ptr, fscore_ptr, flex_ptr, fbits_ptr, fprod_ptr, frank_ptr, fslot_ptr, inv_ptr,
    cs_ptr, cl_ptr, ci_ptr, flag_ptr,
    tokens_ptr, parents_ptr, depths_ptr, scores_ptr, nodes_ptr,
    KT, L, KB, D, B,
    FP: tl.constexpr, LOG_F: tl.constexpr, LOG_P: tl.constexpr, LOG_U: tl.constexpr,
):
    """One request's tree, if ``flag_ptr[b]`` asks for it (the requests ``enum_kernel`` handed
    over): per-depth best-FP frontiers in scratch, merged into the best B so far.

    Candidates scoring below the running B-th best (less a rounding margin) cannot be in the tree,
    nor can their descendants (a child scores at most its parent), so they are dropped: a depth
    with few survivors sorts FP compacted entries instead of every pair, and the first depth with
    none ends the search. Kept entries keep the positions the full frontier gives them.
    """
    b = tl.program_id(0)
    if tl.load(flag_ptr + b) == 0:
        return
    lrow = logits_ptr + b * L * KT
    frow = b * D * FP
    neg_inf = float("-inf")
    q = tl.arange(0, FP)

    # depth 1: ranks 0..KB-1 (already best first)
    ok = q < KB
    c = tl.load(lse_ptr + b * L).to(tl.float64)
    x = tl.load(lrow + q, mask=ok, other=0.0).to(tl.float64)
    code, bits = _rank_code(q.to(tl.int64) + 1)
    best_s = tl.where(ok, x - c, neg_inf)
    best_l = tl.where(ok, code << (63 - bits), INT64_MAX)
    best_i = q
    tl.store(fx_ptr + frow + q, x)
    tl.store(fscore_ptr + frow + q, best_s)
    tl.store(flex_ptr + frow + q, code << (63 - bits))
    tl.store(fbits_ptr + frow + q, bits)
    tl.store(fprod_ptr + frow + q, q.to(tl.int64) + 1)
    tl.store(frank_ptr + frow + q, q)
    tl.store(fslot_ptr + frow + q, tl.full([FP], -1, tl.int32))
    tl.debug_barrier()

    # depth d: children (parent position, rank) from the static pair table, best FP kept
    p = tl.arange(0, 1 << LOG_P)
    in_p = p < P
    slot = tl.load(slot_tab + p, mask=in_p, other=0)
    rank = tl.load(rank_tab + p, mask=in_p, other=0)
    code, clen = _rank_code(rank.to(tl.int64) + 1)
    alive = KB > 0
    for d in range(1, D):
        if alive:
            c += tl.load(lse_ptr + b * L + d).to(tl.float64)
            floor = _prune_below(best_s, q, B, c)
            prev = frow + (d - 1) * FP + slot
            pscore = tl.load(fscore_ptr + prev)
            prod = tl.load(fprod_ptr + prev) * (rank.to(tl.int64) + 1)
            cx = tl.load(fx_ptr + prev) + tl.load(lrow + d * KT + rank, mask=in_p, other=0.0).to(tl.float64)
            cand_s = cx - c
            valid = in_p & (pscore > neg_inf) & (prod <= B) & (cand_s >= floor)
            n_valid = tl.sum(valid.to(tl.int32), 0)
            used = tl.load(fbits_ptr + prev) + clen
            cand_l = tl.load(flex_ptr + prev) | (code << tl.maximum(63 - used, 0))
            cand_s = tl.where(valid, cand_s, neg_inf)
            cand_l = tl.where(valid, cand_l, INT64_MAX)
            score = tl.full([FP], neg_inf, tl.float64)
            lex = tl.full([FP], INT64_MAX, tl.int64)
            order = q
            if n_valid <= FP:  # compact the survivors, sort FP entries
                at = tl.cumsum(valid.to(tl.int32), 0) - 1
                tl.store(cs_ptr + b * FP + at, cand_s, mask=valid)
                tl.store(cl_ptr + b * FP + at, cand_l, mask=valid)
                tl.store(ci_ptr + b * FP + at, p, mask=valid)
                tl.debug_barrier()
                kept = q < n_valid
                score = tl.load(cs_ptr + b * FP + q, mask=kept, other=neg_inf)
                lex = tl.load(cl_ptr + b * FP + q, mask=kept, other=INT64_MAX)
                order = tl.load(ci_ptr + b * FP + q, mask=kept, other=(1 << LOG_P) - 1)
                score, lex, order = _best(score, lex, order, LOG_F, LOG_F)
                tl.debug_barrier()  # the compaction buffer is reused at the next depth
            else:
                score, lex, order = _best(cand_s, cand_l, p, LOG_P, LOG_F)
            s2 = tl.load(slot_tab + order, mask=order < P, other=0)
            r2 = tl.load(rank_tab + order, mask=order < P, other=0)
            prev2 = frow + (d - 1) * FP + s2
            _c2, l2 = _rank_code(r2.to(tl.int64) + 1)
            out = frow + d * FP + q
            tl.store(fx_ptr + out, tl.load(fx_ptr + prev2) + tl.load(lrow + d * KT + r2).to(tl.float64))
            tl.store(fscore_ptr + out, score)
            tl.store(flex_ptr + out, lex)
            tl.store(fbits_ptr + out, tl.load(fbits_ptr + prev2) + l2)
            tl.store(fprod_ptr + out, tl.load(fprod_ptr + prev2) * (r2.to(tl.int64) + 1))
            tl.store(frank_ptr + out, r2)
            tl.store(fslot_ptr + out, s2)
            best_s, best_l, best_i = _merge_best(best_s, best_l, best_i, score, lex, d * FP + q, LOG_F)
            alive = n_valid > 0
            tl.debug_barrier()

    # the best B of every depth, best first; parents through an inverse map
    score, order = best_s, best_i
    inv = inv_ptr + b * (1 << LOG_U)
    for u0 in range(0, D * FP, FP):
        tl.store(inv + u0 + q, tl.full([FP], -1, tl.int32))
    tl.debug_barrier()
    chosen = (q < B) & (score > neg_inf)
    tl.store(inv + order, q.to(tl.int32) + 1, mask=chosen)
    tl.debug_barrier()
    level = order // FP
    rank = tl.load(frank_ptr + frow + order, mask=chosen, other=0)
    pslot = tl.load(fslot_ptr + frow + order, mask=chosen, other=0)
    parent = tl.where(level == 0, 0, tl.load(inv + (level - 1) * FP + pslot, mask=chosen & (level > 0), other=0))
    token = tl.load(ids_ptr + b * L * KT + level * KT + rank, mask=chosen, other=-1)
    col = b * (B + 1) + 1 + q
    row_ok = q < B
    tl.store(tokens_ptr + col, tl.where(chosen, token, -1), mask=row_ok)
    tl.store(parents_ptr + col, tl.where(chosen, parent.to(tl.int64), -1), mask=row_ok)
    tl.store(depths_ptr + col, tl.where(chosen, level.to(tl.int64) + 1, 0), mask=row_ok)
    tl.store(scores_ptr + col, tl.where(chosen, score, neg_inf), mask=row_ok)
    tl.store(tokens_ptr + b * (B + 1), tl.load(roots_ptr + b))
    tl.store(parents_ptr + b * (B + 1), -1)
    tl.store(depths_ptr + b * (B + 1), 0)
    tl.store(scores_ptr + b * (B + 1), 0.0)
    tl.store(nodes_ptr + b, 1 + tl.sum(chosen.to(tl.int64), 0))


@triton.jit
def _bins(s, inv_w, NB: tl.constexpr):
    """Histogram bin of scores ``s`` <= 0: floor(-s * inv_w), clamped to [0, NB - 1]."""
    t = -s * inv_w
    t = tl.where(t == t, t, NB - 1.0)  # noqa: PLR0124 - a NaN test: -inf * 0 goes to the last bin
    t = tl.minimum(tl.maximum(t, 0.0), NB - 1.0)
    return t.to(tl.int32)


@triton.jit
def _hist_floor(hist, B, span, c, NB: tl.constexpr):
    """A score that at least ``B`` counted nodes reach, less the rounding margin of
    ``_prune_below``: the lower edge of the bin where the count from the top reaches B (each bin is
    ``span / NB`` wide, widened by 1e-9 against the rounding of the bin index); -inf while that is
    the open last bin."""
    nb = tl.arange(0, NB)
    top = tl.min(tl.where(tl.cumsum(hist, 0) >= B, nb, NB), 0)
    edge = -(top + 1).to(tl.float64) * (span / NB) * (1.0 + 1e-9)
    f = tl.where(top < NB - 1, edge, float("-inf"))
    return f - 1e-6 * (1.0 + tl.abs(f) + tl.abs(c))


@triton.jit
def _kept_prefix(px, hi, xs, last, c, floor, STEPS: tl.constexpr):
    """How many of ranks [0, hi) each parent keeps: a child scores ``px + xs[rank] - c``, kept while
    at least ``floor``; ``xs`` is sorted, so the kept ranks are a prefix, found by binary search
    (``STEPS`` halvings; ranks clamped to ``last``)."""
    lo = hi * 0
    for _ in range(STEPS):
        act = lo < hi
        mid = (lo + hi) // 2
        good = act & ((px + tl.gather(xs, tl.minimum(mid, last), 0)) - c >= floor)
        lo = tl.where(good, mid + 1, lo)
        hi = tl.where(act & ~good, mid, hi)
    return lo


@triton.jit
def _offsets_reached(offs, k, n, last, steps):
    """How many of the first ``n`` (ascending) ``offs`` are <= ``k``, by binary search in ``steps``
    halvings (positions clamped to ``last``): child k's parent is the one before."""
    lo = k * 0
    hi = lo + n
    for _ in range(steps):
        act = lo < hi
        mid = (lo + hi) // 2
        le = tl.gather(offs, tl.minimum(mid, last), 0) <= k
        lo = tl.where(act & le, mid + 1, lo)
        hi = tl.where(act & ~le, mid, hi)
    return lo


@triton.jit
def _narrow_counts(rx, rp, xw, c, floor, npar, B, KB, W: tl.constexpr, SEARCH_W: tl.constexpr):
    """Kept children of each parent of a one-warp tile (a prefix of its ranks, searched in the W
    best ranks ``xw``), and how many parents may keep W or more (the wide path's case)."""
    w = tl.arange(0, W)
    pj = w < npar
    hi = tl.where(pj, tl.minimum(B // tl.where(pj, rp, 1), KB), 0)
    lo = _kept_prefix(rx, tl.minimum(hi, W), xw, W - 1, c, floor, SEARCH_W)
    return lo, tl.sum(((lo == W) & (hi > W)).to(tl.int32), 0)


@triton.jit
def _narrow_children(rx, rp, rl, rb, xw, cnt, npar, total, W: tl.constexpr, SEARCH_W: tl.constexpr):
    """Child k of a one-warp tile of parents, in lane k: (parent slot, rank, x, prod, lex, bits),
    computed as the wide path does."""
    w = tl.arange(0, W)
    offs = tl.cumsum(cnt, 0) - cnt
    j = tl.maximum(_offsets_reached(offs, w, npar, W - 1, SEARCH_W) - 1, 0)
    r = tl.where(w < total, w - tl.gather(offs, j, 0), 0)
    cx = tl.gather(rx, j, 0) + tl.gather(xw, tl.minimum(r, W - 1), 0)
    code, clen = _rank_code(r.to(tl.int64) + 1)
    used = tl.gather(rb, j, 0).to(tl.int64) + clen
    lex = tl.gather(rl, j, 0) | (code << tl.maximum(63 - used, 0))
    return j, r, cx, tl.gather(rp, j, 0) * (r + 1), lex, used.to(tl.int32)


@triton.jit
def _store_nodes(px_ptr, ps_ptr, pl_ptr, pb_ptr, pp_ptr, pr_ptr, pa_ptr, pd_ptr, hist_row, out, kid,
                 cx, c, lex, bits, prod, rank, up, depth, inv_w, NB: tl.constexpr):
    """Pool entries ``out`` of kept nodes (mask ``kid``), counted in the floor histogram."""
    tl.store(px_ptr + out, cx, mask=kid)
    tl.store(ps_ptr + out, cx - c, mask=kid)
    tl.store(pl_ptr + out, lex, mask=kid)
    tl.store(pb_ptr + out, bits, mask=kid)
    tl.store(pp_ptr + out, prod, mask=kid)
    tl.store(pr_ptr + out, rank, mask=kid)
    tl.store(pa_ptr + out, up, mask=kid)
    tl.store(pd_ptr + out, depth, mask=kid)
    tl.atomic_add(hist_row + _bins(cx - c, inv_w, NB), 1, mask=kid, sem="relaxed")


@triton.jit
def enum_kernel(  # noqa: C901, PLR0912, PLR0915 - one fused launch builds the whole tree
    logits_ptr, ids_ptr, lse_ptr, roots_ptr,
    px_ptr, ps_ptr, pl_ptr, pb_ptr, pp_ptr, pr_ptr, pa_ptr, pd_ptr, off_ptr, sel_ptr, inv_ptr, hist_ptr, flag_ptr,
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
    pool of CAP entries; at the end the nodes at or above the final floor (at least B) are sorted
    once. A pool past CAP or more than 2 * FP finalists (ties) sets ``flag_ptr[b]`` and leaves
    the request to ``tree_kernel``.

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
    neg_inf = float("-inf")

    nxt = D > 1  # depth 2's lse and logits load while depth 1 runs
    lse_n = tl.load(lse_ptr + b * L + 1, mask=nxt, other=0.0)
    xrow_n = tl.load(lrow + KT + kr, mask=(kr < KB) & nxt, other=0.0)
    xw_n = tl.load(lrow + KT + lane, mask=(lane < KB) & nxt, other=0.0)
    ok = q < KB  # depth 1: every rank
    c = tl.load(lse_ptr + b * L).to(tl.float64)
    x = tl.load(lrow + q, mask=ok, other=0.0).to(tl.float64)
    code, bits = _rank_code(q.to(tl.int64) + 1)
    tl.store(px_ptr + pool + q, x, mask=ok)
    tl.store(ps_ptr + pool + q, x - c, mask=ok)
    tl.store(pl_ptr + pool + q, code << (63 - bits), mask=ok)
    tl.store(pb_ptr + pool + q, bits.to(tl.int32), mask=ok)
    tl.store(pp_ptr + pool + q, q + 1, mask=ok)
    tl.store(pr_ptr + pool + q, q, mask=ok)
    tl.store(pa_ptr + pool + q, tl.full([CH], -1, tl.int32), mask=ok)
    tl.store(pd_ptr + pool + q, tl.full([CH], 1, tl.int32), mask=ok)
    theta = tl.load(lrow + B - 1).to(tl.float64) - c  # depth 1's B-th score
    span = tl.maximum(-theta, 1e-6) * 1.0625
    inv_w = NB / span
    # the histogram lives in global memory: relaxed atomics, then an L2 read after a barrier
    # (tl.histogram's shared-memory atomics took half the kernel's time on the H200). A read that
    # races later atomics still counts real nodes only, so any F read off it is valid.
    hist_row = hist_ptr + b * NB
    nb = tl.arange(0, NB)
    tl.store(hist_row + nb, tl.zeros([NB], tl.int32))
    tl.debug_barrier()
    tl.atomic_add(hist_row + _bins(x - c, inv_w, NB), 1, mask=ok, sem="relaxed")
    tl.debug_barrier()
    floor = _hist_floor(tl.load(hist_row + nb, cache_modifier=".cg"), B, span, c, NB)
    n_pool = KB
    par0 = n_pool * 0
    over = (theta == neg_inf).to(tl.int32)  # fewer than B finite logits: the frontier kernel's case
    npar = tl.where(over == 0, n_pool, 0)
    # nodes kept since F was read; when 0, a barrier followed every write to the pool and offsets
    since = n_pool * 0
    resident = n_pool * 0  # 1: the narrow tile (rx, rp, rl, rb) holds this depth's parents
    rx = tl.zeros([W], tl.float64)
    rp = tl.full([W], 1, tl.int32)
    rl = tl.zeros([W], tl.int64)
    rb = tl.zeros([W], tl.int32)

    for d in range(1, D):
        if npar > 0:
            c += lse_n.to(tl.float64)
            xrow = xrow_n.to(tl.float64)  # this depth's sorted logits (wide path)
            xw = xw_n.to(tl.float64)  # its W best (narrow path)
            nxt = d + 1 < D
            lse_n = tl.load(lse_ptr + b * L + d + 1, mask=nxt, other=0.0)
            xrow_n = tl.load(lrow + (d + 1) * KT + kr, mask=(kr < KB) & nxt, other=0.0)
            xw_n = tl.load(lrow + (d + 1) * KT + lane, mask=(lane < KB) & nxt, other=0.0)
            nkeep = lane * 0
            spill = npar * 0
            total = npar * 0
            if npar <= W:
                if resident == 0:  # a wide depth's children: read back from the pool once
                    if since > 0:
                        tl.debug_barrier()
                    pj = lane < npar
                    rx = tl.load(px_ptr + pool + par0 + lane, mask=pj, other=0.0)
                    rp = tl.load(pp_ptr + pool + par0 + lane, mask=pj, other=1)
                    rl = tl.load(pl_ptr + pool + par0 + lane, mask=pj, other=0)
                    rb = tl.load(pb_ptr + pool + par0 + lane, mask=pj, other=0)
                nkeep, spill = _narrow_counts(rx, rp, xw, c, floor, npar, B, KB, W, SEARCH_W)
                total = tl.sum(nkeep, 0)
            wide = (npar > W) | (spill > 0) | (total > W)
            offs = q * 0
            if wide:
                if since > 0:
                    tl.debug_barrier()
                total = npar * 0
                for j0 in range(0, npar, CH):  # each parent's kept children: a prefix of its ranks
                    pj = j0 + q < npar
                    pat = pool + par0 + j0 + q
                    pcx = tl.load(px_ptr + pat, mask=pj, other=0.0)
                    hi = tl.minimum(B // tl.load(pp_ptr + pat, mask=pj, other=B + 1), KB)
                    lo = _kept_prefix(pcx, hi, xrow, KB - 1, c, floor, SEARCH_K)
                    offs = total + tl.cumsum(lo, 0) - lo
                    tl.store(off_ptr + pool + j0 + q, offs, mask=pj)
                    total += tl.sum(lo, 0)
            if n_pool + total > CAP:
                over = over + 1
                npar = npar * 0
            else:
                if wide:
                    if npar > CH:  # the offsets are read back from global memory
                        tl.debug_barrier()
                    steps = tl.log2(npar.to(tl.float32)).to(tl.int32) + 2  # > log2(npar): enough halvings
                    for q0 in range(0, total, CH):
                        k = q0 + q
                        lo = q * 0  # child k's parent: the last one whose offset is <= k
                        hi = lo + npar
                        if npar <= CH:  # offsets still in registers
                            lo = _offsets_reached(offs, k, npar, CH - 1, steps)
                            start = tl.gather(offs, tl.maximum(lo - 1, 0), 0)
                        else:
                            for _ in range(steps):
                                act = lo < hi
                                mid = (lo + hi) // 2
                                le = tl.load(off_ptr + pool + mid, mask=act, other=0) <= k
                                lo = tl.where(act & le, mid + 1, lo)
                                hi = tl.where(act & ~le, mid, hi)
                            start = tl.load(off_ptr + pool + lo - 1, mask=k < total, other=0)
                        kid = k < total
                        at = pool + par0 + lo - 1
                        r = tl.where(kid, k - start, 0)
                        cx = tl.load(px_ptr + at, mask=kid, other=0.0) + tl.gather(xrow, tl.minimum(r, KB - 1), 0)
                        code, clen = _rank_code(r.to(tl.int64) + 1)
                        used = tl.load(pb_ptr + at, mask=kid, other=0).to(tl.int64) + clen
                        lex = tl.load(pl_ptr + at, mask=kid, other=0) | (code << tl.maximum(63 - used, 0))
                        prod = tl.load(pp_ptr + at, mask=kid, other=1) * (r + 1)
                        _store_nodes(px_ptr, ps_ptr, pl_ptr, pb_ptr, pp_ptr, pr_ptr, pa_ptr, pd_ptr, hist_row,
                                     pool + n_pool + k, kid, cx, c, lex, used.to(tl.int32), prod, r, par0 + lo - 1,
                                     tl.full([CH], 1, tl.int32) + d, inv_w, NB)
                    resident = resident * 0
                else:  # the children become the next depth's register-resident parents
                    j, r, rx, rp, rl, rb = _narrow_children(rx, rp, rl, rb, xw, nkeep, npar, total, W, SEARCH_W)
                    _store_nodes(px_ptr, ps_ptr, pl_ptr, pb_ptr, pp_ptr, pr_ptr, pa_ptr, pd_ptr, hist_row,
                                 pool + n_pool + lane, lane < total, rx, c, rl, rb, rp, r, par0 + j,
                                 tl.full([W], 1, tl.int32) + d, inv_w, NB)
                    resident = resident * 0 + 1
                since += total
                if since >= tl.maximum(B // 8, 1):  # enough new nodes to move F: read it again
                    tl.debug_barrier()
                    floor = _hist_floor(tl.load(hist_row + nb, cache_modifier=".cg"), B, span, c, NB)
                    since = since * 0
                par0 = n_pool
                npar = total
                n_pool += total

    # finalists: every kept node at or above the final floor (at least B of them), sorted once
    if since > 0:  # the last nodes kept are not in F yet: a tighter F means fewer finalists
        tl.debug_barrier()
        floor = _hist_floor(tl.load(hist_row + nb, cache_modifier=".cg"), B, span, c, NB)
    S: tl.constexpr = 2 << LOG_F  # noqa: N806 - a constexpr size, named like the others
    cnt = n_pool * 0
    for u0 in range(0, n_pool, CH):
        u = u0 + q
        m = u < n_pool
        keep = m & (tl.load(ps_ptr + pool + u, mask=m, other=neg_inf) >= floor)
        at = cnt + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(sel_ptr + b * S + at, u, mask=keep & (at < S))
        tl.store(inv_ptr + pool + u, tl.zeros([CH], tl.int32), mask=m)
        cnt += tl.sum(keep.to(tl.int32), 0)
    over += (cnt > S).to(tl.int32)
    tl.store(flag_ptr + b, over)
    if over == 0:
        tl.debug_barrier()
        w = tl.arange(0, S)
        u = tl.load(sel_ptr + b * S + w, mask=w < cnt, other=0)
        score = tl.load(ps_ptr + pool + u, mask=w < cnt, other=neg_inf)
        lex = tl.load(pl_ptr + pool + u, mask=w < cnt, other=INT64_MAX)
        score, lex, u = _best(score, lex, u, LOG_F + 1, LOG_F)
        f = tl.arange(0, 1 << LOG_F)
        chosen = f < B
        tl.store(inv_ptr + pool + u, f + 1, mask=chosen)
        tl.debug_barrier()
        depth = tl.load(pd_ptr + pool + u, mask=chosen, other=1)
        rank = tl.load(pr_ptr + pool + u, mask=chosen, other=0)
        up = tl.load(pa_ptr + pool + u, mask=chosen, other=0)
        parent = tl.load(inv_ptr + pool + up, mask=chosen & (depth > 1), other=0)
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
def _fill(ptr, lo, hi, longest, value, CB: tl.constexpr):
    """ptr[lo[i]:hi[i]] = value for each row i of the [R] int64 bounds (R == 1: one flat range);
    ``longest`` (int32) >= every hi - lo: a scalar, so no cross-thread reduction finds the loop's end.

    Between a row's 16-aligned bounds the offsets and the mask bound are multiples of 16, so the
    compiler emits one 16-byte store per thread and block; the up to 15 bytes at each end are
    stored one by one."""
    start = (lo + 15) // 16 * 16
    stop = hi // 16 * 16
    edge = tl.arange(0, 16)[None, :]
    head = lo[:, None] + edge
    tl.store(ptr + head, value, mask=(head < start[:, None]) & (head < hi[:, None]))
    tail = stop[:, None] + edge
    tl.store(ptr + tail, value, mask=(tail >= start[:, None]) & (tail < hi[:, None]))
    base = ptr + start[:, None]
    length = (stop - start).to(tl.int32)[:, None]
    col = tl.arange(0, CB)[None, :]
    for c in range(0, longest, CB):
        tl.store(base + c + col, value, mask=c + col < length)


@triton.jit
def _pointers(parents_ptr, r, parent, lowest, N: tl.constexpr, CW: tl.constexpr):
    """First child and next sibling (-1: none) of rows ``r`` (>= ``lowest``) of one request.

    First child: the smallest j with parent[j] == i; next sibling: the smallest j > i with
    parent[j] == parent[i] (the successor in (parent, index) order of ``tree_pointers``). Children
    follow their parent (parents[j] < j), so columns before ``lowest`` cannot match. Elementwise
    minima over blocks of CW columns, one reduction at the end."""
    i = r.to(tl.int32)[:, None]
    first = tl.full([r.shape[0], CW], N, tl.int32)
    sibling = tl.full([r.shape[0], CW], N, tl.int32)
    for c0 in range(lowest // CW * CW, N, CW):
        j = c0 + tl.arange(0, CW)[None, :]
        pj = tl.load(parents_ptr + j, mask=j < N, other=-1).to(tl.int32)
        first = tl.minimum(first, tl.where(pj == i, j, N))
        sibling = tl.minimum(sibling, tl.where((pj == parent[:, None]) & (j > i), j, N))
    first = tl.min(first, 1)
    sibling = tl.min(sibling, 1)
    return tl.where(first < N, first, -1), tl.where((sibling < N) & (parent >= 0), sibling, -1)


@triton.jit(do_not_specialize=["bs", "lens_sum"])  # one compile for every batch size and mask size
def verify_kernel(
    tokens_ptr, parents_ptr, depths_ptr, lens_ptr, bs, lens_sum, D, pad_token,
    ids_out, pos_out, anc_out, full_out, index_out, first_out, sibling_out,
    N: tl.constexpr, BS_P: tl.constexpr, RB: tl.constexpr, CW: tl.constexpr, FILL: tl.constexpr,
):
    """Every verify tensor of one request's rows [t*RB, (t+1)*RB) into uninitialised outputs: ids,
    positions, pointers, ancestor-mask rows and FULL-mask rows, plus a 1/(bs*T) share of the FULL
    mask's True tail (T programs per request). Each byte has one owning program, so programs never
    wait on each other; within a program, zeros are written before the ancestor ones."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    r = t * RB + tl.arange(0, RB)
    real = r < N
    row = b * N + r
    tok = tl.load(tokens_ptr + row, mask=real, other=-1)
    depth = tl.load(depths_ptr + row, mask=real, other=0)
    parent = tl.load(parents_ptr + row, mask=real, other=-1).to(tl.int32)
    s = tl.load(lens_ptr + b)
    tl.store(ids_out + row, tl.where(tok == -1, pad_token, tok), mask=real)
    tl.store(pos_out + row, s + depth, mask=real)
    tl.store(index_out + row, row.to(tl.int64), mask=real)

    # request b's block of the flat FULL mask starts after every earlier request's N*(S+N); the
    # blocks of all requests end at `used`, and past it (up to `size`) the mask is all True
    size = N * lens_sum.to(tl.int64) + bs.to(tl.int64) * N * N
    start = tl.full([], 0, tl.int64)
    used = tl.full([], 0, tl.int64)
    for c0 in range(0, bs, BS_P):
        c = c0 + tl.arange(0, BS_P)
        block = tl.where(c < bs, N * (tl.load(lens_ptr + c, mask=c < bs, other=0) + N), 0)
        start += tl.sum(tl.where(c < b, block, 0), 0).to(tl.int64)
        used += tl.sum(block, 0).to(tl.int64)
    width = s + N
    row_start = tl.where(real, start + r * width, 0)
    prefix_end = tl.where(real, row_start + s, 0)
    _fill(full_out, row_start, prefix_end, s.to(tl.int32), 1, FILL // RB)
    _fill(full_out, prefix_end, tl.where(real, row_start + width, 0), N, 0, FILL // RB)
    flat = tl.full([1], 0, tl.int64)  # a single row: one contiguous range
    anc_rows = (tl.minimum(t * RB + RB, N) - t * RB) * N
    anc_start = (b.to(tl.int64) * N + t * RB) * N
    _fill(anc_out, flat + anc_start, flat + anc_start + anc_rows, anc_rows, 0, FILL)
    programs = bs * tl.num_programs(1)
    share = (size - used + programs - 1) // programs
    tail = used + (b * tl.num_programs(1) + t) * share
    _fill(full_out, flat + tail, flat + tl.minimum(tail + share, size), share.to(tl.int32), 1, FILL)

    first, sibling = _pointers(parents_ptr + b * N, r, parent, t * RB, N, CW)
    tl.store(first_out + row, first.to(tl.int64), mask=real)
    tl.store(sibling_out + row, sibling.to(tl.int64), mask=real)

    tl.debug_barrier()  # the ones below land after this program's zero fills of the same rows
    cur = r.to(tl.int64)  # the row itself, then each ancestor: at most D hops
    hop = real
    anc_row = row.to(tl.int64) * N
    for _ in range(D + 1):
        tl.store(anc_out + anc_row + cur, 1, mask=hop)
        tl.store(full_out + prefix_end + cur, 1, mask=hop)
        cur = tl.load(parents_ptr + b * N + cur, mask=hop, other=-1)
        hop = hop & (cur >= 0)
