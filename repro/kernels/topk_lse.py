"""Fused top-K + logsumexp of drafter logits: one read of the logits, exact tie order.

``topk_lse(x [..., V], k, id_offset=0) -> (logits [..., k] float32, ids [..., k] int64, lse [...]
float32)``. Per row, tokens are ordered by ``float32(x)`` descending, equal values by ascending
token id (``torch.sort(x.float(), descending=True, stable=True)``); the first ``k`` are returned,
their ids as ``local id + id_offset``. ``lse`` is the logsumexp of the whole row in float32
(log-prob = logit - lse); it differs from ``torch.logsumexp(x.float(), -1)`` by a few float32 ulps
(see ``LSE_RTOL``).

Vocab shards (tensor parallel): call it on each rank's slice with ``id_offset`` = the shard start;
the ids are global, so ``repro.ddtree.merge_topk`` combines the shards' (logits, ids, lse).

How it computes (two launches):

- ``stream_kernel`` reads the logits once, bf16 as int32 words of two tokens, 4 tiles in flight
  through Triton's software pipeline; per program it writes the lse partials and one 16-bit order
  key per group of 32 tokens (the group's maximum). It signals its dependents as it starts.
- ``select_kernel`` (launched dependent, waits for the keys) merges the lse; finds the largest
  key that K super keys (maxima of 8 group keys) reach by a 17-ary search, one ``tl.histogram`` of
  16 pivots per round (3 rounds on random rows); lists the groups that reach it; gathers each
  listed group's maximum straight into its slot, then the further tokens that reach the
  threshold; sorts the candidates as int32 keys (value, then id; int64 outside bf16); reads its
  own list and candidates through L1. A row with more candidates than its buffer holds (ties at
  the threshold) is scanned whole in chunks, sorting only the tokens that beat the K-th best.
- Below ``TopKConfig.split_rows`` rows (bs < 5) the select is split: the threshold per row, then
  ``gather_kernel`` over several programs per row, the last of which sorts.

The caller rejects NaN and +inf (``repro.ddtree.build_trees(check_finite=True)``); the kernel does
not check. Triton is imported on the first call, so CPU-only installs import this module freely.
Under ``TRITON_INTERPRET=1`` it also runs on CPU tensors (slowly; small shapes only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

MAX_K = 1024
"""Largest supported k (the candidate sort holds 2 * next_pow2(k) int64 keys per row)."""

LSE_RTOL = 2e-6
"""Bound on |lse - torch.logsumexp(x.float())| / max(1, |lse|): 16 float32 ulps of relative error
(exp2 on the GPU is approximate and the sums run in another order). The benchmark reports the
measured worst case (``lse_max_ulps``)."""

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


SELECT_WIDE_ROWS = 256
"""From this many rows on, the auto select kernel runs 4 warps instead of 8: on the H200 8 warps
were faster at 15 and 120 rows (latency-bound), 4 at 480 and 960 (more rows per SM)."""

GATHER_PER_THREAD = 32
"""Tokens per select thread in a candidate-gather step of the one-launch select when
``TopKConfig.gather`` is 0 (bs 8: 8 warps, 8192; bs 32/64: 4 warps, 4096)."""

SPLIT_GATHER = 2048
"""Tokens per program of the split select's gather_kernel when ``TopKConfig.gather`` is 0."""

_POWERS_OF_TWO = {  # field: (largest allowed or 0 for none, whether 0 means auto)
    "tile": (0, False), "scan_block": (0, False), "min_cap": (0, False), "cap_mult": (0, False),
    "super_keys": (0, False), "search_pivots": (0, False), "stream_warps": (16, False), "select_warps": (16, True),
    "group": (0, True), "gather": (0, True), "slow_chunk": (0, False),
}
"""The TopKConfig fields that are powers of two (they size register tiles and sorts); warps at
most 16: 512 threads at the select's 128-register cap fill an SM's 64 K registers."""


