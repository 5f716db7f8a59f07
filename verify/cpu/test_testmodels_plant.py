"""Tests for `repro.testmodels.plant`: planting a loaded model in memory (patch 0005's step).

The planted law is checked numerically on reduced configs of both full-size architectures (a
Qwen3 GQA target, a DeepseekV3 MLA + MoE target): random weights under Hugging Face names,
planted in place, then a bf16 CPU forward written here (no SGLang) must produce exactly the
planted logits after every token. The names SGLang's modules use at TP1 are checked separately.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - the usual alias

from repro.testmodels import plant as plant_mod
from repro.testmodels.planted import planted_info, planted_ranked, served_logits, successor_table

BF16 = torch.bfloat16
EPS = 1e-5
QWEN = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 200}
MLA = {"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16,
       "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "intermediate_size": 96,
       "moe_intermediate_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
       "n_shared_experts": 1, "first_k_dense_replace": 1, "num_hidden_layers": 3, "vocab_size": 200,
       "routed_scaling_factor": 2.5}


def _rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 0.05).to(BF16)


def _mlp(p: dict, pre: str, hid: int, inter: int, gen: torch.Generator) -> None:
    for name, shape in (("gate_proj", (inter, hid)), ("up_proj", (inter, hid)), ("down_proj", (hid, inter))):
        p[f"{pre}.{name}.weight"] = _rand(gen, *shape)


def qwen_params(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random Qwen3 target under Hugging Face checkpoint names."""
    hid, hd, vocab = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    p = {"model.embed_tokens.weight": _rand(gen, vocab, hid), "model.norm.weight": _rand(gen, hid),
         "lm_head.weight": _rand(gen, vocab, hid)}
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}"
        p |= {f"{a}.self_attn.q_proj.weight": _rand(gen, q, hid), f"{a}.self_attn.k_proj.weight": _rand(gen, kv, hid),
              f"{a}.self_attn.v_proj.weight": _rand(gen, kv, hid), f"{a}.self_attn.o_proj.weight": _rand(gen, hid, q),
              f"{a}.self_attn.q_norm.weight": _rand(gen, hd), f"{a}.self_attn.k_norm.weight": _rand(gen, hd),
              f"{a}.input_layernorm.weight": _rand(gen, hid), f"{a}.post_attention_layernorm.weight": _rand(gen, hid)}
        _mlp(p, f"{a}.mlp", hid, cfg["intermediate_size"], gen)
    return p


def mla_params(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random DeepseekV3 target (MLA, a dense first layer, routed + shared experts), HF names."""
    hid, heads, vocab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora, experts = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["n_routed_experts"]
    p = {"model.embed_tokens.weight": _rand(gen, vocab, hid), "model.norm.weight": _rand(gen, hid),
         "lm_head.weight": _rand(gen, vocab, hid)}
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}"
        p |= {f"{a}.self_attn.q_a_proj.weight": _rand(gen, q_lora, hid),
              f"{a}.self_attn.q_a_layernorm.weight": _rand(gen, q_lora),
              f"{a}.self_attn.q_b_proj.weight": _rand(gen, heads * (nope + rope), q_lora),
              f"{a}.self_attn.kv_a_proj_with_mqa.weight": _rand(gen, kv_lora + rope, hid),
              f"{a}.self_attn.kv_a_layernorm.weight": _rand(gen, kv_lora),
              f"{a}.self_attn.kv_b_proj.weight": _rand(gen, heads * (nope + v), kv_lora),
              f"{a}.self_attn.o_proj.weight": _rand(gen, hid, heads * v),
              f"{a}.input_layernorm.weight": _rand(gen, hid), f"{a}.post_attention_layernorm.weight": _rand(gen, hid)}
        if i < cfg["first_k_dense_replace"]:
            _mlp(p, f"{a}.mlp", hid, cfg["intermediate_size"], gen)
            continue
        p[f"{a}.mlp.gate.weight"] = _rand(gen, experts, hid)
        p[f"{a}.mlp.gate.e_score_correction_bias"] = torch.randn(experts, generator=gen)
        for j in range(experts):
            _mlp(p, f"{a}.mlp.experts.{j}", hid, cfg["moe_intermediate_size"], gen)
        _mlp(p, f"{a}.mlp.shared_experts", hid, cfg["moe_intermediate_size"], gen)
    return p


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SGLang's RMSNorm: float32 statistics, then the weight, cast back to bf16."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(BF16)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over [T, heads, d] (bf16 in, bf16 out)."""
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) / q.shape[-1] ** 0.5
    t = q.shape[0]
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v.float()).to(BF16).reshape(t, -1)


