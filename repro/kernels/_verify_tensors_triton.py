"""Triton kernel of ``repro.kernels.tree_build.verify_tensors_fused``: every verify tensor of a
batch of trees in one launch that writes each output byte once (imported lazily: needs triton)."""

import triton
import triton.language as tl

from repro.kernels._common_triton import request_rows


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
    b, t, r, real, row, tok = request_rows(tokens_ptr, N, RB)
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
