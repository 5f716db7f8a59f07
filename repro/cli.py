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
    "patch": "apply, check or revert the DDTree patch series on the pinned SGLang",
    "wheelhouse": "download, hash-check and pack the pinned serving wheels for an offline GPU host",
    "install-offline": "install a wheelhouse with no network, checking every hash",
    "doctor": "check this machine against the pinned stack: GPU, driver, versions, toolchain, cubins",
    "cubins": "list the GPU architectures the sglang-kernel libraries carry code for",
    "serve": "run SGLang for a deployment profile on 127.0.0.1 until Ctrl-C",
    "bench": "benchmark AR vs DFLASH vs DDTREE (and TP vs EP) against SGLang from profiles",
    "report": "write the Markdown/JSON/PNG handoff report from bench results and verify tiers",
    "topology": "classify the GPU interconnect (nvidia-smi topo -m) and recommend TP or EP",
    "tau": "tau for every budget up to the recorded one, and the DFLASH chain's, from an acceptance recording",
    "tune": "measure round costs and recommend the fastest DDTREE budget per concurrency on this box",
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the ``selected`` verb's module is imported and given its flags."""
    parser = argparse.ArgumentParser(prog="repro", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, help_text in VERBS.items():
        verb_parser = sub.add_parser(verb, help=help_text, description=help_text)
        if verb == selected:
            module = importlib.import_module(f"repro.{verb.replace('-', '_')}")
            module.add_arguments(verb_parser)
            verb_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``repro`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    selected = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(selected if selected in VERBS else None).parse_args(argv)
    try:
        return int(args._module.main(args) or 0)  # noqa: SLF001 - the parser stores the verb module privately
    except (UsageError, ReproError) as exc:
        print(f"repro {args.verb}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print(f"repro {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
