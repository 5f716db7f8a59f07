"""The walk and the whole commit in one Triton launch: ``repro.ddtree.accept`` on the GPU.

``accept_fused(tree, target_tokens, prefix_lens, slots=None, out=None) -> Accepted`` returns
exactly what ``repro.ddtree.accept`` returns (and rewrites the slot table the same way), from one
program per request: the walk follows the target's tokens from the root, at most min(L, B) hops,
each a comparison of the current node's children in registers. ``out`` (an ``Accepted`` of
preallocated tensors with room for ``bs`` requests) makes it allocation-free, for CUDA graphs
and double-buffered overlap scheduling. One compile per (N, W, slot table or not).

Triton is imported on the first call; ``TRITON_INTERPRET=1`` runs it on CPU.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from repro.ddtree.accept import Accepted, SlotTable, commit_width
from repro.ddtree.types import DraftTree


@cache
def _kernel() -> Any:
    from repro.kernels._accept_triton import accept_kernel

    return accept_kernel


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()  # no dispatch on the round's usual path


def _int64_contiguous(t: torch.Tensor) -> torch.Tensor:
    return _contiguous(t if t.dtype == torch.int64 else t.to(torch.int64))


def empty_accepted(bs: int, width: int, *, device: torch.device | str, seq_dtype: torch.dtype, slots: bool) -> Accepted:
    """Uninitialised outputs for ``bs`` requests (what ``accept_fused(out=...)`` fills)."""
    i64 = {"dtype": torch.int64, "device": device}
    return Accepted(
        accept_index=torch.empty(bs, width, **i64),
        accept_len=torch.empty(bs, dtype=torch.int32, device=device),
        bonus=torch.empty(bs, **i64),
        tokens=torch.empty(bs, width, **i64),
        rows=torch.empty(bs, width, **i64),
        positions=torch.empty(bs, width, **i64),
        new_seq_lens=torch.empty(bs, dtype=seq_dtype, device=device),
        path_slots=torch.empty(bs, width, **i64) if slots else None,
    )


def accept_fused(
    tree: DraftTree,
    target_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    slots: SlotTable | None = None,
    out: Accepted | None = None,
) -> Accepted:
    """``repro.ddtree.accept`` in one launch; ``out`` views of the first ``bs`` rows are returned."""
    bs, n = tree.tokens.shape
    width = commit_width(tree)
    if target_tokens.shape != (bs, n):
        msg = f"target_tokens must have shape [bs, N] = {(bs, n)} (got {tuple(target_tokens.shape)})"
        raise ValueError(msg)
    if out is None:
        out = empty_accepted(bs, width, device=tree.device, seq_dtype=prefix_lens.dtype, slots=slots is not None)
    elif out.accept_len.shape[0] != bs:
        out = out.head(bs)
    if (slots is None) != (out.path_slots is None):
        msg = "accept_fused: out.path_slots must be given exactly when a slot table is"
        raise ValueError(msg)
    table = slots.table if slots is not None else prefix_lens
    table_rows = slots.rows if slots is not None else prefix_lens
    stride = int(table.stride(0)) if slots is not None else 0
    _kernel()[(bs,)](
        tree.tokens, tree.parents, _int64_contiguous(target_tokens), _contiguous(prefix_lens),
        table, table_rows, stride,
        out.accept_index, out.accept_len, out.bonus, out.tokens, out.rows, out.positions, out.new_seq_lens,
        out.path_slots if out.path_slots is not None else out.rows,
        N=n, NP=max(2, _pow2(n)), W=width, WP=max(2, _pow2(width)), HAS_TABLE=slots is not None,
    )
    return out
