"""The API tier: AR, DFLASH and DDTREE behind SGLang's OpenAI-compatible and native endpoints, as
clients nobody here wrote use them, with graphs and overlap on and the Kimi parsers on.

Three real servers on 127.0.0.1, side by side (0.15 of the GPU each), serve the planted target with
its own tokenizer (repro.testmodels.tokenizer); DFLASH and DDTREE run the drafter test hook. Each
answers the same workload (verify/sglang/api_workload.py): streamed and unstreamed completions and
chats, stop strings ending inside a word, n > 1, penalties, logit bias, mixed sampling parameters at
once, clients that hang up, malformed and out-of-range requests, refused features, and 240
concurrent requests beyond --max-running-requests 4 while /health is polled. Every T = 0 answer of
DFLASH and DDTREE (token ids and text) equals AR's, AR's is the planted continuation, every bad
request gets a 4xx in one line, and the next request is served.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from repro.testmodels.planted import greedy_continuation
from verify.sglang import api_workload, harness
from verify.sglang.api_workload import BURST, KIMI, NEW, VOCAB, prompt_ids

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

SERVERS = {"ar": None, "dflash": "DFLASH", "ddtree": "DDTREE"}
SPECULATIVE = ["dflash", "ddtree"]
BUDGET = 32
PORT = 31400
RANGE = f"outside the vocabulary range [0, {VOCAB})."
G = {"max_new_tokens": 8, "temperature": 0}
HI = [{"role": "user", "content": " baba"}]
# (label, path, payload, streamed, the message expected in the 4xx, or None: any 4xx)
BAD = [
    ("negative input id", "/generate", {"input_ids": [300, -1, 301], "sampling_params": G}, False,
     f"input_ids holds token id -1, {RANGE}"),
    ("input id = vocabulary size", "/generate", {"input_ids": [300, VOCAB], "sampling_params": G}, False,
     f"input_ids holds token id {VOCAB}, {RANGE}"),
    ("batch row with a huge id", "/generate", {"input_ids": [[300, 301], [302, 2**62]], "sampling_params": G}, False,
     f"input_ids holds token id {2**62}, {RANGE}"),
    ("token_ids_logprob", "/generate", {"input_ids": [300, 301], "token_ids_logprob": [-1], "sampling_params": G},
     False, f"token_ids_logprob holds token id -1, {RANGE}"),
    ("stop_token_ids", "/generate", {"input_ids": [300, 301], "sampling_params": {**G, "stop_token_ids": [VOCAB]}},
     False, f"stop_token_ids holds token id {VOCAB}, {RANGE}"),
    ("logit_bias key", "/generate", {"input_ids": [300, 301], "sampling_params": {**G, "logit_bias": {"-1": 1.0}}},
     False, f"logit_bias holds token id -1, {RANGE}"),
    ("streamed negative id", "/generate", {"input_ids": [300, -1], "sampling_params": G}, True,
     f"input_ids holds token id -1, {RANGE}"),
    ("completion prompt ids", "/v1/completions", {"prompt": [300, -5], "max_tokens": 8}, False,
     f"input_ids holds token id -5, {RANGE}"),
    ("completion batch of prompt ids", "/v1/completions", {"prompt": [[300, 301], [VOCAB]], "max_tokens": 8}, False,
     f"input_ids holds token id {VOCAB}, {RANGE}"),
    ("completion stop_token_ids", "/v1/completions", {"prompt": [300, 301], "max_tokens": 8, "stop_token_ids": [-2]},
     False, f"stop_token_ids holds token id -2, {RANGE}"),
    ("completion logit_bias", "/v1/completions", {"prompt": [300, 301], "max_tokens": 8, "logit_bias": {"5000": 1.0}},
     False, f"logit_bias holds token id 5000, {RANGE}"),
    ("streamed completion", "/v1/completions", {"prompt": [300, VOCAB], "max_tokens": 8}, True,
     f"input_ids holds token id {VOCAB}, {RANGE}"),
    ("chat input_ids", "/v1/chat/completions", {"messages": HI, "input_ids": [300, 4097], "max_completion_tokens": 8},
     False, f"input_ids holds token id 4097, {RANGE}"),
    ("chat logit_bias", "/v1/chat/completions", {"messages": HI, "logit_bias": {"-7": 1.0}, "max_completion_tokens": 8},
     False, f"logit_bias holds token id -7, {RANGE}"),
    ("streamed chat stop_token_ids", "/v1/chat/completions",
     {"messages": HI, "stop_token_ids": [9999], "max_completion_tokens": 8}, True,
     f"stop_token_ids holds token id 9999, {RANGE}"),
    ("empty text", "/generate", {"text": "", "sampling_params": G}, False,
     "texts cannot be empty and tokenizer must be initialized"),  # SGLang's own refusal
    ("empty batch row", "/generate", {"input_ids": [[300], []], "sampling_params": G}, False,
     "input_ids cannot hold an empty sequence."),
    ("body is not JSON", "/generate", b'{"input_ids": [300', False, None),
    ("id is a string", "/generate", {"input_ids": [300, "x"], "sampling_params": G}, False, None),
    ("id is a fraction", "/generate", {"input_ids": [300, 1.5], "sampling_params": G}, False, None),
    ("no prompt", "/generate", {"sampling_params": G}, False, None),
]
LOGPROB = "{} speculative decoding does not support return_logprob yet."
NO_GRAMMAR_BACKEND = "is not supported when the server is launched with --grammar-backend none"
DDTREE_GRAMMAR = "DDTREE speculative decoding does not support grammars (json_schema, regex, ebnf, structural_tag)."


def _args(models, algo: str | None) -> list[str]:
    """A server of the planted target with its tokenizer and the Kimi parsers (AR when ``algo`` is None)."""
    return [*harness.server_args(models / "planted", algo=algo, drafter=models / "dflash" if algo else None,
                                 budget=BUDGET if algo == "DDTREE" else None, tokenizer=True), *KIMI]


@pytest.fixture(scope="module")
def decode(models):
    """The planted tokenizer's decode, special tokens skipped (as the servers' output text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(models / "planted" / "tokenizer.json"))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def runs(models, planted, decode) -> dict:
    """Every server's answers to the workload, the three servers running side by side."""
    env = {"SGLANG_DDTREE_TEST_DRAFTER": str(models / "hook.json")}
    cases = [case[:4] for case in BAD]

    def one(k: int, name: str, algo: str | None) -> dict:
        try:
            with harness.server(f"api-{name}", _args(models, algo), port=PORT + k, env=env if algo else None) as url:
                return api_workload.run(url, planted, decode, cases)
        except Exception as exc:  # noqa: BLE001 - keep the other servers' evidence
            return {"error": repr(exc)[:4000]}

    with ThreadPoolExecutor(len(SERVERS)) as pool:
        futures = {name: pool.submit(one, k, name, algo) for k, (name, algo) in enumerate(SERVERS.items())}
        results = {name: f.result() for name, f in futures.items()}
    harness.save("api_runs", results)
    return results


