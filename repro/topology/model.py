"""The TP / EP cost model: a served round's time and tok/s for a configuration, algorithm, budget and
concurrency on a box, from its parts.

round(config, algorithm, B, c) = target forward (T = c x N tokens: N = 1 for AR, the block for
DFLASH, B + 1 for DDTREE) on the most-loaded GPU + the drafter's forward (DFLASH / DDTREE) + every
collective both run (serial: SGLang's collectives wait for the slowest rank and are not overlapped
in decode) + host time; tok/s = c x τ / round (τ = 1 for AR; DFLASH / DDTREE τ of the drafter profile,
repro/data/drafter_profiles_fit.json). The parts:

- per-GPU compute: repro.topology.compute (bytes and FLOPs of the GPU's share, calibrated on one
  GPU, carried to the box's GPU by its datasheet bandwidth and FLOPs);
- collectives: repro.topology.collectives (what SGLang 0.5.17 runs, file:line there; timed from
  repro/data/collectives.toml or a ``--measure`` result);
- host: ``HostTime``, fitted on the served one-GPU rounds (``DEFAULT_HOST``: the full-size k26-tp8
  share's, docs/perf/fullsize_k26-tp8_h200_2026-12-0*.jsonl.gz; repro/topology/checks.py refits it).
  Every TP rank runs its own scheduler and launches, so a rank's host time is taken as one GPU's.

Assumptions stated once here: no compute / communication overlap; the routed experts' kernel runs on
the box's GPU at the efficiency measured for bf16 slices of the same width on the H200 (the INT4
kernels, Marlin WNA16 on sm120 and FlashInfer TRT-LLM on sm100, are not measured here); the same
router spread on every layer; CUDA graphs for the decode batch sizes (the all-reduce then runs in
graph mode).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from repro.algorithms import AR, DDTREE, DFLASH
from repro.topology.collectives import (
    Fabric,
    GpuClass,
    collectives_us,
    drafter_collectives,
    target_collectives,
)
from repro.topology.compute import (
    DEFAULT,
    Calibration,
    Drafter,
    Target,
    drafter_work,
    forward_us,
    target_work,
)

BUDGETS = (16, 32, 64, 128, 256, 512)
CONCURRENCY = (1, 4, 16)
TAU_PROFILE = "kimi-k2.5-dflash-gsm8k"  # repro/data/models/k26-tp8.toml [plant] hook-profile


@dataclass(frozen=True)
class HostTime:
    """What a served round costs beyond the model's forwards, per algorithm: ``base`` ms (scheduling,
    launches, the drafter's tail) + ``per_root`` ms x sqrt(verified tokens). The second term is the GPU
    and host work the forward measurements leave out (the tree's build and top-K, the verify attention
    over the prefix, the logits over the vocabulary); it grows with a request's tree but far less than
    linearly with the batch, since those kernels run the requests side by side: on the served one-GPU
    rounds a square root, fitted at c 1, predicts c 4 and 16 (docs/TOPOLOGY.md), a linear term
    over-counts them by up to 39%."""

    ms: dict[str, tuple[float, float]]
    source: str = ""

    def at(self, algorithm: str, tokens: int) -> float:
        """Ms of one round of ``algorithm`` verifying ``tokens`` tokens (c x N)."""
        base, per_root = self.ms[algorithm]
        return base + per_root * math.sqrt(tokens)


# Fitted by verify/bench/topology_check.py (repro.topology.checks.fit_host) on the full-size k26-tp8 share's
# served rounds (H200, T 0, docs/perf/fullsize_k26-tp8_h200_2026-12-0*.jsonl.gz) at c 1: AR, DFLASH, DDTREE B 16
# and B 128, the served round less the model's GPU time (DEFAULT calibration). The per-root ms is the share's
# (vocabulary 20480); verify/cpu/test_topology_evidence.py keeps these equal to that fit.
DEFAULT_HOST = HostTime(
    {AR: (0.7168, 0.266667), DFLASH: (1.7973, 0.266667), DDTREE: (3.1348, 0.266667)},
    source="fitted on the k26-tp8 share's served rounds at c 1 (H200, docs/perf/fullsize_k26-tp8_h200_2026-12-0*)")


@dataclass(frozen=True)
class Box:
    """What a prediction runs on: a GPU class, its fabric and the GPU count."""

    gpu: GpuClass
    fabric: Fabric
    gpus: int = 8

    @property
    def label(self) -> str:
        """``8x b300 (nvlink-sm100)``."""
        return f"{self.gpus}x {self.gpu.key} ({self.fabric.key})"


@dataclass(frozen=True)
class Served:
    """What is served: the target and drafter as published, and the τ of each algorithm / budget."""

    target: Target
    drafter: Drafter
    taus: dict[str, float] = field(default_factory=dict)  # "dflash", "16", ... (drafter_profiles_fit.json)
    context: int = 1024  # tokens of context a request attends to (the bench's prompts + half its output)

    def tau(self, algorithm: str, budget: int | None) -> float:
        """τ of ``algorithm`` at ``budget`` (interpolated between the profile's budgets)."""
        if algorithm == AR:
            return 1.0
        if algorithm == DFLASH:
            return self.taus["dflash"]
        known = sorted((int(k), v) for k, v in self.taus.items() if k != "dflash")
        b = int(budget or 0)
        if b <= known[0][0]:
            return known[0][1]
        for (b0, t0), (b1, t1) in itertools.pairwise(known):
            if b <= b1:
                return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
        return known[-1][1]


def profile_taus(name: str = TAU_PROFILE) -> dict[str, float]:
    """τ per budget of a drafter profile's exact simulation (drafter_profiles_fit.json ``check``)."""
    fit = json.loads((resources.files("repro") / "data" / "drafter_profiles_fit.json").read_text())
    return {k: float(v) for k, v in fit["profiles"][name]["check"]["tau"].items()}


def kimi_k26(expert_bytes: float | None = None) -> Served:
    """Kimi-K2.6 as published (repro/data/models/k26-tp8.toml [reference.*]), INT4 experts, with the
    DFlash drafter of Kimi-K2.5-DFlash's shape and the K2.5-DFlash card's τ profile."""
    from repro.testmodels.configs import read_model
    from repro.topology.compute import INT4_G32

    ref = read_model("k26-tp8")["reference"]
    t, d = ref["target"], ref["drafter"]
    cfg = {"hidden_size": t["hidden_size"], "num_hidden_layers": t["num_hidden_layers"], "vocab_size": t["vocab_size"],
           "num_attention_heads": t["num_attention_heads"], "q_lora_rank": t["q_lora_rank"],
           "kv_lora_rank": t["kv_lora_rank"], "qk_nope_head_dim": t["qk_nope_head_dim"],
           "qk_rope_head_dim": t["qk_rope_head_dim"], "v_head_dim": t["v_head_dim"], "first_k_dense_replace": 1,
           "intermediate_size": t["intermediate_size"], "n_routed_experts": t["n_routed_experts"],
           "num_experts_per_tok": t["num_experts_per_tok"], "moe_intermediate_size": t["moe_intermediate_size"],
           "n_shared_experts": t["n_shared_experts"]}
    target = Target.from_config("Kimi-K2.6", cfg, INT4_G32 if expert_bytes is None else expert_bytes)
    drafter = Drafter(d["num_hidden_layers"], d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"],
                      d["head_dim"], d["intermediate_size"], d["block_size"], len(d["target_layer_ids"]))
    return Served(target, drafter, profile_taus())


def verify_tokens(algorithm: str, budget: int | None, block: int) -> int:
    """N: tokens a request verifies a round."""
    return {AR: 1, DFLASH: block}.get(algorithm, int(budget or 0) + 1)


def predict_round(served: Served, box: Box, config: str, algorithm: str, budget: int | None, concurrency: int, *,
                  cal: Calibration = DEFAULT, host: HostTime | None = None, spread: str = "skewed",
                  graph_max_tokens: int = 4112) -> dict[str, Any]:
    """One cell's prediction with its parts (ms), as a JSON-ready dict."""
    host = host or DEFAULT_HOST
    t, d, p = served.target, served.drafter, box.gpus
    n = verify_tokens(algorithm, budget, d.block)
    tokens = concurrency * n
    bw, fl = box.gpu.hbm_tb_s, box.gpu.bf16_tflops
    work = target_work(t, config, p, tokens, context=served.context, requests=concurrency, spread_kind=spread)
    target_us = forward_us(cal, work, bw, fl)
    drafter_us = 0.0 if algorithm == AR else forward_us(cal, drafter_work(d, t, p, concurrency,
                                                                            context=served.context), bw, fl)
    graph = tokens <= graph_max_tokens
    plan = target_collectives(config, hidden=t.hidden, vocab=t.vocab, layers=t.layers, tokens=tokens, p=p, topk=t.topk)
    plan += drafter_collectives(algorithm, hidden=d.hidden, layers=d.layers, requests=concurrency, block=d.block, p=p,
                                budget=int(budget or 0))
    coll_us, parts = collectives_us(box.fabric, plan, graph=graph)
    host_ms = host.at(algorithm, tokens)
    round_ms = (target_us + drafter_us + coll_us) / 1e3 + host_ms
    tau = served.tau(algorithm, budget)
    return {"config": config, "algorithm": algorithm, "budget": budget, "concurrency": concurrency, "tokens": tokens,
            "tau": tau, "target_ms": target_us / 1e3, "drafter_ms": drafter_us / 1e3, "collectives_ms": coll_us / 1e3,
            "host_ms": host_ms, "round_ms": round_ms, "tok_s": concurrency * tau / round_ms * 1e3,
            "expert_gb": work.expert_bytes * work.moe_layers / 1e9, "weights_gb": (work.dense_bytes +
                                                                                    work.expert_bytes * work.moe_layers) / 1e9,
            "rank_share": work.spread.rank_share if work.spread and config != "tp" else None,
            "experts_read": (work.spread.max_experts if config != "tp" else work.spread.experts) if work.spread else None,
            "graph": graph, "collectives": parts}


def configs_for(box: Box) -> list[str]:
    """The configurations SGLang 0.5.17 can run on ``box``: DeepEP only with NVLink P2P."""
    return ["tp", "ep", "deepep"] if box.fabric.deepep else ["tp", "ep"]


def cells() -> list[tuple[str, int | None]]:
    """(algorithm, budget) of the prediction table: AR, DFLASH, DDTREE at every BUDGETS."""
    return [(AR, None), (DFLASH, None), *((DDTREE, b) for b in BUDGETS)]


def predict_table(served: Served, box: Box, *, cal: Calibration = DEFAULT, host: HostTime | None = None,
                  spread: str = "skewed", concurrency: tuple[int, ...] = CONCURRENCY) -> list[dict[str, Any]]:
    """Every configuration x algorithm / budget x concurrency on ``box``."""
    return [predict_round(served, box, config, algorithm, budget, c, cal=cal, host=host, spread=spread)
            for config in configs_for(box) for algorithm, budget in cells() for c in concurrency]


def best(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The fastest row (tok/s) among those matching every ``key=value``."""
    hits = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return max(hits, key=lambda r: r["tok_s"]) if hits else None
