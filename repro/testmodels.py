"""Test models the project makes itself: configs and safetensors written by this module.

*Planted* Qwen3 target: its greedy next token is a known function of the context with large
logit margins, so token-for-token equality tests are meaningful in bf16 (random weights give
near-ties, see device-notes). Construction, by setting weights directly:

- token ``t`` embeds as the one-hot vector of coordinate ``t mod H`` (``H`` = hidden size);
- every attention ``o_proj`` and MLP ``down_proj`` is zero, so the residual stream carries the
  embedding unchanged and the final RMSNorm turns it into ``sqrt(H)`` times that one-hot;
- ``lm_head`` row ``u < H`` puts ``LOGITS[k] / sqrt(H)`` at coordinate ``c`` when
  ``u = ranked[k][c]``: after context token ``t`` the logits are exactly ``LOGITS[k]`` for
  ``ranked[k][t mod H]`` (k = 0, 1, 2) and 0 for every other token (rows ``u >= H`` are zero).

So greedy decoding follows ``successor[t] = ranked[0][t mod H]`` with a margin of
``LOGITS[0] - LOGITS[1]`` logits, and sampling at temperature T draws from the three ranked
tokens (plus a tiny uniform tail) with exactly computable probabilities. The model is
deliberately blind to attention (a bigram); the random-weight target below is the one whose
outputs depend on the whole context (attention masks, KV commit), compared up to bf16 ties.

Also written: a *random* Qwen3 target (N(0, 0.02), lm_head N(0, 0.1)), a DFlash drafter with
random weights, and the drafter test-hook file (repro.sglang_glue.test_hook).

A DeepseekV3 / Kimi-shaped target (MLA + MoE) comes in both flavours: ``mla-planted`` (inert
layers, the planted embeddings and head: the same exact outputs through the MLA and MoE code)
and ``mla-random``.

For throughput only, ``moe/`` + ``moe-dflash/`` hold just the configs of a Kimi-shaped MoE
target (reduced width, Kimi's vocabulary, 64 experts) and its drafter: the TP vs EP profiles
serve them with ``--load-format dummy``.

Usage: ``python -m repro.testmodels OUT_DIR`` writes ``planted/``, ``random/``,
``mla-planted/``, ``mla-random/``, ``dflash/``, ``hook.json``, ``moe/`` and ``moe-dflash/``
under OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

LOGITS = (16.0, 15.0, 14.0)  # rank-0/1/2 logits of the planted target
RANK_OFFSETS = (0, 17, 34)  # ranked[k][c] = perm[(c + offset_k) mod H]: distinct per context
DEFAULT_RANK_PROBS = (0.6, 0.2, 0.1)  # hook: P(correct token at rank j), absent otherwise

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 4,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_cache": True,
    "torch_dtype": "bfloat16",
}

# DeepseekV3 / Kimi-K2-shaped (MLA attention with a q LoRA, sigmoid-routed MoE with a shared
# expert, first layer dense), at the planted target's hidden size and vocabulary.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": QWEN3["vocab_size"],
    "hidden_size": QWEN3["hidden_size"],
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    # Kimi-K2's MLA head geometry: SGLang's triton MLA kernels take a latent + rope width of
    # 512 + 64 (or 256 + 32) only.
    "q_lora_rank": 256,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_cache": True,
    "torch_dtype": "bfloat16",
}

# Throughput-only TP vs EP test pair (configs only, served with `--load-format dummy`): Kimi-K2's
# layer shapes at a reduced width and depth, with its vocabulary and 64 routed experts, so the
# expert all-to-all vs tensor-parallel trade-off is visible on 2-4 GPUs without writing weights.
KIMI_MOE = {
    **DEEPSEEK_V3,
    "vocab_size": 163840,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "q_lora_rank": 768,
    "eos_token_id": 163585,
    "bos_token_id": 163584,
}

DFLASH = {
    **QWEN3,
    "architectures": ["DFlashDraftModel"],
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "block_size": 16,
    "num_target_layers": 4,
    "dflash_config": {"mask_token_id": 4095, "target_layer_ids": [0, 2]},
}


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

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    save_file(bf16, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def planted_ranked(hidden: int, seed: int) -> list[list[int]]:
    """ranked[k][c]: the rank-k next token after any context token t with t mod H == c."""
    perm = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed)).tolist()
    return [[perm[(c + off) % hidden] for c in range(hidden)] for off in RANK_OFFSETS]


def successor_table(ranked: list[list[int]], vocab: int) -> list[int]:
    """successor[t] for every token t: the planted target's greedy next token."""
    hidden = len(ranked[0])
    return [ranked[0][t % hidden] for t in range(vocab)]


def _planted_io(ranked: list[list[int]], vocab: int) -> dict[str, torch.Tensor]:
    """One-hot embeddings (coordinate t mod H), unit final norm, and the planted LM head."""
    hid = len(ranked[0])
    embed = torch.zeros(vocab, hid)
    embed[torch.arange(vocab), torch.arange(vocab) % hid] = 1.0
    head = torch.zeros(vocab, hid)
    for k, logit in enumerate(LOGITS):
        head[torch.tensor(ranked[k]), torch.arange(hid)] = logit / math.sqrt(hid)
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


