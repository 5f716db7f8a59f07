"""One depth of ``enum_kernel`` (``_tree_enum_triton``): the kept children of the depth before's
kept nodes, by the narrow (one warp, registers) or the wide path (the pool, CH at a time).

``pool_cols`` is the kept-node pool's columns, CAP entries per request, indexed by the constants
below: the sum of logits along the path, score, rank-tuple code, code bits, rank product, rank,
parent's pool index and depth.
"""

import triton
import triton.language as tl

from repro.kernels._common_triton import rank_code

LOGIT_SUM, SCORE, LEX, BITS, PROD, RANK, PARENT, DEPTH = (tl.constexpr(i) for i in range(8))  # columns of ``pool_cols``


@triton.jit
def score_bins(s, inv_w, NB: tl.constexpr):
    """Histogram bin of scores ``s`` <= 0: floor(-s * inv_w), clamped to [0, NB - 1]."""
    t = -s * inv_w
    t = tl.where(t == t, t, NB - 1.0)  # noqa: PLR0124 - a NaN test: -inf * 0 goes to the last bin
    t = tl.minimum(tl.maximum(t, 0.0), NB - 1.0)
    return t.to(tl.int32)


@triton.jit
def hist_floor(hist, B, span, c, NB: tl.constexpr):
    """A score that at least ``B`` counted nodes reach, less the rounding margin of the frontier
    kernel's ``_prune_below``: the lower edge of the bin where the count from the top reaches B
    (each bin is ``span / NB`` wide, widened by 1e-9 against the rounding of the bin index); -inf
    while that is the open last bin."""
    nb = tl.arange(0, NB)
    top = tl.min(tl.where(tl.cumsum(hist, 0) >= B, nb, NB), 0)
    edge = -(top + 1).to(tl.float64) * (span / NB) * (1.0 + 1e-9)
    f = tl.where(top < NB - 1, edge, float("-inf"))
    return f - 1e-6 * (1.0 + tl.abs(f) + tl.abs(c))


@triton.jit
def _kept_prefix(parent_x, hi, xs, last, c, floor, STEPS: tl.constexpr):
    """How many of ranks [0, hi) each parent keeps: a child scores ``parent_x + xs[rank] - c``, kept
    while at least ``floor``; ``xs`` is sorted, so the kept ranks are a prefix, found by binary
    search (``STEPS`` halvings; ranks clamped to ``last``)."""
    lo = hi * 0
    for _ in range(STEPS):
        act = lo < hi
        mid = (lo + hi) // 2
        good = act & ((parent_x + tl.gather(xs, tl.minimum(mid, last), 0)) - c >= floor)
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
def store_nodes(pool_cols, hist_row, out, kid, cx, c, lex, bits, prod, rank, up, depth, inv_w, NB: tl.constexpr):
    """Pool entries ``out`` of kept nodes (mask ``kid``), counted in the floor histogram."""
    tl.store(pool_cols[LOGIT_SUM] + out, cx, mask=kid)
    tl.store(pool_cols[SCORE] + out, cx - c, mask=kid)
    tl.store(pool_cols[LEX] + out, lex, mask=kid)
    tl.store(pool_cols[BITS] + out, bits, mask=kid)
    tl.store(pool_cols[PROD] + out, prod, mask=kid)
    tl.store(pool_cols[RANK] + out, rank, mask=kid)
    tl.store(pool_cols[PARENT] + out, up, mask=kid)
    tl.store(pool_cols[DEPTH] + out, depth, mask=kid)
    tl.atomic_add(hist_row + score_bins(cx - c, inv_w, NB), 1, mask=kid, sem="relaxed")


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
def _narrow_keep(pool_cols, pool, lane, par0, npar, since, resident, rx, rp, rl, rb, xw, c, floor, B, KB,
                 W: tl.constexpr, SEARCH_W: tl.constexpr):
    """With at most W parents, the narrow path's kept children per parent, parents that may keep
    more than W (then the wide path runs) and their total; the parents' tile (rx, rp, rl, rb:
    logit sum, rank product, code, code bits) is read from the pool if the depth before ran wide."""
    nkeep = lane * 0
    spill = npar * 0
    total = npar * 0
    if npar <= W:
        if resident == 0:  # a wide depth's children: read back from the pool once
            if since > 0:
                tl.debug_barrier()
            pj = lane < npar
            rx = tl.load(pool_cols[LOGIT_SUM] + pool + par0 + lane, mask=pj, other=0.0)
            rp = tl.load(pool_cols[PROD] + pool + par0 + lane, mask=pj, other=1)
            rl = tl.load(pool_cols[LEX] + pool + par0 + lane, mask=pj, other=0)
            rb = tl.load(pool_cols[BITS] + pool + par0 + lane, mask=pj, other=0)
        nkeep, spill = _narrow_counts(rx, rp, xw, c, floor, npar, B, KB, W, SEARCH_W)
        total = tl.sum(nkeep, 0)
    return nkeep, spill, total, rx, rp, rl, rb


