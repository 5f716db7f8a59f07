"""How T tokens spread over a MoE layer's experts, and how unevenly over EP ranks.

For T tokens routed top-k over E experts, a TP GPU reads every expert any token picked (D experts,
each 1/p of it); an EP GPU owns E/p whole experts (rank r owns ids [r E/p, (r + 1) E/p), SGLang's
``local_expert_mapping``, token_dispatcher/standard.py:186-210) and reads those of them that were
picked (D_g), for the token-expert pairs routed to them (P_g). Every layer's all-reduce waits for the
slowest rank, so what a step costs is the most-loaded rank's D_g and P_g, layer by layer.

Three spreads, simulated with fixed seeds (numpy; deterministic):

- ``uniform``: each token picks k distinct experts uniformly (independent tokens);
- ``skewed``: expert popularity Dirichlet(0.3) per layer, each token picks k distinct experts with
  probability proportional to it (the K2-class imbalance; the project's planted trees read about as
  few experts as this: docs/PERFORMANCE.md's 84 / 138 / 195 experts for B 16 / 64 / 128);
- ``planted``: the full-size planted targets' router (repro.testmodels.plant.router_weight): token t
  picks the top-k of column ``t mod H``; T distinct columns stand for T distinct tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

SPREADS = ("uniform", "skewed", "planted")
SKEW_ALPHA = 0.3  # Dirichlet concentration of the skewed spread's expert popularity
LAYERS = 8  # layers (independent routings) each simulated figure averages over
PLANTED_ROUTER_SEED = 1  # repro/data/models/k26-tp8.toml [plant] router-seed


@dataclass(frozen=True)
class Spread:
    """Means over layers of one routing of T tokens (EP figures for ``ranks`` ranks)."""

    tokens: int
    experts: float  # D: distinct experts picked
    pairs: float  # token-expert pairs: T x k
    ranks: int
    max_experts: float  # D_g of the rank with the most (per layer, then averaged)
    max_pairs: float  # P_g of the rank with the most pairs
    max_blocks16: float  # sum over the loaded rank's experts of ceil(pairs / 16): the fused-MoE kernel's M tiles
    blocks16: float  # the same over all experts (a TP GPU's tiles)
    max_blocks64: float = 0.0  # as max_blocks16 with 64-row tiles
    blocks64: float = 0.0

    def tiles(self, block_m: int, *, rank: bool) -> float:
        """M tiles of ``block_m`` rows (16 or 64) the fused MoE runs: the loaded rank's or all."""
        if block_m == 16:
            return self.max_blocks16 if rank else self.blocks16
        return self.max_blocks64 if rank else self.blocks64

    @property
    def rank_share(self) -> float:
        """The most-loaded rank's share of the pairs (1 / ranks when balanced)."""
        return self.max_pairs / self.pairs if self.pairs else 0.0

    def as_dict(self) -> dict[str, float]:
        """JSON-ready form."""
        return {"tokens": self.tokens, "experts": self.experts, "pairs": self.pairs, "ranks": self.ranks,
                "max_experts": self.max_experts, "max_pairs": self.max_pairs, "rank_share": self.rank_share}


def _picks(kind: str, tokens: int, experts: int, topk: int, layer: int) -> np.ndarray:
    """[tokens, topk] expert ids of one layer's routing."""
    rng = np.random.default_rng(1_000_003 * (SPREADS.index(kind) + 1) + layer)
    if kind == "uniform":
        keys = rng.random((tokens, experts))
    elif kind == "skewed":
        popularity = rng.dirichlet(np.full(experts, SKEW_ALPHA))
        # Gumbel top-k: k distinct experts drawn without replacement, proportionally to popularity
        keys = np.log(np.maximum(popularity, 1e-300)) - np.log(-np.log(rng.random((tokens, experts))))
    else:
        msg = f"spread must be one of {', '.join(SPREADS)} (got {kind!r})"
        raise ValueError(msg)
    return np.argpartition(-keys, topk - 1, axis=1)[:, :topk]


@functools.lru_cache(maxsize=64)
def _planted_tops(layer: int, experts: int, topk: int, hidden: int) -> np.ndarray:
    """[hidden, topk] the experts each planted column picks (torch only here)."""
    from repro.testmodels.plant import router_weight

    return router_weight(PLANTED_ROUTER_SEED, layer, experts, hidden).topk(topk, dim=0).indices.T.numpy()


def routing(kind: str, tokens: int, experts: int, topk: int, layer: int, hidden: int = 7168) -> np.ndarray:
    """[tokens, topk] expert ids of ``tokens`` distinct tokens in simulated layer ``layer``."""
    if kind != "planted":
        return _picks(kind, tokens, experts, topk, layer)
    tops = _planted_tops(layer + 1, experts, topk, hidden)  # layer 0 is dense in the planted targets
    cols = np.resize(np.random.default_rng(layer).permutation(hidden), tokens)  # past H columns repeat
    return tops[cols]


def rank_loads(ids: np.ndarray, experts: int, ranks: int) -> tuple[np.ndarray, ...]:
    """Per rank: distinct experts read, pairs, and M tiles of 16 and of 64 rows (ids < 0, masked, skipped)."""
    counts = np.bincount(ids[ids >= 0].ravel(), minlength=experts).reshape(ranks, experts // ranks)
    return ((counts > 0).sum(axis=1), counts.sum(axis=1), np.ceil(counts / 16).sum(axis=1),
            np.ceil(counts / 64).sum(axis=1))


@functools.lru_cache(maxsize=4096)
def spread(kind: str, tokens: int, experts: int = 384, topk: int = 8, ranks: int = 8,
           hidden: int = 7168) -> Spread:
    """The mean :class:`Spread` of ``tokens`` distinct tokens over LAYERS simulated layers."""
    if tokens < 1 or experts % ranks or not 1 <= topk <= experts:
        msg = f"spread: tokens >= 1, ranks dividing experts, 1 <= topk <= experts (got {tokens}, {ranks}, {experts}, {topk})"
        raise ValueError(msg)
    d = p = md = mp = mb = b = mb64 = b64 = 0.0
    for layer in range(LAYERS):
        ids = routing(kind, tokens, experts, topk, layer, hidden)
        per_d, per_p, per_b, per_b64 = rank_loads(ids, experts, ranks)
        d += per_d.sum()
        p += per_p.sum()
        b += per_b.sum()
        b64 += per_b64.sum()
        worst = int(np.lexsort((per_d, per_p))[-1])  # the rank with the most pairs (ties: most experts)
        md += per_d.max()
        mp += per_p[worst]
        mb += per_b.max()
        mb64 += per_b64.max()
    n = LAYERS
    return Spread(tokens, d / n, p / n, ranks, md / n, mp / n, mb / n, b / n, mb64 / n, b64 / n)