def _swiglu(p: dict, pre: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, p[f"{pre}.gate_proj.weight"]), F.linear(x, p[f"{pre}.up_proj.weight"])
    return F.linear((F.silu(gate.float()) * up.float()).to(BF16), p[f"{pre}.down_proj.weight"])


def _gqa(p: dict, a: str, x: torch.Tensor, cfg: dict) -> torch.Tensor:
    t, hd, heads, kvh = x.shape[0], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q = _rms(F.linear(x, p[f"{a}.q_proj.weight"]).view(t, heads, hd), p[f"{a}.q_norm.weight"])
    k = _rms(F.linear(x, p[f"{a}.k_proj.weight"]).view(t, kvh, hd), p[f"{a}.k_norm.weight"])
    v = F.linear(x, p[f"{a}.v_proj.weight"]).view(t, kvh, hd)
    rep = heads // kvh
    return F.linear(_attend(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)), p[f"{a}.o_proj.weight"])


def _mla(p: dict, a: str, x: torch.Tensor, cfg: dict) -> torch.Tensor:
    t, heads, kv_lora = x.shape[0], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    q = F.linear(_rms(F.linear(x, p[f"{a}.q_a_proj.weight"]), p[f"{a}.q_a_layernorm.weight"]),
                 p[f"{a}.q_b_proj.weight"]).view(t, heads, nope + rope)
    latent, k_rope = F.linear(x, p[f"{a}.kv_a_proj_with_mqa.weight"]).split([kv_lora, rope], dim=-1)
    kv = F.linear(_rms(latent, p[f"{a}.kv_a_layernorm.weight"]), p[f"{a}.kv_b_proj.weight"]).view(t, heads, -1)
    k = torch.cat([kv[..., :nope], k_rope.unsqueeze(1).expand(t, heads, rope)], dim=-1)
    return F.linear(_attend(q, k, kv[..., nope:]), p[f"{a}.o_proj.weight"])


def _moe(p: dict, a: str, x: torch.Tensor, cfg: dict, chosen: list) -> torch.Tensor:
    """Sigmoid router with a correction bias, top-k, normalized weights, plus the shared expert."""
    scores = F.linear(x.float(), p[f"{a}.gate.weight"].float()).sigmoid()
    top = (scores + p[f"{a}.gate.e_score_correction_bias"]).topk(cfg["num_experts_per_tok"], dim=-1).indices
    chosen.append(top)
    weights = scores.gather(-1, top)
    weights = weights / weights.sum(-1, keepdim=True) * cfg["routed_scaling_factor"]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(cfg["n_routed_experts"]):
        rows, slot = (top == e).nonzero(as_tuple=True)
        out[rows] += weights[rows, slot, None] * _swiglu(p, f"{a}.experts.{e}", x[rows]).float()
    return (out + _swiglu(p, f"{a}.shared_experts", x).float()).to(BF16)


