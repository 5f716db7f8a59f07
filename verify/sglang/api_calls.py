"""HTTP calls of the API tier: JSON posts that return their status instead of raising, streamed
(server-sent events) posts that can hang up early like a client that goes away, and the error
message of any refusal shape SGLang answers with.

Not a test module: verify/sglang/test_api.py imports it. Plain ``http.client`` on 127.0.0.1, no proxy.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def _send(conn: http.client.HTTPConnection, path: str, payload: dict | bytes) -> http.client.HTTPResponse:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    return conn.getresponse()


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def post(url: str, path: str, payload: dict | bytes, timeout: float = 300) -> tuple[int, Any]:
    """POST ``payload`` (a dict as JSON, or raw bytes); (status, the body as JSON or text)."""
    conn = _connection(url, timeout)
    try:
        resp = _send(conn, path, payload)
        return resp.status, _parse(resp.read())
    finally:
        conn.close()


def stream(url: str, path: str, payload: dict, *, hang_up_after: int | None = None,
           timeout: float = 300) -> tuple[int, list]:
    """POST a streamed request; (status, every ``data:`` event parsed, ``[DONE]`` left out).

    With ``hang_up_after``, the connection is closed after that many events, as a client that
    drops its stream mid-request. A non-200 answer's body is the one event.
    """
    conn = _connection(url, timeout)
    events: list = []
    try:
        resp = _send(conn, path, {**payload, "stream": True})
        if resp.status != 200:
            return resp.status, [_parse(resp.read())]
        while hang_up_after is None or len(events) < hang_up_after:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                break
            events.append(_parse(data))
        return resp.status, events
    finally:
        conn.close()


def get(url: str, path: str, timeout: float = 60) -> tuple[int, Any]:
    """GET ``path``; (status, the body as JSON or text)."""
    conn = _connection(url, timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, _parse(resp.read())
    finally:
        conn.close()


def error_message(body: Any) -> str | None:
    """The message of a refusal: ``{"error": {"message"}}`` (native and streamed errors),
    ``{"message"}`` (the OpenAI endpoints), or None for a body that is no error."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message"))
    if isinstance(error, str):
        return error
    if body.get("object") == "error" or ("message" in body and "choices" not in body):
        return str(body.get("message"))
    return None
