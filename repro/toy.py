"""A tiny deterministic target and a noisy-oracle drafter, for the demo and the CPU tests.

The target is one float64 attention layer with a KV cache, so a tree verify really depends on
positions, the FULL mask layout and the commit of accepted KV rows; an engine bug shows up as a
difference from plain autoregressive decoding. The drafter rolls the target out greedily for L
steps and blurs each step's distribution with seeded noise, so the correct token sits at rank 0
most of the time and at ranks 1, 2, ... otherwise: side branches of a tree then pay off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from repro.ddtree import greedy_tokens, sample_target_tokens
from repro.ddtree.accept import Accepted, SlotTable
from repro.ddtree.tensors import tree_mask_index
from repro.round import Drafted, DraftTail, Round, ddtree_round


@dataclass
class KVCache:
    """Per-request committed keys/values, padded: [bs, capacity, H]; ``lens`` [bs]."""

    k: torch.Tensor
    v: torch.Tensor
    lens: torch.Tensor
    hidden: list[list[torch.Tensor]] = field(default_factory=list)  # committed hidden states

    @classmethod
    def empty(cls, bs: int, capacity: int, dim: int) -> KVCache:
        """A cache of ``bs`` empty requests with room for ``capacity`` positions."""
        z = torch.zeros(bs, capacity, dim, dtype=torch.float64)
        return cls(z, z.clone(), torch.zeros(bs, dtype=torch.int64), [[] for _ in range(bs)])

    def clone(self) -> KVCache:
        """A deep copy."""
        return KVCache(self.k.clone(), self.v.clone(), self.lens.clone(), [list(h) for h in self.hidden])

    def select(self, keep: torch.Tensor) -> KVCache:
        """The requests where ``keep`` [bs] is true (finished requests leave the batch)."""
        rows = keep.nonzero()[:, 0].tolist()
        return KVCache(self.k[keep], self.v[keep], self.lens[keep], [self.hidden[r] for r in rows])

    def append(self, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor, count: torch.Tensor) -> None:
        """Append rows ``[:, j]`` for j < count[b] (k/v/hidden: [bs, J, H]) after each request's end."""
        bs, width, _ = k.shape
        j = torch.arange(width)
        keep = j[None, :] < count[:, None]
        dst = torch.where(keep, self.lens[:, None] + j, self.k.shape[1])  # capacity = discard
        pad = lambda t: torch.cat([t, t.new_zeros(bs, 1, t.shape[2])], 1)  # noqa: E731
        kk, vv = pad(self.k), pad(self.v)
        kk.scatter_(1, dst[..., None].expand_as(k), k)
        vv.scatter_(1, dst[..., None].expand_as(v), v)
        self.k, self.v = kk[:, :-1], vv[:, :-1]
        for b in range(bs):
            self.hidden[b].extend(hidden[b, : int(count[b])])
        self.lens = self.lens + count


