"""Tests for `repro.serving.openai_client` and `repro bench --api openai`: the stream parser on written
streams, the request body of a cell, and runs against the fake SGLang server's /v1/completions."""

from __future__ import annotations

import io
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from repro import cli
from repro.errors import ReproError
from repro.evidence.load import Job
from repro.evidence.results import read_records, summarize
from repro.serving.openai_client import OpenAIClient, completion_body, fold_completion
from repro.serving.sglang_client import Client, events
from verify.benchrun import bench_args, fake_server, workspace
from verify.fake_sglang import make_models, write_profiles


def _sse(*items: dict | str) -> io.BytesIO:
    """A Server-Sent Events body: each dict as a ``data:`` line, a string verbatim."""
    lines = [f"data: {json.dumps(i)}\n\n" if isinstance(i, dict) else i for i in items]
    return io.BytesIO("".join(lines).encode())


def _chunk(text: str, tokens: int | None = None, finish: str | None = None) -> dict:
    chunk: dict = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if tokens is not None:
        chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": tokens}
    return chunk


USAGE = {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}}
DONE = "data: [DONE]\n\n"


def _fold(body: io.BytesIO):
    return fold_completion(events(body, "/v1/completions"), time.perf_counter())


class TestStreamParser:
    def test_cumulative_usage_gives_ttft_tokens_per_chunk_and_counts(self) -> None:
        """Per-chunk usage: the first chunk with tokens is TTFT, each later one a gap of its new tokens
        (an empty text still counts: the detokenizer may hold a token back); the last usage counts."""
        done = _fold(_sse(_chunk(" a", 1), _chunk(" b c d", 4), _chunk("", 5), _chunk(" e f", 6, "length"),
                          USAGE, DONE))
        assert [n for _, n in done.chunks] == [3, 1, 1]
        assert (done.prompt_tokens, done.completion_tokens, done.finish_reason) == (5, 6, "length")
        assert 0 <= done.ttft_s <= done.latency_s and done.spec_verify_ct is None and done.tau is None

    def test_without_per_chunk_usage_itl_is_missing_not_invented(self) -> None:
        """A server that sends usage only at the end: TTFT from the first text, no chunks recorded."""
        done = _fold(_sse(_chunk(""), _chunk(" a"), _chunk(" b c", finish="length"), USAGE, DONE))
        assert done.completion_tokens == 6 and done.chunks == [] and done.ttft_s <= done.latency_s

    def test_an_error_chunk_is_an_error(self) -> None:
        """SGLang's streamed error object ends the request as a ReproError quoting it."""
        error = {"error": {"object": "error", "message": "Generation aborted.", "type": "BadRequestError",
                           "code": 400}}
        with pytest.raises(ReproError, match=r"/v1/completions answered an error: .*Generation aborted"):
            _fold(_sse(_chunk(" a", 1), error, DONE))

    def test_a_dropped_stream_is_an_error(self) -> None:
        """A stream that ends before [DONE] (a server that died) is a ReproError, not a short answer."""
        with pytest.raises(ReproError, match=r"stream ended before \[DONE\]"):
            _fold(_sse(_chunk(" a", 1), _chunk(" b", 2)))

    @pytest.mark.parametrize(("items", "error"), [
        ((_chunk(" a"), DONE), r"sent no usage"),
        ((USAGE, DONE), r"finished without emitting a token"),
        ((_chunk(" a", -1), USAGE, DONE), r"expected completion_tokens an integer >= 0"),
        (({"choices": "x"}, DONE), r"expected a list of objects"),
    ])
    def test_malformed_streams_are_errors(self, items: tuple, error: str) -> None:
        """No usage, no token, a negative count or malformed choices: a ReproError saying which."""
        with pytest.raises(ReproError, match=error):
            _fold(_sse(*items))


