"""A fake SGLang server for the CPU tests of `serve`, `bench` and the HTTP client.

Run as ``python -m verify.fake_sglang`` with ``sglang.launch_server``'s arguments (unknown ones are
ignored). It serves, on 127.0.0.1 only, the part of SGLang 0.5.17's native API the project uses:
``GET /health`` (503 while "starting", then 200), ``GET /server_info`` (server args, internal
states, version), ``POST /generate`` with ``input_ids`` or ``text``, ``sampling_params`` and
``stream`` (Server-Sent Events ``data: {...}`` per decode round, then ``data: [DONE]``), with the
``meta_info`` fields SGLang returns, ``spec_verify_ct`` and ``spec_accept_length`` included; and
of its OpenAI-compatible API ``GET /v1/models`` and streamed ``POST /v1/completions`` (a chunk per
round, a cumulative ``usage`` on each with ``stream_options.continuous_usage_stats``, a last
``usage`` chunk with ``include_usage``); ``POST /flush_cache`` counts its calls in ``/server_info``.

Decoding is simulated: each round takes a fixed time and emits tau tokens on average (AR 1,
DFLASH 3, DDTREE more with the budget), so speedups and tau are known and deterministic enough to
assert on; with ``--fake-batch-cost F`` a round takes ``1 + F`` times longer for every other request
decoding at once, as a batch's rounds do, so open-loop latency grows with the load. It stops by
itself after ``--fake-max-lifetime-s`` or when its parent dies.

Test knobs: ``--fake-step-ms``, ``--fake-batch-cost``, ``--fake-refuse-index N`` (answer HTTP 503 to
every request whose id ends in ``-N``, as `repro bench` numbers its requests), ``--fake-drop-index N``
(end such a request's stream after two events, without ``[DONE]``), ``--fake-startup-s``,
``--fake-exit-at-start CODE``, ``--fake-ignore-sigterm``, ``--fake-max-lifetime-s``,
``--fake-no-server-info`` (404 there, as an OpenAI-compatible server that is not SGLang);
``$FAKE_SGLANG_PIDFILE`` receives the pid.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from repro.schedule import BudgetSchedule

READY_LINE = "The server is fired up and ready to roll!"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The launch_server flags the fake understands, plus its fault switches."""
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-ddtree-budget", type=int, default=None)
    p.add_argument("--speculative-ddtree-budget-schedule", default=None)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--fake-step-ms", type=float, default=1.0)
    p.add_argument("--fake-batch-cost", type=float, default=0.0)
    p.add_argument("--fake-refuse-index", type=int, default=None)
    p.add_argument("--fake-drop-index", type=int, default=None)
    p.add_argument("--fake-startup-s", type=float, default=0.2)
    p.add_argument("--fake-exit-at-start", type=int, default=None)
    p.add_argument("--fake-ignore-sigterm", action="store_true")
    p.add_argument("--fake-max-lifetime-s", type=float, default=120.0)
    p.add_argument("--fake-no-server-info", action="store_true")
    args = p.parse_known_args(argv)[0]
    if args.speculative_ddtree_budget_schedule is not None:  # as SGLang: the budget is the schedule's largest
        args.speculative_ddtree_budget = BudgetSchedule.parse(args.speculative_ddtree_budget_schedule).max_budget
    return args


def mean_tau(args: argparse.Namespace, temperature: float) -> float:
    """Tokens per round the simulation aims at (bonus included)."""
    algorithm = args.speculative_algorithm
    if algorithm is None:
        return 1.0
    tau = 3.0
    if algorithm == "DDTREE":
        tau += 3.0 * (1 - math.exp(-args.speculative_ddtree_budget / 32))
    return max(1.0, tau * (0.85 if temperature > 0 else 1.0))


def round_seconds(args: argparse.Namespace) -> float:
    """Wall time of one decode round: verification grows with the tree, EP is a bit faster."""
    cost = {None: 1.0, "DFLASH": 1.25}.get(args.speculative_algorithm)
    if cost is None:
        cost = 1.25 + args.speculative_ddtree_budget / 256
    return args.fake_step_ms / 1e3 * cost * (0.8 if args.ep_size > 1 else 1.0)


