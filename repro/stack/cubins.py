"""``repro cubins [PATH] [--target smXX] [--json|--markdown]``: which GPUs sglang-kernel can run on.

Lists the SASS (and PTX) architectures each shared library of a sglang-kernel wheel, unpacked tree
or installed copy carries, then, for every target of ``stack.toml`` (or the one given), whether each
library the target loads has SASS for each of its compute capabilities. A capability with no code
at all is a red line (exit 1); PTX only is a warning (JIT at first load). Needs no CUDA tools.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from pathlib import Path

from repro.errors import ReproError, UsageError
from repro.stack import fatbin
from repro.stack.pins import Stack, Target, format_capability, load_stack


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro cubins``."""
    parser.add_argument("path", nargs="?", type=Path,
                        help="a sglang-kernel wheel, a directory or a .so (default: the installed sglang-kernel)")
    parser.add_argument("--target", help="check only this SM target of stack.toml")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON")
    output.add_argument("--markdown", action="store_true", help="print the Markdown tables README records")


def _installed_kernel_libraries() -> tuple[str, dict[str, frozenset[fatbin.CudaCode]]]:
    try:
        dist = importlib.metadata.distribution("sglang-kernel")
    except importlib.metadata.PackageNotFoundError:
        msg = "no PATH given and sglang-kernel is not installed here"
        raise UsageError(msg) from None
    site = Path(str(dist.locate_file("")))
    try:
        return f"installed sglang-kernel {dist.version}", fatbin.scan_tree(site / "sgl_kernel")
    except ValueError as exc:
        msg = f"the installed sglang-kernel is damaged: {exc}"
        raise ReproError(msg) from None


def _rows(targets: list[Target], libraries: dict[str, frozenset[fatbin.CudaCode]]) -> list[dict]:
    return [
        {"target": target.name, "capability": format_capability(cov.capability),
         "library": cov.library, "present": cov.present, "sass": list(cov.sass),
         "ptx": list(cov.ptx), "verdict": cov.verdict}
        for target in targets
        for cov in fatbin.coverage(libraries, target.sgl_kernel_libs, target.capabilities)
    ]


def _column_cell(codes: frozenset[fatbin.CudaCode], arch: str) -> str:
    """Markdown cell for an expected arch (``sm_100a``): the SASS present for it, family included."""
    number = int(arch[3:].rstrip("af"))
    found = sorted(c.label for c in codes if c.kind == "sass" and c.arch == number)
    return " ".join(found) if found else "**missing**"


def _markdown(stack: Stack, libraries: dict[str, frozenset[fatbin.CudaCode]], rows: list[dict]) -> str:
    archs = sorted({a for t in stack.targets.values() for a in t.cubin_archs}, key=lambda a: int(a[3:].rstrip("af")))
    head = "| library | " + " | ".join(archs) + " | all SASS |"
    lines = [head, "|" + "---|" * (len(archs) + 2)]
    for lib, codes in sorted(libraries.items()):
        cells = [_column_cell(codes, a) for a in archs]
        every = " ".join(c.label for c in sorted(codes)) or "none"
        lines.append(f"| `{lib}` | " + " | ".join(cells) + f" | {every} |")
    lines += ["", "| target | capability | library it loads | SASS that runs there | verdict |",
              "|---|---|---|---|---|"]
    for r in rows:
        verdict = {"ok": "ok", "jit": "PTX only (JIT)", "missing": "**RED LINE: no code**"}[r["verdict"]]
        runs = " ".join(r["sass"] + r["ptx"]) or "-"
        lines.append(f"| {r['target']} | {r['capability']} | `{r['library']}` | {runs} | {verdict} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Print the table(s); exit 1 when a target has a capability with no code."""
    stack = load_stack()
    try:
        targets = [stack.target(args.target)] if args.target else list(stack.targets.values())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.path is None:
        source, libraries = _installed_kernel_libraries()
    else:
        if not args.path.exists():
            msg = f"PATH must be a wheel, a directory or a .so file (got {args.path}, which does not exist)"
            raise UsageError(msg)
        try:
            source, libraries = str(args.path), fatbin.scan(args.path)
        except ValueError as exc:
            msg = f"PATH {exc}"
            raise UsageError(msg) from None
    rows = _rows(targets, libraries)
    red = [r for r in rows if r["verdict"] == "missing"]
    if args.json:
        print(json.dumps({"source": source, "ok": not red, "targets": rows, "libraries": {
            lib: {"sass": [c.label for c in sorted(codes) if c.kind == "sass"],
                  "ptx": [c.label for c in sorted(codes) if c.kind == "ptx"]}
            for lib, codes in sorted(libraries.items())}}, indent=1))
    elif args.markdown:
        print(_markdown(stack, libraries, rows))
    else:
        print(f"device code in {source}:")
        for lib, codes in sorted(libraries.items()):
            print(f"  {lib:<58} {' '.join(c.label for c in sorted(codes)) or 'no device code'}")
        print("per target:")
        for r in rows:
            runs = " ".join(r["sass"] + r["ptx"]) or ("library missing" if not r["present"] else "nothing")
            print(f"  {r['verdict']:<8} {r['target']:<6} {r['capability']:<5} {r['library']:<40} {runs}")
        for r in red:
            print(f"RED LINE: {r['target']} GPUs of capability {r['capability']} cannot run {r['library']}")
    return 1 if red else 0
