"""`repro serve PROFILE`: run SGLang for a deployment profile on 127.0.0.1 until Ctrl-C or SIGTERM.

The server runs in its own process group with its output in a log file; the command returns once
the server is stopped cleanly (exit 0), or with the log's last lines if it fails to start or dies.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path

from repro.algorithms import budgeted
from repro.argtypes import NONNEGATIVE_INT, PORT, SECONDS
from repro.errors import UsageError
from repro.serving.profiles import get_profile, models_dir
from repro.serving.sglang_server import SGLangServer, server_argv, sigterm_as_interrupt


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro serve``."""
    parser.add_argument("profile", metavar="PROFILE", help="a profile name (see profiles.toml)")
    parser.add_argument("--algorithm", help="serve AR, DFLASH or DDTREE instead of the profile's")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=NONNEGATIVE_INT, help="DDTREE budget instead of the profile's")
    budget.add_argument("--budget-schedule", metavar="SCHEDULE",
                        help="DDTREE budget per batch size instead of the profile's, e.g. 1:63,4:31,16:15")
    parser.add_argument("--port", type=PORT, default=None, help="default: the profile's port")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="where model directories live (default $REPRO_MODELS_DIR or ./models)")
    parser.add_argument("--log", type=Path, default=None,
                        help="server log file (default results/logs/serve-PROFILE.log)")
    parser.add_argument("--start-timeout", type=SECONDS, default=None, metavar="S",
                        help="seconds to wait for /health (default: the profile's)")
    parser.add_argument("--profile-file", type=Path, default=None, help="another profiles.toml")
    parser.add_argument("--print-command", action="store_true",
                        help="print the SGLang command line and exit")


def _serve_until_signalled(server: SGLangServer) -> None:
    """Watch the server until SIGINT or SIGTERM; the handlers only set a flag, so a signal never
    lands inside a subprocess call (an interrupted ``Popen.poll`` can leave its lock held)."""
    stop = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda _signum, _frame: stop.set()) for s in signals}
    try:
        while not stop.wait(1.0):
            server.check_alive()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM; exit 0 once the server is stopped cleanly."""
    profile = get_profile(args.profile, args.profile_file)
    if args.algorithm or args.budget is not None or args.budget_schedule is not None:
        profile = profile.with_algorithm(args.algorithm or profile.algorithm, args.budget, args.budget_schedule)
        if not budgeted(profile.algorithm) and (args.budget is not None or args.budget_schedule is not None):
            flag = "--budget" if args.budget is not None else "--budget-schedule"
            msg = f"{flag} is DDTREE's (the server would run {profile.algorithm})"
            raise UsageError(msg)
    port = args.port or profile.port
    root = models_dir(args.models_dir)
    if args.print_command:
        print(shlex.join(server_argv(profile, port, root)))
        return 0
    log = args.log or Path("results/logs") / f"serve-{profile.name}.log"
    if log.is_dir():
        msg = f"--log: {log} is a directory (expected a log file path)"
        raise UsageError(msg)
    server = SGLangServer(profile, port=port, models_root=root, log_path=log)
    with sigterm_as_interrupt():
        try:
            server.start()
            print(f"repro serve: starting {profile.name} ({profile.label}) on {server.url}; "
                  f"log {log}", file=sys.stderr, flush=True)
            took = server.wait_healthy(args.start_timeout or profile.start_timeout)
            print(f"serving {profile.name} ({profile.label}) at {server.url} (ready after "
                  f"{took:.0f} s); Ctrl-C or SIGTERM stops it", flush=True)
            _serve_until_signalled(server)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while it was starting
            pass
        finally:
            code = server.stop()
    print(f"repro serve: stopped {profile.name} (server exit code {code})", file=sys.stderr)
    return 0