@triton.jit
def _wide_counts(pool_cols, child_offset_ptr, wide, pool, q, par0, npar, since, total, xrow, c, floor, B, KB,
                 CH: tl.constexpr, SEARCH_K: tl.constexpr):
    """On the wide path, each parent's kept children (a prefix of its ranks) as offsets of a
    prefix sum, in registers (``offs``, the last CH parents) and in ``child_offset_ptr``; their total."""
    offs = q * 0
    if wide:
        if since > 0:
            tl.debug_barrier()
        total = npar * 0
        for j0 in range(0, npar, CH):  # each parent's kept children: a prefix of its ranks
            pj = j0 + q < npar
            pat = pool + par0 + j0 + q
            pcx = tl.load(pool_cols[LOGIT_SUM] + pat, mask=pj, other=0.0)
            hi = tl.minimum(B // tl.load(pool_cols[PROD] + pat, mask=pj, other=B + 1), KB)
            lo = _kept_prefix(pcx, hi, xrow, KB - 1, c, floor, SEARCH_K)
            offs = total + tl.cumsum(lo, 0) - lo
            tl.store(child_offset_ptr + pool + j0 + q, offs, mask=pj)
            total += tl.sum(lo, 0)
    return total, offs


@triton.jit
def _wide_children(pool_cols, child_offset_ptr, hist_row, d, pool, q, n_pool, par0, npar, total, offs, xrow, c, code,
                   inv_w, KB, CH: tl.constexpr, NB: tl.constexpr):
    """The wide path's children, CH at a time: child k's parent is the last whose offset is <= k,
    its rank k - that offset; each goes to the pool after the ``n_pool`` kept so far. Returns the
    last chunk's rank codes (``code``: see ``enum_depth``)."""
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
                le = tl.load(child_offset_ptr + pool + mid, mask=act, other=0) <= k
                lo = tl.where(act & le, mid + 1, lo)
                hi = tl.where(act & ~le, mid, hi)
            start = tl.load(child_offset_ptr + pool + lo - 1, mask=k < total, other=0)
        kid = k < total
        at = pool + par0 + lo - 1
        r = tl.where(kid, k - start, 0)
        cx = tl.load(pool_cols[LOGIT_SUM] + at, mask=kid, other=0.0) + tl.gather(xrow, tl.minimum(r, KB - 1), 0)
        code, clen = rank_code(r.to(tl.int64) + 1)
        used = tl.load(pool_cols[BITS] + at, mask=kid, other=0).to(tl.int64) + clen
        lex = tl.load(pool_cols[LEX] + at, mask=kid, other=0) | (code << tl.maximum(63 - used, 0))
        prod = tl.load(pool_cols[PROD] + at, mask=kid, other=1) * (r + 1)
        store_nodes(pool_cols, hist_row, pool + n_pool + k, kid, cx, c, lex, used.to(tl.int32), prod, r, par0 + lo - 1,
                    tl.full([CH], 1, tl.int32) + d, inv_w, NB)
    return code


@triton.jit
def _narrow_children(rx, rp, rl, rb, xw, cnt, npar, total, W: tl.constexpr, SEARCH_W: tl.constexpr):
    """Child k of a one-warp tile of parents, in lane k: (parent slot, rank, x, prod, lex, bits),
    computed as the wide path does."""
    w = tl.arange(0, W)
    offs = tl.cumsum(cnt, 0) - cnt
    j = tl.maximum(_offsets_reached(offs, w, npar, W - 1, SEARCH_W) - 1, 0)
    r = tl.where(w < total, w - tl.gather(offs, j, 0), 0)
    cx = tl.gather(rx, j, 0) + tl.gather(xw, tl.minimum(r, W - 1), 0)
    code, clen = rank_code(r.to(tl.int64) + 1)
    used = tl.gather(rb, j, 0).to(tl.int64) + clen
    lex = tl.gather(rl, j, 0) | (code << tl.maximum(63 - used, 0))
    return j, r, cx, tl.gather(rp, j, 0) * (r + 1), lex, used.to(tl.int32)


@triton.jit
def _keep_children(pool_cols, child_offset_ptr, hist_row, nb, d, pool, q, lane, span, inv_w, c, xrow, xw, code, floor,
                   n_pool, par0, npar, since, resident, rx, rp, rl, rb, nkeep, total, offs, wide, B, KB,
                   CH: tl.constexpr, NB: tl.constexpr, W: tl.constexpr, SEARCH_W: tl.constexpr):
    """Store the depth's ``total`` kept children in the pool (wide, or narrow: they stay in the
    register tile as the next depth's parents), refresh F after B / 8 new nodes; the next
    depth's (code, floor, pool size, first parent, parents, nodes since F, tile resident, tile)."""
    if wide:
        code = _wide_children(pool_cols, child_offset_ptr, hist_row, d, pool, q, n_pool, par0, npar, total, offs, xrow,
                              c, code, inv_w, KB, CH, NB)
        resident = resident * 0
    else:  # the children become the next depth's register-resident parents
        j, r, rx, rp, rl, rb = _narrow_children(rx, rp, rl, rb, xw, nkeep, npar, total, W, SEARCH_W)
        store_nodes(pool_cols, hist_row, pool + n_pool + lane, lane < total, rx, c, rl, rb, rp, r, par0 + j,
                    tl.full([W], 1, tl.int32) + d, inv_w, NB)
        resident = resident * 0 + 1
    since += total
    if since >= tl.maximum(B // 8, 1):  # enough new nodes to move F: read it again
        tl.debug_barrier()
        floor = hist_floor(tl.load(hist_row + nb, cache_modifier=".cg"), B, span, c, NB)
        since = since * 0
    par0 = n_pool
    npar = total
    n_pool += total
    return code, floor, n_pool, par0, npar, since, resident, rx, rp, rl, rb


@triton.jit
def enum_depth(pool_cols, child_offset_ptr, hist_row, nb, lse_ptr, lrow, b, d, pool, q, kr, lane, span, inv_w,
               lse_n, xrow_n, xw_n, c, code, floor, n_pool, par0, over, npar, since, resident, rx, rp, rl, rb,
               KT, L, KB, D, B, CH: tl.constexpr, CAP: tl.constexpr, NB: tl.constexpr, SEARCH_K: tl.constexpr,
               W: tl.constexpr, SEARCH_W: tl.constexpr):
    """Depth d of the enumeration, its lse and logits loaded the depth before (the next depth's
    load here); returns the state it updates. A pool that would pass CAP flags the request.

    ``nxt`` (whether a depth follows) and ``code`` (depth 1's rank codes, then the last wide
    chunk's) are returned unused: the kernel has always carried them around its depth loop, and
    Triton's layouts follow the carried ``code`` (without it B 256 at 4 warps compiles to other
    machine code), so the split keeps them."""
    c += lse_n.to(tl.float64)
    xrow = xrow_n.to(tl.float64)  # this depth's sorted logits (wide path)
    xw = xw_n.to(tl.float64)  # its W best (narrow path)
    nxt = d + 1 < D
    lse_n = tl.load(lse_ptr + b * L + d + 1, mask=nxt, other=0.0)
    xrow_n = tl.load(lrow + (d + 1) * KT + kr, mask=(kr < KB) & nxt, other=0.0)
    xw_n = tl.load(lrow + (d + 1) * KT + lane, mask=(lane < KB) & nxt, other=0.0)
    nkeep, spill, total, rx, rp, rl, rb = _narrow_keep(pool_cols, pool, lane, par0, npar, since, resident, rx, rp, rl,
                                                       rb, xw, c, floor, B, KB, W, SEARCH_W)
    wide = (npar > W) | (spill > 0) | (total > W)
    total, offs = _wide_counts(pool_cols, child_offset_ptr, wide, pool, q, par0, npar, since, total, xrow, c, floor,
                               B, KB, CH, SEARCH_K)
    if n_pool + total > CAP:
        over = over + 1
        npar = npar * 0
    else:
        code, floor, n_pool, par0, npar, since, resident, rx, rp, rl, rb = _keep_children(
            pool_cols, child_offset_ptr, hist_row, nb, d, pool, q, lane, span, inv_w, c, xrow, xw, code, floor, n_pool,
            par0, npar, since, resident, rx, rp, rl, rb, nkeep, total, offs, wide, B, KB, CH, NB, W, SEARCH_W)
    return nxt, lse_n, xrow_n, xw_n, c, code, floor, n_pool, par0, over, npar, since, resident, rx, rp, rl, rb
