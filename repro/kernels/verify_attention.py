"""Split-KV attention for a verify forward: a batch of draft trees (or chains) against their
requests' cached prefixes, in two Triton launches.

SGLang's Triton backend verifies with its prefill kernel (``extend_attention_fwd``): one program
per (request, query head, 128 queries) walks the request's whole prefix. At small batches that is
a few dozen programs on a 132-SM GPU, each a long serial loop, and on the full-size dense target
it was 40% of a round's GPU time (docs/ROUND-HOST.md). ``verify_attention`` instead

- packs the G query heads of one KV head into a tile (each K/V block is read once for all G),
- splits each prefix into ``nsplit`` slices taken by parallel programs (flash-decoding), plus one
  program per tile for the draft tokens' own keys under the tree mask (or causal, for a chain),
- merges the slices' partial outputs by their log-sum-exp (``combine_kernel``).

The arguments are those SGLang passes its extend kernel; ``custom_mask`` uses its full-mask layout
(row q of request b at ``mask_indptr[b] + q * (prefix + q_len) + prefix``; the prefix columns are
never read). Shapes are static given (requests, ``max_q_len``), so CUDA graphs capture it; the
slices are sized in the kernel from each request's prefix length. Triton is imported on the first
call; ``TRITON_INTERPRET=1`` runs it on CPU.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any, NamedTuple

import torch

from repro.algorithms import DDTREE, DFLASH
from repro.errors import UsageError

ENV = "REPRO_VERIFY_ATTENTION"
"""Whose verifies the SGLang glue (patch 0007) sends here: a comma list of ``SERVED`` algorithms
(default both: the same attention for the tree and the chain it is compared with), or ``off``."""
SERVED = (DDTREE, DFLASH)
"""The speculative algorithms whose verify layout (SGLang's full-mask tree, DFLASH's causal chain)
the project tests against this kernel."""
BLOCK_M = 64
"""Rows of a query tile: 64 // G draft tokens of all G heads that share a KV head."""
BLOCK_N = 64
"""Prefix keys a step."""
NUM_WARPS = 4
"""Warps of a split program."""
NUM_STAGES = 2
"""Software-pipeline stages of the key loops (Triton buffers that many key blocks on sm_90 and
sm_100, one elsewhere)."""
WIDE_ROWS = 128
"""Query rows (draft tokens x G) past which a verify takes wide tiles: each K/V block is read by
half as many tiles, and fewer, longer prefix slices leave fewer partials to write and merge (on
the H200 a 64-token tree at bs 1 and 4 took 1.5-1.7x less time; chains and trees of up to 32
tokens at G 4 were as fast or faster in narrow tiles: docs/perf/sweep_verify_tiles_h200_2026-12-04.json)."""
WIDE_BLOCK_M = 128
"""Rows of a wide query tile."""
WIDE_WARPS = 8
"""Warps of a wide tile's programs."""
OFFS32_LIMIT = 2**31
"""Pools spanning fewer elements than this address their keys and values with int32 offsets."""
MAX_SPLITS = 16
"""Most prefix slices a request (more only adds partials to merge)."""
SMEM_SLACK = 1024
"""Shared-memory bytes the compiler adds past the tiles (barriers: up to 544 measured on sm_100)."""
FASTER_ROWS = 2052
"""Query rows a KV head up to which the split kernel is measured to beat SGLang's (``faster``):
513 verify tokens at G 4, B 512's tree and its root, the largest budget the benches serve."""


@cache
def _kernels() -> tuple[Any, Any]:
    from repro.kernels._verify_attention_triton import combine_kernel, split_kernel

    return split_kernel, combine_kernel


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


@cache
def _shared_memory(device: torch.device) -> tuple[int, int]:
    """(bytes of shared memory a program may opt into, buffers of each key block): Hopper and
    datacenter Blackwell (sm_90, sm_100) pipeline two, the others Triton compiles for (sm_80,
    sm_120) one. Unbounded off CUDA (the interpreter)."""
    if device.type != "cuda":
        return 1 << 40, NUM_STAGES
    props = torch.cuda.get_device_properties(device)
    return props.shared_memory_per_block_optin, NUM_STAGES if props.major in (9, 10) else 1


