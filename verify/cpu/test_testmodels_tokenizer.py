"""Tests for `repro.testmodels.tokenizer`: the planted targets' tokenizer covers the whole vocabulary,
round-trips word ids and any text, renders its chat template, and is written deterministically."""

from __future__ import annotations

import json

import jinja2.sandbox
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from repro.testmodels.configs import SMALL_QWEN3, read_model
from repro.testmodels.planted import planted_ranked, successor_table
from repro.testmodels.tokenizer import CHAT_TEMPLATE, IM_END, IM_START, SPACE, build, vocabulary, write_tokenizer
from verify.sglang.api_workload import N_PROMPTS, prompt_ids

pytest.importorskip("tokenizers", reason="the dev extra's tokenizers is not installed")

QWEN3 = read_model(SMALL_QWEN3)["target"]
V, BOS, EOS = QWEN3["vocab_size"], QWEN3["bos_token_id"], QWEN3["eos_token_id"]
TOK = build(V, BOS, EOS)
TOKENS, SPECIAL = vocabulary(V, BOS, EOS)
WORD_IDS = [i for i, t in enumerate(TOKENS) if t.startswith(SPACE)]
BYTE_IDS = [i for i, t in enumerate(TOKENS) if t.startswith("<0x")]


def _text(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=False)


class TestVocabulary:
    def test_every_id_has_its_own_token(self):
        """The tokenizer's vocabulary is exactly ids 0..V-1, each a distinct token."""
        vocab = TOK.get_vocab(with_added_tokens=True)
        assert sorted(vocab.values()) == list(range(V))
        assert len(set(TOKENS)) == V and all(vocab[t] == i for i, t in enumerate(TOKENS))

    def test_specials_sit_at_the_config_ids(self):
        """<s> and </s> are the config's BOS and EOS ids; the other specials take the lowest free ids."""
        assert (TOK.token_to_id("<s>"), TOK.token_to_id("</s>")) == (BOS, EOS)
        assert sorted(SPECIAL.values()) == [0, 1, 2, 3, 4]

    def test_bytes_are_the_top_256_ids(self):
        """The 256 byte tokens are the highest ids, in byte order."""
        assert list(range(V - 256, V)) == BYTE_IDS
        assert [TOKENS[i] for i in BYTE_IDS[:2]] == ["<0x00>", "<0x01>"]

    def test_planted_outputs_are_words_or_specials(self):
        """Every token the planted target's greedy decoding can emit decodes to a word or a special
        token, never a byte: its output text determines its output ids."""
        successors = set(successor_table(planted_ranked(QWEN3["hidden_size"], 0), V))
        assert not successors & set(BYTE_IDS)
        assert successors <= set(WORD_IDS) | set(SPECIAL.values())

    @pytest.mark.parametrize(("vocab", "bos", "eos", "message"), [
        (4096, 1, 1, "bos 1 and eos 1 must be two distinct ids"),
        (4096, 1, 4096, "bos 1 and eos 4096 must be two distinct ids below the vocabulary size 4096"),
        (200, 1, 2, "a vocabulary of 200 tokens has no room for 256 bytes and a word"),
    ])
    def test_impossible_vocabularies_are_refused(self, vocab, bos, eos, message):
        """Clashing or out-of-range specials and a vocabulary without room for the bytes: a ValueError."""
        with pytest.raises(ValueError, match=message):
            vocabulary(vocab, bos, eos)

    def test_specials_move_with_a_large_config(self):
        """A full-size vocabulary keeps its config's BOS / EOS inside the byte range's span, the bytes
        skipping them (the Kimi TP8 share: 20480 tokens, BOS 20224, EOS 20225)."""
        tokens, special = vocabulary(20480, 20224, 20225)
        assert tokens[20224] == "<s>" and tokens[20225] == "</s>"
        assert tokens[20479] == "<0xFF>" and tokens[20223] == "<0x01>" and tokens[20222] == "<0x00>"
        assert special[IM_START] == 1


class TestRoundTrip:
    @given(st.lists(st.sampled_from(WORD_IDS), min_size=1, max_size=64))
    def test_word_ids_round_trip(self, ids):
        """Any sequence of word ids decodes to text that encodes back to the same ids."""
        assert TOK.encode(_text(ids), add_special_tokens=False).ids == ids

    @given(st.text(alphabet=st.characters(blacklist_characters=SPACE, blacklist_categories=("Cs",)), max_size=80))
    def test_any_text_round_trips(self, text):
        """Any text (but a literal ▁ or a byte token's name) encodes to ids that decode back to it."""
        assume("<0x" not in text)
        assert _text(TOK.encode(text, add_special_tokens=False).ids) == text

    def test_words_decode_to_a_space_and_letters(self):
        """A word id decodes to a space and its letters; a special token is skipped in output text."""
        assert _text([WORD_IDS[0]]) == " "
        assert TOK.decode([WORD_IDS[1], EOS, WORD_IDS[2]]) == " baba babe"


class TestWritten:
    def test_files_are_deterministic_and_load(self, tmp_path):
        """Writing twice gives the same bytes, and tokenizer.json loads back to the same tokenizer."""
        from tokenizers import Tokenizer

        for d in ("a", "b"):
            (tmp_path / d).mkdir()
            (tmp_path / d / "config.json").write_text(json.dumps(QWEN3))
            write_tokenizer(tmp_path / d)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        loaded = Tokenizer.from_file(str(tmp_path / "a" / "tokenizer.json"))
        assert loaded.encode(" baba babe").ids == TOK.encode(" baba babe").ids == WORD_IDS[1:3]
        config = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
        assert (config["bos_token"], config["eos_token"], config["chat_template"]) == ("<s>", "</s>", CHAT_TEMPLATE)

    def test_chat_template_renders_chatml(self):
        """The chat template renders string and list contents (None for an assistant turn) as ChatML,
        and the rendered prompt encodes with the chat markers as single special tokens."""
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        messages = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": " baba"}, {"type": "image"}]},
                    {"role": "assistant", "content": None}]
        text = env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
        assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n baba<|im_end|>\n"
                        "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n")
        ids = TOK.encode(text, add_special_tokens=False).ids
        assert ids.count(SPECIAL[IM_START]) == 4 and ids.count(SPECIAL[IM_END]) == 3
        assert WORD_IDS[1] in ids

    def test_the_api_tiers_prompts_are_words(self):
        """Every prompt of the API tier (verify/sglang/api_workload.py) is planted-tokenizer words, so
        its text encodes back to its ids and the planted continuation of a text prompt is known."""
        for i in range(N_PROMPTS):
            ids = prompt_ids(i)
            assert set(ids) <= set(WORD_IDS)
            assert TOK.encode(TOK.decode(ids), add_special_tokens=False).ids == ids
