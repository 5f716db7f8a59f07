"""Running `repro bench` against the fake SGLang server in the CPU tests: the workspace and the checks of its output."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.evidence.results import read_records
from repro.serving.sglang_client import Client
from repro.serving.sglang_server import free_port
from verify.fake_sglang import REPO, make_models, subprocess_env, write_profiles

FAST = {"sglang": {"fake-step-ms": 3}}


def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` with test models and a profiles file, made the working directory."""
    make_models(tmp_path / "models")
    write_profiles(tmp_path / "profiles.toml", {
        "fake": FAST,
        "fake-dead": {"sglang": {"fake-exit-at-start": 3}},
        "fake-ar-only": {"algorithm": "AR", "budget": None, "drafter": None},
        "fake-slow": {"sglang": {"fake-step-ms": 5}},
        "fake-shared": {"sglang": {"fake-step-ms": 3, "mem-fraction-static": 0.3}},
        "fake-capped": {"sglang": {"fake-step-ms": 3, "mem-fraction-static": 0.7, "max-total-tokens": 4096}},
        "fake-busy": {"sglang": {"fake-step-ms": 3, "fake-batch-cost": 0.5}},
        "fake-refusing": {"sglang": {"fake-step-ms": 3, "fake-refuse-index": 2}},
    })
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return tmp_path


def bench_args(*extra: str, out: str = "out.jsonl") -> list[str]:
    """The `repro bench` argv over the test profiles and models, writing ``out``."""
    return ["bench", "--profile-file", "profiles.toml", "--models-dir", "models",
            "--max-new-tokens", "24", "--warmup", "1", "-o", out, *extra]


def requests_of(path: Path) -> list[tuple[str, int]]:
    """(cell key, index) of every request record, duplicates kept."""
    return [(json.dumps(r["cell"], sort_keys=True), r["index"]) for r in read_records(path)
            if r["kind"] == "request"]


def wait_for_requests(path: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``path`` holds ``count`` request records while ``proc`` still runs."""
    deadline = time.monotonic() + 60
    while not (path.exists() and len(requests_of(path)) >= count):
        assert proc.poll() is None and time.monotonic() < deadline, "bench ended too early"
        time.sleep(0.05)


def check_complete(path: Path, expected: int) -> None:
    """Every line parses, no request is recorded twice, and all ``expected`` are there."""
    for line in path.read_text().splitlines():
        json.loads(line)
    seen = requests_of(path)
    assert len(seen) == len(set(seen)) == expected, collections.Counter(seen).most_common(2)


def fake_server(root: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """A healthy fake server of ``root``'s test models on a free port with ``args`` (the caller kills
    it), and its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "verify.fake_sglang", "--model-path", str(root / "models" / "target"),
         "--port", str(port), "--fake-startup-s", "0", "--fake-step-ms", "2", "--fake-max-lifetime-s", "60", *args],
        env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not Client(url).healthy(timeout=1):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the fake server did not start")
        time.sleep(0.05)
    return proc, url
