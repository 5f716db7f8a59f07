"""Per-depth top-K of the drafter distribution, exact to the spec's tie order (docs/SPEC.md §2.1).

Order: float32 logit descending, equal logits by ascending token id. log_softmax is monotone in
the logit, so this is the order of the exact log-probabilities; we never let float32 rounding of
``logit - lse`` merge two different logits into a tie, which keeps every path (torch here, the
fused Triton kernel, vocabulary shards) bit-identical whatever way each rounds its ``lse``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from repro.ddtree.types import TopK

_LOW32 = 0xFFFFFFFF


def check_draft_logits(draft_logits: torch.Tensor, *, check_finite: bool = True) -> None:
    """Raise one ValueError naming the problem if ``draft_logits`` is not a usable [bs, L, V].

    ``check_finite`` reads the values and therefore synchronises with the device once.
    """
    if not isinstance(draft_logits, torch.Tensor):
        msg = f"draft_logits must be a torch.Tensor (got {type(draft_logits).__name__})"
        raise ValueError(msg)
    if draft_logits.dim() != 3:
        msg = (
            f"draft_logits must have shape [bs, L, V] (got rank {draft_logits.dim()}, "
            f"shape {tuple(draft_logits.shape)})"
        )
        raise ValueError(msg)
    if not draft_logits.is_floating_point():
        msg = f"draft_logits must be a float tensor (got {draft_logits.dtype})"
        raise ValueError(msg)
    bs, horizon, vocab = draft_logits.shape
    for name, size in (("bs", bs), ("L", horizon), ("V", vocab)):
        if size == 0:
            msg = f"draft_logits must have {name} >= 1 (got shape {tuple(draft_logits.shape)})"
            raise ValueError(msg)
    if check_finite and not bool(torch.isfinite(draft_logits).all()):
        bad = (~torch.isfinite(draft_logits)).nonzero()[0].tolist()
        msg = f"draft_logits must be finite (NaN or inf at [bs, L, V] index {bad})"
        raise ValueError(msg)


def check_budget(budget: int) -> None:
    """Raise ValueError unless ``budget`` is an int >= 0."""
    if isinstance(budget, bool) or not isinstance(budget, int):
        msg = f"budget must be an int >= 0 (got {budget!r})"
        raise ValueError(msg)
    if budget < 0:
        msg = f"budget must be >= 0 (got {budget})"
        raise ValueError(msg)


def order_keys(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 keys whose descending order is (float32 logit desc, token id asc); all distinct."""
    bits = (logits.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    mono = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)
    return (mono << 32) | (_LOW32 - ids)


def _ids_from_keys(keys: torch.Tensor) -> torch.Tensor:
    return _LOW32 - (keys & _LOW32)


def topk_logprobs(draft_logits: torch.Tensor, k: int) -> TopK:
    """The top-``k`` tokens of every row of ``draft_logits`` [bs, L, V], plus each row's lse.

    No host synchronisation; ``k`` is clamped to V.
    """
    vocab = draft_logits.shape[-1]
    k = min(k, vocab)
    x = draft_logits.float()
    ids = torch.arange(vocab, device=x.device).expand_as(x)
    keys = torch.topk(order_keys(x, ids), k, dim=-1, sorted=True).values
    top_ids = _ids_from_keys(keys)
    return TopK(
        logits=torch.gather(x, -1, top_ids),
        ids=top_ids,
        lse=torch.logsumexp(x, dim=-1),
        vocab_size=vocab,
    )


def merge_topk(parts: Sequence[TopK], k: int) -> TopK:
    """Combine per-shard top-K results (ids already global) into the top-``k`` of the vocabulary.

    Each shard must hold its own top-min(k, shard size); the lse of the whole row is the
    logsumexp of the shards' lse. This is what a tensor-parallel rank gathers from its peers.
    """
    if not parts:
        msg = "merge_topk needs at least one shard (got 0)"
        raise ValueError(msg)
    logits = torch.cat([p.logits for p in parts], dim=-1)
    ids = torch.cat([p.ids for p in parts], dim=-1)
    pos = torch.topk(order_keys(logits, ids), min(k, logits.shape[-1]), dim=-1, sorted=True).indices
    return TopK(
        logits=torch.gather(logits, -1, pos),
        ids=torch.gather(ids, -1, pos),
        lse=torch.logsumexp(torch.stack([p.lse for p in parts], dim=-1), dim=-1),
        vocab_size=parts[0].vocab_size,
    )