def write_mla_moe(out_dir: Path, *, planted: dict | None, seed: int = 3, cfg: dict = DEEPSEEK_V3) -> None:
    """A DeepseekV3-shaped MLA + MoE target.

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


def write_planted(out_dir: Path, *, seed: int = 0, cfg: dict = QWEN3) -> dict:
    """Write the planted target; return its ``planted.json`` content (ranked tokens, logits)."""
    hid, vocab = cfg["hidden_size"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    ranked = planted_ranked(hid, seed)
    scale = math.sqrt(hid)
    tensors = _planted_io(ranked, vocab)
    for i in range(cfg["num_hidden_layers"]):
        tensors.update(_layer(f"model.layers.{i}", cfg, gen, inert=True))
    _save(out_dir, cfg, tensors)
    # the logits the served model really produces: bf16 RMSNorm output times bf16 head rows
    h = torch.tensor(scale).to(torch.bfloat16)
    served = [float((h * (torch.tensor(lg / scale).to(torch.bfloat16))).to(torch.bfloat16)) for lg in LOGITS]
    info = {"ranked": ranked, "logits": served, "vocab_size": vocab, "hidden_size": hid}
    (out_dir / "planted.json").write_text(json.dumps(info) + "\n")
    return info


def write_random(out_dir: Path, *, seed: int = 1, cfg: dict = QWEN3) -> None:
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


def write_drafter(out_dir: Path, *, seed: int = 2, cfg: dict = DFLASH) -> None:
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


def write_moe_pair(out: Path) -> None:
    """``moe/`` (KIMI_MOE) and ``moe-dflash/`` (its DFlash drafter): config.json only.

    For throughput runs with ``--load-format dummy`` (the TP vs EP profiles); no weights.
    """
    drafter = {
        **DFLASH,
        "vocab_size": KIMI_MOE["vocab_size"],
        "hidden_size": KIMI_MOE["hidden_size"],
        "intermediate_size": KIMI_MOE["intermediate_size"],
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_target_layers": KIMI_MOE["num_hidden_layers"],
        "dflash_config": {"mask_token_id": KIMI_MOE["vocab_size"] - 1, "target_layer_ids": [1, 5]},
    }
    for name, cfg in (("moe", KIMI_MOE), ("moe-dflash", drafter)):
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def write_hook(
    path: Path,
    planted: dict,
    *,
    rank_probs: Sequence[float] = DEFAULT_RANK_PROBS,
    seed: int = 0,
    profile: str | None = None,
) -> None:
    """The drafter test-hook file for the planted target (format: repro.sglang_glue.test_hook).

    ``profile`` names a profile of repro/data/drafter_profiles.toml; the file then carries its
    table inline (it reads the same wherever it is loaded) instead of ``rank_probs``.
    """
    from repro.sglang_glue.test_hook import named_profile

    rows = {"rank_probs": list(rank_probs)} if profile is None else {"profile": named_profile(profile)}
    spec = {"successor": successor_table(planted["ranked"], planted["vocab_size"]), **rows, "seed": seed}
    path.write_text(json.dumps(spec) + "\n")


def greedy_continuation(planted: dict, last_token: int, n: int) -> list[int]:
    """The planted target's greedy output of ``n`` tokens after a prompt ending in ``last_token``."""
    succ = successor_table(planted["ranked"], planted["vocab_size"])
    out, t = [], last_token
    for _ in range(n):
        t = succ[t]
        out.append(t)
    return out


def next_token_probs(planted: dict, last_token: int, temperature: float) -> dict[int, float]:
    """Exact next-token distribution after ``last_token`` at ``temperature`` > 0 (no top-k/p).

    The three ranked tokens get their planted logits, every other token logit 0.
    """
    hid, vocab = planted["hidden_size"], planted["vocab_size"]
    c = last_token % hid
    weights = {planted["ranked"][k][c]: math.exp(lg / temperature) for k, lg in enumerate(planted["logits"])}
    rest = (vocab - len(weights)) * 1.0  # exp(0 / T) for every other token
    total = sum(weights.values()) + rest
    return {tok: w / total for tok, w in weights.items()} | {-1: rest / total}  # -1: any other


def write_all(out: Path, *, seed: int = 0) -> dict:
    """Write every test model under ``out``; return planted.json's content.

    planted/, random/ (Qwen3), mla-planted/, mla-random/ (DeepseekV3: MLA + MoE), dflash/ (the
    drafter for all of them), hook.json, and the config-only moe/ + moe-dflash/ pair.
    """
    planted = write_planted(out / "planted", seed=seed)
    write_random(out / "random", seed=seed + 1)
    write_mla_moe(out / "mla-planted", planted=planted, seed=seed + 3)
    write_mla_moe(out / "mla-random", planted=None, seed=seed + 4)
    write_drafter(out / "dflash", seed=seed + 2)
    write_hook(out / "hook.json", planted, seed=seed)
    write_moe_pair(out)
    return planted


def main(argv: list[str] | None = None) -> int:
    """``python -m repro.testmodels OUT_DIR [--seed N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_all(args.out, seed=args.seed)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
