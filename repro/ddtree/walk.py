"""The acceptance walk and the target's per-node token choice (docs/SPEC.md §4).

The walk is lossless at any temperature: the target picks one token per node under that node's
ancestor-only context (argmax at T = 0, a sample of its own decoding rule at T > 0) and the walk
follows exactly those tokens, so every emitted token is a genuine target choice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from repro.ddtree.types import NO_PARENT, NOT_ACCEPTED, DraftTree, WalkResult


def walk(tree: DraftTree, target_tokens: torch.Tensor) -> WalkResult:
    """Follow the target's tokens from the root while they match a child; batched, sync-free.

    ``target_tokens[b, i]`` is the target's token at node i, shape [bs, N].
    """
    for name, value, kind in (("tree", tree, DraftTree), ("target_tokens", target_tokens, torch.Tensor)):
        if not isinstance(value, kind):
            msg = f"{name} must be a {kind.__name__} (got {type(value).__name__})"
            raise TypeError(msg)
    if target_tokens.shape != tree.tokens.shape:
        msg = f"target_tokens must have shape [bs, N] = {tuple(tree.tokens.shape)} (got {tuple(target_tokens.shape)})"
        raise ValueError(msg)
    target = target_tokens.to(tree.tokens)
    real = tree.parents != NO_PARENT
    parent = tree.parents.clamp(min=0)
    # a node "matches" if the target's token at its parent is its own token; siblings hold
    # distinct tokens, so at most one child of any node matches
    matches = real & (torch.gather(target, 1, parent) == tree.tokens)
    matches[:, 0] = True
    accepted = matches
    for _ in range(min(tree.horizon, tree.budget)):  # accepted = every node on the path matches
        accepted = matches & torch.gather(accepted, 1, parent)
    accepted = accepted & (real | (torch.arange(tree.n, device=tree.device) == 0))

    horizon = tree.horizon
    bs = tree.bs
    accept_index = torch.full((bs, horizon + 2), NOT_ACCEPTED, dtype=torch.int64, device=tree.device)
    slot = torch.where(accepted, tree.depths, horizon + 1)  # accepted nodes sit at their depth
    nodes = torch.arange(tree.n, device=tree.device).expand(bs, -1)
    accept_index.scatter_(1, slot, nodes)
    accept_index = accept_index[:, : horizon + 1].contiguous()
    accept_len = accepted.sum(1)
    last = torch.gather(accept_index, 1, (accept_len - 1)[:, None])
    return WalkResult(accept_index, accept_len, torch.gather(target, 1, last)[:, 0])


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax per node (T = 0), [..., V] -> [...]."""
    return torch.argmax(logits, dim=-1)


_SAMPLER_BYTES = 1 << 29  # temporaries of one sampling chunk (scaled logits, probs, race, ...)

# renorm(probs [R, V], top_k [R], top_p [R]) -> probs with only each row's kept tokens, renormalised
Renorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sample_target_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    filtered: bool = True,
    renorm: Renorm | None = None,
) -> torch.Tensor:
    """One token per node [bs, N] from target logits [bs, N, V], each request with its own rule.

    ``temperature`` [bs] (0 means greedy), ``top_k`` [bs] (<= 0 disables), ``top_p`` [bs] (1
    disables). Sampling is an exponential race (argmax of p / Exp(1)), so it never syncs; the
    ``generator`` makes it reproducible. ``filtered=False`` promises that no request uses top-k
    or top-p (SGLang knows it on the host): the race then runs on the scaled logits, with no
    sort. Otherwise the kept tokens (top-p on the full distribution, then top-k: the sort rule
    below) come from ``renorm`` (a sort-free kernel) or, without one, from a sort of each row.
    Rows go through in chunks of about 512 MiB of temporaries, so a large vocabulary (Kimi's
    163840) never needs bs*N*V copies at once.
    """
    bs, n, vocab = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if t.shape != (bs,):
            msg = f"{name} must have shape [bs] = ({bs},) (got {tuple(t.shape)})"
            raise ValueError(msg)
    rows = logits.reshape(bs * n, vocab)
    per_row = lambda t: t.repeat_interleave(n)  # noqa: E731 - one rule per request, N rows each
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    rules = (per_row(temperature.float()), per_row(k), per_row(top_p.float()))
    step = max(1, _SAMPLER_BYTES // (vocab * 24))
    out = [_sample_rows(rows[i : i + step], *(r[i : i + step] for r in rules), generator,
                        filtered=filtered, renorm=renorm)
           for i in range(0, bs * n, step)]
    return torch.cat(out).view(bs, n)


def _sample_rows(
    x: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None,
    *,
    filtered: bool,
    renorm: Renorm | None,
) -> torch.Tensor:
    """The rule of each row of x [R, V] (temperature/top_k in [1, V]/top_p [R]) applied to that row."""
    x = x.float()
    greedy = temperature <= 0
    scaled = x / torch.where(greedy, 1.0, temperature)[:, None]
    race = torch.empty_like(scaled).exponential_(generator=generator)
    if not filtered:  # Gumbel-max: argmax(x / T - log E) samples softmax(x / T)
        sampled = torch.argmax(scaled - race.log_(), dim=-1)
    elif renorm is not None:
        sampled = torch.argmax(renorm(torch.softmax(scaled, dim=-1), top_k, top_p) / race, dim=-1)
    else:
        sorted_x, order = torch.sort(scaled, dim=-1, descending=True)
        ranks = torch.arange(x.shape[-1], device=x.device)
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each rank
        keep = (ranks < top_k[:, None]) & ((before < top_p[:, None]) | (ranks == 0))
        kept = torch.where(keep, probs, 0.0)
        sampled = torch.gather(order, -1, torch.argmax(kept / race, dim=-1, keepdim=True))[:, 0]
    return torch.where(greedy, greedy_tokens(x), sampled)
