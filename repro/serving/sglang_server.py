"""Start, watch and stop one SGLang server for a profile (used by `repro serve` and `repro bench`).

The server runs ``python -m sglang.launch_server`` in its own process group (so stopping it also
stops its scheduler and detokenizer processes), listens on 127.0.0.1 only, and writes its output
to a log file. Every failure names the log and quotes its last lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

from repro.algorithms import algorithm, budgeted, drafts
from repro.errors import ReproError, UsageError
from repro.serving.profiles import Profile, model_path, reserved_flag
from repro.serving.sglang_client import Client

HOST = "127.0.0.1"
TAIL_LINES = 25
GRAPH_OOM = ("Capture cuda graph failed", "out of memory")  # SGLang 0.5.17's words for it


def _flag(key: str, value: Any) -> list[str]:
    if value is True:
        return [f"--{key}"]
    if value is False:
        return []
    values = value if isinstance(value, list) else [value]
    return [f"--{key}", *(str(v) for v in values)]


def server_argv(profile: Profile, port: int, models_root: Path,
                python: str = sys.executable) -> list[str]:
    """The full command line that serves ``profile`` on 127.0.0.1:``port``."""
    argv = [python, "-m", profile.launch_module,
            "--model-path", str(model_path(profile.model, models_root)),
            "--host", HOST, "--port", str(port), "--tp-size", str(profile.tp),
            "--attention-backend", profile.attention_backend]
    if profile.ep > 1:
        argv += ["--ep-size", str(profile.ep)]
    if profile.moe_a2a_backend != "none":
        argv += ["--moe-a2a-backend", profile.moe_a2a_backend]
    speculative = algorithm(profile.algorithm).sglang
    if speculative is not None:
        assert profile.drafter, "validated by repro.serving.profiles"
        argv += ["--speculative-algorithm", speculative,
                 "--speculative-draft-model-path", str(model_path(profile.drafter, models_root)),
                 "--speculative-draft-attention-backend", profile.draft_attention_backend]
    if budgeted(profile.algorithm) and profile.budget_schedule:
        argv += ["--speculative-ddtree-budget-schedule", profile.budget_schedule]
    elif budgeted(profile.algorithm):
        argv += ["--speculative-ddtree-budget", str(profile.budget)]
    if profile.graph_bs:
        argv += ["--cuda-graph-backend-decode", "full",
                 "--cuda-graph-bs-decode", *(str(b) for b in profile.graph_bs)]
    else:
        argv += ["--cuda-graph-backend-decode", "disabled"]
    if profile.tokenizer == "none":
        argv += ["--skip-tokenizer-init"]
    if profile.load_format != "auto":
        argv += ["--load-format", profile.load_format]
        if drafts(profile.algorithm):
            argv += ["--speculative-draft-load-format", profile.load_format]
    return argv + _profile_flags(profile)


def _profile_flags(profile: Profile) -> list[str]:
    """The profile's ``sglang`` table as flags; an owned or network flag is refused (on load by
    repro.serving.profiles, and here again for a profile built in code)."""
    argv: list[str] = []
    for key, value in profile.sglang.items():
        if reserved_flag(key):
            msg = f"profile {profile.name!r}: sglang.{key} would set --{reserved_flag(key)}"
            raise UsageError(msg)
        argv += _flag(key, value)
    return argv


def server_env(profile: Profile, models_root: Path) -> dict[str, str]:
    """The server's environment: ours (NCCL settings included), loopback unproxied, profile's env."""
    extra = {k: v.replace("{models}", str(models_root)) for k, v in profile.env.items()}
    return {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1", **extra}


def check_models(profile: Profile, models_root: Path) -> None:
    """Raise a UsageError naming the first model directory or env file of ``profile`` missing."""
    needed = [("model", profile.model)]
    if drafts(profile.algorithm) and profile.drafter:
        needed.append(("drafter", profile.drafter))
    for key, value in needed:
        path = model_path(value, models_root)
        if not path.is_dir():
            msg = (
                f"profile {profile.name!r}: {key} directory {path} does not exist "
                f"(set --models-dir or $REPRO_MODELS_DIR)"
            )
            raise UsageError(msg)
    for key, value in profile.env.items():
        path = Path(value.replace("{models}", str(models_root)))
        if "{models}" in value and not path.exists():
            msg = (
                f"profile {profile.name!r}: env {key} names {path}, which does not "
                f"exist (set --models-dir or $REPRO_MODELS_DIR)"
            )
            raise UsageError(msg)


def port_is_free(port: int) -> bool:
    """True when nothing listens on (or holds) 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines of ``path``, indented, or a note if there are none."""
    try:
        with path.open(errors="replace") as f:
            tail = deque((ln.rstrip() for ln in f if ln.strip()), maxlen=lines)
    except OSError:
        return "  (no log was written)"
    return "\n".join(f"  | {ln}" for ln in tail) or "  (the log is empty)"


def failure_hint(tail: str) -> str:
    """The profile keys that fix a failure the log's tail shows, else "".

    SGLang's own advice names flags that repro sets from the profile.
    """
    if all(text in tail for text in GRAPH_OOM):
        return (": its decode CUDA graphs did not fit in GPU memory (lower the profile's largest "
                "cuda-graph-bs, or set cuda-graph-max-tokens to cap a DDTREE verify graph's bs x (B + 1) tokens)")
    return ""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C inside the block, so servers are stopped on both."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launching process dies (Linux), so no server is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class SGLangServer:
    """One server process; use as a context manager so it is always stopped."""

    def __init__(self, profile: Profile, *, port: int, models_root: Path, log_path: Path,
                 stop_grace: float = 30.0) -> None:
        self.profile, self.port, self.models_root = profile, port, models_root
        self.log_path, self.stop_grace = log_path, stop_grace
        self.client = Client(f"http://{HOST}:{port}")
        self.proc: subprocess.Popen[bytes] | None = None
        self.started: float | None = None  # time.monotonic() at launch

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.client.url

    def start(self) -> None:
        """Check models and port, then launch the server in a new process group."""
        check_models(self.profile, self.models_root)
        if not port_is_free(self.port):
            msg = (
                f"port {HOST}:{self.port} is already in use "
                f"(pass --port with a free one, or stop what holds it)"
            )
            raise UsageError(msg)
        argv = server_argv(self.profile, self.port, self.models_root)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            self.started = time.monotonic()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env=server_env(self.profile, self.models_root),
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509 - only calls prctl

    def failure(self, what: str) -> ReproError:
        """An error saying ``what`` happened (and the profile's fix, when the log shows a known
        failure), with the server log's last lines."""
        tail = log_tail(self.log_path)
        return ReproError(f"SGLang server for {self.profile.name} ({self.profile.label}) {what}"
                          f"{failure_hint(tail)}; last lines of {self.log_path}:\n{tail}")

    def check_alive(self) -> None:
        """Raise (with the log tail) if the server process has exited."""
        assert self.proc is not None, "start() first"
        code = self.proc.poll()
        if code is not None:
            msg = f"exited with code {code}"
            raise self.failure(msg)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code if the process ends within ``timeout`` seconds, else None."""
        assert self.proc is not None, "start() first"
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait_healthy(self, timeout: float) -> float:
        """Block until ``/health`` answers 200, at most ``timeout`` seconds after the launch;
        return the seconds since the launch (servers started together each count their own)."""
        start, poll = self.started or time.monotonic(), 0.1
        while True:
            self.check_alive()
            if self.client.healthy(timeout=30.0):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                msg = (
                    f"was not healthy after {timeout:.0f} s (raise the profile's "
                    f"start-timeout or --start-timeout)"
                )
                raise self.failure(msg)
            time.sleep(poll)
            poll = min(2.0, poll * 1.5)  # quick for a fast start, quiet in a long model load

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after the grace period; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # stragglers of the group, if any
        return self.proc.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
