"""Triton kernels behind :func:`repro.kernels.topk_lse.topk_lse` (imported lazily: needs triton).

Two launches, one pass over the logits:

1. ``stream_kernel`` (grid rows × splits) reads each row once. Per group of ``G`` consecutive
   tokens it writes a 16-bit order key of the group's maximum, and per split the running
   (max, sum of exp) of the logsumexp.
2. ``select_kernel`` (grid rows) merges the lse partials, finds by a two-byte radix select over the
   group keys a threshold ``tb`` that at least ``K`` groups reach (so at least ``K`` tokens do, and
   every top-K token does), re-reads only the groups that reach it, compacts the tokens that reach
   it, and sorts those few candidates exactly. A row with more candidates than ``CAP`` (ties,
   sorted rows) takes an exact slow path: a running top-K over the whole row in id order.

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


@triton.jit
def stream_kernel(
    x_ptr, stride_row, V, M, chunk, S, gkey_ptr, part_ptr,
    TG: tl.constexpr, G: tl.constexpr,
):
    """Per (row, split): 16-bit order key of every group maximum, and the split's (max, sumexp)."""
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = x_ptr + r * stride_row
    g_ar = tl.arange(0, TG)
    e_ar = tl.arange(0, G)
    m_run = tl.full([TG], float("-inf"), tl.float32)
    s_run = tl.zeros([TG], tl.float32)
    # Every split runs the same trip count; steps past V are fully masked (no memory traffic).
    for t in range(0, chunk, TG * G):
        base = p * chunk + t
        idx = base + g_ar[:, None] * G + e_ar[None, :]
        x = tl.load(row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        gmax = tl.max(x, axis=1)
        gi = base // G + g_ar
        tk = _ordered_bits(tl.where(gmax == 0.0, 0.0, gmax)) >> 16
        tl.store(gkey_ptr + r * M + gi, tk.to(tl.int16), mask=gi < M)
        # Online logsumexp per group lane: one exp2 per token, no cross-thread reduction.
        m_new = tl.maximum(m_run, gmax)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        terms = tl.exp2((x - m_ref[:, None]) * LOG2E)
        s_run = s_run * tl.exp2((m_run - m_ref) * LOG2E) + tl.sum(terms, axis=1)
        m_run = m_new
    m = tl.max(m_run, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_run * tl.exp2((m_run - m_ref) * LOG2E), axis=0)
    tl.store(part_ptr + (r * S + p) * 2, m)
    tl.store(part_ptr + (r * S + p) * 2 + 1, s)


@triton.jit
def _byte_histogram(gk_row, M, u0, v0, hi, LOW: tl.constexpr, MB: tl.constexpr):
    """256-bin histogram of the high byte (or, for keys whose high byte is ``hi``, the low byte).

    ``u0``/``v0``: the first ``MB`` biased group keys and their validity, already in registers.
    """
    if LOW:
        hist = tl.histogram(u0 & 255, 256, mask=v0 & ((u0 >> 8) == hi))
    else:
        hist = tl.histogram(u0 >> 8, 256, mask=v0)
    mo = tl.arange(0, MB)
    for c in range(MB, M, MB):
        gi = c + mo
        v = gi < M
        u = tl.load(gk_row + gi, mask=v, other=0).to(tl.int32) + KEY_BIAS
        if LOW:
            hist += tl.histogram(u & 255, 256, mask=v & ((u >> 8) == hi))
        else:
            hist += tl.histogram(u >> 8, 256, mask=v)
    return hist


@triton.jit
def _threshold(gk_row, M, K, u0, v0, MB: tl.constexpr):
    """Largest biased 16-bit key ``tb`` that at least ``K`` group keys reach (0 if fewer than K)."""
    b_ar = tl.arange(0, 256)
    hist = _byte_histogram(gk_row, M, u0, v0, 0, False, MB)
    reach = tl.cumsum(hist, axis=0, reverse=True)
    hi = tl.max(tl.where(reach >= K, b_ar, 0), axis=0)
    above = tl.sum(tl.where(b_ar > hi, hist, 0), axis=0)
    hist = _byte_histogram(gk_row, M, u0, v0, hi, True, MB)
    reach = tl.cumsum(hist, axis=0, reverse=True) + above
    lo = tl.max(tl.where(reach >= K, b_ar, 0), axis=0)
    return hi * 256 + lo


@triton.jit
def _compact_groups(gk_row, gidx_row, M, tb, u0, v0, MB: tl.constexpr, CAP: tl.constexpr):
    """Write the ids of groups whose key reaches ``tb`` (ascending, first CAP); return their count."""
    mo = tl.arange(0, MB)
    sel = (v0 & (u0 >= tb)).to(tl.int32)
    pos = tl.cumsum(sel, axis=0) - 1
    tl.store(gidx_row + pos, mo, mask=(sel > 0) & (pos < CAP))
    nsel = tl.sum(sel, axis=0)
    for c in range(MB, M, MB):
        gi = c + mo
        v = gi < M
        u = tl.load(gk_row + gi, mask=v, other=0).to(tl.int32) + KEY_BIAS
        sel = (v & (u >= tb)).to(tl.int32)
        pos = nsel + tl.cumsum(sel, axis=0) - 1
        tl.store(gidx_row + pos, gi, mask=(sel > 0) & (pos < CAP))
        nsel += tl.sum(sel, axis=0)
    return nsel


@triton.jit
def _compact_candidates(row, V, tb, gidx_row, nsel, cand_row,
                        G: tl.constexpr, GT: tl.constexpr, CAP: tl.constexpr):
    """Write the sort keys of the tokens of the listed groups that reach ``tb``; return their count."""
    ga = tl.arange(0, GT)
    ea = tl.arange(0, G)
    ncand = nsel * 0
    for j0 in range(0, nsel, GT):
        j = j0 + ga
        jm = j < nsel
        grp = tl.load(gidx_row + j, mask=jm, other=0, cache_modifier=".cg")
        idx = grp[:, None] * G + ea[None, :]
        lm = jm[:, None] & (idx < V)
        x = tl.load(row + idx, mask=lm, other=float("-inf")).to(tl.float32)
        key, tk = _sort_keys(x, idx)
        c = tl.reshape((lm & (tk + KEY_BIAS >= tb)).to(tl.int32), [GT * G])
        pos = ncand + tl.cumsum(c, axis=0) - 1
        tl.store(cand_row + pos, tl.reshape(key, [GT * G]), mask=(c > 0) & (pos < CAP))
        ncand += tl.sum(c, axis=0)
    return ncand


@triton.jit
def _scan_row(row, V, K, tb, K_P: tl.constexpr, CAP: tl.constexpr):
    """Exact top-``K_P`` keys (first K exact) by a running merge over the row in id order.

    Slow path for rows whose candidates overflow CAP. A tile is merged only if one of its keys
    beats the current K-th best, so an all-equal row costs one merge.
    """
    ka = tl.arange(0, K_P)
    ca = tl.arange(0, CAP)
    state = tl.full([K_P], PAD, tl.int64)
    kth = tl.min(state, axis=0)
    for c0 in range(0, V, CAP):
        idx = c0 + ca
        lm = idx < V
        x = tl.load(row + idx, mask=lm, other=float("-inf")).to(tl.float32)
        key, tk = _sort_keys(x, idx)
        key = tl.where(lm & (tk + KEY_BIAS >= tb), key, PAD)
        if tl.max(key, axis=0) > kth:
            state = _merge_desc(state, _top_desc(key, K_P), K_P)
            kth = tl.sum(tl.where(ka == K - 1, state, 0), axis=0)
    return state


@triton.jit
def select_kernel(
    x_ptr, stride_row, V, M, S, K, id_offset,
    gkey_ptr, part_ptr, gidx_ptr, cand_ptr, val_ptr, id_ptr, lse_ptr,
    S_P: tl.constexpr, MB: tl.constexpr, G: tl.constexpr, GT: tl.constexpr,
    K_P: tl.constexpr, CAP: tl.constexpr,
):
    """Per row: logsumexp, then the exact top-K (value desc, id asc) from the few candidates."""
    r = tl.program_id(0).to(tl.int64)
    row = x_ptr + r * stride_row

    so = tl.arange(0, S_P)
    ms = tl.load(part_ptr + (r * S + so) * 2, mask=so < S, other=float("-inf"))
    ss = tl.load(part_ptr + (r * S + so) * 2 + 1, mask=so < S, other=0.0)
    m = tl.max(ms, axis=0)
    tl.store(lse_ptr + r, m + tl.log(tl.sum(ss * tl.exp2((ms - m) * LOG2E), axis=0)))

    gk_row = gkey_ptr + r * M
    mo = tl.arange(0, MB)
    v0 = mo < M
    u0 = tl.load(gk_row + mo, mask=v0, other=0).to(tl.int32) + KEY_BIAS
    tb = _threshold(gk_row, M, K, u0, v0, MB)

    gidx_row = gidx_ptr + r * CAP
    cand_row = cand_ptr + r * CAP
    nsel = _compact_groups(gk_row, gidx_row, M, tb, u0, v0, MB, CAP)
    ncand = nsel + CAP  # > CAP: "overflow" unless the candidates are gathered below
    if nsel <= CAP:
        tl.debug_barrier()  # the group list was written by other threads of this program
        ncand = _compact_candidates(row, V, tb, gidx_row, nsel, cand_row, G, GT, CAP)
    if ncand <= CAP:
        tl.debug_barrier()
        ca = tl.arange(0, CAP)
        keys = tl.load(cand_row + ca, mask=ca < ncand, other=PAD, cache_modifier=".cg")
        top = _top_desc(keys, K_P)
    else:
        top = _scan_row(row, V, K, tb, K_P, CAP)

    val, ids = _decode(top, id_offset)
    o = tl.arange(0, K_P)
    tl.store(val_ptr + r * K + o, val, mask=o < K)
    tl.store(id_ptr + r * K + o, ids, mask=o < K)
