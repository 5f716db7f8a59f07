"""Tests for the request validation patch 0008 adds, run on CPU from the patched sglang source.

The functions are taken from the pinned wheel's files after `repro.patch` applies the series (the
wheel fixture of test_patch.py) and compiled alone, with stand-ins for the request classes.
"""

from __future__ import annotations
import __future__

import ast
import zipfile
from types import SimpleNamespace

import pytest

from repro import patch
from verify.cpu.test_patch import SGLANG, wheel  # noqa: F401 - the pinned wheel, a pytest fixture

VOCAB = 4096
GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")


class GenerateReqInput(SimpleNamespace):
    """Stand-in for sglang's GenerateReqInput: the fields the validation reads."""


class EmbeddingReqInput(SimpleNamespace):
    """Stand-in for sglang's EmbeddingReqInput."""


def _patched_source(wheel_path, path: str) -> str:
    """``path`` of the wheel with every patch of the series that touches it applied."""
    with zipfile.ZipFile(wheel_path) as zf:
        text = zf.read(path).decode()
    for p in patch.load_series(SGLANG):
        for fp in p.files:
            if fp.path == path:
                text = patch.apply_hunks(text, fp)
    assert text is not None, f"the series does not apply to {path}"
    return text


def _compile(source: str, names: list[str], namespace: dict) -> dict:
    """The functions or methods ``names`` of ``source``, compiled alone into ``namespace``."""
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(n.name for n in nodes) == sorted(names)
    code = compile(ast.Module(body=nodes, type_ignores=[]), "patched", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - our own patched sglang source, compiled for the test
    return namespace


@pytest.fixture(scope="module")
def validate(wheel):  # noqa: F811 - the imported fixture
    """TokenizerManager._validate_token_ids_in_vocab as patched, bound to a vocabulary of 4096."""
    source = _patched_source(wheel, "sglang/srt/managers/tokenizer_manager.py")
    ns = _compile(source, ["_token_ids", "_validate_token_ids_in_vocab"],
                  {"GenerateReqInput": GenerateReqInput, "EmbeddingReqInput": EmbeddingReqInput})
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    return lambda obj: ns["_validate_token_ids_in_vocab"](manager, obj)


@pytest.fixture(scope="module")
def refusal(wheel):  # noqa: F811 - the imported fixture
    """validate_dflash_request as patched: (algorithm name, overlap, request fields) -> refusal."""
    source = _patched_source(wheel, "sglang/srt/speculative/dflash_utils.py")
    fn = _compile(source, ["validate_dflash_request"], {})["validate_dflash_request"]

    def run(name: str, *, overlap: bool = True, logprob: bool = False, hidden: bool = False, **grammar) -> str | None:
        algorithm = SimpleNamespace(name=name, is_ddtree=lambda: name == "DDTREE")
        params = SimpleNamespace(**(dict.fromkeys(GRAMMARS) | grammar))
        req = SimpleNamespace(return_logprob=logprob, return_hidden_states=hidden, sampling_params=params)
        return fn(req, overlap, algorithm)

    return run


def _request(input_ids=None, token_ids_logprob=None, sampling_params=None) -> GenerateReqInput:
    return GenerateReqInput(input_ids=input_ids or [5, 6], token_ids_logprob=token_ids_logprob,
                            sampling_params=sampling_params if sampling_params is not None else {})


class TestTokenIds:
    @pytest.mark.parametrize(("obj", "message"), [
        (_request([5, -1, 7]), "input_ids holds token id -1, outside the vocabulary range [0, 4096)."),
        (_request([[1, 2], [3, 4096]]), "input_ids holds token id 4096, outside the vocabulary range [0, 4096)."),
        (_request(token_ids_logprob=[[1], [5000]]),
         "token_ids_logprob holds token id 5000, outside the vocabulary range [0, 4096)."),
        (_request(sampling_params=[{"stop_token_ids": [1]}, {"stop_token_ids": [-3]}]),
         "stop_token_ids holds token id -3, outside the vocabulary range [0, 4096)."),
        (_request(sampling_params={"logit_bias": {"10": 1.0, "4096": -1.0}}),
         "logit_bias holds token id 4096, outside the vocabulary range [0, 4096)."),
        (_request(sampling_params={"logit_bias": {"-2": 1.0}}),
         "logit_bias holds token id -2, outside the vocabulary range [0, 4096)."),
        (_request(sampling_params={"logit_bias": {"abc": 1.0}}), "logit_bias must hold integer token ids, got 'abc'."),
        (_request(sampling_params={"stop_token_ids": [True]}), "stop_token_ids must hold integer token ids, got True."),
        (_request([[1], []]), "input_ids cannot hold an empty sequence."),
        (EmbeddingReqInput(input_ids=[2**40]),
         f"input_ids holds token id {2**40}, outside the vocabulary range [0, 4096)."),
    ])
    def test_out_of_vocabulary_ids_are_refused_in_one_line(self, validate, obj, message):
        """Any id outside [0, V) in any id-carrying field, a non-integer id, or an empty batch row
        raises one ValueError (HTTP 400) naming the field, the id and the range."""
        with pytest.raises(ValueError, match=r".*") as info:
            validate(obj)
        assert str(info.value) == message

    def test_ids_in_the_vocabulary_pass(self, validate):
        """A request whose every id lies in [0, V) passes: the edges 0 and V - 1 included."""
        params = [{"stop_token_ids": [0, 4095], "logit_bias": {"4095": 2.0, "0": -1.0}}, None]
        assert validate(_request([[0, 4095], [17]], [[0], [4095]], params)) is None


class TestRefusals:
    def test_refusals_name_the_servers_algorithm(self, refusal):
        """return_logprob and return_hidden_states (with overlap) are refused naming the algorithm."""
        assert refusal("DDTREE", logprob=True) == "DDTREE speculative decoding does not support return_logprob yet."
        assert refusal("DFLASH", logprob=True) == "DFLASH speculative decoding does not support return_logprob yet."
        assert refusal("DDTREE", hidden=True) == (
            "DDTREE speculative decoding does not support return_hidden_states yet.")
        assert refusal("DDTREE", overlap=False, hidden=True) is None

    @pytest.mark.parametrize("grammar", GRAMMARS)
    def test_ddtree_refuses_grammars(self, refusal, grammar):
        """A grammar of any kind is refused by DDTREE with one message; DFLASH leaves it to the backend."""
        assert refusal("DDTREE", **{grammar: "x"}) == (
            "DDTREE speculative decoding does not support grammars (json_schema, regex, ebnf, structural_tag).")
        assert refusal("DFLASH", **{grammar: "x"}) is None
        assert refusal("DDTREE") is None