def forward(p: dict, cfg: dict, tokens: torch.Tensor, chosen: list | None = None) -> torch.Tensor:
    """[T, V] float logits of a Qwen3 (no ``q_lora_rank``) or DeepseekV3 config, in bf16."""
    x = p["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}"
        attn = _mla if "q_lora_rank" in cfg else _gqa
        x = x + attn(p, f"{a}.self_attn", _rms(x, p[f"{a}.input_layernorm.weight"]), cfg)
        h = _rms(x, p[f"{a}.post_attention_layernorm.weight"])
        moe = "q_lora_rank" in cfg and i >= cfg["first_k_dense_replace"]
        x = x + (_moe(p, f"{a}.mlp", h, cfg, chosen if chosen is not None else []) if moe else _swiglu(p, f"{a}.mlp", h))
    return F.linear(_rms(x, p["model.norm.weight"]), p["lm_head.weight"]).float()


def info_for(cfg: dict, architecture: str) -> dict:
    """planted.json content for a reduced config (seeded ranks, router seed 3)."""
    ranked = planted_ranked(cfg["hidden_size"], seed=5)
    return planted_info(ranked, vocab=cfg["vocab_size"], eps=EPS, architecture=architecture,
                        num_hidden_layers=cfg["num_hidden_layers"], router_seed=3)


CASES = {"qwen3": (QWEN, qwen_params, "Qwen3ForCausalLM"), "mla-moe": (MLA, mla_params, "DeepseekV3ForCausalLM")}


@pytest.fixture(scope="module", params=sorted(CASES))
def planted(request):
    """A reduced target of each architecture, planted, with its info and config."""
    cfg, build, arch = CASES[request.param]
    params, info = build(cfg, torch.Generator().manual_seed(11)), info_for(cfg, arch)
    report = plant_mod.plant_parameters(params.items(), info)
    return cfg, params, info, report


class TestPlantedLaw:
    def test_logits_after_every_token_are_the_planted_ones(self, planted):
        """After each token t the logits are served_logits at ranked[k][t mod H] and 0 elsewhere."""
        cfg, params, info, _ = planted
        tokens = torch.randperm(cfg["vocab_size"], generator=torch.Generator().manual_seed(2))
        logits = forward(params, cfg, tokens)
        want = torch.zeros_like(logits)
        cols = tokens % cfg["hidden_size"]
        for k, value in enumerate(served_logits(cfg["hidden_size"], EPS)):
            want[torch.arange(len(tokens)), torch.tensor(info["ranked"][k])[cols]] = value
        assert torch.equal(logits, want)

    def test_greedy_follows_the_successor_table(self, planted):
        """argmax after every token is successor[t]; the runner-up is a full logit behind."""
        cfg, params, info, _ = planted
        tokens = torch.arange(cfg["vocab_size"])
        top = forward(params, cfg, tokens).topk(2, dim=-1)
        assert top.indices[:, 0].tolist() == successor_table(info["ranked"], cfg["vocab_size"])
        assert float((top.values[:, 0] - top.values[:, 1]).min()) >= 0.9

    def test_an_output_left_nonzero_breaks_the_law(self, planted):
        """Negative control: one MLP output projection restored to random values changes the logits."""
        cfg, params, _, _ = planted
        name = next(k for k in params if k.endswith(("layers.1.mlp.down_proj.weight",
                                                     "layers.1.mlp.shared_experts.down_proj.weight")))
        broken = dict(params) | {name: _rand(torch.Generator().manual_seed(9), *params[name].shape)}
        tokens = torch.arange(cfg["vocab_size"])
        assert not torch.equal(forward(broken, cfg, tokens), forward(params, cfg, tokens))

    def test_every_layer_output_is_zeroed(self, planted):
        """The report lists an attention and an MLP output zeroed in every layer."""
        cfg, _, _, report = planted
        assert report.layers_zeroed == {i: {"attn", "mlp"} for i in range(cfg["num_hidden_layers"])}


class TestRouter:
    def test_forward_picks_the_experts_of_the_planted_router(self):
        """The MoE forward routes token t to the top-k of column t mod H of router_weight."""
        params, info = mla_params(MLA, torch.Generator().manual_seed(4)), info_for(MLA, "DeepseekV3ForCausalLM")
        plant_mod.plant_parameters(params.items(), info)
        chosen: list = []
        tokens = torch.arange(40)
        forward(params, MLA, tokens, chosen)
        for layer, top in zip(range(1, MLA["num_hidden_layers"]), chosen, strict=True):
            router = plant_mod.router_weight(3, layer, MLA["n_routed_experts"], MLA["hidden_size"])
            want = router[:, tokens % MLA["hidden_size"]].topk(MLA["num_experts_per_tok"], dim=0).indices.T
            assert torch.equal(top.sort(-1).values, want.sort(-1).values)

    def test_columns_are_permutations_of_distinct_bf16_values(self):
        """Every router column holds the same E distinct values, exactly representable in bf16."""
        w = plant_mod.router_weight(1, 7, 384, 64)
        assert torch.equal(w.to(BF16).float(), w)
        assert torch.equal(w.sort(dim=0).values, w[:, :1].sort(dim=0).values.expand(-1, 64))
        assert w[:, 0].unique().numel() == 384
        assert not torch.equal(w, plant_mod.router_weight(1, 8, 384, 64))

    def test_too_many_experts_is_an_error(self):
        """More than 512 experts cannot be ranked by distinct bf16 integers: ValueError."""
        with pytest.raises(ValueError, match=r"n_experts must be in 1\.\.512"):
            plant_mod.router_weight(0, 0, 513, 8)


def _sglang_names(cfg: dict) -> dict[str, torch.Tensor]:
    """SGLang 0.5.17's DeepseekV2 parameters at TP1: fused a-projections, fused MoE experts."""
    hid, vocab, experts = cfg["hidden_size"], cfg["vocab_size"], cfg["n_routed_experts"]
    p = {"model.embed_tokens.weight": torch.ones(vocab, hid), "lm_head.weight": torch.ones(vocab + 56, hid),
         "model.norm.weight": torch.zeros(hid)}
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}"
        p |= {f"{a}.self_attn.fused_qkv_a_proj_with_mqa.weight": torch.ones(8, hid),
              f"{a}.self_attn.q_a_layernorm.weight": torch.zeros(8), f"{a}.self_attn.kv_a_layernorm.weight": torch.zeros(8),
              f"{a}.self_attn.q_b_proj.weight": torch.ones(8, 8), f"{a}.self_attn.kv_b_proj.weight": torch.ones(8, 8),
              f"{a}.self_attn.o_proj.weight": torch.ones(hid, 8), f"{a}.input_layernorm.weight": torch.zeros(hid),
              f"{a}.post_attention_layernorm.weight": torch.zeros(hid)}
        if i == 0:
            p |= {f"{a}.mlp.gate_up_proj.weight": torch.ones(8, hid), f"{a}.mlp.down_proj.weight": torch.ones(hid, 4)}
        else:  # shared expert fused into the routed ones (SGLang's default on sm90)
            p |= {f"{a}.mlp.gate.weight": torch.ones(experts, hid, dtype=BF16),
                  f"{a}.mlp.gate.e_score_correction_bias": torch.ones(experts),
                  f"{a}.mlp.experts.w13_weight": torch.ones(experts + 1, 8, hid),
                  f"{a}.mlp.experts.w2_weight": torch.ones(experts + 1, hid, 4)}
    return p