def block_t(max_q_len: int) -> int:
    """The draft tokens' own keys a step: no wider than the tree, so its mask tile costs no
    registers the prefix loop would need (the kernel's registers are those of its widest branch)."""
    return min(BLOCK_N, max(16, 1 << (max(1, max_q_len) - 1).bit_length()))


def shared_bytes(block_m: int, max_q_len: int, head_dim: int, v_dim: int, elem: int, stages: int) -> int:
    """An upper bound of the split kernel's shared memory: the query tile, and ``stages`` buffers
    of a prefix key block and of a block of the tree's own keys, keys and values (Triton 3.6's
    figures for sm_80 to sm_120 stay under it: verify/cpu/test_kernels_compile.py)."""
    keys = BLOCK_N + block_t(max_q_len)
    return elem * (block_m * head_dim + stages * keys * (head_dim + v_dim)) + SMEM_SLACK


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _span(t: torch.Tensor) -> int:
    """Elements from ``t``'s first to its last (a strided view's reach, not its numel)."""
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0


def num_splits(bs: int, kv_heads: int, m_tiles: int, sms: int) -> int:
    """Prefix slices a request of narrow tiles: enough programs for about two waves of ``sms``, a
    power of two from 1 to MAX_SPLITS."""
    return min(MAX_SPLITS, _pow2_floor(2 * sms // max(1, bs * kv_heads * m_tiles)))


def wide_splits(bs: int, kv_heads: int, m_tiles: int, sms: int) -> int:
    """Prefix slices a request of wide tiles (one program an SM at a time): the most, a power of
    two from 2 to MAX_SPLITS, whose programs (the slices and the tree's, every tile) fit one wave."""
    tiles = bs * kv_heads * m_tiles
    n = 2
    while 2 * n <= MAX_SPLITS and tiles * (2 * n + 1) <= sms:
        n *= 2
    return n


class Tiling(NamedTuple):
    """How a verify's query rows are tiled and its prefixes split."""

    block_m: int
    num_warps: int
    m_tiles: int
    nsplit: int


def tile_shape(max_q_len: int, group: int) -> tuple[int, int]:
    """(rows, warps) of a query tile: narrow (BLOCK_M, NUM_WARPS) up to WIDE_ROWS query rows a KV
    head, wide (WIDE_BLOCK_M, WIDE_WARPS) past it."""
    return (BLOCK_M, NUM_WARPS) if max(1, max_q_len) * group <= WIDE_ROWS else (WIDE_BLOCK_M, WIDE_WARPS)


def tiling(bs: int, max_q_len: int, group: int, kv_heads: int, sms: int) -> Tiling:
    """``tile_shape``'s tiles, and the prefix split over two waves of programs (narrow) or one (wide)."""
    block_m, num_warps = tile_shape(max_q_len, group)
    m_tiles = -(-(max(1, max_q_len) * group) // block_m)
    split = num_splits if block_m == BLOCK_M else wide_splits
    return Tiling(block_m, num_warps, m_tiles, split(bs, kv_heads, m_tiles, sms))


def serves(algorithm: str | None) -> bool:
    """Whether the server's verifies come here, by ``REPRO_VERIFY_ATTENTION`` (``ENV``)."""
    value = os.environ.get(ENV, ",".join(SERVED)).strip().upper()
    names = set() if value == "OFF" else {name.strip() for name in value.split(",")}
    if not names <= set(SERVED) or "" in names:
        msg = f"{ENV} must be off or a comma list of {', '.join(SERVED)} (got {os.environ[ENV]!r})"
        raise UsageError(msg)
    return algorithm is not None and str(algorithm).upper() in names


def faster(max_q_len: int, q_heads: int, kv_heads: int) -> bool:
    """Whether the split kernel beats SGLang's extend kernel on a verify of ``max_q_len`` draft
    tokens a request, as measured on the H200 (bench_verify_attention, docs/PERFORMANCE.md):
    every chain and tree of up to FASTER_ROWS query rows a KV head (513 tokens at G 4) at bs 1, 4
    and 16, prefixes 300-2,000 (1.02-12.5x; 513: 1.91-2.41x). Wider trees are not measured: SGLang's kernel keeps them."""
    return max_q_len * (q_heads // kv_heads) <= FASTER_ROWS


def supports(q: torch.Tensor, k_buffer: torch.Tensor, *, max_q_len: int, head_dim: int, v_head_dim: int,
             page_size: int = 1, logit_cap: float = 0.0, sliding_window: int = -1, has_sinks: bool = False,
             kv_scaled: bool = False, temperature_len: int = -1) -> bool:
    """Whether ``verify_attention`` takes this layer's verify: plain softmax attention with a
    token-granular (page 1) KV pool of the queries' dtype, power-of-two head dims, on a shape where
    it is ``faster`` (at every batch size measured) and its tiles fit the GPU's shared memory;
    anything else (soft cap, window, sinks, fp8 KV, length-scaled queries, trees past FASTER_ROWS,
    head dim 256 trees on sm_90, any head dim 256 verify on sm_120) stays with SGLang's kernel."""
    pow2 = all(d >= 16 and d & (d - 1) == 0 for d in (head_dim, v_head_dim))
    plain = logit_cap == 0 and sliding_window < 0 and not has_sinks and not kv_scaled and temperature_len <= 0
    dtype = q.dtype in (torch.bfloat16, torch.float16, torch.float32) and k_buffer.dtype == q.dtype
    if not (pow2 and plain and dtype and page_size == 1 and faster(max_q_len, q.shape[1], k_buffer.shape[1])):
        return False
    limit, stages = _shared_memory(q.device)
    block_m, _ = tile_shape(max_q_len, q.shape[1] // k_buffer.shape[1])
    return shared_bytes(block_m, max_q_len, head_dim, v_head_dim, q.element_size(), stages) <= limit


def verify_attention(
    q: torch.Tensor, k_ext: torch.Tensor, v_ext: torch.Tensor, o: torch.Tensor,
    k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None, mask_indptr: torch.Tensor | None, max_q_len: int, sm_scale: float,
) -> torch.Tensor:
    """Write softmax(q k^T * sm_scale) v into ``o`` for every draft token: ``q`` [T, Hq, D],
    ``k_ext`` / ``v_ext`` [T, Hkv, D / Dv] (the draft tokens' own keys and values), ``o`` [T, Hq, Dv],
    ``k_buffer`` / ``v_buffer`` [slots, Hkv, D / Dv] (the pool), ``kv_indices[kv_indptr[b]:
    kv_indptr[b + 1]]`` request b's prefix slots, ``qo_indptr`` its draft tokens. ``custom_mask``
    (bool or uint8, SGLang's full-mask layout) is the tree; None verifies causal chains."""
    split_kernel, combine_kernel = _kernels()
    tokens, q_heads, head_dim = q.shape
    kv_heads, v_dim = k_buffer.shape[1], v_buffer.shape[2]
    bs = qo_indptr.numel() - 1
    block_m, num_warps, m_tiles, nsplit = tiling(bs, max_q_len, q_heads // kv_heads, kv_heads, _sm_count(q.device))
    o_part = torch.empty(tokens, q_heads, nsplit + 1, v_dim, dtype=torch.float32, device=q.device)
    l_part = torch.empty(tokens, q_heads, nsplit + 1, dtype=torch.float32, device=q.device)
    mask = custom_mask if custom_mask is not None else qo_indptr  # never read without USE_MASK
    offs32 = max(_span(k_buffer), _span(v_buffer)) < OFFS32_LIMIT
    split_kernel[(bs, kv_heads, m_tiles * (nsplit + 1))](
        q, k_ext, v_ext, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, mask,
        mask_indptr if mask_indptr is not None else qo_indptr, o_part, l_part,
        sm_scale * 1.4426950408889634,
        q.stride(0), q.stride(1), k_ext.stride(0), k_ext.stride(1), v_ext.stride(0), v_ext.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), l_part.stride(0), l_part.stride(1),
        G=q_heads // kv_heads, NSPLIT=nsplit, D=head_dim, DV=v_dim, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        BLOCK_T=block_t(max_q_len), USE_MASK=custom_mask is not None, OFFS32=offs32, num_warps=num_warps, num_stages=NUM_STAGES,
    )
    combine_kernel[(tokens, q_heads)](
        o_part, l_part, o,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), l_part.stride(0), l_part.stride(1),
        o.stride(0), o.stride(1),
        PARTS=nsplit + 1, PARTS_P2=2 * nsplit, DV=v_dim, num_warps=1,
    )
    return o
