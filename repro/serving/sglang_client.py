"""A small HTTP client for SGLang's native API: ``/health``, ``/server_info``, ``/flush_cache``,
streamed ``/generate``.

Standard library only (the GPU host has no `requests` guarantee) and loopback only: it never reads
proxy settings. A streamed ``/generate`` answers Server-Sent Events, ``data: {json}`` per decode
step then ``data: [DONE]``; every event's ``meta_info.completion_tokens`` is cumulative, so timing
uses it rather than the ids (which are cumulative or incremental depending on server flags).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlsplit

from repro.errors import ReproError, UsageError
from repro.files import parse_json

_NET_ERRORS = (OSError, http.client.HTTPException)


@dataclass
class Completion:
    """Timing and counters of one streamed request (times in seconds)."""

    prompt_tokens: int
    completion_tokens: int
    spec_verify_ct: int | None  # decode verify rounds; None on a non-speculative server
    ttft_s: float
    latency_s: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (gap since previous, new tokens)
    finish_reason: str | None = None

    @property
    def tau(self) -> float | None:
        """Tokens per verify round, bonus included (SGLang's ``spec_accept_length``)."""
        if not self.spec_verify_ct:
            return None
        return self.completion_tokens / self.spec_verify_ct


def parse_url(url: str) -> tuple[str, int]:
    """(host, port) of ``http://HOST:PORT``; a UsageError (a ValueError) for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port = None
        parts = None
    if parts is None or parts.scheme != "http" or not parts.hostname or not port or \
            parts.path not in ("", "/") or parts.query or parts.fragment:
        msg = f"url must look like http://127.0.0.1:PORT (got {url!r})"
        raise UsageError(msg)
    return parts.hostname, port


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """``body`` as a JSON object; a ReproError quoting it otherwise (a proxy's HTML page, ...)."""
    try:
        data = parse_json(body.decode())
    except (UnicodeDecodeError, ValueError):
        data = None
    if not isinstance(data, dict):
        msg = f"{what} answered something that is not a JSON object: {body[:120]!r}"
        raise ReproError(msg)
    return data


class Client:
    """One SGLang server at ``url`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        self.host, self.port = parse_url(url)
        self.url, self.timeout = url.rstrip("/"), timeout

    def _connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def _get(self, path: str, timeout: float) -> tuple[int, bytes]:
        conn = self._connect(timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def healthy(self, timeout: float = 30.0) -> bool:
        """True once ``/health`` answers 200 (503 while starting, refused before listening)."""
        try:
            return self._get("/health", timeout)[0] == 200
        except _NET_ERRORS:
            return False

    def server_info(self, timeout: float = 30.0) -> dict[str, Any]:
        """``/server_info`` (server args, scheduler info, internal states, version)."""
        try:
            status, body = self._get("/server_info", timeout)
            if status == 404:
                status, body = self._get("/get_server_info", timeout)
        except _NET_ERRORS as exc:
            msg = f"GET {self.url}/server_info failed: {exc}"
            raise ReproError(msg) from None
        if status != 200:
            msg = f"GET {self.url}/server_info returned HTTP {status}: {body[:200]!r}"
            raise ReproError(msg)
        return json_object(body, f"GET {self.url}/server_info")

    def flush_cache(self, timeout: float = 60.0) -> None:
        """Empty the server's prefix cache (SGLang's ``/flush_cache``, which waits up to ``timeout``
        seconds for the requests still running to end: it flushes only an idle server)."""
        conn = self._connect(timeout + 30)
        try:
            conn.request("POST", f"/flush_cache?timeout={timeout:g}")
            resp = conn.getresponse()
            status, body = resp.status, resp.read(300)
        except _NET_ERRORS as exc:
            msg = f"POST {self.url}/flush_cache failed: {exc}"
            raise ReproError(msg) from None
        finally:
            conn.close()
        if status != 200:
            msg = f"POST {self.url}/flush_cache returned HTTP {status}: {body!r}"
            raise ReproError(msg)

    def generate(self, payload: dict[str, Any]) -> Completion:
        """Send one streamed ``/generate`` request and time it; any failure is a ReproError."""
        return self.stream("/generate", {**payload, "stream": True}, _fold_generate)

    def stream(self, path: str, body: dict[str, Any],
               fold: Callable[[Iterator[dict[str, Any]], float], Completion]) -> Completion:
        """POST ``body`` to ``path`` and ``fold`` its event stream (and the send time) into a
        :class:`Completion`; any failure is a ReproError."""
        conn = self._connect()
        start = time.perf_counter()
        try:
            conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                msg = f"POST {self.url}{path} returned HTTP {resp.status}: {resp.read(300)!r}"
                raise ReproError(msg)
            return fold(events(resp, path), start)
        except _NET_ERRORS as exc:
            msg = f"POST {self.url}{path} failed: {type(exc).__name__}: {exc}"
            raise ReproError(msg) from None
        finally:
            conn.close()


def events(resp: IO[bytes], what: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a Server-Sent Events stream (``data: {json}`` lines) up to ``data:
    [DONE]``; a ReproError for a stream that ends before it, an event that is not a JSON object,
    or an error event (``{"error": ...}``)."""
    while True:
        line = resp.readline()
        if not line:
            msg = f"the {what} stream ended before [DONE] (did the server die?)"
            raise ReproError(msg)
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        event = json_object(data, what)
        if "error" in event:
            msg = f"{what} answered an error: {event['error']}"
            raise ReproError(msg)
        yield event


def _fold_generate(stream: Iterator[dict[str, Any]], start: float) -> Completion:
    """Fold a ``/generate`` event stream into a :class:`Completion`."""
    meta: dict[str, Any] = {}
    tokens, ttft, last = 0, None, start
    chunks: list[tuple[float, int]] = []
    for event in stream:
        meta = event.get("meta_info") or {}
        if not isinstance(meta, dict):
            msg = f"/generate answered meta_info = {meta!r:.60} (expected a JSON object)"
            raise ReproError(msg)
        count = _count(meta, "completion_tokens", tokens)
        if count > tokens:
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                chunks.append((now - last, count - tokens))
            tokens, last = count, now
    if ttft is None:
        msg = "/generate finished without emitting a token"
        raise ReproError(msg)
    finish = meta.get("finish_reason")
    finish = finish.get("type") if isinstance(finish, dict) else finish
    return Completion(
        prompt_tokens=_count(meta, "prompt_tokens", 0), completion_tokens=tokens,
        spec_verify_ct=_count(meta, "spec_verify_ct", 0) or None,
        ttft_s=ttft, latency_s=last - start, chunks=chunks,
        finish_reason=finish if isinstance(finish, str) or finish is None else str(finish),
    )


def _count(meta: dict[str, Any], key: str, default: int) -> int:
    """A non-negative integer counter of ``meta_info``; a ReproError naming it otherwise."""
    value = meta.get(key, default)
    if value is None and key == "spec_verify_ct":
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"/generate answered meta_info.{key} = {value!r:.60} (expected an integer >= 0)"
        raise ReproError(msg)
    return value