@dataclasses.dataclass(frozen=True)
class TopKConfig:
    """Launch tunables of the top-K kernels. Each default is the choice the H200 measured fastest
    (``verify/bench/bench_topk.py --sweep`` searches the alternatives; docs/PERFORMANCE.md)."""

    tile: int = 4096
    """Tokens per stream-kernel step (>= group): with 4 stages, 32 KB of bf16 in flight per program."""
    programs: int = 2048
    """Stream programs aimed at (rows x splits; at bs 1 capped by whole tiles per row): ~16 per H200 SM."""
    stream_warps: int = 8
    """Warps per stream program: 16 tokens per thread of a 4096-token tile."""
    select_warps: int = 0
    """0: 8 below SELECT_WIDE_ROWS rows (latency-bound), else 4 (more rows per SM)."""
    group: int = 0
    """Tokens per group key; 0: 32, fewer when V < 128 * next_pow2(k) (at least 4 groups per top-K slot)."""
    cap_mult: int = 2
    """Candidate buffer = max(cap_mult * next_pow2(k), min_cap) keys per row: random rows fit, ties take the slow path."""
    min_cap: int = 128
    """Least candidate buffer: a small k still holds a few tied tokens without the slow path."""
    gather: int = 0
    """Tokens per candidate-gather step; 0: GATHER_PER_THREAD per select thread, SPLIT_GATHER per gather_kernel program."""
    scan_block: int = 8192
    """Group keys the select holds in registers: V 163840 at G 32 (5120 keys) in one tile."""
    super_keys: int = 8
    """Group keys per super key of the threshold search (1: none; halved below 2.5 K super keys): 8x fewer to count."""
    search_pivots: int = 16
    """Pivots counted per round of the threshold search (1: a bisection): 3 rounds on random rows, not 9."""
    select_maxnreg: int = 128
    """Register cap per select thread (0: the compiler's choice): four 4-warp select programs per SM at any k."""
    split_rows: int = 64
    """Below this many rows the select is two launches (threshold, then gather over several programs; 0: never)."""
    stream_stages: int = 4
    """Tiles in flight per stream program (Triton's pipeline through shared memory): fewer cost HBM rate at bs 32/64."""
    slow_chunk: int = 4
    """Tokens per select thread in a step of the slow path's scan (rows with more than ``cap`` candidates,
    ties): one load and a count a step, a sort only of the tokens that beat the K-th best so far. 4: 1024 a
    step at 8 warps, 512 at 4; sm_90 spills none at bs 1 K 63, bs 16 K 63 or bs 32 K 256 (8: 56-184 bytes),
    24 bytes at bs 4 K 127 and 128 at K 1024 (``verify/bench/kernel_size.py``)."""
    scan_tail: bool = True
    """Hold M group keys as a pow2_floor(M) head and pow2_ceil(rest) tail if they fit scan_block (M 5120: 4096 + 1024)."""

    def __post_init__(self) -> None:
        for name, (most, auto) in _POWERS_OF_TWO.items():
            value = getattr(self, name)
            if value < 1 - auto or value & (value - 1) or 0 < most < value:
                within = f" in [1, {most}]" if most else ""
                msg = f"TopKConfig.{name} must be {'0 (auto) or ' if auto else ''}a power of two{within} (got {value})"
                raise ValueError(msg)
        if self.select_maxnreg and not 32 <= self.select_maxnreg <= 255:
            msg = f"TopKConfig.select_maxnreg must be 0 or in [32, 255] (got {self.select_maxnreg})"
            raise ValueError(msg)
        for name, least in (("split_rows", 0), ("programs", 1), ("stream_stages", 1)):
            if getattr(self, name) < least:
                msg = f"TopKConfig.{name} must be >= {least} (got {getattr(self, name)})"
                raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Launch geometry for one (rows, vocab, k) under a config."""

    rows: int
    vocab: int
    k: int
    group: int  # G: tokens per group key
    groups: int  # M = ceil(V / G)
    tile: int  # tokens per stream step
    splits: int  # S: stream programs per row
    chunk: int  # tokens per stream program (multiple of tile)
    k_pow2: int  # K_P
    cap: int  # candidate keys per row before the slow path
    gather_groups: int  # GT: groups per gather step
    scan_block: int  # MB: group keys of the head tile
    scan_tail: int  # MT: group keys of the tail tile after the head (0: none, blocks of MB are loaded past it)
    search_pivots: int  # P
    stream_warps: int
    select_warps: int
    select_maxnreg: int
    super_keys: int  # R: group keys per super key (power of two; divides scan_block and scan_tail)
    split_select: bool  # rows < config.split_rows
    lse_block: int  # SP: split partials the select loads at once (pow2 >= splits, at most 1024)
    slow_chunk: int  # SC: tokens per step of the slow path's scan (config.slow_chunk per select thread)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def make_plan(rows: int, vocab: int, k: int, config: TopKConfig) -> Plan:
    """Pick group size, splits and buffer sizes (pure Python, no device work)."""
    k_pow2 = _pow2_ceil(k)
    group = config.group or min(32, _pow2_floor(vocab // (4 * k_pow2)))
    groups = -(-vocab // group)
    tile = max(group, min(config.tile, _pow2_ceil(vocab)))
    steps = -(-vocab // tile)
    splits = min(steps, max(1, -(-config.programs // max(rows, 1))))
    chunk = -(-steps // splits) * tile
    head, tail = min(config.scan_block, _pow2_ceil(groups)), 0
    if config.scan_tail and head >= groups > _pow2_floor(groups):  # every key in one padded tile: split it
        head = _pow2_floor(groups)
        tail = _pow2_ceil(groups - head)
    splits = -(-vocab // chunk)
    select_warps = config.select_warps or (8 if rows < SELECT_WIDE_ROWS else 4)
    split = rows < config.split_rows
    supers = config.super_keys  # >= 2.5 K super keys, R | MB and R | MT
    while supers > 1 and (2 * -(-groups // supers) < 5 * k or supers > head or 0 < tail < supers):
        supers //= 2
    return Plan(
        rows=rows,
        vocab=vocab,
        k=k,
        group=group,
        groups=groups,
        tile=tile,
        splits=splits,
        chunk=chunk,
        k_pow2=k_pow2,
        cap=max(config.cap_mult * k_pow2, config.min_cap),
        gather_groups=max(1, (config.gather or (SPLIT_GATHER if split else GATHER_PER_THREAD * 32 * select_warps))
                              // group),
        scan_block=head,
        scan_tail=tail,
        search_pivots=config.search_pivots,
        stream_warps=config.stream_warps,
        select_warps=select_warps,
        select_maxnreg=config.select_maxnreg,
        super_keys=supers,
        split_select=split,
        lse_block=min(_pow2_ceil(splits), 1024),
        slow_chunk=min(config.slow_chunk * 32 * select_warps, _pow2_ceil(vocab)),
    )


def stream_pairs(x2: torch.Tensor, group: int = 2) -> bool:
    """Whether the kernels read 2-D ``x2`` as int32 words of two bf16 tokens (bf16, even vocab and
    row stride, 4-byte aligned, groups of more than one token): one instruction per token to widen
    instead of two."""
    return (group > 1 and x2.dtype == torch.bfloat16 and x2.shape[-1] % 2 == 0 and x2.stride(0) % 2 == 0
            and x2.data_ptr() % 4 == 0)


def int32_candidates(p: Plan, *, pairs: bool) -> bool:
    """Whether the select keys candidates as int32 (bf16 value, list slot, position in group; see
    ``_cand_key``) rather than int64: for bf16 rows read in pairs, while CAP * G fits 15 bits."""
    return pairs and p.cap * p.group <= 2**15


THRESHOLD_CONSTANTS = ("MB", "MT", "R", "CAP", "P", "SP")
"""The select's constants ``threshold_kernel`` takes (the split select's first launch)."""
GATHER_CONSTANTS = ("G", "GT", "K_P", "CAP", "SC", "PAIRS", "KEY32")
"""The select's constants ``gather_kernel`` takes (the split select's second launch)."""


def select_constants(p: Plan, *, pairs: bool) -> dict[str, int | bool]:
    """The compile-time constants of ``select_kernel`` for plan ``p`` (``pairs``: :func:`stream_pairs`);
    the split select's two kernels take the subsets THRESHOLD_CONSTANTS and GATHER_CONSTANTS."""
    return {"MB": p.scan_block, "MT": p.scan_tail, "G": p.group, "GT": p.gather_groups, "K_P": p.k_pow2,
            "CAP": p.cap, "P": p.search_pivots, "SP": p.lse_block, "R": p.super_keys, "SC": p.slow_chunk,
            "PAIRS": pairs, "KEY32": int32_candidates(p, pairs=pairs)}