class TestRequestBody:
    def test_a_cells_request_as_a_completion(self) -> None:
        """The native body of a bench request becomes a streamed completion of the same token ids,
        sampling and request id, asking for usage on every chunk."""
        job = Job(None, [], [{"input_ids": [7, 8, 9]}, {"text": "def f():"}], {})  # type: ignore[arg-type]
        body = completion_body(job.payload(0, 0.5, 64, "set/abc-1"), "m")
        assert body == {"model": "m", "prompt": [7, 8, 9], "max_tokens": 64, "temperature": 0.5, "ignore_eos": True,
                        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                        "rid": "set/abc-1"}
        assert completion_body(job.payload(1, 0.0, 8), "m")["prompt"] == "def f():"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start fake servers with extra arguments (killed at teardown); each call returns a URL."""
    make_models(tmp_path / "fake" / "models")
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> str:
        proc, url = fake_server(tmp_path / "fake", *args)
        procs.append(proc)
        return url

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


class TestAgainstTheFake:
    def test_a_speculative_stream_through_the_openai_api(self, fake) -> None:
        """Every token arrives, counted per chunk from usage; tau is missing (the stream has no rounds)."""
        client = OpenAIClient(fake("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "32"))
        done = client.generate({"input_ids": list(range(10, 30)),
                                "sampling_params": {"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}})
        assert (done.completion_tokens, done.prompt_tokens, done.tau) == (40, 20, None)
        assert sum(n for _, n in done.chunks) == 39 and max(n for _, n in done.chunks) > 1
        assert client.model().endswith("target")

    def test_bench_url_through_the_openai_api(self, fake, tmp_path: Path, monkeypatch) -> None:
        """--api openai --url: the same cells as native, recorded apart (cell.api), with TTFT, ITL and
        tokens and no tau; --flush-cache empties the cache before each cell; the table says the API."""
        work = workspace(tmp_path / "w", monkeypatch)
        url = fake("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8")
        common = ("fake", "--url", url, "--request-rate", "200", "--concurrency", "2", "--num-prompts", "3")
        assert cli.main(bench_args(*common, "--flush-cache")) == 0
        assert cli.main(bench_args(*common, "--api", "openai", "--flush-cache", "--resume")) == 0
        records = read_records(work / "out.jsonl")
        requests = [r for r in records if r["kind"] == "request"]
        assert sorted(r["cell"].get("api") or "native" for r in requests) == ["native"] * 6 + ["openai"] * 6
        assert all(r["tau"] is None and r["completion_tokens"] == 24 for r in requests if r["cell"].get("api"))
        assert Client(url).server_info()["fake_flushes"] == 4  # two cells per run
        summaries = summarize(records)
        assert sorted((s.cell.source, s.cell.label, s.requests, s.tau_mean is None) for s in summaries) == [
            ("fake", "DDTREE B=8", 3, False)] * 2 + [("fake via openai", "DDTREE B=8", 3, True)] * 2
        assert all(s.itl_ms is not None for s in summaries)

    def test_a_server_without_server_info_is_labelled_from_the_profile(self, fake, tmp_path: Path,
                                                                        monkeypatch, capsys) -> None:
        """An OpenAI-compatible server that is not SGLang: the profile's algorithm labels the cells, saying so."""
        work = workspace(tmp_path / "w", monkeypatch)
        url = fake("--fake-no-server-info")
        assert cli.main(bench_args("fake", "--url", url, "--api", "openai", "--concurrency", "1",
                                   "--num-prompts", "2")) == 0
        assert "labelled DDTREE B=8 from profile fake, not read from the server" in capsys.readouterr().err
        (s,) = summarize(read_records(work / "out.jsonl"))
        assert (s.cell.label, s.cell.api, s.requests) == ("DDTREE B=8", "openai", 2)

    def test_a_dropped_stream_is_a_failed_record(self, tmp_path: Path, monkeypatch) -> None:
        """A server the bench starts, measured through /v1/completions: a stream cut before [DONE]
        is recorded as failed and the cell goes on."""
        work = workspace(tmp_path, monkeypatch)
        write_profiles(work / "profiles.toml", {"fake-dropping": {"sglang": {"fake-step-ms": 2, "fake-drop-index": 2}}})
        assert cli.main(bench_args("fake-dropping", "--api", "openai", "--algorithms", "AR", "--concurrency", "2",
                                   "--num-prompts", "3")) == 0
        requests = [r for r in read_records(work / "out.jsonl") if r["kind"] == "request"]
        (failed,) = [r for r in requests if "error" in r]
        assert failed["index"] == 2 and "ended before [DONE]" in failed["error"]
        (s,) = summarize(read_records(work / "out.jsonl"))
        assert (s.requests, s.failed, s.cell.api) == (2, 1, "openai")
