"""Triton kernels behind :func:`repro.kernels.topk_lse.topk_lse` (imported lazily: needs triton).

Two stages, one pass over the logits:

1. ``stream_kernel`` (grid rows x splits) reads each row once. Per group of ``G`` consecutive
   tokens it writes a 16-bit order key of the group's maximum, and per split the running
   (max, sum of exp) of the logsumexp.
2. ``select_kernel`` (grid rows) merges the lse partials, finds by a binary search over the
   super keys (the maximum of each set of ``R`` group keys; the group keys are held in registers:
   one tile of ``MB`` keys, or a head of ``MB`` plus a tail of ``MT`` when those two cover the row)
   the threshold ``tb`` that at least ``K`` super keys reach (so at least ``K`` groups and tokens
   do, and every top-K token does), re-reads only the groups that reach it, compacts the tokens
   that reach it, and sorts those few candidates exactly. A row with more candidates than ``CAP``
   (ties, sorted rows) takes an exact slow path: a running top-K over the whole row in id order.
   Both paths share one sort, so the kernel compiles one bitonic network.
   Below ``TopKConfig.split_rows`` rows the select runs as two launches instead:
   ``threshold_kernel`` (grid rows: lse, threshold, group list) and ``gather_kernel`` (grid rows x
   list slices: each program gathers one slice's candidates, the last of a row's programs sorts).

Exact order: a token's sort key is the int64 ``(ordered float32 bits << 32) | (2**32 - 1 - id)``,
so key descending is value descending, ties by ascending id; -0.0 is keyed as +0.0 (they are equal).
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRET: bool = bool(triton.knobs.runtime.interpret)

LOG2E = tl.constexpr(1.4426950408889634)
PAD = tl.constexpr(-(2**63))  # below the key of every finite or infinite float
LOW32 = tl.constexpr(2**32 - 1)
KEY_BIAS = tl.constexpr(32768)  # 16-bit order key + bias = unsigned bin in [0, 65536)


@triton.jit
def _ordered_bits(v):
    """int32 whose signed order is the order of float32 ``v`` (no NaN; -0.0 mapped to +0.0)."""
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _sort_keys(x, idx):
    """(int64 sort key, 16-bit order key as int32) of float32 ``x`` at local token ids ``idx``."""
    s = _ordered_bits(tl.where(x == 0.0, 0.0, x))
    key = (s.to(tl.int64) << 32) | (LOW32 - idx.to(tl.int64))
    return key, s >> 16


@triton.jit
def _decode(key, id_offset):
    """Float32 value and global int64 token id of sort keys."""
    s = (key >> 32).to(tl.int32)
    val = tl.where(s < 0, s ^ 0x7FFFFFFF, s).to(tl.float32, bitcast=True)
    return val, LOW32 - (key & LOW32) + id_offset


@triton.jit
def _top_desc(keys, K_P: tl.constexpr):
    """The ``K_P`` largest keys, sorted descending (tl.topk cannot return a single key)."""
    if K_P == 1:
        out = tl.zeros([1], tl.int64) + tl.max(keys, axis=0)
    else:
        out = tl.topk(keys, K_P)
    return out


@triton.jit
def _merge_desc(a, b, K_P: tl.constexpr):
    """Top ``K_P`` of two descending-sorted key vectors, sorted descending."""
    if K_P == 1:
        out = tl.maximum(a, b)
    else:
        out = tl.bitonic_merge(tl.maximum(a, tl.flip(b, 0)), descending=True)
    return out


@triton.jit(do_not_specialize=["S"])  # S changes with the row count; chunk stays a multiple of the tile
def stream_kernel(
    x_ptr, stride_row, V, M, chunk, S, gkey_ptr, part_ptr,
    TG: tl.constexpr, G: tl.constexpr, AHEAD: tl.constexpr,
):
    """Per (row, split): 16-bit order key of every group maximum, and the split's (max, sumexp).

    ``AHEAD``: each step issues the next tile's load before reducing its own (two tiles in flight
    per program instead of one)."""
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = x_ptr + r * stride_row
    g_ar = tl.arange(0, TG)
    e_ar = tl.arange(0, G)
    m_run = tl.full([TG], float("-inf"), tl.float32)
    s_run = tl.zeros([TG], tl.float32)
    tile_ar = g_ar[:, None] * G + e_ar[None, :]
    end = tl.minimum(p * chunk + chunk, V)
    if AHEAD:
        x_next = tl.load(row + p * chunk + tile_ar, mask=p * chunk + tile_ar < end, other=float("-inf"))
    # Every split runs the same trip count; steps past V are fully masked (no memory traffic).
    for t in range(0, chunk, TG * G):
        base = p * chunk + t
        if AHEAD:
            x = x_next.to(tl.float32)
            x_next = tl.load(row + base + TG * G + tile_ar, mask=base + TG * G + tile_ar < end, other=float("-inf"))
        else:
            x = tl.load(row + base + tile_ar, mask=base + tile_ar < V, other=float("-inf")).to(tl.float32)
        gmax = tl.max(x, axis=1)
        gi = base // G + g_ar
        tk = _ordered_bits(tl.where(gmax == 0.0, 0.0, gmax)) >> 16
        tl.store(gkey_ptr + r * M + gi, tk.to(tl.int16), mask=gi < M)
        # Online logsumexp per group lane: one exp2 per token, no cross-thread reduction.
        m_new = tl.maximum(m_run, gmax)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        terms = tl.exp2(x * LOG2E - (m_ref * LOG2E)[:, None])  # one FMA + one MUFU per token
        s_run = s_run * tl.exp2((m_run - m_ref) * LOG2E) + tl.sum(terms, axis=1)
        m_run = m_new
    m = tl.max(m_run, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_run * tl.exp2((m_run - m_ref) * LOG2E), axis=0)
    tl.store(part_ptr + (r * S + p) * 2, m)
    tl.store(part_ptr + (r * S + p) * 2 + 1, s)


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
def _count_reaching(gk_row, M, s0, s1, t, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr):
    """How many super keys (:func:`_supers` of ``R`` biased group keys) are >= ``t`` (>= 0).

    ``s0``: those of the first MB keys, -1 padded. With a tail (``MT > 0``) ``s1`` holds those of
    the keys from MB on and the two cover the row; without, blocks of MB keys past the head are
    loaded here.
    """
    n = tl.sum((s0 >= t).to(tl.int32), axis=0)
    if MT > 0:
        n += tl.sum((s1 >= t).to(tl.int32), axis=0)
    else:
        mo = tl.arange(0, MB)
        for c in range(MB, M, MB):
            n += tl.sum((_supers(_biased_keys(gk_row, c + mo, M), R) >= t).to(tl.int32), axis=0)
    return n


@triton.jit
def _key_range(gk_row, M, s0, s1, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr):
    """(smallest, largest + 1) of the super keys (padding excluded)."""
    lo = tl.min(tl.where(s0 >= 0, s0, 1 << 16), axis=0)
    hi = tl.max(s0, axis=0) + 1
    if MT > 0:
        lo = tl.minimum(lo, tl.min(tl.where(s1 >= 0, s1, 1 << 16), axis=0))
        hi = tl.maximum(hi, tl.max(s1, axis=0) + 1)
    else:
        mo = tl.arange(0, MB)
        for c in range(MB, M, MB):
            sc = _supers(_biased_keys(gk_row, c + mo, M), R)
            lo = tl.minimum(lo, tl.min(tl.where(sc >= 0, sc, 1 << 16), axis=0))
            hi = tl.maximum(hi, tl.max(sc, axis=0) + 1)
    return lo, hi


@triton.jit
def _threshold(gk_row, M, K, s0, s1, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr, UNROLL: tl.constexpr):
    """Largest biased 16-bit key ``tb`` that at least ``K`` super keys reach (0 if there are fewer
    than K super keys).

    Binary search over [lo, hi), lo the smallest super key (every one reaches it) and hi the
    largest + 1 (none does): ceil(log2(hi - lo)) counts over the keys held in registers (about 8
    on random rows) instead of 16, the loop unrolled ``UNROLL`` times.
    """
    lo, hi = _key_range(gk_row, M, s0, s1, MB, MT, R)
    lo = tl.where((M + R - 1) // R >= K, lo, 0)
    steps = tl.ceil(tl.log2((hi - lo).to(tl.float32))).to(tl.int32)
    for _ in tl.range(0, steps, loop_unroll_factor=UNROLL):
        mid = (lo + hi) // 2
        reach = _count_reaching(gk_row, M, s0, s1, mid, MB, MT, R) >= K
        lo = tl.where(reach, mid, lo)
        hi = tl.where(reach, hi, mid)
    return lo


@triton.jit
def _lse_and_threshold(gk_row, part_row, lse_at, M, S, K, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr,
                       UNROLL: tl.constexpr, SP: tl.constexpr):
    """Store one row's logsumexp at ``lse_at``; return its threshold ``tb`` and the group keys it
    was searched over (``u0``: the first MB, -1 padded; ``u1``: the tail tile, or ``u0`` when MT = 0)."""
    u0 = _biased_keys(gk_row, tl.arange(0, MB), M)
    u1 = u0
    if MT > 0:
        u1 = _biased_keys(gk_row, MB + tl.arange(0, MT), M)
    tl.store(lse_at, _merge_lse(part_row, S, SP))
    return _threshold(gk_row, M, K, _supers(u0, R), _supers(u1, R), MB, MT, R, UNROLL), u0, u1


@triton.jit
def _append_groups(gidx_row, gi, u, tb, nsel, CAP: tl.constexpr):
    """After the ``nsel`` listed groups, list those of ids ``gi`` whose keys ``u`` reach ``tb``
    (in order, list slots below CAP); return the new count."""
    sel = (u >= tb).to(tl.int32)
    pos = nsel + tl.cumsum(sel, axis=0) - 1
    tl.store(gidx_row + pos, gi, mask=(sel > 0) & (pos < CAP))
    return nsel + tl.sum(sel, axis=0)


@triton.jit
def _compact_groups(gk_row, gidx_row, M, tb, u0, u1, MB: tl.constexpr, MT: tl.constexpr, CAP: tl.constexpr):
    """Write the ids of groups whose key reaches ``tb`` (ascending, first CAP); return their count.

    Keys as in :func:`_count_reaching`: head ``u0``, then the tail ``u1`` or blocks loaded here.
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