def _check_args(x: torch.Tensor, k: int, id_offset: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        msg = (
            f"topk_lse: x must be a tensor [..., V] (got {type(x).__name__} "
            f"with shape {tuple(getattr(x, 'shape', ()))})"
        )
        raise ValueError(msg)
    if x.dtype not in _DTYPES:
        msg = f"topk_lse: x.dtype must be bfloat16, float16 or float32 (got {x.dtype})"
        raise ValueError(msg)
    vocab = x.shape[-1]
    if not 1 <= vocab <= 2**30:  # token offsets are int32 in the kernels
        msg = f"topk_lse: vocab size x.shape[-1] must be in [1, 2**30] (got {vocab})"
        raise ValueError(msg)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(vocab, MAX_K):
        msg = f"topk_lse: k must be an int in [1, min(V, {MAX_K})] with V={vocab} (got {k!r})"
        raise ValueError(msg)
    if isinstance(id_offset, bool) or not isinstance(id_offset, int) or id_offset < 0:
        msg = f"topk_lse: id_offset must be an int >= 0 (got {id_offset!r})"
        raise ValueError(msg)


def topk_lse(
    x: torch.Tensor, k: int, id_offset: int = 0, *, config: TopKConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-``k`` logits, their token ids and the row logsumexp of ``x`` [..., V] (module docstring).

    Returns ``logits [..., k] float32`` (descending), ``ids [..., k] int64`` (``local + id_offset``)
    and ``lse [...] float32``, on ``x``'s device. No host synchronisation; CUDA-graph capturable.
    A last dimension that is not contiguous is copied first.
    """
    stream, select, out = prepare(x, k, id_offset, config=config)
    stream()
    select()
    return out


def prepare(
    x: torch.Tensor, k: int, id_offset: int = 0, *, config: TopKConfig | None = None
) -> tuple[Callable[[], None], Callable[[], None], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Allocate for :func:`topk_lse` and return its two launches apart, plus the outputs.

    ``(launch_stream, launch_select, (logits, ids, lse))``: calling both in order fills the
    outputs from the current contents of ``x``. Benchmarks use it to time the kernels separately.
    """
    _check_args(x, k, id_offset)
    from repro.kernels._common_triton import INTERPRET
    from repro.kernels._topk_select_triton import gather_kernel, select_kernel, threshold_kernel
    from repro.kernels._topk_stream_triton import stream_kernel

    if x.device.type != "cuda" and not INTERPRET:
        msg = (
            f"topk_lse: x must be a CUDA tensor (got device {x.device}; "
            "CPU runs only under TRITON_INTERPRET=1)"
        )
        raise ValueError(msg)
    lead, vocab = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, vocab)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    cfg = config or TopKConfig()
    p = make_plan(x2.shape[0], vocab, k, cfg)
    dev = x.device
    logits = torch.empty((p.rows, k), dtype=torch.float32, device=dev)
    ids = torch.empty((p.rows, k), dtype=torch.int64, device=dev)
    lse = torch.empty((p.rows,), dtype=torch.float32, device=dev)
    gkeys = torch.empty((p.rows, p.groups), dtype=torch.int16, device=dev)
    parts = torch.empty((p.rows, p.splits, 2), dtype=torch.float32, device=dev)
    gidx = torch.empty((p.rows, p.cap), dtype=torch.int32, device=dev)
    pairs = stream_pairs(x2, p.group)
    consts = select_constants(p, pairs=pairs)
    cand = torch.empty((p.rows, p.cap), dtype=torch.int32 if consts["KEY32"] else torch.int64, device=dev)

    def launch_stream() -> None:
        if p.rows:
            stream_kernel[(p.rows, p.splits)](
                x2, x2.stride(0), vocab, p.groups, p.chunk, p.splits, gkeys, parts,
                TG=p.tile // p.group, G=p.group, STAGES=cfg.stream_stages, PAIRS=pairs, num_warps=p.stream_warps,
            )

    state = torch.empty((p.rows, 4), dtype=torch.int32, device=dev) if p.split_select else None
    dependent = {} if INTERPRET else {"launch_pdl": True}  # may start while the kernel before it drains

    def launch_split_select() -> None:
        if p.rows:
            threshold_kernel[(p.rows,)](
                p.groups, p.splits, k, gkeys, parts, gidx, state, lse,
                **{c: consts[c] for c in THRESHOLD_CONSTANTS}, num_warps=p.select_warps, **dependent,
            )
            gather_kernel[(p.rows, -(-p.cap // p.gather_groups))](
                x2, x2.stride(0), vocab, k, id_offset, gidx, state, cand, logits, ids,
                **{c: consts[c] for c in GATHER_CONSTANTS}, num_warps=p.select_warps,
                **dependent, **({"maxnreg": p.select_maxnreg} if p.select_maxnreg else {}),
            )

    def launch_select() -> None:
        if p.split_select:
            launch_split_select()
        elif p.rows:
            select_kernel[(p.rows,)](
                x2, x2.stride(0), vocab, p.groups, p.splits, k, id_offset,
                gkeys, parts, gidx, cand, logits, ids, lse, **consts,
                num_warps=p.select_warps,
                **dependent, **({"maxnreg": p.select_maxnreg} if p.select_maxnreg else {}),
            )

    return launch_stream, launch_select, (logits.view(*lead, k), ids.view(*lead, k), lse.view(lead))
