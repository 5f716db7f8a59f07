"""The drafter test hook's rows in one Triton launch (``repro.drafter_hook.hook``).

``hook_rows(powers, tables, roots, prefix_lens, out, top1_out, ...)`` writes columns
``vocab_start : vocab_start + W`` of every row [bs, L, W] into ``out`` (float32, bfloat16 or
float16) and, if given, each row's argmax into ``top1_out`` [bs, L] int64: exactly
``DrafterTestHook.logits(roots, prefix_lens)`` and its argmax. One program per (row, tile of
``BLOCK`` tokens); with ``out`` None only the argmax, one program per row. No host sync and no
allocation (capturable in a CUDA graph at fixed shapes). Triton is imported on the first call;
``TRITON_INTERPRET=1`` runs it on CPU tensors.
"""

from __future__ import annotations

import torch

from repro.drafter_hook.hashes import SEED_MULT
from repro.drafter_hook.profiles import HookTables

BLOCK = 4096
"""Tokens per program: a row of V 151936 is 38 programs, bs 1 x L 15 rows 570."""
NUM_WARPS = 4


def hook_rows(
    powers: torch.Tensor,
    tables: HookTables,
    roots: torch.Tensor,
    prefix_lens: torch.Tensor,
    out: torch.Tensor | None,
    top1_out: torch.Tensor | None,
    *,
    seed: int,
    decoy_stride: int,
    vocab_start: int = 0,
) -> None:
    """Fill ``out`` and/or ``top1_out`` for the hook of ``powers`` [L, V] (succ^d), ``tables``,
    ``seed`` and ``decoy_stride``; the arguments are checked by ``DrafterTestHook``."""
    import triton

    from repro.drafter_hook._rows_triton import rows_kernel

    bs = roots.shape[0]
    horizon, vocab_size = powers.shape
    width = out.shape[-1] if out is not None else 1
    top1 = top1_out if top1_out is not None else roots[:, None]  # not written when TOP1 is off
    rows = out if out is not None else top1  # not written when ROWS is off
    rows_kernel[(bs * horizon, triton.cdiv(width, BLOCK))](
        roots, roots.stride(0), prefix_lens, prefix_lens.stride(0), powers, tables.logits,
        tables.rank_thresholds, tables.level_thresholds, rows, rows.stride(0), rows.stride(1),
        top1, top1.stride(0), top1.stride(1), vocab_size, vocab_start, width, seed * SEED_MULT,
        tables.levels, tables.ranks, decoy_stride,
        L=horizon, KP=triton.next_power_of_2(max(tables.levels - 1, 1)),
        RP=triton.next_power_of_2(tables.ranks), BLOCK=BLOCK, ROWS=out is not None, TOP1=top1_out is not None,
        num_warps=NUM_WARPS,
    )
