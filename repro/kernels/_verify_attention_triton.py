"""Triton kernels of ``repro.kernels.verify_attention`` (split-KV attention of a verify forward).

``split_kernel``: grid (requests, KV heads, query tiles x (NSPLIT + 1)). A query tile packs the
G query heads that share one KV head (row r is query r // G, head r % G), so each K/V block is
loaded once for all of them. Splits 0..NSPLIT-1 each take one slice of the request's cached prefix
(every draft token sees the whole prefix: no mask); split NSPLIT takes the draft tokens' own keys
under the tree mask (SGLang's full-mask layout: row q of request b at ``mask_indptr[b] + q *
(prefix + q_len) + prefix``) or, without one, causally. Each writes its normalised partial output
and its log2-sum-exp. ``combine_kernel`` merges a (token, head)'s NSPLIT + 1 partials.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _attend(q, k, v, ok, m_i, l_i, acc, qk_scale):
    """One key block into the running softmax: ``ok`` [rows, keys] marks the keys a row sees."""
    s = tl.where(ok, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _pool_slots(at, ok, OFFS32: tl.constexpr):
    """Pool slots of keys ``at``, as int32 where the pool's element offsets fit (cheaper address
    arithmetic in the prefix loop: fewer registers and instructions a step), else int64."""
    slot = tl.load(at, mask=ok, other=0)
    if OFFS32:
        slot = slot.to(tl.int32)
    else:
        slot = slot.to(tl.int64)
    return slot


@triton.jit
def _store_partial(o_ptrs, lse_ptrs, acc, m_i, l_i, row_ok):
    """A slice's normalised output and its log2-sum-exp (-inf where a row saw no key)."""
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(o_ptrs, acc / l_safe[:, None], mask=row_ok[:, None])
    tl.store(lse_ptrs, tl.where(seen, m_i + tl.log2(l_safe), float("-inf")), mask=row_ok)


@triton.jit
def split_kernel(
    Q, K_ext, V_ext, K_buf, V_buf, qo_indptr, kv_indptr, kv_indices, Mask, mask_indptr, O_part, L_part,
    qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_bkt, stride_bkh, stride_bvt, stride_bvh,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    G: tl.constexpr, NSPLIT: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, USE_MASK: tl.constexpr,
    OFFS32: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    m_tile = tl.program_id(2) // (NSPLIT + 1)
    split = tl.program_id(2) % (NSPLIT + 1)
    q_start = tl.load(qo_indptr + b).to(tl.int32)  # int32 or int64 in SGLang: one type for the loops
    q_len = tl.load(qo_indptr + b + 1).to(tl.int32) - q_start
    if m_tile * BLOCK_M >= q_len * G:
        return
    kv_start = tl.load(kv_indptr + b).to(tl.int32)
    prefix = tl.load(kv_indptr + b + 1).to(tl.int32) - kv_start

    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = rows // G
    head = kvh * G + rows % G
    row_ok = qi < q_len
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + (q_start + qi)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    if split < NSPLIT:  # a slice of the cached prefix, whole blocks of BLOCK_N
        chunk = tl.cdiv(tl.cdiv(prefix, NSPLIT), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, prefix)
        for n in range(lo, hi, BLOCK_N):
            cols = n + offs_n
            col_ok = cols < hi
            slot = _pool_slots(kv_indices + kv_start + cols, col_ok, OFFS32)
            k = tl.load(K_buf + slot[:, None] * stride_bkt + kvh * stride_bkh + offs_d[None, :],
                        mask=col_ok[:, None], other=0.0)
            v = tl.load(V_buf + slot[:, None] * stride_bvt + kvh * stride_bvh + offs_dv[None, :],
                        mask=col_ok[:, None], other=0.0)
            m_i, l_i, acc = _attend(q, k, v, col_ok[None, :], m_i, l_i, acc, qk_scale)
    else:  # the draft tokens' own keys: the tree mask, or causal
        mask_row = 0
        if USE_MASK:
            mask_row = tl.load(mask_indptr + b) + qi.to(tl.int64) * (prefix + q_len) + prefix
        offs_t = tl.arange(0, BLOCK_T)
        for n in range(0, q_len, BLOCK_T):
            cols = n + offs_t
            col_ok = cols < q_len
            ok = row_ok[:, None] & col_ok[None, :]
            if USE_MASK:
                bits = tl.load(Mask + mask_row[:, None] + cols[None, :], mask=ok, other=0)
                ok = ok & (bits != 0)
            else:
                ok = ok & (cols[None, :] <= qi[:, None])
            k = tl.load(K_ext + (q_start + cols)[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                        mask=col_ok[:, None], other=0.0)
            v = tl.load(V_ext + (q_start + cols)[:, None] * stride_vt + kvh * stride_vh + offs_dv[None, :],
                        mask=col_ok[:, None], other=0.0)
            m_i, l_i, acc = _attend(q, k, v, ok, m_i, l_i, acc, qk_scale)
    tok = (q_start + qi).to(tl.int64)
    _store_partial(O_part + tok[:, None] * stride_pt + head[:, None] * stride_ph + split * stride_ps + offs_dv[None, :],
                   L_part + tok * stride_lt + head * stride_lh + split, acc, m_i, l_i, row_ok)


@triton.jit
def combine_kernel(
    O_part, L_part, Out,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
    PARTS: tl.constexpr, PARTS_P2: tl.constexpr, DV: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    parts = tl.arange(0, PARTS_P2)
    ok = parts < PARTS
    offs_dv = tl.arange(0, DV)
    lse = tl.load(L_part + t * stride_lt + h * stride_lh + parts, mask=ok, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    o = tl.load(O_part + t * stride_pt + h * stride_ph + parts[:, None] * stride_ps + offs_dv[None, :],
                mask=ok[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + t * stride_ot + h * stride_oh + offs_dv, out.to(Out.dtype.element_ty))
