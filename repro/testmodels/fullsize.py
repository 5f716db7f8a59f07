"""Full-size planted targets: configs as data (``repro/data/models/*.toml``), weights made at load.

Each TOML names a target config (written as ``config.json``), a drafter of its published DFlash
drafter's shape, the memory budget it must fit on one GPU, and the planting seeds. The written
directories hold configs and JSON only; SGLang serves them with ``--load-format dummy`` and patch
0005 plants the target in memory (repro.testmodels.plant), so a 117 GiB target needs no disk.

Also here: the weight and KV-cache arithmetic (as SGLang 0.5.17 holds the modules at TP1), the
layer count a budget allows, SGLang's rule for a DFlash drafter's target layers, and the router
spread (how many distinct experts N distinct tokens activate per layer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.evidence.prompts import DISTINCT
from repro.testmodels.configs import FULLSIZE, read_model, write_config
from repro.testmodels.plant import router_weight
from repro.testmodels.planted import planted_info, planted_ranked, successor_table, write_hook

GIB = 1 << 30
BF16 = 2


@dataclass(frozen=True)
class Budget:
    """What one GPU must hold: weights + the KV cache of ``requests`` x ``context`` tokens."""

    gpu_gib: float
    mem_fraction_static: float
    requests: int
    context: int

    @property
    def static_bytes(self) -> int:
        """SGLang's static pool (weights + KV): mem-fraction-static x GPU memory."""
        return int(self.mem_fraction_static * self.gpu_gib * GIB)


@dataclass(frozen=True)
class FullSizeModel:
    """One ``repro/data/models/NAME.toml``."""

    name: str
    description: str
    target: dict  # config.json of the target
    drafter: dict  # config.json of the drafter
    reference: dict  # the published configs a TP share derives from ({} for a whole model)
    budget: Budget
    seed: int
    router_seed: int
    sources: dict
    hook_profile: str | None = None  # the drafter test hook's profile (repro/data/drafter_profiles.toml)

    @property
    def drafter_name(self) -> str:
        """The drafter's directory name."""
        return f"{self.name}-dflash"


def load_model(name: str) -> FullSizeModel:
    """The full-size model ``name`` (one of configs.FULLSIZE); ValueError naming the file and key."""
    data = read_model(name, ("description", "budget", "plant", "target", "drafter"))
    b = data["budget"]
    budget = Budget(float(b["gpu-gib"]), float(b["mem-fraction-static"]), int(b["requests"]), int(b["context"]))
    return FullSizeModel(name=name, description=data["description"], target=data["target"],
                         drafter=data["drafter"], reference=data.get("reference", {}), budget=budget,
                         seed=int(data["plant"]["seed"]), router_seed=int(data["plant"].get("router-seed", 0)),
                         sources=data.get("sources", {}), hook_profile=data["plant"].get("hook-profile"))


def _gqa_layer(cfg: dict) -> int:
    """Parameters of one Qwen3-style layer (fused QKV, q/k norms, SwiGLU MLP, two norms)."""
    hid, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return hid * (q + 2 * kv) + q * hid + 2 * hd + 3 * hid * cfg["intermediate_size"] + 2 * hid


def _mla_attention(cfg: dict) -> int:
    """Parameters of one DeepseekV3 MLA block, the absorbed w_kc / w_vc copies included."""
    hid, heads, q_lora, kv_lora = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"],
                                   cfg["kv_lora_rank"])
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    return (hid * q_lora + q_lora + q_lora * heads * (nope + rope) + hid * (kv_lora + rope) + kv_lora
            + 2 * kv_lora * heads * (nope + v) + heads * v * hid + 2 * hid)


def weight_bytes(cfg: dict) -> int:
    """Bytes of a bf16 Qwen3, DeepseekV3 or DFlash-drafter config as SGLang holds it at TP1."""
    arch, hid, layers = cfg["architectures"][0], cfg["hidden_size"], cfg["num_hidden_layers"]
    if arch == "DFlashDraftModel":
        n_ctx = len(cfg["dflash_config"]["target_layer_ids"])
        return BF16 * (layers * _gqa_layer(cfg) + n_ctx * hid * hid + 2 * hid)
    io = BF16 * (2 * cfg["vocab_size"] * hid + hid)  # embedding, head (untied), final norm
    if arch == "Qwen3ForCausalLM":
        return io + BF16 * layers * _gqa_layer(cfg)
    if arch != "DeepseekV3ForCausalLM":
        msg = f"weight_bytes: architecture {arch!r} is not Qwen3, DeepseekV3 or DFlash"
        raise ValueError(msg)
    dense = min(cfg["first_k_dense_replace"], layers)
    experts, moe_inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    moe = BF16 * (experts * hid + 3 * hid * moe_inter * (experts + cfg["n_shared_experts"])) + 4 * experts
    return (io + BF16 * layers * _mla_attention(cfg) + dense * BF16 * 3 * hid * cfg["intermediate_size"]
            + (layers - dense) * moe)


def kv_bytes_per_token(cfg: dict) -> int:
    """KV-cache bytes one token takes over all layers (MLA: latent + rope; GQA: K and V)."""
    if cfg["architectures"][0] == "DeepseekV3ForCausalLM":
        per_layer = BF16 * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    else:
        per_layer = BF16 * 2 * cfg["num_key_value_heads"] * cfg["head_dim"]
    return per_layer * cfg["num_hidden_layers"]


def static_bytes(model: FullSizeModel, layers: int | None = None) -> int:
    """Target + drafter weights + both KV caches for the budget's tokens (``layers`` overrides)."""
    target = model.target if layers is None else {**model.target, "num_hidden_layers": layers}
    tokens = model.budget.requests * model.budget.context
    return (weight_bytes(target) + weight_bytes(model.drafter)
            + tokens * (kv_bytes_per_token(target) + kv_bytes_per_token(model.drafter)))


