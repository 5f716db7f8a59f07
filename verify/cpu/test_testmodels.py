"""Tests for `repro.testmodels` (the `repro testmodels` verb, `configs`, `planted`, `small`): the
planted target, the random target, the drafter, the hook file, the model tables, the verb."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from repro import testmodels
from repro.drafter_hook.hook import DrafterTestHook
from repro.testmodels.configs import FULLSIZE, SHARES, SMALL_KIMI_MOE, SMALL_MLA_MOE, SMALL_QWEN3, read_model
from repro.testmodels.planted import greedy_continuation, next_token_probs, served_logits, successor_table
from verify.cli_inputs import run

QWEN3 = read_model(SMALL_QWEN3)["target"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every test model, written once into a temporary directory."""
    out = tmp_path_factory.mktemp("models")
    planted = testmodels.write_all(out)
    return out, planted


def _served_logits(weights: dict, eps: float) -> torch.Tensor:
    """[V, V] logits after each single token, as the inert-layer model serves them in bf16."""
    x = weights["model.embed_tokens.weight"].float()
    h = (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    return (h @ weights["lm_head.weight"].T).float()


class TestPlanted:
    def test_layers_are_inert(self, written):
        """Every attention o_proj and MLP down_proj is zero: the residual stream is the embedding."""
        w = load_file(str(written[0] / "planted" / "model.safetensors"))
        outs = [v for k, v in w.items() if k.endswith(("o_proj.weight", "down_proj.weight"))]
        assert len(outs) == 2 * QWEN3["num_hidden_layers"]
        assert all(bool((v == 0).all()) for v in outs)

    def test_greedy_next_token_is_the_successor_with_a_wide_margin(self, written):
        """argmax after every token is successor[t], ahead of the runner-up by about one logit."""
        out, planted = written
        logits = _served_logits(load_file(str(out / "planted" / "model.safetensors")), 1e-6)
        succ = torch.tensor(successor_table(planted["ranked"], planted["vocab_size"]))
        top = logits.topk(2, dim=-1)
        assert torch.equal(top.indices[:, 0], succ)
        assert float((top.values[:, 0] - top.values[:, 1]).min()) >= 0.9

    def test_planted_json_holds_the_served_logits(self, written):
        """planted.json's logits are the values the bf16 model really produces for ranks 0..2."""
        out, planted = written
        logits = _served_logits(load_file(str(out / "planted" / "model.safetensors")), 1e-6)
        for k, want in enumerate(planted["logits"]):
            toks = torch.tensor(planted["ranked"][k])
            got = logits[torch.arange(len(toks)), toks]
            assert bool((got == want).all()), (k, got.unique(), want)

    def test_served_logits_follow_the_bf16_rmsnorm(self):
        """served_logits rounds rsqrt(1/H + eps) to bf16 before the head: 63.75 (not 64) at H 4096."""
        assert served_logits(512, 1e-6) == [16.0, 15.0, 13.9375]
        assert served_logits(4096, 1e-6) == [15.9375, 14.9375, 13.9375]

    def test_next_token_probs_sum_to_one(self, written):
        """The exact next-token distribution (3 ranked tokens + the uniform rest) sums to 1."""
        probs = next_token_probs(written[1], 123, 1.0)
        assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-12)
        assert max(probs, key=probs.get) == successor_table(written[1]["ranked"], 4096)[123]

    def test_greedy_continuation_follows_the_successor(self, written):
        """greedy_continuation iterates the successor table from the prompt's last token."""
        succ = successor_table(written[1]["ranked"], 4096)
        assert greedy_continuation(written[1], 7, 3) == [succ[7], succ[succ[7]], succ[succ[succ[7]]]]


