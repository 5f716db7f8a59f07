"""Tests for `repro.testmodels.fullsize`: the full-size planted targets' configs, budgets and writers.

The Kimi target's config is one GPU's share of Kimi-K2.6 under TP8; each rule of that split
(documented in repro/data/models/k26-tp8.toml) is checked against the published values recorded
there, and the weight arithmetic against the published parameter counts.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from repro.drafter_hook.hook import DrafterTestHook
from repro.serving.profiles import load_profiles
from repro.testmodels import SPREAD_BUDGETS, SPREAD_COUNTS, fullsize
from repro.testmodels.planted import greedy_continuation, served_logits
from verify.cli_inputs import run

QWEN, KIMI = fullsize.load_model("qwen3-8b"), fullsize.load_model("k26-tp8")
PROFILES = {"qwen3-8b": "full-h200-qwen3-8b", "k26-tp8": "full-h200-k26-tp8"}
SPLIT = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "moe_intermediate_size", "vocab_size")
WHOLE = ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
         "n_routed_experts", "num_experts_per_tok", "n_shared_experts")


def _whole_model(model: fullsize.FullSizeModel) -> dict:
    """The published config the TP share derives from, as one TP1 config."""
    ref = {k: v for k, v in model.reference["target"].items() if k != "tp"}
    return {**model.target, **ref}


class TestKimiShare:
    def test_split_dimensions_are_the_published_ones_over_tp(self):
        """Heads, MLP widths, expert width and vocabulary are K2.6's divided by 8; MLA dims whole."""
        ref, tp = KIMI.reference["target"], KIMI.reference["target"]["tp"]
        for key in SPLIT:
            assert KIMI.target[key] * tp == ref[key], key
        for key in WHOLE:
            assert KIMI.target[key] == ref[key], key

    def test_special_tokens_keep_their_distance_from_the_top(self):
        """bos / eos (and the drafter's mask) move down by 7 shards of 20480 ids."""
        shift = KIMI.reference["target"]["vocab_size"] - KIMI.target["vocab_size"]
        for key in ("bos_token_id", "eos_token_id"):
            assert KIMI.target[key] == KIMI.reference["target"][key] - shift
        assert KIMI.drafter["dflash_config"]["mask_token_id"] == KIMI.reference["drafter"]["mask_token_id"] - shift

    def test_layer_count_is_the_most_the_budget_holds(self):
        """29 layers fit 0.85 x 139 GiB with the drafter and a 16 x 4096-token KV cache; 30 do not."""
        layers = KIMI.target["num_hidden_layers"]
        assert layers == fullsize.max_layers(KIMI) == 29
        assert fullsize.static_bytes(KIMI) <= KIMI.budget.static_bytes < fullsize.static_bytes(KIMI, layers + 1)

    def test_drafter_is_k25_dflash_split_the_same_way(self):
        """8 query heads, 1 KV head, MLP 2304; layers, width, head dim and block as published."""
        ref, d, tp = KIMI.reference["drafter"], KIMI.drafter, KIMI.reference["target"]["tp"]
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            assert d[key] * tp == ref[key], key
        for key in ("num_hidden_layers", "hidden_size", "head_dim", "block_size"):
            assert d[key] == ref[key], key
        assert d["vocab_size"] == KIMI.target["vocab_size"]

    def test_whole_model_has_the_published_parameter_counts(self):
        """On the whole K2.6 config the arithmetic gives its model card's 1T total and 32B activated
        parameters (within 5%; the count includes MLA's absorbed w_kc / w_vc copies)."""
        whole = _whole_model(KIMI)
        total = fullsize.weight_bytes(whole) / 2
        idle = whole["n_routed_experts"] - whole["num_experts_per_tok"]
        expert = 3 * whole["hidden_size"] * whole["moe_intermediate_size"]
        activated = total - len(fullsize.moe_layers(whole)) * idle * expert
        assert math.isclose(total, 1e12, rel_tol=0.05)
        assert math.isclose(activated, 32e9, rel_tol=0.05)


