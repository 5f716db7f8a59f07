"""The small written test models: safetensors the project makes itself, for configs held as data.

*Planted* Qwen3 target (repro.testmodels.planted): inert layers, one-hot embeddings and a planted
LM head, so its greedy next token is a known function of the context with large logit margins
and token-for-token equality tests are meaningful in bf16 (random weights give near-ties,
docs/GPU-NOTES.md). The model is deliberately blind to attention (a bigram); the random-weight target
below is the one whose outputs depend on the whole context (attention masks, KV commit),
compared up to bf16 ties.

Also written: a *random* Qwen3 target (N(0, 0.02), lm_head N(0, 0.1)), a DFlash drafter with
random weights, and the drafter test-hook file (repro.drafter_hook.hook).

A DeepseekV3 / Kimi-shaped target (MLA + MoE) comes in both flavours: ``mla-planted`` (inert
layers, the planted embeddings and head: the same exact outputs through the MLA and MoE code)
and ``mla-random``.

For throughput only, ``moe/`` + ``moe-dflash/`` hold just the configs of a Kimi-shaped MoE
target (reduced width, Kimi's vocabulary, 64 experts) and its drafter: the TP vs EP profiles
serve them with ``--load-format dummy``.

The configs are ``repro/data/models/small-*.toml`` (repro.testmodels.configs).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from repro.testmodels.configs import SMALL_KIMI_MOE, SMALL_MLA_MOE, SMALL_QWEN3, read_model, write_config
from repro.testmodels.planted import fill_embedding_, fill_head_, planted_info, planted_ranked, write_hook


def _normal(gen: torch.Generator, *shape: int, std: float) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _layer(prefix: str, cfg: dict, gen: torch.Generator, *, inert: bool) -> dict[str, torch.Tensor]:
    """Weights of one Qwen3 decoder layer; ``inert`` zeroes the two output projections."""
    hid, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    out = {
        f"{prefix}.self_attn.q_proj.weight": _normal(gen, heads * hd, hid, std=0.02),
        f"{prefix}.self_attn.k_proj.weight": _normal(gen, kv * hd, hid, std=0.02),
        f"{prefix}.self_attn.v_proj.weight": _normal(gen, kv * hd, hid, std=0.02),
        f"{prefix}.self_attn.o_proj.weight": _normal(gen, hid, heads * hd, std=0.02),
        f"{prefix}.self_attn.q_norm.weight": torch.ones(hd),
        f"{prefix}.self_attn.k_norm.weight": torch.ones(hd),
        f"{prefix}.mlp.gate_proj.weight": _normal(gen, inter, hid, std=0.02),
        f"{prefix}.mlp.up_proj.weight": _normal(gen, inter, hid, std=0.02),
        f"{prefix}.mlp.down_proj.weight": _normal(gen, hid, inter, std=0.02),
        f"{prefix}.input_layernorm.weight": torch.ones(hid),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hid),
    }
    if inert:
        out[f"{prefix}.self_attn.o_proj.weight"].zero_()
        out[f"{prefix}.mlp.down_proj.weight"].zero_()
    return out


def _save(out_dir: Path, cfg: dict, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    write_config(out_dir, cfg)
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    save_file(bf16, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def _planted_io(ranked: list[list[int]], vocab: int) -> dict[str, torch.Tensor]:
    """One-hot embeddings (coordinate t mod H), unit final norm, and the planted LM head."""
    hid = len(ranked[0])
    embed, head = torch.zeros(vocab, hid), torch.zeros(vocab, hid)
    fill_embedding_(embed, vocab)
    fill_head_(head, ranked)
    return {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(hid), "lm_head.weight": head}


def _mla_moe_layer(prefix: str, i: int, cfg: dict, gen: torch.Generator, *, inert: bool) -> dict[str, torch.Tensor]:
    """Weights of one DeepseekV3 decoder layer (HF names); ``inert`` zeroes every output projection."""
    hid, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    out = {
        f"{prefix}.input_layernorm.weight": torch.ones(hid),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hid),
        f"{prefix}.self_attn.q_a_proj.weight": _normal(gen, q_lora, hid, std=0.02),
        f"{prefix}.self_attn.q_a_layernorm.weight": torch.ones(q_lora),
        f"{prefix}.self_attn.q_b_proj.weight": _normal(gen, heads * qk, q_lora, std=0.02),
        f"{prefix}.self_attn.kv_a_proj_with_mqa.weight": _normal(gen, kv_lora + cfg["qk_rope_head_dim"], hid, std=0.02),
        f"{prefix}.self_attn.kv_a_layernorm.weight": torch.ones(kv_lora),
        f"{prefix}.self_attn.kv_b_proj.weight": _normal(
            gen, heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), kv_lora, std=0.02
        ),
        f"{prefix}.self_attn.o_proj.weight": _normal(gen, hid, heads * cfg["v_head_dim"], std=0.02),
    }
    mlps = {}
    if i < cfg["first_k_dense_replace"]:
        mlps["mlp"] = cfg["intermediate_size"]
    else:
        out[f"{prefix}.mlp.gate.weight"] = _normal(gen, cfg["n_routed_experts"], hid, std=0.02)
        out[f"{prefix}.mlp.gate.e_score_correction_bias"] = torch.zeros(cfg["n_routed_experts"])
        for j in range(cfg["n_routed_experts"]):
            mlps[f"mlp.experts.{j}"] = cfg["moe_intermediate_size"]
        mlps["mlp.shared_experts"] = cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    for name, inter in mlps.items():
        out[f"{prefix}.{name}.gate_proj.weight"] = _normal(gen, inter, hid, std=0.02)
        out[f"{prefix}.{name}.up_proj.weight"] = _normal(gen, inter, hid, std=0.02)
        out[f"{prefix}.{name}.down_proj.weight"] = _normal(gen, hid, inter, std=0.02)
    if inert:
        for key, value in out.items():
            if key.endswith(("o_proj.weight", "down_proj.weight")):
                value.zero_()
    return out


def _write_mla_moe(out_dir: Path, cfg: dict, *, planted: dict | None, seed: int) -> None:
    """A DeepseekV3-shaped MLA + MoE target of config ``cfg``.

    With ``planted`` (a planted.json content) its layers are inert and its embeddings and head
    are the planted ones, so it has exactly the planted Qwen3 target's outputs while running the
    MLA and MoE code paths; without, all weights are random (lm_head N(0, 0.1)).
    """
    gen = torch.Generator().manual_seed(seed)
    hid, vocab = cfg["hidden_size"], cfg["vocab_size"]
    if planted is not None:
        tensors = _planted_io(planted["ranked"], vocab)
    else:
        tensors = {
            "model.embed_tokens.weight": _normal(gen, vocab, hid, std=0.02),
            "model.norm.weight": torch.ones(hid),
            "lm_head.weight": _normal(gen, vocab, hid, std=0.1),
        }
    for i in range(cfg["num_hidden_layers"]):
        tensors.update(_mla_moe_layer(f"model.layers.{i}", i, cfg, gen, inert=planted is not None))
    _save(out_dir, cfg, tensors)
    if planted is not None:
        (out_dir / "planted.json").write_text(json.dumps(planted) + "\n")


def _write_planted(out_dir: Path, cfg: dict, *, seed: int) -> dict:
    """Write the planted target; return its ``planted.json`` content (ranked tokens, logits)."""
    hid, vocab = cfg["hidden_size"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    ranked = planted_ranked(hid, seed)
    tensors = _planted_io(ranked, vocab)
    for i in range(cfg["num_hidden_layers"]):
        tensors.update(_layer(f"model.layers.{i}", cfg, gen, inert=True))
    _save(out_dir, cfg, tensors)
    info = planted_info(ranked, vocab=vocab, eps=cfg["rms_norm_eps"])
    (out_dir / "planted.json").write_text(json.dumps(info) + "\n")
    return info


def _write_random(out_dir: Path, cfg: dict, *, seed: int) -> None:
    """A random-weight target: context-dependent outputs, bf16 near-ties every ~10 tokens."""
    hid, vocab = cfg["hidden_size"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "model.embed_tokens.weight": _normal(gen, vocab, hid, std=0.02),
        "model.norm.weight": torch.ones(hid),
        "lm_head.weight": _normal(gen, vocab, hid, std=0.1),
    }
    for i in range(cfg["num_hidden_layers"]):
        tensors.update(_layer(f"model.layers.{i}", cfg, gen, inert=False))
    _save(out_dir, cfg, tensors)


def _write_drafter(out_dir: Path, cfg: dict, *, seed: int) -> None:
    """A DFlash drafter with random weights (no embedding or LM head: it borrows the target's)."""
    hid = cfg["hidden_size"]
    gen = torch.Generator().manual_seed(seed)
    n_ctx = len(cfg["dflash_config"]["target_layer_ids"])
    tensors = {
        "norm.weight": torch.ones(hid),
        "fc.weight": _normal(gen, hid, n_ctx * hid, std=0.02),
        "hidden_norm.weight": torch.ones(hid),
    }
    for i in range(cfg["num_hidden_layers"]):
        tensors.update(_layer(f"layers.{i}", cfg, gen, inert=False))
    _save(out_dir, cfg, tensors)


def write_small(out: Path, *, seed: int = 0) -> dict:
    """Every small model under ``out``; return the planted target's planted.json content.

    planted/, random/ (small-qwen3 [target]), mla-planted/, mla-random/ (small-mla-moe),
    dflash/ (small-qwen3 [drafter], the drafter of all of them), hook.json, and the config-only
    moe/ + moe-dflash/ pair (small-kimi-moe, for ``--load-format dummy``).
    """
    pair = ("description", "target", "drafter")
    qwen3, mla_moe, kimi_moe = read_model(SMALL_QWEN3, pair), read_model(SMALL_MLA_MOE), read_model(SMALL_KIMI_MOE, pair)
    planted = _write_planted(out / "planted", qwen3["target"], seed=seed)
    _write_random(out / "random", qwen3["target"], seed=seed + 1)
    _write_drafter(out / "dflash", qwen3["drafter"], seed=seed + 2)
    _write_mla_moe(out / "mla-planted", mla_moe["target"], planted=planted, seed=seed + 3)
    _write_mla_moe(out / "mla-random", mla_moe["target"], planted=None, seed=seed + 4)
    write_hook(out / "hook.json", planted, seed=seed)
    write_config(out / "moe", kimi_moe["target"])
    write_config(out / "moe-dflash", kimi_moe["drafter"])
    return planted