class TestMlaMoe:
    def test_planted_mla_target_serves_the_planted_logits(self, written):
        """mla-planted has inert layers and the planted embeddings/head: same greedy outputs."""
        out, planted = written
        w = load_file(str(out / "mla-planted" / "model.safetensors"))
        outs = [v for k, v in w.items() if k.endswith(("o_proj.weight", "down_proj.weight"))]
        assert outs and all(bool((v == 0).all()) for v in outs)
        logits = _served_logits(w, 1e-6)
        succ = torch.tensor(successor_table(planted["ranked"], planted["vocab_size"]))
        assert torch.equal(logits.argmax(-1), succ)

    def test_mla_moe_config_has_mla_and_moe_layers(self, written):
        """The DeepseekV3 config has a q LoRA, a KV LoRA, routed + shared experts, one dense layer."""
        cfg = json.loads((written[0] / "mla-random" / "config.json").read_text())
        w = load_file(str(written[0] / "mla-random" / "model.safetensors"))
        assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["first_k_dense_replace"] == 1
        assert "model.layers.0.mlp.gate_proj.weight" in w
        assert "model.layers.1.mlp.experts.7.down_proj.weight" in w
        assert "model.layers.1.mlp.shared_experts.up_proj.weight" in w
        assert w["model.layers.2.self_attn.kv_b_proj.weight"].shape == (8 * (128 + 128), 512)
        assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576  # SGLang's triton MLA width
        assert float(w["model.layers.3.self_attn.o_proj.weight"].float().abs().sum()) > 0


class TestOthers:
    def test_moe_pair_is_config_only_and_kimi_shaped(self, written):
        """moe/ and moe-dflash/ hold only configs: Kimi's vocabulary, 64 experts, matching widths."""
        moe = json.loads((written[0] / "moe" / "config.json").read_text())
        drafter = json.loads((written[0] / "moe-dflash" / "config.json").read_text())
        assert sorted(p.name for p in (written[0] / "moe").iterdir()) == ["config.json"]
        assert moe["vocab_size"] == drafter["vocab_size"] == 163840 and moe["n_routed_experts"] == 64
        assert drafter["hidden_size"] == moe["hidden_size"]
        assert max(drafter["dflash_config"]["target_layer_ids"]) < moe["num_hidden_layers"]

    def test_drafter_config_names_the_target_layers_and_mask(self, written):
        """The drafter is a DFlashDraftModel of block 16 over the target's hidden size."""
        cfg = json.loads((written[0] / "dflash" / "config.json").read_text())
        assert cfg["architectures"] == ["DFlashDraftModel"]
        assert cfg["block_size"] == 16 and cfg["hidden_size"] == QWEN3["hidden_size"]
        assert cfg["dflash_config"]["mask_token_id"] < QWEN3["vocab_size"]
        w = load_file(str(written[0] / "dflash" / "model.safetensors"))
        assert "fc.weight" in w and "lm_head.weight" not in w

    def test_every_planted_target_has_its_tokenizer(self, written):
        """Each planted target directory holds a tokenizer of exactly its vocabulary, with its
        config's EOS id as </s>, and the chat template in tokenizer_config.json."""
        from tokenizers import Tokenizer

        for name in testmodels.PLANTED_TARGETS:
            cfg = json.loads((written[0] / name / "config.json").read_text())
            tok = Tokenizer.from_file(str(written[0] / name / "tokenizer.json"))
            assert tok.get_vocab_size(with_added_tokens=True) == cfg["vocab_size"], name
            assert tok.token_to_id("</s>") == cfg["eos_token_id"], name
            assert "chat_template" in json.loads((written[0] / name / "tokenizer_config.json").read_text())

    def test_hook_file_loads_and_continues_the_planted_target(self, written):
        """hook.json loads as a DrafterTestHook whose continuation is the planted greedy output."""
        out, planted = written
        hook = DrafterTestHook.from_file(out / "hook.json", horizon=4, vocab_size=4096, device="cpu")
        got = hook.correct_tokens(torch.tensor([9]))[0].tolist()
        assert got == greedy_continuation(planted, 9, 4)

    def test_random_target_is_not_inert(self, written):
        """The random target's layers write to the residual stream (context-dependent outputs)."""
        w = load_file(str(written[0] / "random" / "model.safetensors"))
        assert float(w["model.layers.0.self_attn.o_proj.weight"].float().abs().sum()) > 0

    def test_configs_are_the_tables(self, written):
        """Every config.json written is its table's [target] or [drafter], key for key."""
        out = written[0]
        tables = {name: read_model(name) for name in (SMALL_QWEN3, SMALL_MLA_MOE, SMALL_KIMI_MOE)}
        want = {"planted": tables[SMALL_QWEN3]["target"], "random": tables[SMALL_QWEN3]["target"],
                "dflash": tables[SMALL_QWEN3]["drafter"], "mla-planted": tables[SMALL_MLA_MOE]["target"],
                "mla-random": tables[SMALL_MLA_MOE]["target"], "moe": tables[SMALL_KIMI_MOE]["target"],
                "moe-dflash": tables[SMALL_KIMI_MOE]["drafter"]}
        for name, cfg in want.items():
            assert json.loads((out / name / "config.json").read_text()) == cfg, name


