"""Triton kernel behind :func:`repro.drafter_hook.rows.hook_rows` (imported lazily: needs triton).

``rows_kernel`` (grid rows x vocabulary tiles): each program replays its request's level chain
and rank draws up to its depth (at most L steps of integer hashing and table compares), reads
the correct token from ``powers`` (succ^d: one load, not d dependent ones), then writes its tile
of the row: each token's floor (a multiply, a shift and a select per token, the reference's
``floor_logits``), then the level's logit at those of the row's R ranked tokens that fall in the
tile (R lanes of scatter); the decoy stride can be any number. The tile-0 program of a row
also writes the row's argmax, the rank-0 token (with ROWS off, only that: one program per row).
Integers and table lookups only: the values are the torch reference's (``repro.drafter_hook.hook``
with ``repro.drafter_hook.hashes``) bit for bit, in any row dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from repro.drafter_hook import hashes
from repro.drafter_hook.profiles import OFF_LOGIT

# the reference's row hash and constants, at compile time
_ROOT = tl.constexpr(hashes.ROOT_MULT)
_PREFIX = tl.constexpr(hashes.PREFIX_MULT)
_DEPTH = tl.constexpr(hashes.DEPTH_MULT)
_MIX0 = tl.constexpr(hashes.MIX_MULTS[0])
_MIX1 = tl.constexpr(hashes.MIX_MULTS[1])
_SALT = tl.constexpr(hashes.LEVEL_SALT)
_MASK = tl.constexpr(hashes.MASK24)
_NEVER = tl.constexpr(1 << 30)  # a threshold no 24-bit uniform reaches (padding lanes)
_OFF = tl.constexpr(OFF_LOGIT)
_FLOOR_HASH = tl.constexpr(hashes.FLOOR_HASH)
_FLOOR_SHIFT = tl.constexpr(hashes.FLOOR_SHIFT)
_FLOOR_TOP = tl.constexpr(hashes.FLOOR_LEVELS - 1)


@triton.jit
def _uniform(h):
    """The 24-bit uniform of a row hash input (``hashes.uniforms``)."""
    h = (h ^ (h >> 16)) * _MIX0
    h = (h ^ (h >> 16)) * _MIX1
    return (h >> 20) & _MASK


@triton.jit
def _floor(v):
    """float32 floor logits of token ids ``v`` (``hashes.floor_logits``, bit for bit)."""
    u = ((v.to(tl.int64) * _FLOOR_HASH) & 0xFFFFFFFF) >> _FLOOR_SHIFT
    level = tl.minimum(u, _FLOOR_TOP).to(tl.float32)
    return tl.where(level < 16, _OFF - 0.125 * level, -32.0 - 0.25 * (level - 16))


@triton.jit
def rows_kernel(
    roots, roots_stride, prefix, prefix_stride, powers, logits_tab, rank_thr, level_thr,
    out, out_stride_b, out_stride_d, top1, top1_stride_b, top1_stride_d,
    vocab, vocab_start, width, seed_term, levels, ranks, stride,
    L: tl.constexpr, KP: tl.constexpr, RP: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    TOP1: tl.constexpr,
):
    row = tl.program_id(0)  # b * L + d - 1
    tile = tl.program_id(1)
    b = row // L
    d = row % L + 1
    root = tl.load(roots + b * roots_stride).to(tl.int64)
    plen = tl.load(prefix + b * prefix_stride).to(tl.int64)
    base = root * _ROOT + plen * _PREFIX + seed_term
    kk = tl.arange(0, KP)
    rr = tl.arange(0, RP)
    level = tl.full([], 0, tl.int32) + levels  # the start row of level_thr
    off = tl.full([], 0, tl.int32)  # 1 once an earlier correct token was not rank 0
    rank = tl.full([], 0, tl.int32)
    for i in range(1, d + 1):
        h = base + i * _DEPTH
        t = tl.load(level_thr + level * (levels - 1) + kk, mask=kk < levels - 1, other=_NEVER)
        level = tl.sum((_uniform(h + _SALT) >= t).to(tl.int32), axis=0)
        t = tl.load(rank_thr + (off * levels + level) * ranks + rr, mask=rr < ranks, other=_NEVER)
        rank = tl.sum((_uniform(h) >= t).to(tl.int32), axis=0)
        off = off | (rank != 0).to(tl.int32)
    correct = tl.load(powers + (d - 1) * vocab + root)  # int32

    if ROWS:
        lo = vocab_start + tile * BLOCK  # this tile: tokens lo .. hi - 1
        hi = tl.minimum(lo + BLOCK, vocab_start + width)
        row_dst = out + b * out_stride_b + (d - 1) * out_stride_d - vocab_start
        v = lo + tl.arange(0, BLOCK)
        tl.store(row_dst + v, _floor(v).to(out.dtype.element_ty), mask=v < hi)
        tl.debug_barrier()  # the floor first: the ranked tokens below overwrite it (other threads)
        decoy = (correct.to(tl.int64) + 1 + rr.to(tl.int64) * stride) % vocab
        tok = tl.where(rr == rank, correct.to(tl.int64), decoy)  # rank j's token; absent: every rank a decoy
        val = tl.load(logits_tab + level * ranks + rr, mask=rr < ranks, other=_OFF)
        tl.store(row_dst + tok, val.to(out.dtype.element_ty), mask=(rr < ranks) & (tok >= lo) & (tok < hi))
    if TOP1:  # noqa: SIM102 - a compile-time branch around a runtime one
        if tile == 0:
            top1_dst = top1 + b * top1_stride_b + (d - 1) * top1_stride_d
            tl.store(top1_dst, tl.where(rank == 0, correct, (correct + 1) % vocab).to(tl.int64))
