"""Per-GPU compute of one forward: the bytes and FLOPs each GPU's share of a target reads and does,
and the time they take on a GPU class, calibrated on one-GPU measurements.

A target (``Target``: a DeepseekV3 MLA + MoE model such as Kimi-K2.6, or a dense Qwen3) split over p
GPUs in one of three configurations of SGLang 0.5.17 (``CONFIGS``):

- ``tp``: TP p. Attention heads split (q_b / kv_b column-, o_proj row-parallel; q_a, kv_a whole);
  every routed expert split in its intermediate (fused_moe_triton/layer.py:296-308: 384 x 2048 / 8
  = 384 x 256 a GPU); the shared expert split; the dense layer's MLP split; the LM head vocab-split.
- ``ep``: TP p + EP p with ``--moe-a2a-backend none``: attention as TP; E / p whole experts a GPU,
  every token replicated and non-local ids masked to -1 (token_dispatcher/standard.py:186-238), so a
  GPU reads the experts of its own that any token picked (48 x 2048 a GPU at 8).
- ``deepep``: TP p + EP p with DeepEP: as ``ep``, but each GPU runs its experts on the tokens
  dispatched to it, and the shared expert is replicated whole (deepseek_v2.py:724-745).

Bytes per GPU per forward: non-expert weights in bf16 (attention, the shared expert, the dense
layer, the router, the LM head shard: the K2 INT4 checkpoints keep them bf16), routed experts at
``expert_bytes`` a parameter (INT4 with a bf16 scale per 32 weights: 0.5625; the planted shares:
bf16), and the KV cache the attention reads (MLA's latent cache is replicated on every TP rank).

Time on GPU class G (``forward_us``): per layer a fixed ``layer_us`` (the kernels' floors), the
non-expert GEMMs at their roofline (bytes at ``dense_eff`` of G's HBM bandwidth or FLOPs at
``flops_eff`` of its bf16 peak, whichever is longer), and per MoE layer ``moe.fixed_us`` plus the
experts' bytes at ``moe.bw_eff`` and their FLOPs at ``moe.flops_eff`` (``moe`` chosen by the expert
slice's width: the fused-MoE kernel runs 256-wide TP slices and 2048-wide whole experts at different
efficiencies; summed, not overlapped, as the fitted constants absorb). The constants are a
``Calibration``: fitted on one H200 (``fit``, from the one-GPU share measurements of
verify/bench/share_cost.py and verify_cost.py) and carried to other GPUs by their datasheet
bandwidth and FLOPs (repro/data/collectives.toml [gpus]). ``DEFAULT`` is that fit on the committed
measurements (docs/perf); ``ROOFLINE`` the guess with stated constants the model used before them, and
``--compute FILE`` (a share_cost.py result) replaces the MoE constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from repro.testmodels.spread import Spread, spread

BF16 = 2
INT4_G32 = 0.5 + BF16 / 32  # bytes a parameter: 4 bits + a bf16 scale per 32 weights
CONFIGS = ("tp", "ep", "deepep")
WIDE = 1024  # expert slices at least this wide use the calibration's "wide" MoE constants


@dataclass(frozen=True)
class Target:
    """A served model as published (the whole model, not a share)."""

    name: str
    hidden: int
    layers: int
    vocab: int
    attention: str  # mla | gqa
    heads: int
    kv_heads: int = 0  # gqa
    head_dim: int = 0  # gqa
    q_lora: int = 0  # mla
    kv_lora: int = 0
    nope: int = 0
    rope: int = 0
    v_dim: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP (all of them for a dense model)
    dense_inter: int = 0
    experts: int = 0
    topk: int = 0
    moe_inter: int = 0
    shared_inter: int = 0
    expert_bytes: float = BF16

    @property
    def moe_layers(self) -> int:
        """Layers that route through experts."""
        return self.layers - self.dense_layers if self.experts else 0

    @classmethod
    def from_config(cls, name: str, cfg: dict, expert_bytes: float = BF16) -> Target:
        """From a HF ``config.json`` (DeepseekV3 or Qwen3)."""
        hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        if "kv_lora_rank" in cfg:
            experts = cfg.get("n_routed_experts", 0)
            return cls(name, hidden, layers, vocab, "mla", cfg["num_attention_heads"], q_lora=cfg["q_lora_rank"],
                       kv_lora=cfg["kv_lora_rank"], nope=cfg["qk_nope_head_dim"], rope=cfg["qk_rope_head_dim"],
                       v_dim=cfg["v_head_dim"], dense_layers=min(cfg.get("first_k_dense_replace", 0), layers) if experts
                       else layers, dense_inter=cfg["intermediate_size"], experts=experts,
                       topk=cfg.get("num_experts_per_tok", 0), moe_inter=cfg.get("moe_intermediate_size", 0),
                       shared_inter=cfg.get("moe_intermediate_size", 0) * cfg.get("n_shared_experts", 0),
                       expert_bytes=expert_bytes)
        return cls(name, hidden, layers, vocab, "gqa", cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
                   head_dim=cfg.get("head_dim", hidden // cfg["num_attention_heads"]), dense_layers=layers,
                   dense_inter=cfg["intermediate_size"])

    def kv_bytes_per_token(self, p: int) -> float:
        """KV-cache bytes a GPU holds per token over all layers (MLA's latent whole on every rank)."""
        if self.attention == "mla":
            return BF16 * (self.kv_lora + self.rope) * self.layers
        return BF16 * 2 * max(self.kv_heads // p, 1) * self.head_dim * self.layers


@dataclass(frozen=True)
class Drafter:
    """A DFlash drafter (Qwen3-style layers, the target's embedding and LM head)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    block: int
    context_layers: int  # target layers its fc reads (the fc is whole on every GPU)

    @classmethod
    def from_config(cls, cfg: dict) -> Drafter:
        """From a DFlash drafter's ``config.json``."""
        return cls(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                   cfg["head_dim"], cfg["intermediate_size"], cfg["block_size"],
                   len(cfg.get("dflash_config", {}).get("target_layer_ids", [])) or 1)


@dataclass(frozen=True)
class Work:
    """What one GPU reads and computes in one forward, split by how it is timed."""

    layers: int
    moe_layers: int
    dense_bytes: float  # non-expert weights + KV cache read
    dense_flops: float
    expert_bytes: float  # per MoE layer (the most-loaded GPU's under EP): each expert read once
    expert_flops: float  # per MoE layer
    expert_width: int  # intermediate width of one expert slice on this GPU
    spread: Spread | None = None
    expert_pad_flops: float = 0.0  # per MoE layer: every row of the 64-row M tiles (padding included), when BM is 64

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out = {k: getattr(self, k) for k in ("layers", "moe_layers", "dense_bytes", "dense_flops", "expert_bytes",
                                             "expert_pad_flops", "expert_flops", "expert_width")}
        out["spread"] = self.spread.as_dict() if self.spread else None
        return out


def _attention_params(t: Target, p: int) -> float:
    """Attention weights one GPU reads per layer (heads split over p)."""
    h = t.heads / p
    if t.attention == "mla":
        return (t.hidden * t.q_lora + t.hidden * (t.kv_lora + t.rope) + t.q_lora * h * (t.nope + t.rope)
                + t.kv_lora * h * (t.nope + t.v_dim) + h * t.v_dim * t.hidden)
    kv = max(t.kv_heads / p, 1)
    return t.hidden * (h + 2 * kv) * t.head_dim + h * t.head_dim * t.hidden


def _attention_flops(t: Target, p: int, tokens: int, context: int) -> float:
    """Score and value FLOPs of ``tokens`` queries over ``context`` cached tokens (MLA absorbed)."""
    h = t.heads / p
    width = (2 * t.kv_lora + t.rope) if t.attention == "mla" else 2 * t.head_dim
    return 2.0 * tokens * context * h * width * t.layers


def target_work(t: Target, config: str, p: int, tokens: int, *, context: int = 1024, requests: int = 1,
                spread_kind: str = "skewed", distinct: int | None = None) -> Work:
    """One GPU's work for a forward of ``tokens`` tokens of ``requests`` requests at ``context``; with
    ``distinct`` fewer than ``tokens`` (a tree's repeated tokens under a router that routes by token), the
    experts read are those ``distinct`` tokens pick, while every token's pairs are still computed."""
    if config not in CONFIGS:
        msg = f"config must be one of {', '.join(CONFIGS)} (got {config!r})"
        raise ValueError(msg)
    attn = _attention_params(t, p) * t.layers
    dense_mlp = 3 * t.hidden * t.dense_inter / p * t.dense_layers
    head = t.vocab / p * t.hidden
    moe = t.moe_layers
    shared = 3 * t.hidden * t.shared_inter / (1 if config == "deepep" else p) * moe
    router = t.experts * t.hidden * moe
    params = attn + dense_mlp + head + shared + router
    kv = t.kv_bytes_per_token(p) * context * requests
    dense_bytes = BF16 * params + kv
    shared_tokens = tokens / p if config == "deepep" else tokens
    dense_flops = 2.0 * tokens * (attn + dense_mlp + head + router) + 2.0 * shared_tokens * shared \
        + _attention_flops(t, p, tokens, context)
    if not moe:
        return Work(t.layers, 0, dense_bytes, dense_flops, 0.0, 0.0, 0)
    unique = max(min(distinct or tokens, tokens), 1)
    s = spread(spread_kind, unique, t.experts, t.topk, p if config != "tp" else _ranks(t.experts, p), t.hidden)
    rank = config != "tp"
    local = t.experts // p if rank else t.experts
    bm = block_m(tokens, local)  # SGLang picks the config by the batch's token count
    width = t.moe_inter if rank else t.moe_inter // p
    slice_params = 3 * t.hidden * width
    read, pairs = (s.max_experts, s.max_pairs) if rank else (s.experts, s.pairs)
    tiles64 = s.tiles(64, rank=rank)
    if unique < tokens:  # repeated tokens: the same experts, more rows each
        pairs *= tokens / unique
        tiles64 = read * math.ceil(pairs / max(read, 1) / 64)
    pad = 2.0 * tiles64 * 64 * slice_params if bm == 64 else 0.0
    return Work(t.layers, moe, dense_bytes, dense_flops, read * slice_params * t.expert_bytes, 2.0 * pairs * slice_params,
                width, s, pad)


def block_m(tokens: int, local_experts: int) -> int:
    """BLOCK_SIZE_M of SGLang's default fused-MoE config for bf16 / INT4-as-bf16 weights without a
    tuned file (moe_runner/triton_utils/fused_moe_triton_config.py get_default_config): 16 rows while
    the tokens are at most the local experts, 64 above."""
    return 16 if tokens <= local_experts else 64


def _ranks(experts: int, p: int) -> int:
    """A rank count dividing ``experts`` for the TP spread (its EP figures are not used)."""
    return p if experts % p == 0 else 1


def drafter_work(d: Drafter, t: Target, p: int, requests: int, *, context: int = 1024) -> Work:
    """One GPU's work for one drafter forward: ``requests`` x block tokens through its layers, the
    fc over the target's context features, and the LM head shard for block - 1 rows a request."""
    tokens = requests * d.block
    kv = max(d.kv_heads / p, 1)
    layer = d.hidden * (d.heads / p + 2 * kv) * d.head_dim + d.heads / p * d.head_dim * d.hidden \
        + 3 * d.hidden * d.inter / p
    fc = d.context_layers * d.hidden * d.hidden
    head = t.vocab / p * t.hidden
    kv_read = BF16 * 2 * kv * d.head_dim * d.layers * context * requests
    flops = 2.0 * tokens * (layer * d.layers + fc) + 2.0 * requests * (d.block - 1) * head \
        + 2.0 * tokens * context * (d.heads / p) * 2 * d.head_dim * d.layers
    return Work(d.layers, 0, BF16 * (layer * d.layers + fc + head) + kv_read, flops, 0.0, 0.0, 0)


@dataclass(frozen=True)
class MoeEfficiency:
    """The fused-MoE kernel's constants for one expert-slice width class."""

    fixed_us: float  # per MoE layer: routing, alignment, activation and combine kernels' floors
    bw_eff: float  # fraction of HBM bandwidth reading expert weights (each picked expert once)
    flops_eff: float  # fraction of bf16 peak on the token-expert pairs' FLOPs
    pad_eff: float = 1e9  # the same for every row of the 64-row M tiles (SGLang's default config past the local
    #                       expert count: block_m), padding included


@dataclass(frozen=True)
class Calibration:
    """The constants of ``forward_us``, fitted on ``device`` (a [gpus] key of collectives.toml)."""

    device: str
    layer_us: float
    dense_eff: float
    flops_eff: float
    moe: dict[str, MoeEfficiency] = field(default_factory=dict)  # "narrow" | "wide"
    source: str = ""

    def moe_for(self, width: int) -> MoeEfficiency:
        """The constants for slices ``width`` wide (narrow ones when no wide ones were measured)."""
        key = "wide" if width >= WIDE else "narrow"
        return self.moe.get(key) or self.moe["narrow"]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"device": self.device, "layer_us": self.layer_us, "dense_eff": self.dense_eff,
                "flops_eff": self.flops_eff, "moe": {k: vars(v) for k, v in self.moe.items()}, "source": self.source}


# The roofline guess the model used before any one-GPU share was measured, kept for reference: dense_eff
# 0.67, the H200 reads qwen3-8b's 15.1 GB of non-embedding weights in 4.67 ms at N 1 (docs/PERFORMANCE.md:
# 15.1 / 4.67 / 4.8 TB/s); layer_us 20, the 4-layer target's AR step is about 0.14 ms of GPU time for 4
# layers + head; the 256-wide fused MoE at about a third of the bandwidth, 0.35 (the k26-tp8 share's AR
# step is 3.4x its byte floor, 3.83 against 1.1 ms), 40 us a layer of routing and alignment; 2048-wide
# experts at the dense GEMMs' 0.67; flops_eff 0.5 of the bf16 peak.
ROOFLINE = Calibration(
    device="h200", layer_us=20.0, dense_eff=0.67, flops_eff=0.5,
    moe={"narrow": MoeEfficiency(40.0, 0.35, 0.35), "wide": MoeEfficiency(40.0, 0.67, 0.5)},
    source="roofline constants stated in repro/topology/compute.py (no one-GPU share measurement)")

# Measured: the MoE constants fitted on both shares' fused-MoE layer (docs/perf/share_cost_h100_2026-12-06.json,
# verify/bench/share_cost.py on one H100; efficiencies are fractions of the H100's datasheet bandwidth and
# FLOPs), flops_eff and layer_us then on the k26-tp8 share's whole forward on the H200
# (docs/perf/verify_cost_k26-tp8_h200_2026-12-02.json); dense_eff as ROOFLINE's. `python -m
# verify.bench.topology_check --shares FILE` refits them; verify/cpu/test_topology_evidence.py keeps these
# equal to that fit. The narrow (256-wide, TP8) slices read their bytes at 0.94 of the bandwidth, the wide
# (2048, EP8) experts at 0.89: per byte the two shapes cost about the same; what differs is how many bytes.
DEFAULT = Calibration(
    device="h100", layer_us=36.73, dense_eff=0.67, flops_eff=0.64,
    moe={"narrow": MoeEfficiency(41.76, 0.9437, 0.2306, 0.9404), "wide": MoeEfficiency(30.98, 0.8907, 0.3045, 0.6654)},
    source=("MoE constants fitted on docs/perf/share_cost_h100_2026-12-06.json (both shares' fused-MoE layer, "
            "216 rows); flops_eff and layer_us on docs/perf/verify_cost_k26-tp8_h200_2026-12-02.json"))


def moe_layer_us(cal: Calibration, w: Work, hbm_tb_s: float, tflops: float) -> float:
    """One MoE layer's routed-expert time on a GPU of ``hbm_tb_s`` / ``tflops``."""
    m = cal.moe_for(w.expert_width)
    return (m.fixed_us + w.expert_bytes / (m.bw_eff * hbm_tb_s * 1e6) + w.expert_flops / (m.flops_eff * tflops * 1e6)
            + w.expert_pad_flops / (m.pad_eff * tflops * 1e6))


def dense_us(cal: Calibration, w: Work, hbm_tb_s: float, tflops: float) -> float:
    """The non-expert part of a forward: the layers' floors, then the roofline of its GEMMs (their
    weight bytes or their FLOPs, whichever takes longer)."""
    return w.layers * cal.layer_us + max(w.dense_bytes / (cal.dense_eff * hbm_tb_s * 1e6),
                                         w.dense_flops / (cal.flops_eff * tflops * 1e6))


def forward_us(cal: Calibration, w: Work, hbm_tb_s: float, tflops: float) -> float:
    """A forward's GPU time on a GPU of ``hbm_tb_s`` TB/s and ``tflops`` bf16 TFLOP/s."""
    rest = dense_us(cal, w, hbm_tb_s, tflops)
    if not w.moe_layers:
        return rest
    return rest + w.moe_layers * moe_layer_us(cal, w, hbm_tb_s, tflops)


def with_moe(cal: Calibration, key: str, eff: MoeEfficiency, source: str) -> Calibration:
    """``cal`` with one MoE width class replaced (a measured fit)."""
    return replace(cal, moe={**cal.moe, key: eff}, source=f"{cal.source}; {source}" if cal.source else source)


def fit_linear(rows: list[tuple[list[float], float]], scale: list[float] | None = None) -> list[float]:
    """Non-negative least-squares coefficients of y ~ sum(c_i x_i), each row's error divided by its
    ``scale`` (default y: relative errors count); a regressor whose coefficient comes out negative is
    dropped (0) and the rest refit."""
    import numpy as np

    if not rows:
        msg = "fit_linear: no rows to fit"
        raise ValueError(msg)
    s = np.array(scale if scale is not None else [y for _, y in rows], dtype=float)
    x = np.array([xs for xs, _ in rows], dtype=float) / s[:, None]
    target = np.array([y for _, y in rows], dtype=float) / s
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], target, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return [float(c) for c in coef]