class TestDrafters:
    @pytest.mark.parametrize("model", [QWEN, KIMI], ids=["qwen3-8b", "k26-tp8"])
    def test_drafter_reads_the_target_layers_by_sglangs_rule(self, model):
        """target_layer_ids follow the DFlash rule for the target's depth and the drafter's layers."""
        d, layers = model.drafter, model.target["num_hidden_layers"]
        assert d["num_target_layers"] == layers
        assert d["dflash_config"]["target_layer_ids"] == fullsize.dflash_target_layers(layers, d["num_hidden_layers"])
        assert d["hidden_size"] == model.target["hidden_size"] and d["dflash_config"]["mask_token_id"] < d["vocab_size"]

    def test_rule_gives_the_published_drafters_lists(self):
        """The rule reproduces Qwen3-8B-DFlash-b16's and Kimi-K2.5-DFlash's published layer ids."""
        assert fullsize.dflash_target_layers(36, 5) == [1, 9, 17, 25, 33]
        ref = KIMI.reference["drafter"]
        assert fullsize.dflash_target_layers(ref["num_target_layers"], ref["num_hidden_layers"]) == ref["target_layer_ids"]


class TestBudget:
    def test_qwen3_8b_weights_are_its_published_parameter_count(self):
        """8.19B parameters, 6.95B of them outside the embedding and head (Qwen3-8B's model card)."""
        params = fullsize.weight_bytes(QWEN.target) / 2
        io = 2 * QWEN.target["vocab_size"] * QWEN.target["hidden_size"]
        assert math.isclose(params, 8.19e9, rel_tol=0.005)
        assert math.isclose(params - io, 6.95e9, rel_tol=0.005)

    @pytest.mark.parametrize("model", [QWEN, KIMI], ids=["qwen3-8b", "k26-tp8"])
    def test_every_model_fits_and_its_profile_uses_the_budgets_fraction(self, model):
        """Weights + KV fit the static pool, and the bench profile passes the same memory fraction."""
        assert fullsize.static_bytes(model) <= model.budget.static_bytes
        profile = load_profiles()[PROFILES[model.name]]
        assert profile.sglang["mem-fraction-static"] == model.budget.mem_fraction_static
        assert (profile.model, profile.drafter, profile.load_format) == (model.name, model.drafter_name, "dummy")

    def test_mla_kv_cache_is_latent_plus_rope(self):
        """An MLA token costs (512 + 64) bf16 values per layer; a Qwen3-8B token 2 x 8 x 128."""
        assert fullsize.kv_bytes_per_token(KIMI.target) == 2 * 576 * KIMI.target["num_hidden_layers"]
        assert fullsize.kv_bytes_per_token(QWEN.target) == 2 * 2 * 8 * 128 * 36

    def test_unknown_architecture_is_an_error(self):
        """weight_bytes names an architecture it cannot count."""
        with pytest.raises(ValueError, match="architecture 'LlamaForCausalLM' is not Qwen3"):
            fullsize.weight_bytes({**QWEN.target, "architectures": ["LlamaForCausalLM"]})


def _short(model: fullsize.FullSizeModel, layers: int) -> fullsize.FullSizeModel:
    return dataclasses.replace(model, target={**model.target, "num_hidden_layers": layers})


