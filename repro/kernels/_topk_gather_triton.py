"""Top-K stage 2, second half: the candidates of the listed groups and their exact sort (helpers
of ``_topk_select_triton``'s kernels).

The select re-reads only the groups that reach the threshold ``tb``: each group's maximum goes
to the group's list slot, its few other tokens that reach ``tb`` after the list. One sort of
those candidates gives the top K. A row with more candidates than ``CAP`` (ties, sorted rows)
takes an exact slow path: a running top-K over the whole row in id order, chunk by chunk, that
sorts only the tokens beating the current K-th best.

Exact order: a token's sort key is the int64 ``(ordered float32 bits << 32) | (2**32 - 1 - id)``,
so key descending is value descending, ties by ascending id; -0.0 is keyed as +0.0 (they are equal).
"""

from __future__ import annotations

import triton
import triton.language as tl

from repro.kernels._common_triton import (
    INF_PAIR,
    KEY_BIAS,
    SAME_PROGRAM,
    flip16,
    merge_desc,
    ordered_bits,
    tile_values,
    top_desc,
)

PAD = tl.constexpr(-(2**63))  # below the key of every finite or infinite float
LOW32 = tl.constexpr(2**32 - 1)


@triton.jit
def _sort_keys(x, idx):
    """(int64 sort key, 16-bit order key as int32) of float32 ``x`` at local token ids ``idx``."""
    s = ordered_bits(tl.where(x == 0.0, 0.0, x))
    key = (s.to(tl.int64) << 32) | (LOW32 - idx.to(tl.int64))
    return key, s >> 16


@triton.jit
def _decode(key, id_offset):
    """Float32 value and global int64 token id of sort keys."""
    s = (key >> 32).to(tl.int32)
    val = tl.where(s < 0, s ^ 0x7FFFFFFF, s).to(tl.float32, bitcast=True)
    return val, LOW32 - (key & LOW32) + id_offset


