"""A client for OpenAI-compatible servers: streamed ``/v1/completions``, timed as `repro bench`
times SGLang's ``/generate`` (:mod:`repro.serving.sglang_client`, whose connection, health check,
``/server_info`` and event-stream reading it shares).

A bench request is translated from the native body: ``input_ids`` become ``prompt`` as a token-id
list (SGLang and vLLM take one), ``text`` a prompt string; ``sampling_params``' ``max_new_tokens``,
``temperature`` and ``ignore_eos`` become ``max_tokens``, ``temperature`` and ``ignore_eos``; ``rid``
is kept (SGLang names the request by it). The model is the first of ``/v1/models``.
``stream_options`` asks for ``include_usage`` (a last chunk whose ``usage`` counts the output
tokens) and ``continuous_usage_stats`` (a cumulative ``usage`` on every chunk, so a chunk's tokens
are known and a speculative round's k tokens count as k inter-token gaps, as on ``/generate``).
A server that sends no per-chunk usage gets TTFT from its first chunk with text and no ITL
(``chunks`` empty: how many tokens a chunk holds is unknown). The stream says nothing of verify
rounds, so accept length (tau) is recorded as missing (``spec_verify_ct`` None).
"""

from __future__ import annotations

import http.client
import itertools
import time
from collections.abc import Iterator
from typing import Any

from repro.errors import ReproError
from repro.serving.sglang_client import Client, Completion, json_object

PATH = "/v1/completions"


def completion_body(payload: dict[str, Any], model: str) -> dict[str, Any]:
    """The streamed ``/v1/completions`` body of a native ``/generate`` ``payload``."""
    params = payload.get("sampling_params") or {}
    body = {"model": model, "prompt": payload["input_ids"] if "input_ids" in payload else payload["text"],
            "max_tokens": params["max_new_tokens"], "temperature": params["temperature"],
            "ignore_eos": bool(params.get("ignore_eos")), "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    return {**body, **({"rid": payload["rid"]} if "rid" in payload else {})}


def _tokens(usage: Any, key: str) -> int:
    """A count of a ``usage`` object; a ReproError naming it otherwise."""
    value = usage.get(key, 0) if isinstance(usage, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"{PATH} answered usage = {usage!r:.80} (expected {key} an integer >= 0)"
        raise ReproError(msg)
    return value


def fold_completion(stream: Iterator[dict[str, Any]], start: float) -> Completion:
    """Fold a ``/v1/completions`` event stream into a :class:`Completion` (see the module docstring)."""
    usage: dict[str, Any] | None = None
    marks: list[tuple[float, int | None]] = []  # (when, new tokens; None: unknown) per chunk that brought tokens
    tokens, finish = 0, None
    for event in stream:
        if event.get("usage") is not None:
            usage = event["usage"]
        choices = event.get("choices") or []
        if not isinstance(choices, list) or not isinstance(choices[0] if choices else {}, dict):
            msg = f"{PATH} answered choices = {choices!r:.80} (expected a list of objects)"
            raise ReproError(msg)
        if not choices:  # the usage chunk
            continue
        finish = choices[0].get("finish_reason") or finish
        if event.get("usage") is not None:
            count = _tokens(usage, "completion_tokens")
            if count > tokens:
                marks.append((time.perf_counter(), count - tokens))
                tokens = count
        elif choices[0].get("text"):
            marks.append((time.perf_counter(), None))
    if usage is None:
        msg = f"{PATH} sent no usage (the server ignored stream_options.include_usage)"
        raise ReproError(msg)
    if not marks:
        msg = f"{PATH} finished without emitting a token"
        raise ReproError(msg)
    known = all(n is not None for _, n in marks)
    chunks = [(t - before, n) for (before, _), (t, n) in itertools.pairwise(marks) if n is not None]
    return Completion(prompt_tokens=_tokens(usage, "prompt_tokens"),
                      completion_tokens=_tokens(usage, "completion_tokens"), spec_verify_ct=None,
                      ttft_s=marks[0][0] - start, latency_s=marks[-1][0] - start,
                      chunks=chunks if known else [], finish_reason=finish if isinstance(finish, str) else None)


class OpenAIClient(Client):
    """One OpenAI-compatible server at ``url``; :meth:`generate` takes the native body."""

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        super().__init__(url, timeout)
        self._model: str | None = None

    def model(self) -> str:
        """The id of the first model ``/v1/models`` lists (asked once)."""
        if self._model is None:
            try:
                status, body = self._get("/v1/models", 30.0)
            except (OSError, http.client.HTTPException) as exc:
                msg = f"GET {self.url}/v1/models failed: {exc}"
                raise ReproError(msg) from None
            data = json_object(body, f"GET {self.url}/v1/models").get("data") if status == 200 else None
            if not isinstance(data, list) or not data or not isinstance(data[0], dict) or \
                    not isinstance(data[0].get("id"), str):
                msg = f"GET {self.url}/v1/models returned HTTP {status} without a model id: {body[:200]!r}"
                raise ReproError(msg)
            self._model = data[0]["id"]
        return self._model

    def generate(self, payload: dict[str, Any]) -> Completion:
        """Send ``payload`` (a ``/generate`` body) as one streamed ``/v1/completions`` request and time it."""
        return self.stream(PATH, completion_body(payload, self.model()), fold_completion)
