"""Triton helpers the kernel modules share (imported lazily: needs triton).

Order-preserving keys (the signed int32 order of float32 bits, bf16 pairs, rank-tuple codes),
bitonic top-k over a single key, the tree kernels' bitonic selection over (score, code, index)
triples, and the rows a verify-input program owns.
"""

from __future__ import annotations

import triton
import triton.language as tl

INTERPRET: bool = bool(triton.knobs.runtime.interpret)
PDL = tl.constexpr(not INTERPRET)  # programmatic dependent launch (sm_90+; inline PTX, so not interpreted)

LOG2E = tl.constexpr(1.4426950408889634)
KEY_BIAS = tl.constexpr(32768)  # 16-bit order key + bias = unsigned bin in [0, 65536)
INF_PAIR = tl.constexpr(-8323200)  # 0xFF80FF80: an int32 word of two bf16 -inf
SAME_PROGRAM = tl.constexpr("")  # load cache policy for data this program wrote (L1 is coherent within it
# after a barrier)
OTHER_PROGRAMS = tl.constexpr(".cg")  # for data other programs wrote: from L2, past this SM's L1
INT64_MAX = tl.constexpr(9223372036854775807)


@triton.jit
def ordered_bits(v):
    """int32 whose signed order is the order of float32 ``v`` (no NaN; -0.0 mapped to +0.0)."""
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def flip16(b):
    """float32 bits of a bf16 value <-> their order bits (the 16-bit order key in the high half, the
    low half kept); its own inverse."""
    return b ^ ((b >> 31) & 0x7FFF0000)


@triton.jit
def tile_values(w, PAIRS: tl.constexpr):
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
def top_desc(keys, K_P: tl.constexpr):
    """The ``K_P`` largest keys, sorted descending (tl.topk cannot return a single key)."""
    if K_P == 1:
        out = tl.zeros([1], keys.dtype) + tl.max(keys, axis=0)
    else:
        out = tl.topk(keys, K_P)
    return out


@triton.jit
def merge_desc(a, b, K_P: tl.constexpr):
    """Top ``K_P`` of two descending-sorted key vectors, sorted descending."""
    if K_P == 1:
        out = tl.maximum(a, b)
    else:
        out = tl.bitonic_merge(tl.maximum(a, tl.flip(b, 0)), descending=True)
    return out


@triton.jit
def rank_code(n):
    """(code, bits) of n = rank + 1: '1', m ones, '0', n's m low bits (as ``_rank_code`` of repro/ddtree/tree.py)."""
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
def best(score, lex, idx, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
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
def merge_best(s1, l1, i1, s2, l2, i2, LOG_F: tl.constexpr):
    """The best 2**LOG_F of two best-first lists of that length, best first (bitonic merge)."""
    f: tl.constexpr = 1 << LOG_F
    s, lx, i = _keep_better(s1, l1, i1, tl.flip(s2, 0), tl.flip(l2, 0), tl.flip(i2, 0))
    s, lx, i = _merge(tl.reshape(s, [2] * LOG_F), tl.reshape(lx, [2] * LOG_F), tl.reshape(i, [2] * LOG_F), LOG_F, False)
    return tl.reshape(s, [f]), tl.reshape(lx, [f]), tl.reshape(i, [f])


@triton.jit
def request_rows(tokens_ptr, N: tl.constexpr, RB: tl.constexpr):
    """Program (b, t)'s rows [t*RB, (t+1)*RB) of request b's N tree nodes: (b, t, r, real, row,
    tok), ``real`` marking the rows below N, ``row`` their flat index, ``tok`` their tokens (-1 past N)."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    r = t * RB + tl.arange(0, RB)
    real = r < N
    row = b * N + r
    return b, t, r, real, row, tl.load(tokens_ptr + row, mask=real, other=-1)
