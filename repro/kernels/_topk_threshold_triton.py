"""Top-K stage 2, first half: per row the logsumexp, the threshold ``tb`` and the list of groups
that reach it (helpers of ``_topk_select_triton``'s kernels).

The threshold is the largest biased 16-bit key that at least ``K`` super keys reach (the
maximum of each set of ``R`` group keys; the group keys are held in registers: one tile of
``MB`` keys, or a head of ``MB`` plus a tail of ``MT`` when those two cover the row), found by a
search that counts them against ``P`` pivots a round (a histogram: two rounds or three on random
rows). At least ``K`` groups and tokens reach it, and so does every top-K token; the groups
that do are listed in id order (the first ``CAP``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from repro.kernels._common_triton import KEY_BIAS, LOG2E


@triton.jit
def _merge_lse(part_row, S, SP: tl.constexpr):
    """logsumexp of a row from its ``S`` splits' (max, sum of exp(x - max)) pairs, ``SP`` pairs per
    load (one load when S <= SP: the select's first step is latency-bound at small bs)."""
    so = tl.arange(0, SP)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    for c in range(0, S, SP):
        ms = tl.load(part_row + (c + so) * 2, mask=c + so < S, other=float("-inf"))
        ss = tl.load(part_row + (c + so) * 2 + 1, mask=c + so < S, other=0.0)
        m_new = tl.maximum(m, tl.max(ms, axis=0))
        total = total * tl.exp2((m - m_new) * LOG2E) + tl.sum(ss * tl.exp2((ms - m_new) * LOG2E), axis=0)
        m = m_new
    return m + tl.log(total)


@triton.jit
def _biased_keys(gk_row, gi, M):
    """Group keys ``gi`` as int32 in [0, 65536) (order key + 32768); -1 where ``gi >= M``."""
    u = tl.load(gk_row + gi, mask=gi < M, other=0).to(tl.int32) + KEY_BIAS
    return tl.where(gi < M, u, -1)


@triton.jit
def _supers(u, R: tl.constexpr):
    """Super keys: the maximum of each of ``len(u) / R`` disjoint sets of ``R`` keys of ``u``.

    If at least K super keys reach t, at least K groups (one per set) and so at least K tokens
    reach t: a threshold found over super keys is a valid, slightly lower, group threshold, found
    by counting R times fewer keys. Any partition works, so the reshape may reorder."""
    if R == 1:
        out = u
    else:
        out = tl.max(tl.reshape(u, [u.shape[0] // R, R], can_reorder=True), axis=1)
    return out


@triton.jit
def _bins(s, lo, step, P: tl.constexpr):
    """Bin of each super key in a search round: ``clamp((s - lo) // step, 0, P)`` (padding: 0)."""
    return tl.minimum(tl.maximum(s - lo, 0) // step, P)


@triton.jit
def _histogram(gk_row, M, s0, s1, lo, step, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr,
               P: tl.constexpr):
    """Histogram [2P] of the super keys (:func:`_supers` of ``R`` biased group keys) over the bins
    of :func:`_bins`: the keys that reach the pivot ``lo + (i + 1) * step`` are those of bins > i.

    ``s0``: those of the first MB keys, -1 padded. With a tail (``MT > 0``) ``s1`` holds those of
    the keys from MB on and the two cover the row; without, blocks of MB keys past the head are
    loaded here.
    """
    h = tl.histogram(_bins(s0, lo, step, P), 2 * P)
    if MT > 0:
        h += tl.histogram(_bins(s1, lo, step, P), 2 * P)
    else:
        mo = tl.arange(0, MB)
        for c in range(MB, M, MB):
            h += tl.histogram(_bins(_supers(_biased_keys(gk_row, c + mo, M), R), lo, step, P), 2 * P)
    return h


@triton.jit
def _min_max(lo_a, hi_a, lo_b, hi_b):
    """Combine two (smallest, largest) pairs."""
    return tl.minimum(lo_a, lo_b), tl.maximum(hi_a, hi_b)


@triton.jit
def _range_tiles(s0, s1, MT: tl.constexpr):
    """(smallest, largest + 1) of super keys ``s0`` (and the tail's ``s1``), padding -1 excluded:
    one block reduction of the pair (head and tail)."""
    if MT > 0:
        h = tl.reshape(s0, [s1.shape[0], s0.shape[0] // s1.shape[0]], can_reorder=True)
        low = tl.minimum(tl.min(tl.where(h >= 0, h, 1 << 16), axis=1), tl.where(s1 >= 0, s1, 1 << 16))
        high = tl.maximum(tl.max(h, axis=1), s1)
    else:
        low = tl.where(s0 >= 0, s0, 1 << 16)
        high = s0
    lo, hi = tl.reduce((low, high), 0, _min_max)
    return lo, hi + 1


@triton.jit
def _key_range(gk_row, M, s0, s1, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr):
    """(smallest, largest + 1) of the super keys (padding excluded); keys as in :func:`_histogram`."""
    lo, hi = _range_tiles(s0, s1, MT)
    if MT == 0:
        mo = tl.arange(0, MB)
        for c in range(MB, M, MB):
            lo_c, hi_c = _range_tiles(_supers(_biased_keys(gk_row, c + mo, M), R), s1, 0)
            lo, hi = _min_max(lo, hi, lo_c, hi_c)
    return lo, hi


@triton.jit
def _threshold(gk_row, M, K, s0, s1, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr, P: tl.constexpr):
    """Largest biased 16-bit key ``tb`` that at least ``K`` super keys reach (0 if there are fewer
    than K super keys).

    A ``P + 1``-ary search over [lo, hi), lo the smallest super key (every one reaches it) and hi
    the largest + 1 (none does). Each round bins the keys held in registers by ``P`` evenly spaced
    pivots (one histogram, :func:`_histogram`), counts the keys that reach each pivot from it, and
    keeps the interval between the last pivot that K keys reach and the next: ceil(log_{P+1}(hi -
    lo)) rounds, 3 on random rows at P = 16, where a bisection takes about 9 dependent block-wide
    counts.
    """
    lo, hi = _key_range(gk_row, M, s0, s1, MB, MT, R)
    lo = tl.where((M + R - 1) // R >= K, lo, 0)
    i = tl.arange(0, 2 * P)
    while hi - lo > 1:  # count(lo) >= K > count(hi)
        step = (hi - lo + P) // (P + 1)
        h = _histogram(gk_row, M, s0, s1, lo, step, MB, MT, R, P)
        reach = tl.sum(h, axis=0) - tl.cumsum(h, axis=0)  # keys reaching each pivot lo + (i + 1) * step
        ok = (i < P) & (lo + (i + 1) * step < hi) & (reach >= K)
        lo_next = lo + tl.sum(ok.to(tl.int32), axis=0) * step  # ok is a prefix: counts fall as pivots rise
        hi = tl.minimum(hi, lo_next + step)
        lo = lo_next
    return lo


@triton.jit
def lse_and_threshold(gk_row, part_row, lse_at, M, S, K, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr,
                       P: tl.constexpr, SP: tl.constexpr):
    """Store one row's logsumexp at ``lse_at``; return its threshold ``tb`` and the group keys it
    was searched over (``u0``: the first MB, -1 padded; ``u1``: the tail tile, or ``u0`` when MT = 0)."""
    u0 = _biased_keys(gk_row, tl.arange(0, MB), M)
    u1 = u0
    if MT > 0:
        u1 = _biased_keys(gk_row, MB + tl.arange(0, MT), M)
    tl.store(lse_at, _merge_lse(part_row, S, SP))
    return _threshold(gk_row, M, K, _supers(u0, R), _supers(u1, R), MB, MT, R, P), u0, u1


@triton.jit
def _append_groups(gidx_row, gi, u, tb, nsel, CAP: tl.constexpr):
    """After the ``nsel`` listed groups, list those of ids ``gi`` whose keys ``u`` reach ``tb``
    (in order, list slots below CAP); return the new count."""
    sel = (u >= tb).to(tl.int32)
    pos = nsel + tl.cumsum(sel, axis=0) - 1
    tl.store(gidx_row + pos, gi, mask=(sel > 0) & (pos < CAP))
    return nsel + tl.sum(sel, axis=0)


@triton.jit
def compact_groups(gk_row, gidx_row, M, tb, u0, u1, MB: tl.constexpr, MT: tl.constexpr, CAP: tl.constexpr):
    """Write the ids of groups whose key reaches ``tb`` (ascending, first CAP); return their count.

    Keys as in :func:`_histogram`: head ``u0``, then the tail ``u1`` or blocks loaded here.
    """
    mo = tl.arange(0, MB)
    nsel = _append_groups(gidx_row, mo, u0, tb, 0, CAP)
    if MT > 0:
        nsel = _append_groups(gidx_row, MB + tl.arange(0, MT), u1, tb, nsel, CAP)
    else:
        for c in range(MB, M, MB):
            gi = c + mo
            nsel = _append_groups(gidx_row, gi, _biased_keys(gk_row, gi, M), tb, nsel, CAP)
    return nsel
