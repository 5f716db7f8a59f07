"""`repro tune PROFILE`: the DDTREE budget that is fastest on this box, per concurrency.

Without ``--results`` it first measures: ``repro bench PROFILE`` (AR, DFLASH, DDTREE at
``--budgets`` and ``--holdout``; or the server at ``--url``) in a child process, with
``$REPRO_DDTREE_RECORD`` set so the DDTREE servers record their acceptance. Then it predicts
throughput for every budget and concurrency from tau(B) of the recording and the measured round
costs (:mod:`repro.tuning.recommend`, :mod:`repro.tuning.costs`), recommends a budget per concurrency, says whether
DDTREE beats DFLASH, checks the predictions on the held-out budgets, prints the server arguments
and appends a ``tune`` record to ``OUTPUT_DIR/tune.jsonl`` for `repro report`. ``--confirm`` also
measures the recommended budgets that were not measured. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from repro.algorithms import DDTREE
from repro.errors import ReproError, UsageError
from repro.evidence.results import ResultsWriter, load_records
from repro.evidence.verdicts import FAIL
from repro.recording import PROMPTS_ENV, RECORD_ENV
from repro.serving.profiles import Profile, load_profiles, models_dir
from repro.serving.sglang_server import server_argv
from repro.tuning.acceptance import read_recordings
from repro.tuning.recommend import analyze, cell_requests, pick_recording, render


def _ints(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = [-1]
    if values and values[0] < 0:
        msg = f"must be a comma list of integers >= 0 (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return values


DEFAULT_PROMPTS = "humaneval"
"""The prompt set tune benches when it measures."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro tune``."""
    parser.add_argument("profile", metavar="PROFILE", help="profile name (repro/data/profiles.toml)")
    parser.add_argument("--results", nargs="+", action="extend", type=Path, default=[], metavar="RESULTS",
                        help="bench JSONL files or directories to read instead of measuring")
    parser.add_argument("--recording", type=Path, default=None,
                        help="acceptance recording (default: the one this run's DDTREE servers write)")
    parser.add_argument("--url", help="measure this running server instead of starting servers")
    parser.add_argument("--budgets", type=_ints, default=[8, 32, 128], help="DDTREE budgets fitted (default 8,32,128)")
    parser.add_argument("--holdout", type=_ints, default=[16, 64],
                        help="DDTREE budgets measured only to check the predictions (default 16,64)")
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16], help="closed-loop clients (default 1,4,16)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the cells (default 0)")
    parser.add_argument("--prompts", default=None,
                        help="humaneval (default), humaneval-distinct (no tokenizer: each prompt ends on its own token) "
                             "or a .jsonl; with --results, the prompt set whose cells to fit")
    parser.add_argument("--num-prompts", type=int, default=32, help="requests per cell (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2, help="warm-up rounds per server (repro bench)")
    parser.add_argument("--confirm", action="store_true", help="also measure the recommended budgets")
    parser.add_argument("--interleave", action="store_true",
                        help="measure in waves of c requests as `repro bench --interleave` does (each wave ends "
                             "with its slowest request): confirm cells comparable with such a grid's")
    parser.add_argument("-o", "--output-dir", type=Path, default=Path("results/tune"))
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--profile-file", type=Path, default=None, help="another profiles.toml")


def _profile(args: argparse.Namespace) -> Profile:
    profiles = load_profiles(args.profile_file)
    if args.profile not in profiles:
        msg = f"PROFILE must be one of {', '.join(profiles)} (got {args.profile!r})"
        raise UsageError(msg)
    return profiles[args.profile]


def _bench(args: argparse.Namespace, out: Path, extra: list[str], recording: Path | None) -> None:
    """Run `repro bench` in a child process, appending to ``out`` (its servers' logs in ``logs`` beside it);
    recording on when ``recording``."""
    argv = [sys.executable, "-m", "repro.cli", "bench", args.profile, "-o", str(out), "--resume",
            "--log-dir", str(out.parent / "logs"),
            "--concurrency", ",".join(map(str, args.concurrency)), "--temperatures", f"{args.temperature:g}",
            "--prompts", args.prompts or DEFAULT_PROMPTS, "--num-prompts", str(args.num_prompts),
            "--max-new-tokens", str(args.max_new_tokens), "--warmup", str(args.warmup), *extra]
    if args.interleave:
        argv.append("--interleave")
    for flag, value in (("--models-dir", args.models_dir), ("--profile-file", args.profile_file)):
        if value is not None:
            argv += [flag, str(value)]
    env = dict(os.environ)
    if recording is not None:
        env[RECORD_ENV], env[PROMPTS_ENV] = str(recording), args.prompts or DEFAULT_PROMPTS
    print(f"tune: {' '.join(argv[2:])}", file=sys.stderr)
    code = subprocess.run(argv, env=env, check=False).returncode
    if code != 0:
        msg = f"repro bench exited {code} (its messages are above; the same tune command resumes it)"
        raise ReproError(msg)


def _prompt_set(records: list[dict[str, Any]], profile: str, prompts: str | None) -> list[dict[str, Any]]:
    """The records less the request cells of ``profile`` on prompt sets other than ``prompts`` (None:
    the results' one set; a UsageError when they hold several, or none on ``prompts``)."""
    def on(r: dict[str, Any]) -> str | None:
        return r["cell"]["prompts"] if r.get("kind") == "request" and r["cell"]["profile"] == profile else None

    sets = sorted({p for r in records if (p := on(r))})
    if prompts is None and len(sets) > 1:
        msg = f"--results hold {profile} cells on {len(sets)} prompt sets ({', '.join(sets)}): choose one with --prompts"
        raise UsageError(msg)
    if prompts is not None and sets and prompts not in sets:
        msg = f"--prompts {prompts}: the results hold no {profile} cell on it (they hold {', '.join(sets)})"
        raise UsageError(msg)
    return [r for r in records if on(r) in (None, prompts or (sets[0] if sets else None))]


def _result(args: argparse.Namespace, results: list[Path], recording_path: Path, holdout: set[int],
            captured: tuple[int, ...]) -> dict[str, Any]:
    records = load_records(results)
    recordings = read_recordings(recording_path, "--recording")
    requests = cell_requests(records, args.profile, args.temperature)  # every set's: the recording may be another's
    records = _prompt_set(records, args.profile, args.prompts)
    recording = pick_recording(recordings, requests)
    if requests is not None and not recording.rounds:  # recorded by another run: all of it describes the drafter
        print(f"tune: {recording_path} holds no round of the results' DDTREE requests at T={args.temperature:g}; "
              f"tau(B) from all its rounds", file=sys.stderr)
        recording = pick_recording(recordings)
    result = analyze(records, recording, profile=args.profile, temperature=args.temperature, holdout=holdout,
                     captured=captured)
    runs = [r for r in records if r.get("kind") == "run"]
    result.update(time=time.time(), results=[str(p) for p in results], recording_file=str(recording_path),
                  fingerprint=runs[-1].get("fingerprint") if runs else None)
    return result


def main(args: argparse.Namespace) -> int:
    """Measure (unless --results), predict, recommend, check; print and record the result."""
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            msg = f"{flag} must be >= 1 (got {value})"
            raise UsageError(msg)
    if not args.budgets or not args.concurrency or min(args.concurrency) < 1:
        msg = f"--budgets and --concurrency must list values (concurrency >= 1) (got {args.budgets}, {args.concurrency})"
        raise UsageError(msg)
    if args.url and args.confirm:
        msg = "--confirm starts servers; it cannot be combined with --url"
        raise UsageError(msg)
    profile = _profile(args)
    missing = [p for p in [*args.results, *([args.recording] if args.recording else [])] if not p.exists()]
    if missing:
        msg = f"{missing[0]} does not exist"
        raise UsageError(msg)
    if args.results and args.recording is None:
        msg = "--results needs --recording (the acceptance recording of the budgets to predict)"
        raise UsageError(msg)
    out_dir = args.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_out = out_dir / f"{args.profile}-bench.jsonl"
    recording = args.recording or out_dir / f"{args.profile}-recording.jsonl"
    results, holdout = list(args.results), set(args.holdout)
    if not results:
        budgets = ",".join(map(str, sorted({*args.budgets, *args.holdout})))
        extra = ["--url", args.url] if args.url else ["--algorithms", "AR,DFLASH,DDTREE", "--budgets", budgets]
        _bench(args, bench_out, extra, None if args.recording else recording)
        results = [bench_out]
    if not recording.exists():
        msg = (f"{recording} was not written: the DDTREE servers did not record (is the installed sglang's "
               f"DDTREE worker wired to ${RECORD_ENV}?)")
        raise ReproError(msg)
    result = _result(args, results, recording, holdout, profile.cuda_graph_bs)
    todo = sorted({row["budget"] for row in result["concurrency"]
                   if row["budget"] is not None and row["measured_tok_s"] is None}) if args.confirm else []
    if todo:  # measured to check the recommendation, so held out of the fit
        _bench(args, bench_out, ["--algorithms", DDTREE, "--budgets", ",".join(map(str, todo))], None)
        result = _result(args, sorted({*results, bench_out}), recording, holdout | set(todo), profile.cuda_graph_bs)
    print(render(result, markdown=False))
    print(_command(result, profile, models_dir(args.models_dir)))
    writer = ResultsWriter(out_dir / "tune.jsonl", resume=True)
    writer.append(result)
    writer.close()
    print(f"tune record: {out_dir / 'tune.jsonl'}")
    return 1 if any(v["status"] == FAIL for v in result["verdicts"]) else 0


def _command(result: dict[str, Any], profile: Profile, root: Path) -> str:
    """The server command of the recommended budget schedule, and its profile key."""
    plan = result.get("schedule")
    if plan is None:
        return "no budget could be recommended (no measured budget range at any concurrency)"
    chosen = profile.with_algorithm(DDTREE, schedule=plan["text"])
    return (f"command: {' '.join(server_argv(chosen, profile.port, root, python='python'))}\n"
            f"profile key: {plan['toml']}")