class TestNames:
    def test_sglang_deepseek_parameters_are_planted_by_name(self):
        """SGLang's fused names: o_proj, down_proj and w2_weight zero; norms 1; w13 and kv_b untouched."""
        p = _sglang_names(MLA)
        report = plant_mod.plant_parameters(p.items(), info_for(MLA, "DeepseekV3ForCausalLM"))
        for name, t in p.items():
            if name.endswith(("o_proj.weight", "down_proj.weight", "w2_weight", "e_score_correction_bias")):
                assert not t.any(), name
            elif name.endswith(("norm.weight", "w13_weight", "kv_b_proj.weight", "q_b_proj.weight")):
                assert bool((t == 1).all()), name  # norms set to 1; the rest left as loaded (all ones)
        assert bool((p["lm_head.weight"][MLA["vocab_size"]:] == 0).all())
        assert report.routers == MLA["num_hidden_layers"] - 1 and report.ones == 4 * MLA["num_hidden_layers"] + 1

    def test_fused_hf_expert_projection_is_zeroed(self):
        """A fused Hugging Face expert tensor named ``experts.down_proj`` counts as an MLP output."""
        p = _sglang_names(MLA)
        for i in range(1, MLA["num_hidden_layers"]):
            p[f"model.layers.{i}.mlp.experts.down_proj"] = p.pop(f"model.layers.{i}.mlp.experts.w2_weight")
        plant_mod.plant_parameters(p.items(), info_for(MLA, "DeepseekV3ForCausalLM"))
        assert not p["model.layers.2.mlp.experts.down_proj"].any()

    def test_a_layer_left_open_is_an_error(self):
        """A layer whose MLP output no rule zeroes (an unknown name) is a ValueError naming it."""
        p = _sglang_names(MLA)
        p["model.layers.2.mlp.experts.w2_renamed"] = p.pop("model.layers.2.mlp.experts.w2_weight")
        with pytest.raises(ValueError, match=r"layers \[2\] keep a nonzero attention or MLP output"):
            plant_mod.plant_parameters(p.items(), info_for(MLA, "DeepseekV3ForCausalLM"))

    def test_sharded_embedding_is_an_error(self):
        """An embedding with fewer rows than the vocabulary (a TP shard) cannot be planted."""
        p = _sglang_names(MLA)
        p["model.embed_tokens.weight"] = torch.ones(MLA["vocab_size"] // 2, MLA["hidden_size"])
        with pytest.raises(ValueError, match=r"expected \[>= 200, 64\] \(the whole vocabulary on one rank"):
            plant_mod.plant_parameters(p.items(), info_for(MLA, "DeepseekV3ForCausalLM"))

    def test_missing_head_and_non_finite_weights_are_errors(self):
        """No lm_head, or a NaN anywhere (an inert layer would pass it on), is a ValueError."""
        p = _sglang_names(MLA)
        del p["lm_head.weight"]
        with pytest.raises(ValueError, match="no head parameter found"):
            plant_mod.plant_parameters(p.items(), info_for(MLA, "DeepseekV3ForCausalLM"))
        p = _sglang_names(MLA)
        p["model.layers.1.self_attn.kv_b_proj.weight"][0, 0] = float("nan")
        with pytest.raises(ValueError, match=r"kv_b_proj\.weight holds a non-finite value"):
            plant_mod.plant_parameters(p.items(), info_for(MLA, "DeepseekV3ForCausalLM"))


class DFlashDraftModel(torch.nn.Module):
    """Stands in for the drafter, which loads through the same dummy loader."""


class Qwen3ForCausalLM(torch.nn.Module):
    """Stands in for SGLang's target class (plant matches it by name)."""


def as_module(params: dict[str, torch.Tensor], cls: type) -> torch.nn.Module:
    """A ``cls`` module holding ``params`` under their dotted names."""
    root = cls()
    for name, tensor in params.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
    return root


class TestPlantFile:
    def test_the_drafter_is_left_as_loaded(self, tmp_path):
        """plant_file skips a model of another architecture and returns None."""
        path = tmp_path / "planted.json"
        path.write_text(json.dumps(info_for(QWEN, "Qwen3ForCausalLM")))
        params = qwen_params(QWEN, torch.Generator().manual_seed(1))
        before = {k: v.clone() for k, v in params.items()}
        assert plant_mod.plant_file(as_module(params, DFlashDraftModel), path) is None
        assert all(torch.equal(params[k], before[k]) for k in params)

    def test_a_module_of_the_named_architecture_is_planted(self, tmp_path):
        """plant_file plants the named parameters of a module whose class is the architecture."""
        info = info_for(QWEN, "Qwen3ForCausalLM")
        path = tmp_path / "planted.json"
        path.write_text(json.dumps(info))
        params = qwen_params(QWEN, torch.Generator().manual_seed(1))
        report = plant_mod.plant_file(as_module(params, Qwen3ForCausalLM), path)
        assert report is not None and report.zeroed == 2 * QWEN["num_hidden_layers"]
        tokens = torch.arange(QWEN["vocab_size"])
        assert forward(params, QWEN, tokens).argmax(-1).tolist() == successor_table(info["ranked"], QWEN["vocab_size"])
