"""Tests for `repro serve`, run as a real command against the fake SGLang server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.serving.sglang_client import Client
from repro.serving.sglang_server import free_port
from verify.fake_sglang import make_models, subprocess_env, write_profiles


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A directory with fake models and a profiles file of fake servers."""
    make_models(tmp_path / "models")
    write_profiles(tmp_path / "profiles.toml", {
        "fake": {},
        "fake-dead": {"sglang": {"fake-exit-at-start": 3}},
        "fake-short": {"sglang": {"fake-max-lifetime-s": 1.5}},
        "fake-lost": {"model": "missing"},
    })
    return tmp_path


def serve(work: Path, *args: str) -> subprocess.Popen[str]:
    """Start `repro serve` in ``work`` against the fake SGLang."""
    argv = [sys.executable, "-m", "repro.cli", "serve", "--profile-file", "profiles.toml",
            "--models-dir", "models", *args]
    env = subprocess_env(FAKE_SGLANG_PIDFILE=str(work / "server.pid"))
    return subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


class TestServe:
    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
    def test_serves_until_signalled_then_stops_cleanly(self, work: Path, sig: int) -> None:
        """The server answers /health once ready; SIGTERM or Ctrl-C stops it and exits 0."""
        port = free_port()
        proc = serve(work, "fake", "--port", str(port))
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"serving fake (DDTREE B=8) at http://127.0.0.1:{port}"), line
        assert Client(f"http://127.0.0.1:{port}").healthy()
        server = int((work / "server.pid").read_text())
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped fake" in err and _gone(server)
        assert (work / "results" / "logs" / "serve-fake.log").exists()

    def test_taken_port_is_a_clear_error(self, work: Path) -> None:
        """A port already in use exits 2 naming the port; nothing is started."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            port = sock.getsockname()[1]
            proc = serve(work, "fake", "--port", str(port))
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2
        assert err.strip() == (f"repro serve: port 127.0.0.1:{port} is already in use "
                               f"(pass --port with a free one, or stop what holds it)")

    def test_missing_model_is_a_clear_error(self, work: Path) -> None:
        """A profile whose model directory is absent exits 2 naming the directory."""
        proc = serve(work, "fake-lost")
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2 and "model directory" in err and "missing does not exist" in err

    def test_server_dying_at_start_shows_the_log_tail(self, work: Path) -> None:
        """A server that exits while starting: exit 1, its code and the log's last lines."""
        proc = serve(work, "fake-dead", "--port", str(free_port()))
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert "exited with code 3" in err and "| RuntimeError: fake failure" in err

    def test_server_dying_while_serving_shows_the_log_tail(self, work: Path) -> None:
        """A server that dies after becoming ready ends `repro serve` with exit 1 and its log."""
        proc = serve(work, "fake-short", "--port", str(free_port()))
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1 and "exited with code 0" in err
        assert "| [fake-sglang] lifetime over" in err

    def test_print_command_shows_the_sglang_command_line(self, work: Path) -> None:
        """--print-command prints the launch command, with algorithm overrides applied."""
        proc = serve(work, "fake", "--algorithm", "DFLASH", "--port", "31234", "--print-command")
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "-m verify.fake_sglang" in out and "--speculative-algorithm DFLASH" in out
        assert "--port 31234" in out and "--speculative-ddtree-budget" not in out
