"""Top-K stage 1, ``stream_kernel`` (grid rows x splits): the one read of the logits.

Per group of ``G`` consecutive tokens it writes a 16-bit order key of the group's maximum, and
per split the running (max, sum of exp) of the logsumexp; the select kernels
(``_topk_select_triton``) read both.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from repro.kernels._common_triton import INF_PAIR, LOG2E, PDL, ordered_bits, tile_values


@triton.jit
def _stream_step(w, gk_at, gi, M, m_run, s_a, s_b, PAIRS: tl.constexpr):
    """One tile: store its group keys at ``gk_at`` (ids ``gi``), update the online logsumexp state
    (``m_run`` per group lane, sums ``s_a`` / ``s_b`` per element: one FMA per token, no
    cross-thread reduction until the end)."""
    a, b = tile_values(w, PAIRS)
    gmax = tl.max(tl.maximum(a, b), axis=1)
    tk = ordered_bits(tl.where(gmax == 0.0, 0.0, gmax)) >> 16
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
    x_ptr, stride_row, V, M, chunk, S, group_key_ptr, lse_part_ptr,
    TG: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr, PAIRS: tl.constexpr,
):
    """Per (row, split): 16-bit order key of every group maximum, and the split's (max, sumexp).

    The full tiles of the split load unmasked in a loop Triton software-pipelines ``STAGES`` deep
    (asynchronous copies through shared memory: several tiles in flight per program without
    holding them in registers); the partial last tile (if any) loads masked after it. ``PAIRS``
    (bf16, even V and row stride): the tile is loaded as int32 words of two tokens (``tile_values``).
    The select, launched dependent on this grid, may start once every program has started
    (programmatic dependent launch; it waits for this grid's results).
    """
    if PDL:
        gdc_launch_dependents()
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    w_g: tl.constexpr = G // 2 if PAIRS else G  # loaded elements per group
    half: tl.constexpr = max(G // 2, 1)  # elements per half tile row (tile_values)
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
    gk_row = group_key_ptr + r * M + start // w_g
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
    tl.store(lse_part_ptr + (r * S + p) * 2, m)
    tl.store(lse_part_ptr + (r * S + p) * 2 + 1, s)