def _ran(runs: dict, name: str, section: str):
    """One server's answers to one section; fails naming the error if the server or section failed."""
    assert "error" not in runs[name], f"{name}: {runs[name]['error']}"
    got = runs[name][section]
    assert not (isinstance(got, dict) and "error" in got), f"{name}/{section}: {got['error']}"
    return got


class TestAnswers:
    def test_ar_answers_are_the_planted_continuation(self, runs, planted, decode):
        """AR's completions and chats (T = 0) are the planted greedy continuation, ids and text."""
        completions, chats = _ran(runs, "ar", "completions"), _ran(runs, "ar", "chats")
        for i, (c, chat) in enumerate(zip(completions["unstreamed"], chats["unstreamed"], strict=True)):
            want = greedy_continuation(planted, prompt_ids(i)[-1], NEW)
            assert c["choices"] == [{"text": decode(want), "ids": want, "finish": "length"}]
            got = chat["choices"][0]
            want = greedy_continuation(planted, got["prompt_ids"][-1], NEW)
            assert (got["ids"], got["message"]["content"]) == (want, decode(want))

    @pytest.mark.parametrize("name", list(SERVERS))
    def test_streamed_answers_equal_unstreamed(self, runs, name):
        """A streamed completion or chat joins to the unstreamed answer (text, ids, finish reason)."""
        completions, chats = _ran(runs, name, "completions"), _ran(runs, name, "chats")
        assert completions["streamed"] == completions["unstreamed"]
        for streamed, whole in zip(chats["streamed"], chats["unstreamed"], strict=True):
            assert streamed == {"content": whole["choices"][0]["message"]["content"], "finish": whole["choices"][0]["finish"]}
        for stop in _ran(runs, name, "stops"):
            assert stop["streamed"] == stop["unstreamed"]

    @pytest.mark.parametrize("name", SPECULATIVE)
    @pytest.mark.parametrize("section", ["completions", "chats", "stops"])
    def test_speculative_equals_ar(self, runs, name, section):
        """DFLASH and DDTREE answer every T = 0 completion, chat (the Kimi parsers' path included)
        and stop-string request exactly as AR does: text, token ids and finish reason."""
        assert _ran(runs, name, section) == _ran(runs, "ar", section)

    def test_stop_strings_cut_where_the_text_reaches_them(self, runs, planted, decode):
        """AR's text ends right before the stop string's first occurrence (which ends inside a word)."""
        for i, stop in enumerate(_ran(runs, "ar", "stops")):
            full = decode(greedy_continuation(planted, prompt_ids(i)[-1], 40))
            assert stop["unstreamed"]["choices"][0]["text"] == full[: full.index(stop["stop"])]
            assert stop["unstreamed"]["choices"][0]["finish"] == "stop"

    @pytest.mark.parametrize("name", SPECULATIVE)
    def test_sampling_parameters_equal_ar(self, runs, name):
        """n = 2, penalties, repetition penalty, logit bias, and the greedy requests of a mixed batch
        equal AR's; n = 3 sampled and the sampled requests of the batch are served in full."""
        got, ar = _ran(runs, name, "sampling"), _ran(runs, "ar", "sampling")
        for key in ("n2", "chat_n2", "penalties", "repetition", "logit_bias", "mixed_greedy"):
            assert got[key] == ar[key], key
        choices = got["n2"]["choices"]
        assert choices[0] == choices[1] == _ran(runs, name, "completions")["unstreamed"][0]["choices"][0]
        for answer in [got["n3_sampled"], *got["mixed_sampled"]]:
            assert [len(c["ids"]) for c in answer["choices"]] in ([NEW], [NEW] * 3)


