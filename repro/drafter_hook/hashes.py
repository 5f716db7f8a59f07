"""The drafter test hook's integer hashes, shared bit for bit by its torch reference
(:mod:`repro.drafter_hook.hook`) and its Triton kernel (:mod:`repro.drafter_hook._rows_triton`).

A row's two uniforms are a hash of (seed, root, prefix length, depth), identical on every TP rank
and with no generator state; an unranked token's floor logit is a hash of its id.
"""

from __future__ import annotations

import torch

from repro.drafter_hook.profiles import OFF_LOGIT, U_BITS

MASK24 = (1 << U_BITS) - 1
# the row hash: an int64 of (root, prefix length, depth, seed), mixed twice (wraps mod 2^64)
ROOT_MULT, PREFIX_MULT, DEPTH_MULT, SEED_MULT = 1_000_003, 7_919, 104_729, 15_485_863
MIX_MULTS = (0x45D9F3B, 0x2C1B3C6D)
LEVEL_SALT = 0x2545F4914F6CDD1D
"""Added to the row hash's input for the level uniform (the rank uniform has none)."""
FLOOR_HASH = 0x9E3779B1
"""Multiplier of an unranked token's floor hash: ``(id * FLOOR_HASH mod 2^32) >> FLOOR_SHIFT``."""
FLOOR_SHIFT = 19
"""A 13-bit hash: 8192 buckets, about V / 8192 tokens each."""
FLOOR_LEVELS = 128
"""Floor levels: buckets 0-126 one level each, the rest the lowest (-59.75)."""


def uniforms(roots: torch.Tensor, prefix_lens: torch.Tensor, *, horizon: int, seed: int, salt: int) -> torch.Tensor:
    """[bs, L] int64 in [0, 2^24): each row's hash of (seed, root, prefix length, depth) + salt."""
    depth = torch.arange(1, horizon + 1, device=roots.device, dtype=torch.int64)
    h = roots.to(torch.int64)[:, None] * ROOT_MULT + prefix_lens.to(torch.int64)[:, None] * PREFIX_MULT
    h = h + depth * DEPTH_MULT + (seed * SEED_MULT + salt)
    for mult in MIX_MULTS:  # integer mixing (wraps mod 2^64, deterministic)
        h = (h ^ (h >> 16)) * mult
    return (h >> 20) & MASK24


def floor_logits(tokens: torch.Tensor) -> torch.Tensor:
    """float32 logits of unranked tokens ``tokens`` (ids, any shape): level
    ``min(hash(id) >> FLOOR_SHIFT, FLOOR_LEVELS - 1)`` at -30 - level / 8 (levels 0-15), then -32 -
    (level - 16) / 4: 128 values in [-59.75, -30], exact in float32, bfloat16 and float16."""
    u = ((tokens.to(torch.int64) * FLOOR_HASH) & 0xFFFFFFFF) >> FLOOR_SHIFT
    level = u.clamp(max=FLOOR_LEVELS - 1).to(torch.float32)
    return torch.where(level < 16, OFF_LOGIT - 0.125 * level, -32.0 - 0.25 * (level - 16))
