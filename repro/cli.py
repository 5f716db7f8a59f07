"""`repro` command line: parses arguments and dispatches to one module per verb.

Each verb is one module (the ``VERBS`` table names it) exposing ``add_arguments(parser)`` and
``main(args) -> int``. Verb modules keep heavy imports (torch, sglang) inside functions so
``repro --help`` stays fast.

Errors are handled here, once, for every verb: a :class:`~repro.errors.UsageError` (bad flags,
files or values, argparse's own complaints included) is one line on stderr and exit 2; a
:class:`~repro.errors.ReproError` or an ``OSError`` of the environment (a full disk, a permission)
is one line and exit 1; Ctrl-C is exit 130; a closed stdout (``repro doctor | head -2``) ends the
command quietly with exit 141, as a process killed by SIGPIPE. ``--debug`` (or
``REPRO_DEBUG=1``) prints the traceback before the line. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from typing import NamedTuple, NoReturn

from repro.errors import ReproError, UsageError


class Verb(NamedTuple):
    """A CLI verb: the module that implements it and its one-line help."""

    module: str
    help: str


# Add a row here and its module to add a verb.
VERBS: dict[str, Verb] = {
    "demo": Verb("repro.demo", "run an embedded end-to-end DDTree decode on a toy target and drafter (CPU)"),
    "golden": Verb("repro.golden.command", "check or regenerate the golden set in golden/"),
    "patch": Verb("repro.patch", "apply, check or revert the DDTree patch series on the pinned SGLang"),
    "wheelhouse": Verb("repro.stack.wheelhouse",
                       "download, hash-check and pack the pinned serving wheels for an offline GPU host"),
    "install-offline": Verb("repro.stack.install_offline", "install a wheelhouse with no network, checking every hash"),
    "doctor": Verb("repro.stack.doctor",
                   "check this machine against the pinned stack: GPU, driver, versions, toolchain, cubins"),
    "cubins": Verb("repro.stack.cubins", "list the GPU architectures the sglang-kernel libraries carry code for"),
    "serve": Verb("repro.serving.serve", "run SGLang for a deployment profile on 127.0.0.1 until Ctrl-C"),
    "bench": Verb("repro.evidence.bench", "benchmark AR vs DFLASH vs DDTREE (and TP vs EP) against SGLang from profiles"),
    "report": Verb("repro.handoff.report",
                   "write the Markdown/JSON/PNG handoff report from bench results and verify tiers"),
    "topology": Verb("repro.topology",
                     "TP8 or EP8 and which budget on this box: a cost model from one-GPU shares and measured collectives"),
    "tau": Verb("repro.tuning.tau",
                "tau for every budget up to the recorded one, and the DFLASH chain's, from an acceptance recording"),
    "tune": Verb("repro.tuning.tune",
                 "measure round costs and recommend the fastest DDTREE budget per concurrency on this box"),
    "testmodels": Verb("repro.testmodels",
                       "write the project's own test models (planted, random, MLA + MoE, full-size configs) into OUT"),
}
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`
DEBUG_HELP = "print the traceback of an error as well (also REPRO_DEBUG=1)"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as one-line UsageErrors instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        msg = f"{message} (see `{self.prog} --help`)"
        raise UsageError(msg)


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the ``selected`` verb's module is imported and given its flags."""
    parser = _Parser(prog="repro", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, (module_name, help_text) in VERBS.items():
        verb_parser = sub.add_parser(verb, help=help_text, description=help_text)
        verb_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                 help=DEBUG_HELP)
        if verb == selected:
            module = importlib.import_module(module_name)
            module.add_arguments(verb_parser)
            verb_parser.set_defaults(_module=module)
    return parser


def _fail(prefix: str, message: str, code: int, *, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"{prefix}: {message}", file=sys.stderr)
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``repro`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    selected = next((a for a in argv if not a.startswith("-")), None)
    prefix = f"repro {selected}" if selected in VERBS else "repro"
    debug = "--debug" in argv or os.environ.get("REPRO_DEBUG", "") not in ("", "0")
    try:
        args = build_parser(selected if selected in VERBS else None).parse_args(argv)
        code = int(args._module.main(args) or 0)  # noqa: SLF001 - the parser stores the verb module privately
        sys.stdout.flush()
    except UsageError as exc:
        return _fail(prefix, str(exc), 2, debug=debug)
    except ReproError as exc:
        return _fail(prefix, str(exc), 1, debug=debug)
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    except OSError as exc:  # the environment: a full disk, a permission, a vanished directory
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(prefix, f"{where}{exc.strerror or exc}", 1, debug=debug)
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
