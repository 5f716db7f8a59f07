"""The verify window of SGLang's ``req_to_token`` table: where the tree's verify rows write KV.

SGLang's overlap-capable DFlash worker over-allocates each request's ``req_to_token`` row ahead
of time; the verify forward writes node ``i`` of request ``b`` to slot ``req_to_token[req_b,
prefix_b + i]``. After the walk, ``repro.round.accept`` reorders that window in place so the
accepted path's slots come first (``repro.ddtree.accept``).
"""

from __future__ import annotations

import torch


def window_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    n: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[bs * n] int64 slots ``req_to_token[req, prefix + j]`` for j < n, request by request
    (into ``out`` when given: a preallocated buffer of at least bs * n)."""
    cols = prefix_lens.to(torch.int64)[:, None] + torch.arange(n, device=prefix_lens.device)
    slots = req_to_token[req_pool_indices.to(torch.int64)[:, None], cols].reshape(-1)
    if out is None:
        return slots.to(torch.int64)
    return out[: slots.numel()].copy_(slots)
