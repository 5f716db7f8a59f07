"""Drafter side: top-K log-probabilities from a vocabulary-parallel LM head shard.

Each tensor-parallel rank holds rows ``[org_vocab_start, org_vocab_start + num_org)`` of the LM
head. It takes the top-K of its own shard and the ranks exchange only those ``K`` candidates and
one logsumexp per row, never the full ``[bs, L, V]`` logits (sglang-notes.md, "drafting").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from repro.ddtree import TopK, merge_topk
from repro.sglang_glue.tree import shard_topk

# all_gather(t) -> the tensors every rank passed, in rank order (t itself when tp = 1)
AllGather = Callable[[torch.Tensor], list[torch.Tensor]]


def vocab_parallel_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    num_org: int,
    org_vocab_start: int,
    vocab_size: int,
    k: int,
    all_gather: AllGather | None = None,
) -> TopK:
    """Top-``k`` of the full-vocabulary drafter rows, computed shard by shard.

    ``hidden`` [bs, L, H] are the drafter's output rows at depths 1..L, ``weight`` this rank's
    LM-head shard [>= num_org, H] (padding rows past ``num_org`` are ignored). Logits are taken
    in float32 after the matmul in the weight's dtype. ``all_gather`` exchanges the shards'
    candidates; ``None`` means a single rank holding the whole vocabulary.
    """
    local = torch.matmul(hidden.to(weight.dtype), weight[:num_org].T).float()  # [bs, L, num_org]
    part = shard_topk(local, k)
    part = replace(part, ids=part.ids + org_vocab_start, vocab_size=vocab_size)
    if all_gather is None:
        return part
    fields = (part.logits, part.ids, part.lse)
    gathered = [all_gather(t.contiguous()) for t in fields]
    parts = [
        TopK(logits=lg, ids=ids, lse=lse, vocab_size=vocab_size)
        for lg, ids, lse in zip(*gathered, strict=True)
    ]
    return merge_topk(parts, k)