@triton.jit
def load_groups(row, V, gidx_row, j, nsel, G: tl.constexpr, PAIRS: tl.constexpr, CACHE: tl.constexpr):
    """The groups in list slots ``j``: their ids [len(j)] and their tokens' float32 values as two
    halves, even and odd positions in the group ([len(j), max(G / 2, 1)]); -inf past V.
    ``PAIRS``: one int32 word holds both halves' bf16 tokens (one load). ``CACHE``: how to load
    the list (``SAME_PROGRAM`` or ``OTHER_PROGRAMS`` wrote it)."""
    grp = tl.load(gidx_row + j, mask=j < nsel, other=0, cache_modifier=CACHE)
    ia = grp[:, None] * G + 2 * tl.arange(0, max(G // 2, 1))[None, :]
    if PAIRS:
        xa, xb = tile_values(tl.load(row.to(tl.pointer_type(tl.int32)) + ia // 2, mask=ia < V, other=INF_PAIR),
                             True)
    else:
        xa = tl.load(row + ia, mask=ia < V, other=float("-inf")).to(tl.float32)
        xb = tl.load(row + ia + 1, mask=(ia + 1 < V) & (G > 1), other=float("-inf")).to(tl.float32)
    return grp, xa, xb


@triton.jit
def _ranked(x, grp, pos, G: tl.constexpr, PAIRS: tl.constexpr):
    """Rank keys of tokens at positions ``pos`` of groups ``grp``: a group's tokens in value order,
    ties by lower id, so a group's maximum is its top candidate and its second the next.

    ``PAIRS`` (bf16 values, low 16 bits 0): int32 ``(16-bit order key << 16) | (G - 1 - pos)``,
    one integer max per token. Else the int64 sort key itself."""
    if PAIRS:
        b = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 becomes +0.0, keyed alike
        out = flip16(b) | (G - 1 - pos)
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
        x = flip16(top & -65536).to(tl.float32, bitcast=True)
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
    return flip16(n).to(tl.float32, bitcast=True), ids


@triton.jit
def _drop_top(ca, cb, top, taken):
    """Mark each group's token of rank key ``top`` taken; return the halves and the next top."""
    ca = tl.where(ca == top[:, None], taken, ca)
    cb = tl.where(cb == top[:, None], taken, cb)
    return ca, cb, tl.max(tl.maximum(ca, cb), axis=1)


@triton.jit
def gather_step(grp, xa, xb, tb, j, nsel, cand_row, extra_at, counter,
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
def compact_candidates(row, V, tb, gidx_row, nsel, cand_row,
                       G: tl.constexpr, GT: tl.constexpr, CAP: tl.constexpr, PAIRS: tl.constexpr,
                       KEY32: tl.constexpr):
    """Write the sort keys of the tokens of the listed groups that reach ``tb``; return their count.

    Groups' maxima go to slots [0, nsel), the few others after them (:func:`gather_step`).
    In one step when GT >= CAP; else double-buffered: the next GT groups are loaded before this
    step's keys are ranked.
    """
    ga = tl.arange(0, GT)
    grp, xa, xb = load_groups(row, V, gidx_row, ga, nsel, G, PAIRS, SAME_PROGRAM)
    if GT >= CAP:  # one step holds every listed group (nsel <= CAP here)
        n_extra = gather_step(grp, xa, xb, tb, ga, nsel, cand_row, nsel, None, G, CAP, PAIRS, KEY32)
    else:
        n_extra = nsel * 0
        for j0 in range(0, nsel, GT):
            grp_next, xa_next, xb_next = load_groups(row, V, gidx_row, j0 + GT + ga, nsel, G, PAIRS, SAME_PROGRAM)
            n_extra += gather_step(grp, xa, xb, tb, j0 + ga, nsel, cand_row, nsel + n_extra, None, G, CAP, PAIRS,
                                   KEY32)
            grp, xa, xb = grp_next, xa_next, xb_next
    return nsel + n_extra


@triton.jit
def _chunk_keys(row, V, tb, idx):
    """Sort keys of the row's tokens ``idx`` that reach ``tb`` (PAD for the rest and past V)."""
    x = tl.load(row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
    key, tk = _sort_keys(x, idx)
    return tl.where((idx < V) & (tk + KEY_BIAS >= tb), key, PAD)


@triton.jit
def _scan_top_keys(row, V, K, tb, scratch, K_P: tl.constexpr, CAP: tl.constexpr, SC: tl.constexpr):
    """The slow path: exact top-``K_P`` sort keys of the whole row, descending, by a running
    merge over chunks of ``SC`` tokens in id order. A chunk costs one load and a count of its
    tokens that beat the current K-th best; only those are sorted, at most ``CAP`` at a time:
    their ids compacted into ``scratch`` (the row's candidate buffer, unused on this path), their
    keys read back and merged. So a row of ties costs a load per chunk and a few sorts, not a
    sort per ``CAP`` tokens."""
    ka = tl.arange(0, K_P)
    ca = tl.arange(0, CAP)
    state = tl.full([K_P], PAD, tl.int64)
    kth = tl.min(state, axis=0)
    for c in range(tl.cdiv(V, SC)):
        idx = c * SC + tl.arange(0, SC)
        beat = _chunk_keys(row, V, tb, idx) > kth
        n = tl.sum(beat.to(tl.int32), axis=0)
        while n > 0:
            at = tl.cumsum(beat.to(tl.int32), axis=0) - 1
            take = beat & (at < CAP)
            tl.debug_barrier()  # the last pass has read the buffer
            tl.store(scratch + at, idx, mask=take)
            tl.debug_barrier()  # written by other threads of this program
            ids = tl.load(scratch + ca, mask=ca < n, other=0, cache_modifier=SAME_PROGRAM)
            keys = tl.where(ca < n, _chunk_keys(row, V, tb, ids), PAD)
            state = merge_desc(state, top_desc(keys, K_P), K_P)
            kth = tl.sum(tl.where(ka == K - 1, state, 0), axis=0)
            beat = beat & ~take & (_chunk_keys(row, V, tb, idx) > kth)
            n = tl.sum(beat.to(tl.int32), axis=0)
    return state


@triton.jit
def _top_keys(row, V, K, tb, cand_row, ncand, K_P: tl.constexpr, CAP: tl.constexpr, SC: tl.constexpr,
              CACHE: tl.constexpr):
    """Exact top-``K_P`` int64 sort keys, descending (the first K are the answer): one sort of the
    candidate buffer of int64 sort keys when it holds every candidate (``ncand <= CAP``), else
    :func:`_scan_top_keys`."""
    if ncand <= CAP:
        keys = tl.load(cand_row + tl.arange(0, CAP), mask=tl.arange(0, CAP) < ncand, other=PAD, cache_modifier=CACHE)
        state = top_desc(keys, K_P)
    else:
        state = _scan_top_keys(row, V, K, tb, cand_row, K_P, CAP, SC)
    return state


@triton.jit
def top_candidates(row, V, K, tb, cand_row, gidx_row, ncand, id_offset, CACHE: tl.constexpr,
                   G: tl.constexpr, K_P: tl.constexpr, CAP: tl.constexpr, SC: tl.constexpr, KEY32: tl.constexpr):
    """Values and global ids of the row's exact top ``K_P`` (the first K are the answer): one sort
    of the candidate buffer (int32 keys when ``KEY32``), or past ``CAP`` candidates the slow path
    (:func:`_scan_top_keys`, chunks of ``SC`` tokens). ``CACHE``: how to load the buffer and list
    (``SAME_PROGRAM`` or ``OTHER_PROGRAMS`` wrote them)."""
    if KEY32:
        if ncand <= CAP:
            ca = tl.arange(0, CAP)
            keys = tl.load(cand_row + ca, mask=ca < ncand, other=-1, cache_modifier=CACHE)
            val, ids = _decode32(top_desc(keys, K_P), gidx_row, id_offset, G, CAP, CACHE)
        else:
            val, ids = _decode(_scan_top_keys(row, V, K, tb, cand_row, K_P, CAP, SC), id_offset)
    else:
        val, ids = _decode(_top_keys(row, V, K, tb, cand_row, ncand, K_P, CAP, SC, CACHE), id_offset)
    return val, ids