class TestRobustness:
    @pytest.mark.parametrize("name", list(SERVERS))
    def test_bad_requests_get_a_one_line_4xx_and_the_next_is_served(self, runs, name):
        """Each malformed or out-of-range request is refused with a 4xx (its message one line naming
        the id and the range), and the request after it is answered as before, /health 200."""
        first = _ran(runs, name, "completions")["unstreamed"][0]
        for got, (label, *_, expected) in zip(_ran(runs, name, "bad"), BAD, strict=True):
            assert 400 <= (got["code"] or 0) < 500, f"{label}: {got}"
            if expected is not None:
                assert got["message"] == expected, label
            assert got["probe"] == first and got["health"] == 200, f"after {label}: {got}"

    @pytest.mark.parametrize("name", list(SERVERS))
    def test_refusals_name_the_algorithm(self, runs, name):
        """return_logprob is served by AR and refused (400) naming DFLASH or DDTREE; a grammar is
        refused for want of a grammar backend, by DDTREE before that with its own message."""
        got = _ran(runs, name, "refusals")
        for key in ("logprob", "openai_logprobs"):
            want = (200, None) if name == "ar" else (400, LOGPROB.format(SERVERS[name]))
            assert (got[key]["status"], got[key]["message"]) == want, key
        assert got["grammar"]["status"] == 400
        if name == "ddtree":
            assert got["grammar"]["message"] == DDTREE_GRAMMAR
        else:
            assert NO_GRAMMAR_BACKEND in got["grammar"]["message"]

    @pytest.mark.parametrize("name", list(SERVERS))
    def test_aborted_streams_leave_the_server_serving(self, runs, name):
        """After clients hang up mid-stream, the requests beside them and the next one are answered
        as before, and /health_generate (a request through the scheduler) answers 200."""
        got, unstreamed = _ran(runs, name, "aborts"), _ran(runs, name, "completions")["unstreamed"]
        assert got["beside"] == unstreamed[4:6] and got["probe"] == unstreamed[0]
        assert got["health_generate"] == 200

    @pytest.mark.parametrize("name", list(SERVERS))
    def test_a_burst_beyond_max_running_requests(self, runs, name):
        """240 concurrent requests: every answer equals AR's (AR answers every one) or is a clear
        4xx, /health answers 200 throughout, and the scheduler answers after."""
        got, ar = _ran(runs, name, "burst"), _ran(runs, "ar", "burst")
        assert len(got["answers"]) == BURST and got["health"]
        assert set(got["health"]) == {200} and got["after"] == 200
        for i, (answer, want) in enumerate(zip(got["answers"], ar["answers"], strict=True)):
            assert "choices" in want or "hung_up" in want, f"AR request {i}: {want}"
            if "status" in answer:
                assert 400 <= answer["status"] < 500 and "\n" not in (answer.get("message") or ""), f"{i}: {answer}"
            else:
                assert answer == want, f"request {i}"

    def test_ddtree_serves_with_the_kimi_parsers(self, runs):
        """The DDTREE server runs with SGLang's Kimi tool-call and reasoning parsers."""
        assert _ran(runs, "ddtree", "parsers") == {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2"}

