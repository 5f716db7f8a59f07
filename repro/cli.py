"""`repro` command line: parses arguments and dispatches to one module per verb.

Each verb lives in ``repro/<verb>.py`` (``-`` becomes ``_``) and exposes ``add_arguments(parser)``
and ``main(args) -> int``. Verb modules keep heavy imports (torch, sglang) inside functions so
``repro --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from repro.errors import ReproError, UsageError

# verb -> one-line help. Add a row here and a module repro/<verb>.py to add a verb.
VERBS: dict[str, str] = {
    "demo": "run an embedded end-to-end DDTree decode on a toy target and drafter (CPU)",
    "golden": "check or regenerate the golden set in golden/",
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one sub-parser per verb."""
    parser = argparse.ArgumentParser(prog="repro", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, help_text in VERBS.items():
        module = importlib.import_module(f"repro.{verb.replace('-', '_')}")
        verb_parser = sub.add_parser(verb, help=help_text, description=help_text)
        module.add_arguments(verb_parser)
        verb_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``repro`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.main(args) or 0)
    except (UsageError, ReproError) as exc:
        print(f"repro {args.verb}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print(f"repro {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