class TestTables:
    def test_every_table_is_read(self):
        """Each repro/data/models/*.toml is a small or full-size model table the writers read, or a one-GPU share
        of the TP / EP model (repro.testmodels.shares)."""
        tables = Path(str(resources.files("repro") / "data" / "models"))
        names = {SMALL_QWEN3, SMALL_MLA_MOE, SMALL_KIMI_MOE, *FULLSIZE, *SHARES}
        assert {p.stem for p in tables.glob("*.toml")} == names
        assert all(read_model(name, ("description",))["description"] for name in names)

    def test_missing_table_or_key_names_the_file(self):
        """A table that is not there, or lacks a required key, is a ValueError naming the file."""
        with pytest.raises(ValueError, match=r"nope\.toml: cannot read the model table"):
            read_model("nope")
        with pytest.raises(ValueError, match=r"small-mla-moe\.toml: unknown keys \[\] / missing keys \['drafter'\]"):
            read_model(SMALL_MLA_MOE, ("description", "target", "drafter"))


class TestVerb:
    def test_writes_every_model(self, tmp_path):
        """`repro testmodels OUT` writes every test model and the hook file, and says so."""
        code, out, err = run(["testmodels", str(tmp_path / "models")])
        assert (code, err) == (0, "")
        names = {p.name for p in (tmp_path / "models").iterdir()}
        small = {"planted", "random", "mla-planted", "mla-random", "dflash", "hook.json", "moe", "moe-dflash"}
        assert names == small | {"qwen3-8b", "qwen3-8b-dflash", "k26-tp8", "k26-tp8-dflash"}
        assert out == f"wrote {', '.join(sorted(names))} under {tmp_path / 'models'}\n"

    @pytest.mark.parametrize(("argv", "message"), [
        ([], "OUT is required (a directory to write the test models into), or --spread NAME"),
        (["{tmp}/f", "--spread", "k26-tp8"], "give OUT or --spread, not both (got OUT {tmp}/f and --spread k26-tp8)"),
        (["{tmp}/f"], "OUT: {tmp}/f is not a directory (expected a directory to write the test models into)"),
        (["{tmp}/f/sub"], "OUT: {tmp}/f is not a directory (expected a directory to write the test models into)"),
        (["{tmp}/m", "--seed", "-1"], "argument --seed: must be an integer in 0..4294967295 (got '-1')"),
        (["--spread", "qwen3-8b"], "argument --spread: invalid choice: 'qwen3-8b'"),
    ])
    def test_bad_input_is_one_line_and_exit_2(self, tmp_path, argv, message):
        """A missing or non-directory OUT, OUT with --spread, a bad seed or a dense target: one line."""
        (tmp_path / "f").write_text("a file")
        code, out, err = run(["testmodels", *(a.replace("{tmp}", str(tmp_path)) for a in argv)])
        assert (code, out) == (2, "")
        assert err.startswith(f"repro testmodels: {message.replace('{tmp}', str(tmp_path))}"), err
        assert err.count("\n") == 1 and not (tmp_path / "m").exists()
