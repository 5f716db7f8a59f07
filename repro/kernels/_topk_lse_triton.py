"""Triton kernels behind :func:`repro.kernels.topk_lse.topk_lse` (imported lazily: needs triton).

Two stages, one pass over the logits:

1. ``stream_kernel`` (grid rows x splits) reads each row once. Per group of ``G`` consecutive
   tokens it writes a 16-bit order key of the group's maximum, and per split the running
   (max, sum of exp) of the logsumexp.
2. ``select_kernel`` (grid rows) merges the lse partials, finds by a search over the super keys
   (the maximum of each set of ``R`` group keys; the group keys are held in registers: one tile of
   ``MB`` keys, or a head of ``MB`` plus a tail of ``MT`` when those two cover the row) that
   counts them against ``P`` pivots a round (a histogram: two rounds or three on random rows)
   the threshold ``tb`` that at least ``K`` super keys reach (so at least ``K`` groups and tokens
   do, and every top-K token does), re-reads only the groups that reach it (each group's maximum
   to the group's list slot, its few other tokens that reach tb after the list), and sorts those
   few candidates exactly. It is launched dependent on the stream (programmatic dependent launch:
   its programs start while the stream drains and wait for its results). A row with more
   candidates than ``CAP`` (ties, sorted rows) takes an exact slow path: a running top-K over the
   whole row in id order.
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
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

INTERPRET: bool = bool(triton.knobs.runtime.interpret)
PDL = tl.constexpr(not INTERPRET)  # programmatic dependent launch (sm_90+; inline PTX, so not interpreted)

LOG2E = tl.constexpr(1.4426950408889634)
PAD = tl.constexpr(-(2**63))  # below the key of every finite or infinite float
LOW32 = tl.constexpr(2**32 - 1)
KEY_BIAS = tl.constexpr(32768)  # 16-bit order key + bias = unsigned bin in [0, 65536)
INF_PAIR = tl.constexpr(-8323200)  # 0xFF80FF80: an int32 word of two bf16 -inf
SAME_PROGRAM = tl.constexpr("")  # load cache policy for data this program wrote (L1 is coherent within it
# after a barrier)
OTHER_PROGRAMS = tl.constexpr(".cg")  # for data other programs wrote: from L2, past this SM's L1


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
        out = tl.zeros([1], keys.dtype) + tl.max(keys, axis=0)
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


@triton.jit
def _tile_values(w, PAIRS: tl.constexpr):
    """Float32 values of a loaded tile as two halves ``(a, b)`` [TG, max(G / 2, 1)] (which token is
    in which half does not matter: the stream reduces whole groups).

    ``PAIRS``: ``w`` holds int32 words of two bf16 tokens each; float32 of a bf16 is its bits in the
    high half, so one shift or one AND per token (the generic ``.to(float32)`` of bf16 costs two)."""
    if PAIRS:
        a = (w << 16).to(tl.float32, bitcast=True)
        b = (w & -65536).to(tl.float32, bitcast=True)
    elif w.shape[1] == 1:  # groups of one token: b is empty (-inf)
        a = w.to(tl.float32)
        b = tl.full(a.shape, float("-inf"), tl.float32)
    else:
        a, b = tl.split(tl.reshape(w.to(tl.float32), [w.shape[0], w.shape[1] // 2, 2]))
    return a, b


@triton.jit
def _stream_step(w, gk_at, gi, M, m_run, s_a, s_b, PAIRS: tl.constexpr):
    """One tile: store its group keys at ``gk_at`` (ids ``gi``), update the online logsumexp state
    (``m_run`` per group lane, sums ``s_a`` / ``s_b`` per element: one FMA per token, no
    cross-thread reduction until the end)."""
    a, b = _tile_values(w, PAIRS)
    gmax = tl.max(tl.maximum(a, b), axis=1)
    tk = _ordered_bits(tl.where(gmax == 0.0, 0.0, gmax)) >> 16
    tl.store(gk_at, tk.to(tl.int16), mask=gi < M)
    m_new = tl.maximum(m_run, gmax)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    scale = tl.exp2((m_run - m_ref) * LOG2E)[:, None]
    shift = (m_ref * LOG2E)[:, None]
    s_a = s_a * scale + tl.exp2(a * LOG2E - shift)  # one FMA + one MUFU + one FMA per token
    s_b = s_b * scale + tl.exp2(b * LOG2E - shift)
    return m_new, s_a, s_b


@triton.jit(do_not_specialize=["S"])  # S changes with the row count; chunk stays a multiple of the tile
def stream_kernel(
    x_ptr, stride_row, V, M, chunk, S, gkey_ptr, part_ptr,
    TG: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr, PAIRS: tl.constexpr,
):
    """Per (row, split): 16-bit order key of every group maximum, and the split's (max, sumexp).

    The full tiles of the split load unmasked in a loop Triton software-pipelines ``STAGES`` deep
    (asynchronous copies through shared memory: several tiles in flight per program without
    holding them in registers); the partial last tile (if any) loads masked after it. ``PAIRS``
    (bf16, even V and row stride): the tile is loaded as int32 words of two tokens,
    :func:`_tile_values`. The select, launched dependent on this grid, may start once every
    program has started (programmatic dependent launch; it waits for this grid's results).
    """
    if PDL:
        gdc_launch_dependents()
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    w_g: tl.constexpr = G // 2 if PAIRS else G  # loaded elements per group
    half: tl.constexpr = max(G // 2, 1)  # elements per half tile row (_tile_values)
    w_t: tl.constexpr = TG * w_g  # per tile
    if PAIRS:
        row = x_ptr.to(tl.pointer_type(tl.int32)) + r * (stride_row // 2)
        start = p * (chunk // 2)
        end = tl.minimum(start + chunk // 2, V // 2)
        other = INF_PAIR
    else:
        row = x_ptr + r * stride_row
        start = p * chunk
        end = tl.minimum(start + chunk, V)
        other = float("-inf")
    g_ar = tl.arange(0, TG)
    tile_ar = g_ar[:, None] * w_g + tl.arange(0, w_g)[None, :]
    gk_row = gkey_ptr + r * M + start // w_g
    m_run = tl.full([TG], float("-inf"), tl.float32)
    s_a = tl.zeros([TG, half], tl.float32)
    s_b = tl.zeros([TG, half], tl.float32)
    full = (end - start) // w_t * w_t
    for t in tl.range(0, full, w_t, num_stages=STAGES):
        w = tl.load(row + start + t + tile_ar)
        gi = start // w_g + t // w_g + g_ar
        m_run, s_a, s_b = _stream_step(w, gk_row + t // w_g + g_ar, gi, M, m_run, s_a, s_b, PAIRS)
    if full < end - start:
        w = tl.load(row + start + full + tile_ar, mask=start + full + tile_ar < end, other=other)
        gi = start // w_g + full // w_g + g_ar
        m_run, s_a, s_b = _stream_step(w, gk_row + full // w_g + g_ar, gi, M, m_run, s_a, s_b, PAIRS)
    m = tl.max(m_run, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    scale = tl.exp2((m_run - m_ref) * LOG2E)[:, None]
    s = tl.sum(tl.sum(s_a * scale + s_b * scale, axis=1), axis=0)
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
def _lse_and_threshold(gk_row, part_row, lse_at, M, S, K, MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr,
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
def _compact_groups(gk_row, gidx_row, M, tb, u0, u1, MB: tl.constexpr, MT: tl.constexpr, CAP: tl.constexpr):
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


@triton.jit
def _load_groups(row, V, gidx_row, j, nsel, G: tl.constexpr, PAIRS: tl.constexpr, CACHE: tl.constexpr):
    """The groups in list slots ``j``: their ids [len(j)] and their tokens' float32 values as two
    halves, even and odd positions in the group ([len(j), max(G / 2, 1)]); -inf past V.
    ``PAIRS``: one int32 word holds both halves' bf16 tokens (one load). ``CACHE``: how to load
    the list (``SAME_PROGRAM`` or ``OTHER_PROGRAMS`` wrote it)."""
    grp = tl.load(gidx_row + j, mask=j < nsel, other=0, cache_modifier=CACHE)
    ia = grp[:, None] * G + 2 * tl.arange(0, max(G // 2, 1))[None, :]
    if PAIRS:
        xa, xb = _tile_values(tl.load(row.to(tl.pointer_type(tl.int32)) + ia // 2, mask=ia < V, other=INF_PAIR),
                              True)
    else:
        xa = tl.load(row + ia, mask=ia < V, other=float("-inf")).to(tl.float32)
        xb = tl.load(row + ia + 1, mask=(ia + 1 < V) & (G > 1), other=float("-inf")).to(tl.float32)
    return grp, xa, xb


@triton.jit
def _flip16(b):
    """float32 bits of a bf16 value <-> their order bits (the 16-bit order key in the high half, the
    low half kept); its own inverse."""
    return b ^ ((b >> 31) & 0x7FFF0000)


@triton.jit
def _ranked(x, grp, pos, G: tl.constexpr, PAIRS: tl.constexpr):
    """Rank keys of tokens at positions ``pos`` of groups ``grp``: a group's tokens in value order,
    ties by lower id, so a group's maximum is its top candidate and its second the next.

    ``PAIRS`` (bf16 values, low 16 bits 0): int32 ``(16-bit order key << 16) | (G - 1 - pos)``,
    one integer max per token. Else the int64 sort key itself."""
    if PAIRS:
        b = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 becomes +0.0, keyed alike
        out = _flip16(b) | (G - 1 - pos)
    else:
        out = _sort_keys(x, grp[:, None] * G + pos)[0]
    return out


@triton.jit
def _reaches(top, tb, PAIRS: tl.constexpr):
    """Whether rank keys ``top`` (:func:`_ranked`) are of tokens whose 16-bit key reaches ``tb``."""
    if PAIRS:
        out = top >= (tb - KEY_BIAS) << 16
    else:
        out = (top >> 48).to(tl.int32) + KEY_BIAS >= tb
    return out


@triton.jit
def _taken(PAIRS: tl.constexpr):
    """A rank key below every :func:`_ranked` one (bf16 -inf keeps its low 16 bits for the position)."""
    if PAIRS:
        out = tl.full([], -(2**31), tl.int32)
    else:
        out = tl.full([], PAD, tl.int64)
    return out


@triton.jit
def _sort_key_of(top, grp, G: tl.constexpr, PAIRS: tl.constexpr):
    """Sort key (local token id) of a group's rank key ``top`` from :func:`_ranked`."""
    if PAIRS:
        x = _flip16(top & -65536).to(tl.float32, bitcast=True)
        key = _sort_keys(x, grp * G + G - 1 - (top & 0xFFFF))[0]
    else:
        key = top
    return key


@triton.jit
def _cand_key(top, grp, j, G: tl.constexpr, CAP: tl.constexpr, PAIRS: tl.constexpr, KEY32: tl.constexpr):
    """The candidate-buffer key of the token with rank key ``top`` in the group ``grp`` at list slot
    ``j``. ``KEY32`` (bf16, CAP * G <= 2**15): int32 ``((16-bit key + 32768) * CAP + CAP - 1 - j) * G
    + G - 1 - position``: value descending, then list slot and position ascending, which is id
    ascending (the list holds groups in id order); :func:`_decode32` reads it back. Else the
    int64 sort key."""
    if KEY32:
        key = (((top >> 16) + KEY_BIAS) * CAP + CAP - 1 - j) * G + (top & (G - 1))
    else:
        key = _sort_key_of(top, grp, G, PAIRS)
    return key


@triton.jit
def _decode32(key, gidx_row, id_offset, G: tl.constexpr, CAP: tl.constexpr, CACHE: tl.constexpr):
    """Float32 value and global int64 token id of :func:`_cand_key` int32 keys (-1: padding)."""
    n = (key // (G * CAP) - KEY_BIAS) << 16
    slot = CAP - 1 - (key // G) % CAP
    grp = tl.load(gidx_row + slot, mask=key >= 0, other=0, cache_modifier=CACHE)
    ids = grp.to(tl.int64) * G + (G - 1 - key % G) + id_offset
    return _flip16(n).to(tl.float32, bitcast=True), ids


@triton.jit
def _drop_top(ca, cb, top, taken):
    """Mark each group's token of rank key ``top`` taken; return the halves and the next top."""
    ca = tl.where(ca == top[:, None], taken, ca)
    cb = tl.where(cb == top[:, None], taken, cb)
    return ca, cb, tl.max(tl.maximum(ca, cb), axis=1)


@triton.jit
def _gather_step(grp, xa, xb, tb, j, nsel, cand_row, extra_at, counter,
                 G: tl.constexpr, CAP: tl.constexpr, PAIRS: tl.constexpr, KEY32: tl.constexpr):
    """Candidates of the groups ``grp`` in list slots ``j``: each group's maximum (it reaches tb:
    that listed the group) to candidate slot ``j``; then, while any group's next token also
    reaches tb (ties, or a second large token: a few groups per row), those to slots from
    ``extra_at`` on (compacted; ``counter``: if not None, slots are reserved there with one atomic
    per round, for programs sharing a row). Returns how many extra slots were used.

    The common step costs a few integer ops per token and no scan across groups."""
    pos = 2 * tl.arange(0, max(G // 2, 1))[None, :]
    ca = _ranked(xa, grp, pos, G, PAIRS)
    cb = _ranked(xb, grp, pos + 1, G, PAIRS)
    live = j < nsel
    top = tl.max(tl.maximum(ca, cb), axis=1)
    tl.store(cand_row + j, _cand_key(top, grp, j, G, CAP, PAIRS, KEY32), mask=live)
    taken = _taken(PAIRS)  # below every rank key
    n_extra = nsel * 0
    ca, cb, top = _drop_top(ca, cb, top, taken)
    has = live & _reaches(top, tb, PAIRS) & (top != taken)
    more = tl.sum(has.to(tl.int32), axis=0)
    while more > 0:
        if counter is None:
            base = extra_at + n_extra
        else:
            base = extra_at + tl.atomic_add(counter, more, sem="relaxed")
        at = base + tl.cumsum(has.to(tl.int32), axis=0) - 1
        tl.store(cand_row + at, _cand_key(top, grp, j, G, CAP, PAIRS, KEY32), mask=has & (at < CAP))
        n_extra += more
        ca, cb, top = _drop_top(ca, cb, top, taken)
        has = has & _reaches(top, tb, PAIRS) & (top != taken)
        more = tl.sum(has.to(tl.int32), axis=0)
    return n_extra


@triton.jit
def _compact_candidates(row, V, tb, gidx_row, nsel, cand_row,
                        G: tl.constexpr, GT: tl.constexpr, CAP: tl.constexpr, PAIRS: tl.constexpr,
                        KEY32: tl.constexpr):
    """Write the sort keys of the tokens of the listed groups that reach ``tb``; return their count.

    Groups' maxima go to slots [0, nsel), the few others after them (:func:`_gather_step`).
    In one step when GT >= CAP; else double-buffered: the next GT groups are loaded before this
    step's keys are ranked.
    """
    ga = tl.arange(0, GT)
    grp, xa, xb = _load_groups(row, V, gidx_row, ga, nsel, G, PAIRS, SAME_PROGRAM)
    if GT >= CAP:  # one step holds every listed group (nsel <= CAP here)
        n_extra = _gather_step(grp, xa, xb, tb, ga, nsel, cand_row, nsel, None, G, CAP, PAIRS, KEY32)
    else:
        n_extra = nsel * 0
        for j0 in range(0, nsel, GT):
            grp_next, xa_next, xb_next = _load_groups(row, V, gidx_row, j0 + GT + ga, nsel, G, PAIRS,
                                                             SAME_PROGRAM)
            n_extra += _gather_step(grp, xa, xb, tb, j0 + ga, nsel, cand_row, nsel + n_extra, None, G, CAP, PAIRS,
                                    KEY32)
            grp, xa, xb = grp_next, xa_next, xb_next
    return nsel + n_extra


@triton.jit
def _row_tile_keys(row, V, tb, t, CAP: tl.constexpr):
    """Sort keys of the row's tokens [t * CAP, (t + 1) * CAP) that reach ``tb`` (PAD for the rest)."""
    idx = t * CAP + tl.arange(0, CAP)
    x = tl.load(row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
    key, tk = _sort_keys(x, idx)
    return tl.where((idx < V) & (tk + KEY_BIAS >= tb), key, PAD)


@triton.jit
def _top_keys(row, V, K, tb, cand_row, ncand, K_P: tl.constexpr, CAP: tl.constexpr, BUFFER: tl.constexpr,
              CACHE: tl.constexpr):
    """Exact top-``K_P`` int64 sort keys, descending (the first K are the answer).

    From the candidate buffer when it holds every candidate (``ncand <= CAP``; ``BUFFER``: it holds
    int64 sort keys): one sort. Else the slow path, a running merge over the whole row in id order
    that sorts a tile only if one of its keys beats the current K-th best (so an all-equal row
    costs one sort).
    """
    ka = tl.arange(0, K_P)
    in_buffer = (ncand <= CAP) & BUFFER
    state = tl.full([K_P], PAD, tl.int64)
    kth = tl.min(state, axis=0)
    for t in range(tl.where(in_buffer, 1, tl.cdiv(V, CAP))):
        if BUFFER:
            if in_buffer:
                keys = tl.load(cand_row + tl.arange(0, CAP), mask=tl.arange(0, CAP) < ncand, other=PAD,
                               cache_modifier=CACHE)
            else:
                keys = _row_tile_keys(row, V, tb, t, CAP)
        else:
            keys = _row_tile_keys(row, V, tb, t, CAP)
        if tl.max(keys, axis=0) > kth:
            top = _top_desc(keys, K_P)
            if in_buffer:
                state = top
            else:
                state = _merge_desc(state, top, K_P)
            kth = tl.sum(tl.where(ka == K - 1, state, 0), axis=0)
    return state


@triton.jit
def _top_candidates(row, V, K, tb, cand_row, gidx_row, ncand, id_offset, CACHE: tl.constexpr,
                    G: tl.constexpr, K_P: tl.constexpr, CAP: tl.constexpr, KEY32: tl.constexpr):
    """Values and global ids of the row's exact top ``K_P`` (the first K are the answer): one sort
    of the candidate buffer (int32 keys when ``KEY32``), or past ``CAP`` candidates the slow path.
    ``CACHE``: how to load the buffer and list (``SAME_PROGRAM`` or ``OTHER_PROGRAMS`` wrote them)."""
    if KEY32:
        if ncand <= CAP:
            ca = tl.arange(0, CAP)
            keys = tl.load(cand_row + ca, mask=ca < ncand, other=-1, cache_modifier=CACHE)
            val, ids = _decode32(_top_desc(keys, K_P), gidx_row, id_offset, G, CAP, CACHE)
        else:
            val, ids = _decode(_top_keys(row, V, K, tb, cand_row, ncand, K_P, CAP, False, CACHE), id_offset)
    else:
        val, ids = _decode(_top_keys(row, V, K, tb, cand_row, ncand, K_P, CAP, True, CACHE), id_offset)
    return val, ids


@triton.jit(do_not_specialize=["S"])
def select_kernel(
    x_ptr, stride_row, V, M, S, K, id_offset,
    gkey_ptr, part_ptr, gidx_ptr, cand_ptr, val_ptr, id_ptr, lse_ptr,
    MB: tl.constexpr, MT: tl.constexpr, G: tl.constexpr, GT: tl.constexpr,
    K_P: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr, SP: tl.constexpr, R: tl.constexpr,
    PAIRS: tl.constexpr, KEY32: tl.constexpr,
):
    """Per row: logsumexp, then the exact top-K (value desc, id asc) from the few candidates.
    ``PAIRS``: bf16 rows read as int32 words (see ``stream_kernel``); ``KEY32``: int32 candidate
    keys (:func:`_cand_key`)."""
    if PDL:
        gdc_wait()  # launched dependent on stream_kernel: its keys and partials are visible after this
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * stride_row
    gk_row = gkey_ptr + r * M
    tb, u0, u1 = _lse_and_threshold(gk_row, part_ptr + r * S * 2, lse_ptr + r, M, S, K, MB, MT, R, P, SP)
    gidx_row = gidx_ptr + r * CAP
    cand_row = cand_ptr + r * CAP
    nsel = _compact_groups(gk_row, gidx_row, M, tb, u0, u1, MB, MT, CAP)
    ncand = nsel + CAP  # > CAP: "overflow" unless the candidates are gathered below
    if nsel <= CAP:
        tl.debug_barrier()  # the group list was written by other threads of this program
        ncand = _compact_candidates(row, V, tb, gidx_row, nsel, cand_row, G, GT, CAP, PAIRS, KEY32)
    tl.debug_barrier()  # the candidate keys too
    val, ids = _top_candidates(row, V, K, tb, cand_row, gidx_row, ncand, id_offset, SAME_PROGRAM, G, K_P, CAP,
                               KEY32)
    o = tl.arange(0, K_P)
    tl.store(val_ptr + r * K + o, val, mask=o < K)
    tl.store(id_ptr + r * K + o, ids, mask=o < K)


@triton.jit(do_not_specialize=["S"])
def threshold_kernel(
    M, S, K, gkey_ptr, part_ptr, gidx_ptr, state_ptr, lse_ptr,
    MB: tl.constexpr, MT: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr, P: tl.constexpr,
    SP: tl.constexpr,
):
    """Per row, the first half of the select: logsumexp, the threshold ``tb`` and the list of the
    groups that reach it; ``state_ptr[r]`` = (tb, groups listed, 0, 0) for ``gather_kernel``."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    r = tl.program_id(0).to(tl.int64)
    gk_row = gkey_ptr + r * M
    tb, u0, u1 = _lse_and_threshold(gk_row, part_ptr + r * S * 2, lse_ptr + r, M, S, K, MB, MT, R, P, SP)
    nsel = _compact_groups(gk_row, gidx_ptr + r * CAP, M, tb, u0, u1, MB, MT, CAP)
    o = tl.arange(0, 4)
    tl.store(state_ptr + r * 4 + o, tl.where(o == 0, tb, tl.where(o == 1, nsel, 0)))


@triton.jit
def gather_kernel(
    x_ptr, stride_row, V, K, id_offset, gidx_ptr, state_ptr, cand_ptr, val_ptr, id_ptr,
    G: tl.constexpr, GT: tl.constexpr, K_P: tl.constexpr, CAP: tl.constexpr, PAIRS: tl.constexpr,
    KEY32: tl.constexpr,
):
    """Per (row, slice of ``GT`` listed groups), the second half: the tokens of these groups that
    reach ``tb`` go to the row's candidate buffer (:func:`_gather_step`: each group's maximum to
    its list slot, the few others after the list, slots reserved with one atomic per round; their
    order does not matter, they are sorted), then the last of the row's programs to finish sorts
    the candidates (or, past ``CAP`` of them, takes the slow path) and writes the top K.

    Spreading a row's gather over programs shortens the select's critical path: one step of GT
    groups instead of a loop over every listed group. Ordering as in a split-K semaphore: a
    barrier, then one gpu-scope acq_rel atomic per program; the last reads the buffer from L2.
    """
    if PDL:
        gdc_wait()  # launched dependent on threshold_kernel
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = x_ptr + r * stride_row
    st = state_ptr + r * 4
    tb = tl.load(st)
    nsel = tl.load(st + 1)
    gidx_row = gidx_ptr + r * CAP
    cand_row = cand_ptr + r * CAP
    if (nsel <= CAP) & (p * GT < nsel):
        j = p * GT + tl.arange(0, GT)
        grp, xa, xb = _load_groups(row, V, gidx_row, j, nsel, G, PAIRS, OTHER_PROGRAMS)
        _gather_step(grp, xa, xb, tb, j, nsel, cand_row, nsel, st + 2, G, CAP, PAIRS, KEY32)
    tl.debug_barrier()
    if tl.atomic_add(st + 3, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
        tl.debug_barrier()
        ncand = tl.where(nsel <= CAP, nsel + tl.load(st + 2, cache_modifier=OTHER_PROGRAMS), CAP + 1)
        val, ids = _top_candidates(row, V, K, tb, cand_row, gidx_row, ncand, id_offset, OTHER_PROGRAMS, G, K_P, CAP,
                                   KEY32)
        o = tl.arange(0, K_P)
        tl.store(val_ptr + r * K + o, val, mask=o < K)
        tl.store(id_ptr + r * K + o, ids, mask=o < K)