class Handler(BaseHTTPRequestHandler):
    args: argparse.Namespace
    ready_at: float
    counter = iter(range(10**9))
    decoding = 0  # requests decoding now
    flushes = 0  # POST /flush_cache calls
    lock = threading.Lock()

    def log_message(self, fmt: str, *a: Any) -> None:
        """Log one line per request to stderr."""
        sys.stderr.write(f"[fake-sglang] {self.command} {self.path} {a[1] if len(a) > 1 else ''}\n")

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        """Answer /health and the server-info endpoints."""
        if self.path == "/health":
            ok = time.monotonic() >= self.ready_at
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.args.model_path, "object": "model"}]})
        elif self.path in ("/server_info", "/get_server_info") and not self.args.fake_no_server_info:
            a = self.args
            self._json(200, {
                "model_path": a.model_path, "tp_size": a.tp_size, "ep_size": a.ep_size,
                "speculative_algorithm": a.speculative_algorithm,
                "speculative_draft_model_path": a.speculative_draft_model_path,
                "speculative_ddtree_budget": a.speculative_ddtree_budget,
                "speculative_ddtree_budget_schedule": a.speculative_ddtree_budget_schedule,
                "skip_tokenizer_init": a.skip_tokenizer_init,
                "internal_states": [{"avg_spec_accept_length": 0.0}], "version": "0.5.17-fake",
                "fake_flushes": Handler.flushes})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        """Answer /generate, streamed or not, streamed /v1/completions and /flush_cache."""
        if self.path.partition("?")[0] == "/flush_cache":
            Handler.flushes += 1
            self._json(200, {"message": "Cache flushed."})
            return
        if self.path not in ("/generate", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/v1/completions":
            req = _native(req)
        ids = req.get("input_ids")
        if ids is None and isinstance(req.get("text"), str):
            ids = list(req["text"].encode())
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            self._json(400, {"object": "error", "message": "input_ids or text is required",
                             "code": 400})
            return
        params = req.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 16))
        temperature = float(params.get("temperature", 1.0))
        rid = req.get("rid") or f"fake-{next(self.counter)}"  # SGLang keeps a client's request id
        if self.args.fake_refuse_index is not None and rid.endswith(f"-{self.args.fake_refuse_index}"):
            self._json(503, {"object": "error", "message": "refused by --fake-refuse-index", "code": 503})
            return
        with self.lock:
            Handler.decoding += 1
        try:
            rounds = self._decode(rid, ids, max_new, temperature)
            drop = self.args.fake_drop_index is not None and rid.endswith(f"-{self.args.fake_drop_index}")
            if drop:
                rounds = itertools.islice(rounds, 2)
            if "openai" in req:
                self._answer(_chunks(rounds, req["openai"]), stream=True, drop=drop)
            else:
                self._answer(rounds, stream=bool(req.get("stream")), drop=drop)
        finally:
            with self.lock:
                Handler.decoding -= 1

    def _answer(self, events: Iterator[dict[str, Any]], *, stream: bool, drop: bool = False) -> None:
        """Send the last event as JSON, or every event as Server-Sent Events (``drop``: without ``[DONE]``)."""
        if not stream:
            *_, last = events
            self._json(200, last)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in events:
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.flush()
        if not drop:
            self.wfile.write(b"data: [DONE]\n\n")

    def _decode(self, rid: str, ids: list[int], max_new: int, temperature: float):
        """Yield one response object per round, as SGLang streams them (cumulative ids)."""
        a = self.args
        rng = random.Random(sum(ids) * 7919 + max_new)  # noqa: S311 - seeded fake outputs, not secrets
        tau, step = mean_tau(a, temperature), round_seconds(a)
        out: list[int] = []
        verify_ct, start = 0, time.monotonic()
        while len(out) < max_new:
            time.sleep(step * (1 + a.fake_batch_cost * (Handler.decoding - 1)))
            n = 1  # the first token comes from prefill; AR decodes one token per round
            if out and a.speculative_algorithm:
                verify_ct += 1
                n = max(1, min(16, round(rng.gauss(tau, 0.8))))
            out += [(sum(ids) + 7 * (len(out) + k)) % 4096 for k in range(n)]
            out = out[:max_new]
            done = len(out) >= max_new
            meta: dict[str, Any] = {
                "id": rid, "finish_reason": {"type": "length", "length": max_new} if done else None,
                "prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": 0,
                "weight_version": "default"}
            if a.speculative_algorithm and verify_ct:
                meta.update(spec_verify_ct=verify_ct, spec_accept_length=len(out) / verify_ct,
                            spec_num_correct_drafts=len(out) - 1 - verify_ct)
            if done:
                meta["e2e_latency"] = time.monotonic() - start
            yield {"text": "", "output_ids": list(out), "meta_info": meta}