def max_layers(model: FullSizeModel) -> int:
    """The most target layers whose :func:`static_bytes` fit the budget's static pool."""
    layers = 1
    while static_bytes(model, layers + 1) <= model.budget.static_bytes:
        layers += 1
    return layers


def dflash_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """SGLang's DFlash rule for the target layers a drafter reads: spread over 1 .. L - 3.

    It gives the published drafters' lists: [1, 9, 17, 25, 33] for Qwen3-8B (36 layers, 5 draft
    layers) and [1, 12, 24, 35, 47, 58] for Kimi-K2.5 (61 layers, 6).
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def moe_layers(cfg: dict) -> list[int]:
    """The layer indices that route through experts (none for a dense config)."""
    if "n_routed_experts" not in cfg:
        return []
    return list(range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]))


def expert_spread(model: FullSizeModel, counts: list[int]) -> dict[int, list[int]]:
    """For each N in ``counts``: distinct experts that N distinct tokens activate, per MoE layer.

    The planted residual of token t is one-hot in ``t mod H``, so its router logits are column
    ``t mod H`` of the planted router (times a positive constant) and its experts that column's
    top-k; tokens 0 .. N-1 stand for N tokens distinct modulo H.
    """
    cfg = model.target
    experts, k, hid = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"]
    spread: dict[int, list[int]] = {n: [] for n in counts}
    for layer in moe_layers(cfg):
        top = router_weight(model.router_seed, layer, experts, hid).topk(k, dim=0).indices  # [k, H]
        for n in counts:
            spread[n].append(int(torch.unique(top[:, :n]).numel()))
    return spread


def prompt_ids(model: FullSizeModel, count: int, prompts: str = DISTINCT) -> list[list[int]]:
    """The first ``count`` prompts of a set as the token ids `repro bench` sends this target
    (no tokenizer: UTF-8 byte ids, cut to their last 1,024; ``humaneval-distinct``, as
    verify/device/experiments.toml benches it, ends each on a token of its own)."""
    from repro.evidence.prompts import load_prompts, request_input

    vocab = model.target["vocab_size"]
    return [request_input(p, tokenizer="none", vocab_size=vocab, max_tokens=1024)["input_ids"]
            for p in load_prompts(prompts).prompts[:count]]


def tree_tokens(model: FullSizeModel, budgets: list[int], prompts: list[list[int]]) -> dict[int, torch.Tensor]:
    """For each DDTREE budget B: [len(prompts), B + 1] the token ids of the tree (root first) that
    the target's test hook drafts in each prompt's first round.

    A tree's nodes at one depth share that position's best tokens, so its B + 1 tokens repeat.
    """
    from repro.ddtree import build_trees
    from repro.drafter_hook.hook import DrafterTestHook
    from repro.drafter_hook.profiles import named_profile

    cfg = model.target
    hook = DrafterTestHook.build(successor_table(planted_ranked(cfg["hidden_size"], model.seed), cfg["vocab_size"]),
                                 named_profile(model.hook_profile), horizon=model.drafter["block_size"] - 1,
                                 seed=model.seed)
    roots = hook.successor[torch.tensor([ids[-1] for ids in prompts])]  # the prefill's token
    logits = hook.logits(roots, torch.tensor([len(ids) for ids in prompts]))
    return {budget: build_trees(logits, budget, roots).tokens for budget in budgets}


def tree_spread(model: FullSizeModel, budgets: list[int], prompts: list[list[int]]) -> dict[int, tuple[float, float]]:
    """For each DDTREE budget B: (distinct tokens, distinct experts per MoE layer) of ``tree_tokens``,
    means over prompts and layers.

    The planted router routes by token, so a repeated token reads no further expert (compare
    ``expert_spread`` at N = B + 1: what as many distinct tokens read).
    """
    cfg = model.target
    experts, k, hid = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"]
    tops = [router_weight(model.router_seed, layer, experts, hid).topk(k, dim=0).indices for layer in moe_layers(cfg)]
    out = {}
    for budget, tokens in tree_tokens(model, budgets, prompts).items():
        classes = [torch.unique(row[row >= 0] % hid) for row in tokens]
        reads = [int(torch.unique(top[:, c]).numel()) for c in classes for top in tops]
        out[budget] = (sum(c.numel() for c in classes) / len(classes), sum(reads) / len(reads))
    return out


def write_model(out: Path, model: FullSizeModel) -> dict:
    """``out/NAME/`` (config.json, planted.json, hook.json) and ``out/NAME-dflash/config.json``.

    Returns the planted.json content. Configs only: patch 0005 makes the weights at load.
    """
    cfg = model.target
    ranked = planted_ranked(cfg["hidden_size"], model.seed)
    need = static_bytes(model) / model.budget.mem_fraction_static
    info = planted_info(ranked, vocab=cfg["vocab_size"], eps=cfg["rms_norm_eps"],
                        architecture=cfg["architectures"][0], num_hidden_layers=cfg["num_hidden_layers"],
                        router_seed=model.router_seed, gpu_bytes_needed=int(need))
    write_config(out / model.name, cfg)
    write_config(out / model.drafter_name, model.drafter)
    (out / model.name / "planted.json").write_text(json.dumps(info) + "\n")
    write_hook(out / model.name / "hook.json", info, seed=model.seed, profile=model.hook_profile)
    return info


def write_fullsize(out: Path) -> list[str]:
    """Every full-size model under ``out``; the directory names written."""
    names = []
    for name in FULLSIZE:
        model = load_model(name)
        write_model(out, model)
        names += [model.name, model.drafter_name]
    return names
