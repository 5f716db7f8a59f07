"""Triton kernel of ``repro.kernels.tree_build.tree_inputs_fused``: a serving verify's inputs."""

import triton
import triton.language as tl

from repro.kernels._common_triton import request_rows


@triton.jit(do_not_specialize=["hops"])  # one compile for every batch size (the grid carries it)
def tree_inputs_kernel(
    tokens_ptr, parents_ptr, depths_ptr, lens_ptr, hops, pad_token, ids_out, pos_out, mask_out,
    N: tl.constexpr, NP: tl.constexpr, RB: tl.constexpr, CHUNK: tl.constexpr,
):
    """Rows [t*RB, (t+1)*RB) of request b: input ids, positions (prefix + depth) and the rows'
    ancestor block of the flat FULL mask, built in registers (a row's own column, then one
    column per hop up its ancestors) and stored once; the prefix columns are not touched."""
    b, _, r, real, row, tok = request_rows(tokens_ptr, N, RB)
    s = tl.load(lens_ptr + b).to(tl.int64)
    tl.store(ids_out + row, tl.where(tok == -1, pad_token, tok), mask=real)
    tl.store(pos_out + row, s + tl.load(depths_ptr + row, mask=real, other=0), mask=real)

    start = tl.zeros([], tl.int64)  # request b's rows start after every earlier request's N*(S+N)
    for c0 in range(0, b, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        lens = tl.load(lens_ptr + c, mask=c < b, other=0).to(tl.int64)
        start += tl.sum(tl.where(c < b, N * (lens + N), 0), 0)
    col = tl.arange(0, NP)[None, :]
    cur = r.to(tl.int64)
    anc = col == cur[:, None]
    for _ in range(hops):  # depth <= min(L, B): that many hops reach the root
        cur = tl.load(parents_ptr + b * N + cur, mask=real & (cur >= 0), other=-1)
        anc = anc | (col == cur[:, None])
    offset = start + r.to(tl.int64) * (s + N) + s
    tl.store(mask_out + offset[:, None] + col, anc.to(mask_out.dtype.element_ty), mask=real[:, None] & (col < N))
