"""Triton kernel of ``repro.kernels.accept``: the walk and the whole commit of one request per program."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["table_stride"])
def accept_kernel(
    tokens_ptr, parents_ptr, target_ptr, prefix_ptr, table_ptr, table_rows_ptr, table_stride,
    index_out, len_out, bonus_out, emit_out, rows_out, pos_out, seq_out, slots_out,
    N: tl.constexpr, NP: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, HAS_TABLE: tl.constexpr,
):
    """Request b: follow the target's tokens from the root while one of the node's children holds
    it (siblings hold distinct tokens, so at most one does), then write the path, tau, the bonus,
    the emission, the path's verify rows and positions, prefix + tau and, with a slot table, the
    verify window reordered path first (the rest keep node order behind it)."""
    b = tl.program_id(0)
    node = tl.arange(0, NP)
    real = node < N
    token = tl.load(tokens_ptr + b * N + node, mask=real, other=-2)
    parent = tl.load(parents_ptr + b * N + node, mask=real, other=-2)
    k = tl.arange(0, WP)
    path = tl.where(k == 0, 0, -1)  # path[k]: the node at depth k
    after = tl.full([WP], -1, tl.int32)  # after[k] = path[k + 1]
    step = tl.full([NP], -1, tl.int32)  # step[i]: node i's place on the path (root 0), -1 off it
    step = tl.where(node == 0, 0, step)
    cur = tl.zeros([], tl.int64)
    tau = tl.full([], 1, tl.int32)
    for d in range(1, W):
        want = tl.load(target_ptr + b * N + cur)
        hit = (parent == cur) & (token == want) & (tau == d)  # the walk ended: no more hits
        child = tl.max(tl.where(hit, node, -1), 0)
        found = child >= 0
        step = tl.where(node == child, d, step)
        path = tl.where((k == d) & found, child, path)
        after = tl.where((k == d - 1) & found, child, after)
        cur = tl.where(found, child.to(tl.int64), cur)
        tau += found.to(tl.int32)
    bonus = tl.load(target_ptr + b * N + cur)
    live = k < tau
    prefix = tl.load(prefix_ptr + b)
    nxt = tl.load(tokens_ptr + b * N + tl.where(k + 1 < tau, after, 0))
    emit = tl.where(k + 1 < tau, nxt, tl.where(k + 1 == tau, bonus, 0))
    in_w = k < W
    tl.store(index_out + b * W + k, tl.where(live, path, -1).to(tl.int64), mask=in_w)
    tl.store(emit_out + b * W + k, emit, mask=in_w)
    tl.store(rows_out + b * W + k, (b * N + tl.where(live, path, 0)).to(tl.int64), mask=in_w)
    tl.store(pos_out + b * W + k, prefix.to(tl.int64) + k, mask=in_w)
    tl.store(len_out + b, tau)
    tl.store(bonus_out + b, bonus)
    tl.store(seq_out + b, prefix + tau.to(prefix.dtype))
    if HAS_TABLE:
        on = step >= 0
        behind = tl.cumsum(on.to(tl.int32), 0) - on.to(tl.int32)  # path nodes before node i
        place = tl.where(on, step, tau + node - behind)
        row = tl.load(table_rows_ptr + b).to(tl.int64)
        window = table_ptr + row * table_stride + prefix.to(tl.int64)
        slot = tl.load(window + node, mask=real)
        tl.debug_barrier()  # every slot of the window is read before any is rewritten
        tl.store(window + place, slot, mask=real)
        tl.store(slots_out + b * W + place, slot.to(tl.int64), mask=real & (place < W))

