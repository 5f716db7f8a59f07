"""Tests for `repro.cli`: one error mechanism for every verb (one line, exit 2 or 1, --debug, pipes)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from repro import cli
from repro.errors import ReproError, UsageError

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "verify" / "fixtures" / "topology" / "b300x8-nv18.txt"


@pytest.fixture
def verb(monkeypatch):
    """Register a throwaway verb ``probe`` whose main raises what the test puts in ``box``."""
    box: dict[str, BaseException | None] = {"raise": None}

    def main(_args: argparse.Namespace) -> int:
        if box["raise"] is not None:
            raise box["raise"]
        print("probe ran")
        return 0

    module = types.ModuleType("repro.probe")
    module.add_arguments = lambda parser: parser.add_argument("--n", type=int, default=0)
    module.main = main
    monkeypatch.setitem(sys.modules, "repro.probe", module)
    monkeypatch.setitem(cli.VERBS, "probe", cli.Verb("repro.probe", "a verb registered by a test"))
    return box


class TestErrors:
    def test_argparse_errors_are_one_line_naming_the_flag(self, capsys) -> None:
        """A bad flag value is one stderr line (no usage block) and exit 2."""
        assert cli.main(["topology", "--from"]) == 2
        err = capsys.readouterr().err
        assert err == "repro topology: argument --from: expected one argument (see `repro topology --help`)\n"

    @pytest.mark.parametrize(("exc", "code"), [
        (UsageError("--n must be >= 1 (got 0)"), 2), (ReproError("the server died"), 1),
        (PermissionError(13, "Permission denied", "out/r.md"), 1),
    ])
    def test_a_new_verb_gets_the_mechanism_for_free(self, verb, capsys, exc, code) -> None:
        """A verb that only registers itself turns user and environment errors into one line."""
        verb["raise"] = exc
        assert cli.main(["probe"]) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("repro probe: ")
        assert "Traceback" not in err

    def test_debug_shows_the_traceback_too(self, verb, capsys, monkeypatch) -> None:
        """--debug (or REPRO_DEBUG=1) prints the traceback before the one line."""
        verb["raise"] = UsageError("--n must be >= 1 (got 0)")
        assert cli.main(["probe", "--debug"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" in err and err.endswith("repro probe: --n must be >= 1 (got 0)\n")
        monkeypatch.setenv("REPRO_DEBUG", "1")
        assert cli.main(["probe"]) == 2
        assert "Traceback" in capsys.readouterr().err

    def test_a_bug_keeps_its_traceback(self, verb) -> None:
        """Only user and environment errors become one line; a programming error propagates."""
        verb["raise"] = ZeroDivisionError("division by zero")
        with pytest.raises(ZeroDivisionError):
            cli.main(["probe"])


class _ClosedStdout:
    """A stdout whose reader has gone away (``| head`` after its lines)."""

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


class TestBrokenPipe:
    @pytest.mark.parametrize("argv", [["probe"], ["doctor"]])
    def test_closed_stdout_exits_quietly(self, verb, capsys, monkeypatch, argv) -> None:
        """A reader that stops early (`repro doctor | head -2`) ends the command with 141 and
        nothing on stderr."""
        monkeypatch.setattr(sys, "stdout", _ClosedStdout())
        assert cli.main(argv) == cli.BROKEN_PIPE
        assert capsys.readouterr().err == ""

    def test_closed_pipe_of_a_real_process(self) -> None:
        """`repro topology > closed pipe` exits 141 without a traceback or an 'Exception ignored'."""
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run([sys.executable, "-m", "repro.cli", "topology", "--from", str(TOPOLOGY)],
                                  stdout=write, stderr=subprocess.PIPE, check=False, timeout=60,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        finally:
            os.close(write)
        assert done.returncode == cli.BROKEN_PIPE and done.stderr == b""


@pytest.mark.parametrize("name", list(cli.VERBS))
def test_a_repeated_list_flag_adds_to_the_list(name) -> None:
    """Every optional flag that takes several values extends its list when given twice (``--results a
    --results b`` reads both): argparse's default keeps only the last, silently dropping the first."""
    parser = cli.build_parser(name)
    verb = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    listed = [a for a in verb._actions if a.option_strings and a.nargs in ("+", "*")]
    assert all(isinstance(a, argparse._ExtendAction) for a in listed), \
        f"repro {name}: {[a.option_strings[0] for a in listed if not isinstance(a, argparse._ExtendAction)]} keep only the last"


def test_tune_reads_every_results_flag() -> None:
    """``repro tune --results a --results b c`` reads a, b and c (a grid and its confirm cells, say)."""
    parser = cli.build_parser("tune")
    args = parser.parse_args(["tune", "p", "--results", "a", "--results", "b", "c"])
    assert args.results == [Path("a"), Path("b"), Path("c")]
