"""The drafter test hook's rows in one Triton launch (``repro.sglang_glue.test_hook``).

``hook_rows(hook, roots, prefix_lens, out, top1_out, vocab_start)`` writes columns
``vocab_start : vocab_start + W`` of every row [bs, L, W] into ``out`` (float32, bfloat16 or
float16) and, if given, each row's argmax into ``top1_out`` [bs, L] int64: exactly
``hook.logits(roots, prefix_lens)`` and its argmax. One program per (row, tile of ``BLOCK``
tokens); with ``out`` None only the argmax, one program per row. No host sync and no allocation
(capturable in a CUDA graph at fixed shapes). Triton is imported on the first call;
``TRITON_INTERPRET=1`` runs it on CPU tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from repro.sglang_glue.test_hook import DrafterTestHook

BLOCK = 4096
"""Tokens per program: a row of V 151936 is 38 programs, bs 1 x L 15 rows 570."""
NUM_WARPS = 4


def hook_rows(
    hook: DrafterTestHook,
    roots: torch.Tensor,
    prefix_lens: torch.Tensor,
    out: torch.Tensor | None,
    top1_out: torch.Tensor | None,
    vocab_start: int = 0,
) -> None:
    """Fill ``out`` and/or ``top1_out``; the arguments are checked by ``DrafterTestHook``."""
    import triton

    from repro.kernels._hook_rows_triton import rows_kernel
    from repro.sglang_glue.test_hook import SEED_MULT

    tables = hook.tables
    bs, horizon = roots.shape[0], hook.horizon
    width = out.shape[-1] if out is not None else 1
    top1 = top1_out if top1_out is not None else roots[:, None]  # not written when TOP1 is off
    rows = out if out is not None else top1  # not written when ROWS is off
    rows_kernel[(bs * horizon, triton.cdiv(width, BLOCK))](
        roots, roots.stride(0), prefix_lens, prefix_lens.stride(0), hook.powers, tables.logits,
        tables.rank_thresholds, tables.level_thresholds, rows, rows.stride(0), rows.stride(1),
        top1, top1.stride(0), top1.stride(1), hook.vocab_size, vocab_start, width, hook.seed * SEED_MULT,
        tables.levels, tables.ranks, hook.decoy_stride,
        L=horizon, KP=triton.next_power_of_2(max(tables.levels - 1, 1)),
        RP=triton.next_power_of_2(tables.ranks), BLOCK=BLOCK, ROWS=out is not None, TOP1=top1_out is not None,
        num_warps=NUM_WARPS,
    )
