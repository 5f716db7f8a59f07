"""What the API tier asks every server (AR, DFLASH, DDTREE) and what it answered, as JSON.

Prompts are words of the planted target's tokenizer (repro.testmodels.tokenizer), so a text
prompt's last token id, hence the planted greedy continuation, is known. Each section of
:func:`run` is recorded even when another fails (its error as ``{"error": ...}``): a server that
dies on one request shows where. Not a test module: verify/sglang/test_api.py runs and judges it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from repro.testmodels.planted import greedy_continuation
from verify.sglang.api_calls import error_message, get, post, stream

VOCAB = 4096
NEW = 24  # tokens of a T = 0 answer
N_PROMPTS = 6
BURST = 240  # concurrent requests, far beyond the servers' --max-running-requests 4
GREEDY = {"temperature": 0, "ignore_eos": True}
KIMI = ["--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]


def prompt_ids(i: int) -> list[int]:
    """Prompt ``i``: 3..31 word ids of the planted tokenizer (ids 300..2999 are words)."""
    return [300 + (i * 131 + j * 17 + (j * j) % 11) % 2700 for j in range(3 + (i * 7) % 29)]


def completion(body: dict) -> dict:
    """Text, token ids and finish reason of each choice of a /v1/completions answer."""
    return {"choices": [{"text": c["text"], "ids": c.get("token_ids"), "finish": c["finish_reason"]}
                        for c in sorted(body["choices"], key=lambda c: c["index"])]}


def streamed_completion(events: list) -> dict:
    """The same record from a streamed /v1/completions answer (its chunks joined per choice)."""
    choices: dict[int, dict] = {}
    for event in events:
        for c in event.get("choices", []):
            rec = choices.setdefault(c["index"], {"text": "", "ids": [], "finish": None})
            rec["text"] += c.get("text") or ""
            rec["ids"] += c.get("token_ids") or []
            rec["finish"] = c.get("finish_reason") or rec["finish"]
    return {"choices": [choices[i] for i in sorted(choices)]}


def chat(body: dict) -> dict:
    """Message, token ids, prompt ids and finish reason of each choice of a chat answer."""
    keep = ("content", "reasoning_content", "tool_calls")
    return {"choices": [{"message": {k: c["message"].get(k) for k in keep}, "ids": c.get("token_ids"),
                         "prompt_ids": c.get("prompt_token_ids"), "finish": c["finish_reason"]}
                        for c in sorted(body["choices"], key=lambda c: c["index"])]}


def streamed_chat(events: list) -> dict:
    """Content and finish reason of a streamed chat answer (its deltas joined)."""
    text, finish = "", None
    for event in events:
        for c in event.get("choices", []):
            text += c.get("delta", {}).get("content") or ""
            finish = c.get("finish_reason") or finish
    return {"content": text, "finish": finish}


class Workload:
    """The requests of one server at ``url``; ``decode`` is the planted tokenizer's decode."""

    def __init__(self, url: str, planted: dict, decode: Callable[[list[int]], str]) -> None:
        self.url, self.planted, self.decode = url, planted, decode
        self.texts = [decode(prompt_ids(i)) for i in range(N_PROMPTS)]

    def complete(self, i: int, **params: Any) -> dict:
        """Unstreamed /v1/completions of prompt ``i`` at T = 0 (``params`` override)."""
        status, body = post(self.url, "/v1/completions", self._completion_payload(i, params))
        return completion(body) if status == 200 else {"status": status, "message": error_message(body)}

    def _completion_payload(self, i: int, params: dict) -> dict:
        return {"prompt": self.texts[i], "max_tokens": NEW, "return_token_ids": True, **GREEDY, **params}

    def _chat_payload(self, i: int, params: dict) -> dict:
        return {"messages": [{"role": "user", "content": self.texts[i]}], "max_completion_tokens": NEW,
                "separate_reasoning": False, **GREEDY, **params}

    def completions(self) -> dict:
        """Every prompt unstreamed and streamed, the streamed with usage."""
        streamed = [stream(self.url, "/v1/completions", {**self._completion_payload(i, {}),
                                                         "stream_options": {"include_usage": True}})
                    for i in range(N_PROMPTS)]
        return {"unstreamed": [self.complete(i) for i in range(N_PROMPTS)],
                "streamed": [streamed_completion(events) for _, events in streamed]}

    def chats(self) -> dict:
        """Every prompt as a chat, unstreamed (with token ids) and streamed; the Kimi parsers' path:
        reasoning separated (the parser's default) and a tool offered."""
        unstreamed = [post(self.url, "/v1/chat/completions", self._chat_payload(i, {"return_token_ids": True}))[1]
                      for i in range(N_PROMPTS)]
        streamed = [stream(self.url, "/v1/chat/completions", self._chat_payload(i, {}))[1] for i in range(N_PROMPTS)]
        kimi = [post(self.url, "/v1/chat/completions",
                     self._chat_payload(i, {"separate_reasoning": True, "tools": TOOLS, "tool_choice": "auto"}))[1]
                for i in range(2)]
        return {"unstreamed": [chat(b) for b in unstreamed], "streamed": [streamed_chat(e) for e in streamed],
                "kimi": [chat(b) for b in kimi]}

    def stop_strings(self) -> list[dict]:
        """Stop strings that end inside a token (the first letters of a word), a few words in."""
        out = []
        for i in range(N_PROMPTS):
            stop = self.stop_string(i, 4 + 3 * i)
            params = {"max_tokens": 40, "stop": [stop]}
            status, events = stream(self.url, "/v1/completions", self._completion_payload(i, params))
            out.append({"stop": stop, "unstreamed": self.complete(i, **params),
                        "streamed": streamed_completion(events) if status == 200 else {"status": status}})
        return out

    def stop_string(self, i: int, k: int) -> str:
        """The planted continuation of prompt ``i`` from its ``k``-th word: that word and the first
        letter of the next (the first pair of word tokens from ``k`` on)."""
        cont = greedy_continuation(self.planted, prompt_ids(i)[-1], 40)
        words = [self.decode([t]) for t in cont]
        while len(words[k]) < 2 or len(words[k + 1]) < 2:
            k += 1
        return words[k] + words[k + 1][:2]

    def sampling(self) -> dict:
        """n > 1, penalties, logit bias, and greedy and sampled requests of mixed parameters at once."""
        last = prompt_ids(2)[-1]  # biased: its rank-1 next token, 1.5 up (one logit below rank 0)
        bias_to = self.planted["ranked"][1][last % self.planted["hidden_size"]]
        sampled = [{"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.0, "top_k": 20},
                   {"temperature": 0.7, "min_p": 0.05}, {"temperature": 1.2, "frequency_penalty": 0.3}]
        with ThreadPoolExecutor(8) as pool:
            greedy = [pool.submit(self.complete, i) for i in range(4)]
            other = [pool.submit(self.complete, i, **p) for i, p in enumerate(sampled)]
        return {
            "n2": self.complete(0, n=2), "n3_sampled": self.complete(1, n=3, temperature=0.9),
            "chat_n2": chat(post(self.url, "/v1/chat/completions", self._chat_payload(0, {"n": 2}))[1]),
            "penalties": self.complete(1, max_tokens=40, frequency_penalty=0.3, presence_penalty=0.45),
            "repetition": self.complete(3, max_tokens=40, repetition_penalty=1.3),
            "logit_bias": self.complete(2, max_tokens=40, logit_bias={str(bias_to): 1.5}),
            "mixed_greedy": [f.result() for f in greedy], "mixed_sampled": [f.result() for f in other],
        }

    def refusals(self) -> dict:
        """What the server says to return_logprob (native and OpenAI) and to a grammar."""
        def native(extra: dict, params: dict) -> dict:
            status, body = post(self.url, "/generate", {"text": self.texts[0], **extra,
                                                        "sampling_params": {"max_new_tokens": 8, **GREEDY, **params}})
            return {"status": status, "message": error_message(body)}
        status, body = post(self.url, "/v1/completions", self._completion_payload(0, {"logprobs": 1}))
        return {"logprob": native({"return_logprob": True}, {}), "grammar": native({}, {"regex": "( [a-z]+)+"}),
                "openai_logprobs": {"status": status, "message": error_message(body)}}

    def bad_requests(self, cases: list[tuple[str, str, Any, bool]]) -> list[dict]:
        """Each bad request, then the probe (prompt 0) and /health: the server must still serve."""
        out = []
        for label, path, payload, streamed in cases:
            if streamed:
                status, events = stream(self.url, path, payload)
                body = events[0] if events else None
                code = body.get("error", {}).get("code") if isinstance(body, dict) and status == 200 else status
            else:
                status, body = post(self.url, path, payload)
                code = status
            out.append({"label": label, "status": status, "code": code, "message": error_message(body),
                        "probe": self.complete(0), "health": get(self.url, "/health")[0]})
        return out

    def aborts(self) -> dict:
        """Clients that hang up mid-stream (alone, and beside requests that run to the end)."""
        long = {"max_tokens": 1000}
        stream(self.url, "/v1/completions", self._completion_payload(0, long), hang_up_after=3)
        stream(self.url, "/v1/chat/completions", self._chat_payload(1, {"max_completion_tokens": 1000}), hang_up_after=2)
        with ThreadPoolExecutor(4) as pool:
            for i in (2, 3):
                pool.submit(stream, self.url, "/v1/completions", self._completion_payload(i, long), hang_up_after=2)
            beside = [pool.submit(self.complete, i) for i in (4, 5)]
        return {"beside": [f.result() for f in beside], "probe": self.complete(0),
                "health_generate": get(self.url, "/health_generate")[0]}

    def burst(self) -> dict:
        """BURST requests at once (completions, streamed completions, native /generate; a few
        clients hang up), while /health is polled: every answer, and every poll's status."""
        polls: list[tuple[int, float]] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                t0 = time.monotonic()
                polls.append((get(self.url, "/health", timeout=30)[0], time.monotonic() - t0))
                time.sleep(0.1)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            with ThreadPoolExecutor(BURST) as pool:
                answers = list(pool.map(self._burst_request, range(BURST)))
        finally:
            done.set()
            poller.join()
        return {"answers": answers, "health": [s for s, _ in polls], "health_max_s": max(t for _, t in polls),
                "after": get(self.url, "/health_generate")[0]}

    def _burst_request(self, i: int) -> dict:
        try:
            return self._burst_one(i)
        except OSError as exc:  # a refused or reset connection is an answer too (a failing one)
            return {"error": repr(exc)}

    def _burst_one(self, i: int) -> dict:
        params = {"max_tokens": 9 + i % 8}
        if i % 60 == 59:
            stream(self.url, "/v1/completions", self._completion_payload(i % N_PROMPTS, {"max_tokens": 500}),
                   hang_up_after=2)
            return {"hung_up": True}
        if i % 3 == 0:
            return self.complete(i % N_PROMPTS, **params)
        if i % 3 == 1:
            status, events = stream(self.url, "/v1/completions", self._completion_payload(i % N_PROMPTS, params))
            return streamed_completion(events) if status == 200 else {"status": status}
        payload = {"input_ids": prompt_ids(i), "sampling_params": {"max_new_tokens": params["max_tokens"], **GREEDY}}
        status, body = post(self.url, "/generate", payload)
        if status != 200:
            return {"status": status, "message": error_message(body)}
        return {"choices": [{"text": body["text"], "ids": body["output_ids"], "finish": body["meta_info"]["finish_reason"]}]}

    def parsers(self) -> dict:
        """The tool-call and reasoning parsers the server reports in /server_info."""
        _, info = get(self.url, "/server_info")
        return {key: info.get(key) for key in ("tool_call_parser", "reasoning_parser")} if isinstance(info, dict) else {}


def run(url: str, planted: dict, decode: Callable[[list[int]], str], bad: list) -> dict:
    """Every section of the workload against the server at ``url``."""
    w = Workload(url, planted, decode)
    sections = {"completions": w.completions, "chats": w.chats, "stops": w.stop_strings, "sampling": w.sampling,
                "refusals": w.refusals, "bad": lambda: w.bad_requests(bad), "aborts": w.aborts,
                "burst": w.burst, "parsers": w.parsers}
    results = {}
    for name, section in sections.items():
        try:
            results[name] = section()
        except Exception as exc:  # noqa: BLE001 - record it; the other sections still run
            results[name] = {"error": repr(exc)[:2000]}
    return results
