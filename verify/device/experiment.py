"""GPU experiments as data: ``python3 -m verify.device.experiment list | show NAME | run NAME | seed-triton-cache``.

Each experiment is a row of ``verify/device/experiments.toml`` (``verify.device.rows``); ``show``
prints the exact commands ``run`` starts (the setup's first when the row runs on the installed
SGLang) and checks the files it would write; ``run`` runs them from the repository root on the GPU
machine (``verify.device.runner``: setup once, resume, time limit, packed into ``$OUT``). Exit status of
``run``: 0 done, 3 not finished within ``--time-limit`` (run it again), 1 a step failed, 2 a bad row.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from repro.errors import UsageError
from verify.device.rows import EXPERIMENTS, Row, load_rows
from verify.device.runner import (
    TRITON_CACHE,
    Clock,
    environment,
    paths_from_env,
    run_row,
    seed_triton_cache,
    steps_with_setup,
    triton_cache_dir,
)

TIME_LIMIT = 570.0  # seconds: one 10-minute device command, less the start and the copy back


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m verify.device.experiment", description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=EXPERIMENTS, help="the experiments file")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every experiment: name, kind, what it measures")
    show = sub.add_parser("show", help="the commands an experiment runs, and where its results go")
    show.add_argument("name")
    run = sub.add_parser("run", help="run an experiment (on the GPU machine, from the repository root)")
    run.add_argument("name")
    run.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="S",
                     help=f"start no step after S seconds and end every one by then (default {TIME_LIMIT:g})")
    run.add_argument("--fresh", action="store_true", help="remove the experiment's results folder first")
    sub.add_parser("seed-triton-cache", help="unpack the carried triton-cache.tar.gz into an empty TRITON_CACHE_DIR "
                                             "(`run` does it first; for scripts that start servers themselves)")
    return parser


def _row(rows: dict[str, Row], name: str) -> Row:
    if name not in rows:
        msg = f"no experiment {name!r} (see `list`)"
        raise UsageError(msg)
    return rows[name]


def main(argv: list[str] | None = None) -> int:
    """Entry point; a bad row or name is one line on stderr and exit 2."""
    args = _parser().parse_args(argv)
    paths = paths_from_env(os.environ)
    if args.command == "seed-triton-cache":
        cache = triton_cache_dir(os.environ)
        seeded = seed_triton_cache(paths.carry / f"{TRITON_CACHE}.tar.gz", cache)
        print(f"Triton cache {cache}: " + (f"{seeded} files from the carried archive" if seeded else "left as it is"))
        return 0
    try:
        rows = load_rows(args.file)
        if args.command == "list":
            width = max(map(len, rows))
            for row in rows.values():
                print(f"{row.name:<{width}}  {row.kind:<7} {row.about}")
            return 0
        row = _row(rows, args.name)
        if args.command == "show":
            print(f"# {row.name} ({row.kind}): {row.about}\n# results: {paths.dir(row)}, packed into $OUT/{row.name}.tar.gz")
            env = environment(row, paths, {})
            print("# environment: " + " ".join(f"{k}={shlex.quote(env[k])}" for k in sorted(env) if k != "PATH"))
            for step in steps_with_setup(row, rows, paths):
                for write in step.writes:
                    print(f"# writes {write.path}: {write.about} ({len(write.text())} bytes)")
                extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in step.env.items())
                print(f"{extra + ' ' if extra else ''}{shlex.join(step.command())} > {paths.dir(row) / step.log}")
            return 0
        if args.fresh:
            shutil.rmtree(paths.dir(row), ignore_errors=True)
        return run_row(row, rows, paths, Clock(args.time_limit), os.environ)
    except UsageError as exc:
        print(f"experiment: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