def _inverse(c: float) -> float:
    """1 / c, or a huge efficiency (the term costs nothing) for c = 0."""
    return 1 / c if c > 0 else 1e9


def fit_moe(points: list[dict[str, float]], hbm_tb_s: float, tflops: float) -> MoeEfficiency:
    """The MoE constants from measured layer times: each point's ``us`` against its expert ``bytes``
    (each picked expert read once), the pairs' ``flops`` and the 64-row tiles' ``pad_flops``,
    non-negative: t = fixed + bytes / (eff BW) + flops / (eff_f F) + pad_flops / (eff_p F)."""
    bw, fl = hbm_tb_s * 1e6, tflops * 1e6
    rows = [([1.0, p["bytes"] / bw, p["flops"] / fl, p.get("pad_flops", 0.0) / fl], p["us"]) for p in points]
    fixed, inv_bw, inv_f, inv_p = fit_linear(rows)
    return MoeEfficiency(fixed, _inverse(inv_bw), _inverse(inv_f), _inverse(inv_p))


def relative_errors(predicted: list[float], measured: list[float]) -> list[float]:
    """(predicted - measured) / measured, point by point."""
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]


def worst(errors: list[float]) -> float:
    """The largest |relative error| (0 for none)."""
    return max((abs(e) for e in errors), default=0.0)


def finite(x: float) -> bool:
    """Whether x is a finite float."""
    return isinstance(x, (int, float)) and math.isfinite(x)
