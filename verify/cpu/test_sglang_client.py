"""Tests for `repro.serving.sglang_client` against the fake SGLang server (loopback, bounded lifetime)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from repro.errors import ReproError
from repro.serving.sglang_client import Client
from repro.serving.sglang_server import free_port
from verify.fake_sglang import make_models, subprocess_env

Launch = Callable[..., Client]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """Start fake servers with extra arguments; each is killed at teardown."""
    models = make_models(tmp_path / "models")
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> Client:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "verify.fake_sglang", "--model-path", str(models / "target"),
             "--port", str(port), "--fake-startup-s", "0", "--fake-max-lifetime-s", "60", *args],
            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        client = Client(f"http://127.0.0.1:{port}", timeout=10)
        deadline = time.monotonic() + 20
        while not client.healthy(timeout=1):
            assert time.monotonic() < deadline and proc.poll() is None, "fake server did not start"
            time.sleep(0.05)
        return client

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _body(max_new: int = 40, temperature: float = 0.0) -> dict:
    return {"input_ids": list(range(10, 30)),
            "sampling_params": {"temperature": temperature, "max_new_tokens": max_new,
                                "ignore_eos": True}}


class TestClient:
    def test_url_must_be_http_with_a_port(self) -> None:
        """A URL without a port is refused with the expected form."""
        with pytest.raises(ValueError, match=r"url must look like http://127\.0\.0\.1:PORT"):
            Client("http://127.0.0.1")

    def test_healthy_is_false_when_nothing_listens(self) -> None:
        """A refused connection reads as not healthy, not as an exception."""
        assert not Client(f"http://127.0.0.1:{free_port()}").healthy(timeout=1)

    def test_server_info_reports_the_algorithm(self, launch: Launch) -> None:
        """/server_info carries the server args, the speculative algorithm included."""
        info = launch("--speculative-algorithm", "DFLASH").server_info()
        assert info["speculative_algorithm"] == "DFLASH" and "internal_states" in info

    def test_speculative_stream_gives_tau_ttft_and_chunks(self, launch: Launch) -> None:
        """A DDTREE stream yields every token, tau = completion / verify rounds, and chunk gaps."""
        done = launch("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget",
                      "32").generate(_body())
        assert done.completion_tokens == 40 and done.prompt_tokens == 20
        assert done.spec_verify_ct and done.tau == pytest.approx(40 / done.spec_verify_ct)
        assert done.tau > 2  # the fake accepts ~4.8 tokens per round at B=32
        assert sum(n for _, n in done.chunks) == 39  # the first token counts to TTFT
        assert 0 < done.ttft_s <= done.latency_s and done.finish_reason == "length"

    def test_ar_stream_has_no_tau(self, launch: Launch) -> None:
        """A non-speculative server reports no verify rounds, so tau is None."""
        done = launch().generate(_body(max_new=8))
        assert done.spec_verify_ct is None and done.tau is None
        assert [n for _, n in done.chunks] == [1] * 7

    def test_bad_request_is_an_http_error(self, launch: Launch) -> None:
        """A request the server rejects raises with the status code."""
        with pytest.raises(ReproError, match=r"returned HTTP 400"):
            launch().generate({"sampling_params": {}})

    def test_dead_server_is_a_clear_error(self) -> None:
        """A request to a port nobody serves raises a one-line ReproError naming the URL."""
        with pytest.raises(ReproError, match=r"POST http://127\.0\.0\.1:\d+/generate failed"):
            Client(f"http://127.0.0.1:{free_port()}").generate(_body())