def _native(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/completions body as the /generate one it asks for (its stream options under ``openai``)."""
    prompt = body.get("prompt")
    return {("text" if isinstance(prompt, str) else "input_ids"): prompt, "rid": body.get("rid"),
            "sampling_params": {"max_new_tokens": body.get("max_tokens", 16),
                                "temperature": body.get("temperature", 1.0)},
            "openai": body.get("stream_options") or {}}


def _chunks(rounds: Iterator[dict[str, Any]], options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """/v1/completions stream chunks of /generate rounds: a word of text per new token."""
    sent, meta = 0, {}
    for event in rounds:
        meta = event["meta_info"]
        finish = meta["finish_reason"]
        chunk: dict[str, Any] = {"id": meta["id"], "object": "text_completion", "choices": [{
            "index": 0, "text": "".join(f" w{i}" for i in event["output_ids"][sent:]),
            "finish_reason": finish and finish["type"]}]}
        sent = len(event["output_ids"])
        if options.get("continuous_usage_stats"):
            chunk["usage"] = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": sent}
        yield chunk
    if options.get("include_usage"):
        yield {"id": meta["id"], "object": "text_completion", "choices": [], "usage": {
            "prompt_tokens": meta["prompt_tokens"], "completion_tokens": sent,
            "total_tokens": meta["prompt_tokens"] + sent}}


# ---- helpers for the tests that drive this server -------------------------------------------

REPO = Path(__file__).resolve().parents[1]
BASE_PROFILE: dict[str, Any] = {
    "target": "sm90", "machine": "fake box", "interconnect": "nvlink", "model": "target",
    "drafter": "drafter", "tp": 1, "algorithm": "DDTREE", "budget": 8, "tokenizer": "none",
    "thresholds": "test-models", "start-timeout": 30, "launch-module": "verify.fake_sglang",
}


def make_models(root: Path, vocab_size: int = 4096) -> Path:
    """Model directories ``target`` and ``drafter`` (a config.json each) under ``root``."""
    for name in ("target", "drafter"):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return root


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)  # str, int, float and bool print as TOML does


def write_profiles(path: Path, profiles: dict[str, dict[str, Any]]) -> Path:
    """A profiles.toml whose profiles are BASE_PROFILE updated with each given table."""
    lines = []
    for name, overrides in profiles.items():
        lines.append(f"[profiles.{name}]")
        table = {**BASE_PROFILE, **overrides}
        lines += [f"{k} = {_toml(v)}" for k, v in table.items() if v is not None]
    path.write_text("\n".join(lines) + "\n")
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    """The current environment with the repository importable (for ``-m repro.cli`` and this module)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def _watchdog(lifetime: float) -> None:
    """Exit when the lifetime is over or the parent died (the tests never leave a server behind)."""
    parent, deadline = os.getppid(), time.monotonic() + lifetime
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.2)
    sys.stderr.write("[fake-sglang] lifetime over or parent gone: exiting\n")
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """Serve like ``python -m sglang.launch_server`` until killed."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.fake_exit_at_start is not None:
        sys.stderr.write("RuntimeError: fake failure while loading the model\n")
        sys.exit(args.fake_exit_at_start)
    if not Path(args.model_path).is_dir():
        sys.stderr.write(f"OSError: {args.model_path} is not a model directory\n")
        sys.exit(1)
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    Handler.args = args
    Handler.ready_at = time.monotonic() + args.fake_startup_s
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)  # loopback whatever --host says
    server.daemon_threads = True
    threading.Thread(target=_watchdog, args=(args.fake_max_lifetime_s,), daemon=True).start()
    if os.environ.get("FAKE_SGLANG_PIDFILE"):
        Path(os.environ["FAKE_SGLANG_PIDFILE"]).write_text(str(os.getpid()))
    ready = threading.Timer(args.fake_startup_s, print, (READY_LINE,), {"file": sys.stderr})
    ready.start()
    server.serve_forever()


if __name__ == "__main__":
    main()
