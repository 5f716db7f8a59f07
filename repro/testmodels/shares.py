"""One GPU's share of Kimi-K2.6 at 8 GPUs, for the TP / EP model: ``k26-tp8`` (TP8: all 384 experts,
each 256 wide) and ``k26-ep8`` (TP8 + EP8, a2a none: 48 whole experts of 2048; repro/data/models/
k26-ep8.toml says what else it shares with k26-tp8 and why it is measured as a MoE layer).

What verify/bench/share_cost.py feeds SGLang's fused MoE for a batch of T tokens:

- ``routed_ids``: [T, 8] global expert ids, from the planted router (each distinct token picks the
  top-8 of its column of repro.testmodels.plant.router_weight) or a skewed one (Dirichlet(0.3)
  popularity, repro.testmodels.spread);
- ``ep_local_ids``: the ids a rank's fused MoE sees under EP, SGLang's ``local_expert_mapping``
  (token_dispatcher/standard.py:186-210): rank r owns [r E/p, (r + 1) E/p), its ids shift to
  0 .. E/p - 1 and every other id becomes -1;
- ``most_loaded_rank``: the rank the step waits for (most token-expert pairs; ties: most experts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from repro.testmodels.configs import read_model

MASKED = -1


@dataclass(frozen=True)
class Share:
    """One share's routed-expert shape (global and local experts, slice width) and routing."""

    name: str
    experts_global: int
    experts_local: int
    width: int
    ranks: int  # 1 for TP (every GPU holds every expert's slice)
    topk: int
    hidden: int
    router_seed: int

    @property
    def ep(self) -> bool:
        """Whether the share holds a subset of the experts (EP)."""
        return self.experts_local < self.experts_global


def load_share(name: str) -> Share:
    """``k26-tp8`` or ``k26-ep8``; ValueError naming the file for anything else."""
    if name == "k26-tp8":
        data = read_model(name, ("description", "target", "plant"))
        t = data["target"]
        return Share(name, t["n_routed_experts"], t["n_routed_experts"], t["moe_intermediate_size"], 1,
                     t["num_experts_per_tok"], t["hidden_size"], int(data["plant"]["router-seed"]))
    data = read_model(name, ("description", "share", "reference"))
    s, ref = data["share"], data["reference"]["target"]
    return Share(name, int(s["experts-global"]), int(s["experts-local"]), int(s["expert-width"]), int(s["ranks"]),
                 int(ref["num_experts_per_tok"]), int(ref["hidden_size"]), int(s["router-seed"]))


def routed_ids(share: Share, tokens: int, spread: str, layer: int) -> np.ndarray:
    """[tokens, topk] global expert ids of ``tokens`` distinct tokens in one layer ("planted" or "skewed")."""
    from repro.testmodels.spread import routing

    return routing(spread, tokens, share.experts_global, share.topk, layer, share.hidden)


def ep_local_ids(ids: np.ndarray, rank: int, experts_local: int) -> np.ndarray:
    """SGLang's local_expert_mapping applied to ``ids`` for ``rank``: own ids shifted, the rest -1."""
    local = ids - rank * experts_local
    return np.where((local >= 0) & (local < experts_local), local, MASKED)


def rank_load(ids: np.ndarray, experts_global: int, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: (token-expert pairs, distinct experts) of global ``ids``."""
    counts = np.bincount(ids.ravel(), minlength=experts_global).reshape(ranks, experts_global // ranks)
    return counts.sum(axis=1), (counts > 0).sum(axis=1)


def most_loaded_rank(ids: np.ndarray, experts_global: int, ranks: int) -> int:
    """The rank with the most pairs (ties: the most distinct experts, then the lowest rank)."""
    pairs, experts = rank_load(ids, experts_global, ranks)
    order = sorted(range(ranks), key=lambda r: (-int(pairs[r]), -int(experts[r]), r))
    return order[0]


def share_ids(share: Share, ids: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The ids the share's GPU runs (EP: the most-loaded rank's, masked) and what it reads:
    ``experts`` (distinct experts it reads), ``pairs`` (token-expert pairs it runs), ``tiles16`` /
    ``tiles64`` (the fused MoE's M tiles of 16 / 64 rows), ``rank`` and ``rank_share`` (its share of all pairs)."""
    if not share.ep:
        counts = np.bincount(ids.ravel(), minlength=share.experts_global)
        return ids, {"experts": int((counts > 0).sum()), "pairs": int(counts.sum()), **_tiles(counts),
                     "experts_all": int((counts > 0).sum()), "rank": None, "rank_share": 1.0}
    rank = most_loaded_rank(ids, share.experts_global, share.ranks)
    local = ep_local_ids(ids, rank, share.experts_local)
    counts = np.bincount(local[local >= 0].ravel(), minlength=share.experts_local)
    total = np.bincount(ids.ravel(), minlength=share.experts_global)
    return local, {"experts": int((counts > 0).sum()), "pairs": int(counts.sum()), **_tiles(counts),
                   "experts_all": int((total > 0).sum()), "rank": rank, "rank_share": float(counts.sum() / ids.size)}


def _tiles(counts: np.ndarray) -> dict[str, int]:
    """The fused MoE's M tiles of 16 and of 64 rows over per-expert pair counts."""
    return {"tiles16": int(np.ceil(counts / 16).sum()), "tiles64": int(np.ceil(counts / 64).sum())}