class ToyTarget:
    """One attention layer + tanh MLP-free block over a float64 embedding; deterministic weights."""

    def __init__(self, vocab: int = 256, dim: int = 32, max_len: int = 1024, seed: int = 0, sharpness: float = 6.0) -> None:
        g = torch.Generator().manual_seed(seed)
        rand = lambda *shape, scale: torch.randn(*shape, generator=g, dtype=torch.float64) * scale  # noqa: E731
        self.vocab, self.dim, self.max_len = vocab, dim, max_len
        self.emb = rand(vocab, dim, scale=1.0)
        self.pos = rand(max_len, dim, scale=0.5)
        self.wq, self.wk, self.wv, self.wo = (rand(dim, dim, scale=dim**-0.5) for _ in range(4))
        self.out = rand(dim, vocab, scale=sharpness * dim**-0.5)

    def forward(
        self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, allow: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens/pos [bs, T]; ``allow`` [bs, T, C+T] over (cache slots, new rows).

        Returns logits [bs, T, V], hidden [bs, T, H], k and v [bs, T, H].
        """
        h = self.emb[tokens] + self.pos[pos]
        q, k, v = h @ self.wq, h @ self.wk, h @ self.wv
        keys = torch.cat([cache.k, k], 1)
        vals = torch.cat([cache.v, v], 1)
        att = (q @ keys.transpose(1, 2)) / math.sqrt(self.dim)
        att = torch.softmax(att.masked_fill(~allow, float("-inf")), -1)
        hidden = torch.tanh(h + (att @ vals) @ self.wo)
        return hidden @ self.out, hidden, k, v

    def step(self, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain autoregressive step: feed one token per request [bs], commit its KV.

        Returns the next-token logits [bs, V] and the hidden state [bs, H].
        """
        bs = tokens.shape[0]
        cap = cache.k.shape[1]
        allow = torch.cat([torch.arange(cap)[None, :] < cache.lens[:, None], torch.ones(bs, 1, dtype=torch.bool)], 1)
        logits, hidden, k, v = self.forward(tokens[:, None], cache.lens[:, None], cache, allow[:, None, :])
        cache.append(k, v, hidden, torch.ones(bs, dtype=torch.int64))
        return logits[:, 0], hidden[:, 0]

    def verify(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, n: int, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tree verify of N = ``n`` rows per request ([bs*N] ids and positions): every node attends
        to the committed cache and, per the ancestor blocks of the flat FULL ``mask``, to the tree
        rows it may see. Returns logits [bs, N, V], hidden, k, v [bs, N, H]."""
        bs = input_ids.numel() // n
        anc = mask[tree_mask_index(cache.lens, n)].bool()  # [bs, N, N]
        committed = torch.arange(cache.k.shape[1])[None, None, :] < cache.lens[:, None, None]
        allow = torch.cat([committed.expand(bs, n, -1), anc], 2)
        return self.forward(input_ids.view(bs, n), positions.view(bs, n), cache, allow)


class ToyDrafter:
    """Greedy target rollout of L steps, each step's logits blurred by seeded Gumbel noise."""

    def __init__(self, target: ToyTarget, horizon: int = 15, noise: float = 0.5, seed: int = 0) -> None:
        self.target, self.horizon, self.noise = target, horizon, noise
        self.gen = torch.Generator().manual_seed(seed)

    def draft(self, roots: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Drafter logits [bs, L, V] for the L positions after each request's root."""
        scratch = cache.clone()
        tok, rows = roots, []
        for d in range(self.horizon):
            logits, _ = self.target.step(tok, scratch)
            u = torch.rand(logits.shape, generator=self.gen, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
            rows.append(logits + self.noise * (1 + d / self.horizon) * -torch.log(-torch.log(u)))
            tok = greedy_tokens(logits)
        return torch.stack(rows, 1).float()


@dataclass(frozen=True)
class Sampling:
    """Per-request decoding rule; temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def choose(self, logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The target's token per row of logits [bs, T, V]."""
        bs = logits.shape[0]
        full = lambda x, dt: torch.full((bs,), x, dtype=dt)  # noqa: E731
        return sample_target_tokens(
            logits, full(self.temperature, torch.float64), full(self.top_k, torch.int64), full(self.top_p, torch.float64), gen
        )


@dataclass
class Decoded:
    """Outputs of a decode loop."""

    tokens: list[list[int]]  # generated tokens per request (first one from the prefill)
    hidden: list[list[torch.Tensor]]  # committed hidden states per request, prompt included
    taus: list[list[int]] = field(default_factory=list)  # per round, per request (DDTree only)
    trees: list = field(default_factory=list)  # (tree, walk) of the first rounds (DDTree only)


def prefill(
    target: ToyTarget, prompts: torch.Tensor, capacity: int, sampling: Sampling, gen: torch.Generator
) -> tuple[KVCache, torch.Tensor]:
    """Commit the prompts [bs, P]; return (cache, first generated token [bs])."""
    cache = KVCache.empty(prompts.shape[0], capacity, target.dim)
    for j in range(prompts.shape[1]):
        logits, _ = target.step(prompts[:, j], cache)
    return cache, sampling.choose(logits[:, None], gen)[:, 0]


def decode_ar(target: ToyTarget, prompts: torch.Tensor, new_tokens: int, sampling: Sampling, seed: int = 0) -> Decoded:
    """Plain autoregressive decoding: the losslessness baseline."""
    gen = torch.Generator().manual_seed(seed)
    cache, tok = prefill(target, prompts, prompts.shape[1] + new_tokens + 1, sampling, gen)
    out = [tok]
    for _ in range(new_tokens - 1):
        logits, _ = target.step(tok, cache)
        tok = sampling.choose(logits[:, None], gen)[:, 0]
        out.append(tok)
    return Decoded(torch.stack(out, 1).tolist(), cache.hidden)


class _ToyEngine:
    """The toy pair as a round engine (``repro.round.Engine``): eager tail, cache appends."""

    def __init__(self, target: ToyTarget, rows: torch.Tensor, cache: KVCache, roots: torch.Tensor,
                 sampling: Sampling, gen: torch.Generator) -> None:
        self.model, self.rows, self.cache, self.roots = target, rows, cache, roots
        self.sampling, self.gen = sampling, gen
        self._verified: tuple[torch.Tensor, ...] = ()

    @property
    def prefix_lens(self) -> torch.Tensor:
        """Committed lengths (the root is not in the cache yet)."""
        return self.cache.lens

    def draft(self, tail: DraftTail) -> Drafted:
        """The tail on the round's drafter rows."""
        bs, n = self.roots.shape[0], tail.n
        mask = torch.zeros(n * int(self.cache.lens.sum()) + bs * n * n, dtype=torch.bool)
        return tail(self.rows, self.roots, self.cache.lens, mask)

    def target(self, drafted: Drafted) -> torch.Tensor:
        """The toy target's tree verify; its hidden states and K/V wait for the commit."""
        n = drafted.tree.n
        logits, *self._verified = self.model.verify(drafted.input_ids, drafted.positions, drafted.mask, n, self.cache)
        return logits.reshape(-1, logits.shape[-1])

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The decoding rule at every node."""
        bs = self.roots.shape[0]
        return self.sampling.choose(logits.view(bs, -1, logits.shape[-1]), self.gen)

    def slots(self) -> SlotTable | None:
        """The toy cache appends rows instead of keeping a slot table."""
        return None

    def accept_out(self, bs: int) -> Accepted | None:  # noqa: ARG002 - the toy allocates
        """No preallocated outputs."""
        return None

    def commit(self, drafted: Drafted, accepted: Accepted) -> None:  # noqa: ARG002 - rows say it all
        """Append the accepted path's K/V and hidden states (verify rows in path order)."""
        rows = accepted.rows
        hidden, k, v = (t.reshape(-1, t.shape[-1])[rows] for t in self._verified)
        self.cache.append(k, v, hidden, accepted.accept_len.to(torch.int64))


@dataclass(frozen=True)
class ToyRound:
    """What ``decode_ddtree``'s ``on_round`` hook sees of one round."""

    requests: list[int]  # original request index of each batch row
    draft_logits: torch.Tensor  # [bs, L, V] the drafter rows the tree was built from
    roots: torch.Tensor  # [bs] the round's root tokens
    cache: KVCache  # a copy of the committed cache the round verified against (without this round)
    out: Round


def toy_round(target: ToyTarget, rows: torch.Tensor, cache: KVCache, roots: torch.Tensor, budget: int,
              sampling: Sampling, gen: torch.Generator) -> Round:
    """One round of the toy pair on given drafter rows [bs, L, V]; commits into ``cache``."""
    tail = DraftTail(budget, rows.shape[1], target.vocab)
    return ddtree_round(_ToyEngine(target, rows, cache, roots, sampling, gen), tail)


def decode_ddtree(
    target: ToyTarget,
    drafter: ToyDrafter,
    prompts: torch.Tensor,
    new_tokens: int,
    budget: int | Callable[[int], int],
    sampling: Sampling,
    seed: int = 0,
    keep_trees: int = 0,
    on_round: Callable[[ToyRound], None] | None = None,
) -> Decoded:
    """DDTree decoding with the toy pair; every request runs until it has ``new_tokens``.

    ``budget`` is B, or B as a function of the round's batch size (a budget schedule,
    ``repro.schedule.BudgetSchedule.budget``, or any rule: each round builds its own tree).
    ``on_round``, when given, is called once per round with the round and the cache it verified
    against (recording, tests).
    """
    budget_of = budget if callable(budget) else lambda _bs: budget
    gen = torch.Generator().manual_seed(seed)
    cap = prompts.shape[1] + new_tokens + 2 * drafter.horizon + 2  # + last-round overshoot + rollout
    cache, roots = prefill(target, prompts, cap, sampling, gen)
    tokens = [[int(t)] for t in roots]
    result = Decoded(tokens, list(cache.hidden))  # lists shared with the cache: filled as it commits
    live = list(range(prompts.shape[0]))  # original index of each request still in the batch
    while live:
        rows = drafter.draft(roots, cache)
        before = cache.clone() if on_round is not None else None
        rnd = toy_round(target, rows, cache, roots, budget_of(len(live)), sampling, gen)
        if on_round is not None:
            on_round(ToyRound(list(live), rows, roots, before, rnd))
        taus = rnd.accepted.accept_len.tolist()
        for b, (row, tau) in enumerate(zip(rnd.accepted.tokens.tolist(), taus, strict=True)):
            tokens[live[b]].extend(row[:tau])
        result.taus.append(taus)
        if len(result.trees) < keep_trees:
            result.trees.append((rnd.tree, rnd.walk))
        going = torch.tensor([len(tokens[i]) < new_tokens for i in live])
        live = [i for i, g in zip(live, going.tolist(), strict=True) if g]
        cache, roots = cache.select(going), rnd.accepted.bonus[going]
    result.tokens = [t[:new_tokens] for t in tokens]
    return result