class TestSpread:
    def test_distinct_experts_grow_with_distinct_tokens(self):
        """One token activates k experts per layer; N tokens about E (1 - (1 - k/E)^N), up to all E."""
        counts = [1, 16, 64, 513]
        spread = fullsize.expert_spread(_short(KIMI, 4), counts)
        experts, k = KIMI.target["n_routed_experts"], KIMI.target["num_experts_per_tok"]
        assert spread[1] == [k] * 3
        for n in (16, 64):
            expected = experts * (1 - (1 - k / experts) ** n)
            assert all(abs(c - expected) < 0.1 * expected for c in spread[n]), (n, spread[n])
        assert all(c >= experts - 2 for c in spread[513])

    def test_a_trees_repeated_tokens_read_fewer_experts_than_distinct_ones(self):
        """A tree's B + 1 tokens repeat (a depth's nodes share its best tokens): fewer distinct
        tokens, and fewer experts read, than B + 1 distinct tokens; the root alone reads k."""
        model = _short(KIMI, 4)
        prompts = [[(37 * i + 11 * j) % 20000 for j in range(20 + i)] for i in range(8)]
        trees = fullsize.tree_spread(model, [0, 16, 64], prompts)
        assert trees[0] == (1.0, model.target["num_experts_per_tok"])
        distinct = fullsize.expert_spread(model, [17, 65])
        for budget in (16, 64):
            tokens, experts = trees[budget]
            assert 1 < tokens < budget + 1
            assert experts < sum(distinct[budget + 1]) / len(distinct[budget + 1])
        assert trees[0][1] < trees[16][1] < trees[64][1]

    def test_spread_verb_prints_a_row_per_count_and_budget(self, monkeypatch):
        """``repro testmodels --spread k26-tp8`` prints min / mean / max per N, then each budget's tree."""
        monkeypatch.setattr(fullsize, "load_model", lambda _name: _short(KIMI, 3))
        code, out, err = run(["testmodels", "--spread", "k26-tp8"])
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert len(lines) == 2 + len(SPREAD_COUNTS) + len(SPREAD_BUDGETS)
        assert lines[1].split() == ["N=", "1", "8", "/", "8.0", "/", "8"]
        assert [line.split()[1] for line in lines[-len(SPREAD_BUDGETS):]] == [str(b) for b in SPREAD_BUDGETS]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every full-size model written once: (directory, names written)."""
    out = tmp_path_factory.mktemp("fullsize")
    return out, fullsize.write_fullsize(out)


class TestWrite:
    def test_directories_hold_configs_and_json_only(self, written):
        """Each target directory has config.json, planted.json, hook.json; each drafter config.json."""
        out, names = written
        assert names == ["qwen3-8b", "qwen3-8b-dflash", "k26-tp8", "k26-tp8-dflash"]
        for model in (QWEN, KIMI):
            assert sorted(p.name for p in (out / model.name).iterdir()) == ["config.json", "hook.json", "planted.json"]
            assert json.loads((out / model.name / "config.json").read_text()) == model.target
            assert json.loads((out / model.drafter_name / "config.json").read_text()) == model.drafter

    @pytest.mark.parametrize("model", [QWEN, KIMI], ids=["qwen3-8b", "k26-tp8"])
    def test_planted_json_names_what_planting_needs(self, written, model):
        """planted.json: architecture, layers, router seed, served logits, GPU memory needed."""
        info = json.loads((written[0] / model.name / "planted.json").read_text())
        cfg = model.target
        assert info["architecture"] == cfg["architectures"][0] and info["num_hidden_layers"] == cfg["num_hidden_layers"]
        assert info["logits"] == served_logits(cfg["hidden_size"], cfg["rms_norm_eps"])
        assert info["logits"][0] - info["logits"][1] >= 0.9
        assert info["gpu_bytes_needed"] * model.budget.mem_fraction_static <= model.budget.gpu_gib * fullsize.GIB
        assert info["router_seed"] == model.router_seed and len(info["ranked"][0]) == cfg["hidden_size"]

    def test_hook_file_continues_the_planted_target(self, written):
        """The full-size hook.json loads at the target's vocabulary and follows its successor table."""
        out = written[0] / KIMI.name
        info = json.loads((out / "planted.json").read_text())
        hook = DrafterTestHook.from_file(out / "hook.json", horizon=3, vocab_size=KIMI.target["vocab_size"], device="cpu")
        assert hook.correct_tokens(torch.tensor([9000]))[0].tolist() == greedy_continuation(info, 9000, 3)

    @pytest.mark.parametrize(("model", "profile"), [(QWEN, "paper-qwen3-8b-math500"), (KIMI, "kimi-k2.5-dflash-gsm8k")],
                             ids=["qwen3-8b", "k26-tp8"])
    def test_hook_file_carries_the_calibrated_profile(self, written, model, profile):
        """Each full-size hook.json is the calibrated profile fitted to that model's published drafter."""
        assert model.hook_profile == profile
        path = written[0] / model.name / "hook.json"
        assert json.loads(path.read_text())["profile"]["name"] == profile
        hook = DrafterTestHook.from_file(path, horizon=3, vocab_size=model.target["vocab_size"], device="cpu")
        assert hook.profile == profile and hook.tables.levels > 1  # calibrated: several levels, not the fixed ranks
