"""Where a server's host time goes, from py-spy's collapsed stacks (``served_round --pyspy``).

    python -m verify.bench.pyspy_rounds OUT/pyspy_dflash.txt OUT/pyspy_ddtree-b32.txt [--top 40] [--json]

Each input line is ``frame;frame;...;frame COUNT`` (``py-spy record --format raw --threads``; the
first frame names the thread). For the busiest thread of each file (the scheduler's loop) prints
the share of its samples spent inside each function (inclusive) and on top of the stack (self),
side by side across files, so two configurations' rounds compare function by function.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

_LOCATION = re.compile(r"\s*\((?P<file>[^()]*?)(?::\d+)?\)\s*$")


def _frame(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``file.py:func`` (lines dropped: one entry per function)."""
    match = _LOCATION.search(frame)
    if match is None:
        return frame.strip()
    name = frame[: match.start()].strip()
    return f"{Path(match.group('file')).name}:{name}"


def profile(path: Path) -> dict[str, object]:
    """Inclusive and self sample shares of the busiest thread's functions."""
    threads: dict[str, list[tuple[list[str], int]]] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        threads.setdefault(frames[0], []).append(([_frame(f) for f in frames[1:]], int(count)))
    if not threads:
        msg = f"{path}: no py-spy stacks (expected 'frame;frame COUNT' lines)"
        raise ValueError(msg)
    thread, stacks = max(threads.items(), key=lambda kv: sum(c for _, c in kv[1]))
    total = sum(c for _, c in stacks)
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, count in stacks:
        for name in set(frames):
            inclusive[name] += count
        if frames:
            own[frames[-1]] += count
    return {"file": path.name, "thread": thread, "samples": total,
            "inclusive": {k: v / total for k, v in inclusive.items()}, "self": {k: v / total for k, v in own.items()}}


def main(argv: list[str] | None = None) -> int:
    """Print the functions that hold most of each file's busiest thread, side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        profiles = [profile(f) for f in args.files]
    except (OSError, ValueError) as exc:
        print(f"pyspy_rounds: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(profiles))
        return 0
    for kind in ("inclusive", "self"):
        names = Counter()
        for p in profiles:
            names.update(p[kind])
        print(f"\n{kind} share of samples  | " + " | ".join(f"{p['file']} ({p['samples']})" for p in profiles))
        for name, _ in names.most_common(args.top):
            print(" | ".join([f"{name[:90]:90s}", *(f"{100 * p[kind].get(name, 0):6.1f}%" for p in profiles)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