@triton.jit
def _load_groups(row, V, gidx_row, j, nsel, G: tl.constexpr):
    """Token ids, validity and float32 logits ([len(j), G]) of the groups in list slots ``j``."""
    grp = tl.load(gidx_row + j, mask=j < nsel, other=0, cache_modifier=".cg")
    idx = grp[:, None] * G + tl.arange(0, G)[None, :]
    valid = (j < nsel)[:, None] & (idx < V)
    x = tl.load(row + idx, mask=valid, other=float("-inf"))
    return idx, valid, x.to(tl.float32)


@triton.jit
def _compact_candidates(row, V, tb, gidx_row, nsel, cand_row,
                        G: tl.constexpr, GT: tl.constexpr, CAP: tl.constexpr):
    """Write the sort keys of the tokens of the listed groups that reach ``tb``; return their count.

    Double-buffered: the next GT groups are loaded before this step's keys are compacted.
    """
    ga = tl.arange(0, GT)
    idx, valid, x = _load_groups(row, V, gidx_row, ga, nsel, G)
    ncand = nsel * 0
    for j0 in range(0, nsel, GT):
        idx_next, valid_next, x_next = _load_groups(row, V, gidx_row, j0 + GT + ga, nsel, G)
        key, tk = _sort_keys(x, idx)
        # slots per group (a prefix sum over GT counts), then within the group: no scan over GT * G
        c = (valid & (tk + KEY_BIAS >= tb)).to(tl.int32)
        per = tl.sum(c, axis=1)
        pos = (ncand + tl.cumsum(per, axis=0) - per)[:, None] + tl.cumsum(c, axis=1) - 1
        tl.store(cand_row + pos, key, mask=(c > 0) & (pos < CAP))
        ncand += tl.sum(per, axis=0)
        idx, valid, x = idx_next, valid_next, x_next
    return ncand


