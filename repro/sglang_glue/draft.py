"""Drafter side: this rank's logits rows from SGLang's (vocabulary-parallel) LM head.

Each tensor-parallel rank holds rows ``[start, start + num_org)`` of the LM head. It computes the
logits of its own shard only; ``repro.round.DraftTail.topk`` then takes that shard's top-K with
global ids and the ranks exchange only those ``K`` candidates and one logsumexp per row, never
the full ``[bs, L, V]`` logits (docs/SGLANG-DESIGN.md, "What a tree breaks in DFlash").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadShard:
    """The slice of the LM head one rank holds."""

    weight: torch.Tensor  # [>= num_org, H]: rows past num_org are padding
    num_org: int  # vocabulary rows this rank owns
    start: int  # global id of its first row


def head_shard(lm_head: torch.nn.Module) -> HeadShard:
    """The shard of SGLang's (Parallel)LMHead ``lm_head``; one ValueError for an unsupported head."""
    weight = getattr(lm_head, "weight", None)
    if weight is None:
        msg = "DDTREE needs the target's lm_head to expose `weight`"
        raise ValueError(msg)
    shard = getattr(lm_head, "shard_indices", None)
    if shard is None:
        return HeadShard(weight, int(weight.shape[0]), 0)
    if int(shard.num_added_elements) != 0:
        msg = "DDTREE does not support an LM head with added vocabulary"
        raise ValueError(msg)
    return HeadShard(weight, int(shard.num_org_elements), int(shard.org_vocab_start_index))


def shard_logits(hidden: torch.Tensor, shard: HeadShard) -> torch.Tensor:
    """[bs, L, num_org] logits of the drafter rows ``hidden`` [bs, L, H], in the weight's dtype
    (the top-K reads bf16 directly: no float32 copy of the rows).

    One GEMM of bs * L rows: a strided [bs, L, H] view (the block's rows past the root) given to
    matmul as is runs as bs batched GEMMs that each read the whole head (4.4 ms a round at bs 16
    on Qwen3-8B's head against 0.35 ms, H200)."""
    bs, rows, width = hidden.shape
    flat = hidden.reshape(bs * rows, width).to(shard.weight.dtype)
    return torch.matmul(flat, shard.weight[: shard.num_org].T).view(bs, rows, -1)