@triton.jit
def _top_keys(row, V, K, tb, cand_row, ncand, K_P: tl.constexpr, CAP: tl.constexpr):
    """Exact top-``K_P`` keys, descending (the first K are the answer).

    From the candidate buffer when it holds every candidate (``ncand <= CAP``: one sort); else
    the slow path, a running merge over the whole row in id order that sorts a tile only if one
    of its keys beats the current K-th best (so an all-equal row costs one sort).
    """
    ka = tl.arange(0, K_P)
    ca = tl.arange(0, CAP)
    in_buffer = ncand <= CAP
    state = tl.full([K_P], PAD, tl.int64)
    kth = tl.min(state, axis=0)
    for t in range(tl.where(in_buffer, 1, tl.cdiv(V, CAP))):
        if in_buffer:
            keys = tl.load(cand_row + ca, mask=ca < ncand, other=PAD, cache_modifier=".cg")
        else:
            idx = t * CAP + ca
            x = tl.load(row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
            key, tk = _sort_keys(x, idx)
            keys = tl.where((idx < V) & (tk + KEY_BIAS >= tb), key, PAD)
        if tl.max(keys, axis=0) > kth:
            top = _top_desc(keys, K_P)
            if in_buffer:
                state = top
            else:
                state = _merge_desc(state, top, K_P)
            kth = tl.sum(tl.where(ka == K - 1, state, 0), axis=0)
    return state


@triton.jit(do_not_specialize=["S"])
def select_kernel(
    x_ptr, stride_row, V, M, S, K, id_offset,
    gkey_ptr, part_ptr, gidx_ptr, cand_ptr, val_ptr, id_ptr, lse_ptr,
    MB: tl.constexpr, MT: tl.constexpr, G: tl.constexpr, GT: tl.constexpr,
    K_P: tl.constexpr, CAP: tl.constexpr, UNROLL: tl.constexpr, SP: tl.constexpr, R: tl.constexpr,
):
    """Per row: logsumexp, then the exact top-K (value desc, id asc) from the few candidates."""
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * stride_row
    gk_row = gkey_ptr + r * M
    tb, u0, u1 = _lse_and_threshold(gk_row, part_ptr + r * S * 2, lse_ptr + r, M, S, K, MB, MT, R, UNROLL, SP)
    gidx_row = gidx_ptr + r * CAP
    cand_row = cand_ptr + r * CAP
    nsel = _compact_groups(gk_row, gidx_row, M, tb, u0, u1, MB, MT, CAP)
    ncand = nsel + CAP  # > CAP: "overflow" unless the candidates are gathered below
    if nsel <= CAP:
        tl.debug_barrier()  # the group list was written by other threads of this program
        ncand = _compact_candidates(row, V, tb, gidx_row, nsel, cand_row, G, GT, CAP)
    tl.debug_barrier()  # the candidate keys too
    val, ids = _decode(_top_keys(row, V, K, tb, cand_row, ncand, K_P, CAP), id_offset)
    o = tl.arange(0, K_P)
    tl.store(val_ptr + r * K + o, val, mask=o < K)
    tl.store(id_ptr + r * K + o, ids, mask=o < K)


@triton.jit(do_not_specialize=["S"])
def threshold_kernel(
    M, S, K, gkey_ptr, part_ptr, gidx_ptr, state_ptr, lse_ptr,
    MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, UNROLL: tl.constexpr,
    SP: tl.constexpr,
):
    """Per row, the first half of the select: logsumexp, the threshold ``tb`` and the list of the
    groups that reach it; ``state_ptr[r]`` = (tb, groups listed, 0, 0) for ``gather_kernel``."""
    r = tl.program_id(0).to(tl.int64)
    gk_row = gkey_ptr + r * M
    tb, u0, u1 = _lse_and_threshold(gk_row, part_ptr + r * S * 2, lse_ptr + r, M, S, K, MB, MT, R, UNROLL, SP)
    nsel = _compact_groups(gk_row, gidx_ptr + r * CAP, M, tb, u0, u1, MB, MT, CAP)
    o = tl.arange(0, 4)
    tl.store(state_ptr + r * 4 + o, tl.where(o == 0, tb, tl.where(o == 1, nsel, 0)))


@triton.jit
def gather_kernel(
    x_ptr, stride_row, V, K, id_offset, gidx_ptr, state_ptr, cand_ptr, val_ptr, id_ptr,
    G: tl.constexpr, GT: tl.constexpr, K_P: tl.constexpr, CAP: tl.constexpr,
):
    """Per (row, slice of ``GT`` listed groups), the second half: the tokens of these groups that
    reach ``tb`` go to the row's candidate buffer (slots reserved with one atomic; their order
    does not matter, they are sorted), then the last of the row's programs to finish sorts the
    candidates (or, past ``CAP`` of them, takes the slow path) and writes the top K.

    Spreading a row's gather over programs shortens the select's critical path: one step of GT
    groups instead of a loop over every listed group. Ordering as in a split-K semaphore: a
    barrier, then one gpu-scope acq_rel atomic per program; the last reads the buffer from L2.
    """
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = x_ptr + r * stride_row
    st = state_ptr + r * 4
    tb = tl.load(st)
    nsel = tl.load(st + 1)
    gidx_row = gidx_ptr + r * CAP
    cand_row = cand_ptr + r * CAP
    if (nsel <= CAP) & (p * GT < nsel):
        idx, valid, x = _load_groups(row, V, gidx_row, p * GT + tl.arange(0, GT), nsel, G)
        key, tk = _sort_keys(x, idx)
        c = (valid & (tk + KEY_BIAS >= tb)).to(tl.int32)
        per = tl.sum(c, axis=1)
        base = tl.atomic_add(st + 2, tl.sum(per, axis=0), sem="relaxed")
        pos = (base + tl.cumsum(per, axis=0) - per)[:, None] + tl.cumsum(c, axis=1) - 1
        tl.store(cand_row + pos, key, mask=(c > 0) & (pos < CAP))
    tl.debug_barrier()
    if tl.atomic_add(st + 3, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
        tl.debug_barrier()
        ncand = tl.where(nsel <= CAP, tl.load(st + 2, cache_modifier=".cg"), CAP + 1)
        val, ids = _decode(_top_keys(row, V, K, tb, cand_row, ncand, K_P, CAP), id_offset)
        o = tl.arange(0, K_P)
        tl.store(val_ptr + r * K + o, val, mask=o < K)
        tl.store(id_ptr + r * K + o, ids, mask=o < K)
