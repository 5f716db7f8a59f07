"""`repro bench PROFILE...`: AR vs DFLASH vs DDTREE(budgets) x load x temperature on SGLang.

For each profile and algorithm (and each DDTREE budget) one server is started from the profile,
warmed up, and driven (``repro.evidence.load``) by closed-loop clients at every ``--concurrency``
and by Poisson arrivals at every ``--request-rate``, at every temperature; each request, finished
or failed, is appended to the results JSONL and fsynced. ``--resume`` skips what the file already
holds, so a crash, a dead server or ``--time-limit`` costs nothing but a rerun; it refuses a file
whose cells were measured with another server command, models, prompts (``repro.evidence.runconfig``)
or arrival seed.
``--url`` measures a server that is already running instead (its algorithm is read from
``/server_info``). ``--api openai`` sends the same requests through the OpenAI-compatible
``/v1/completions`` (:mod:`repro.serving.openai_client`), its cells recorded apart (``Cell.api``);
against a ``--url`` server without SGLang's ``/server_info`` the profile's algorithm labels them.
``--flush-cache`` empties the server's prefix cache before each cell, as ``bench_serving
--flush-cache`` does, so cells over the same prompts all start cold.
``--interleave`` starts every server at once and measures them in turns, one
wave of ``c`` requests each per turn, the first of a turn rotating: a shared host's slow swings
then fall on every algorithm alike, so same-run ratios hold (each cell's throughput counts only
its own turns' wall time; an open-loop cell is one turn). Every input is checked before the
results file is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from repro.algorithms import ALGORITHMS, DDTREE, budgeted
from repro.argtypes import NONNEGATIVE_INT, PORT, POSITIVE_INT, SECONDS, comma_list, number
from repro.errors import ReproError, UsageError
from repro.evidence import runconfig
from repro.evidence.compare import RATIO_HEADERS, latency_ratios, ratio_rows
from repro.evidence.latency import LATENCY_HEADERS, SPREAD_NOTE, latency_rows
from repro.evidence.load import Job, Runner, check_arrivals, progress_bar, warm_up
from repro.evidence.prompts import PromptSet, load_prompts, request_input, vocab_size
from repro.evidence.records import APIS
from repro.evidence.results import (
    HEADERS,
    Cell,
    ResultsWriter,
    existing_records,
    finished,
    format_table,
    read_records,
    summarize,
    table_rows,
)
from repro.schedule import BudgetSchedule
from repro.serving.openai_client import OpenAIClient
from repro.serving.profiles import Profile, load_profiles, model_path, models_dir
from repro.serving.sglang_client import Client, parse_url
from repro.serving.sglang_server import SGLangServer, check_models, free_port, sigterm_as_interrupt

INCOMPLETE = 3  # exit code: stopped at --time-limit; rerun with --resume
SHARED_MEMORY = 0.9  # --interleave: most of the GPU memory the servers' mem-fraction-static may claim together


def _url(text: str) -> str:
    try:
        parse_url(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _algorithms(text: str) -> list[str]:
    names = [v.strip().upper() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in ALGORITHMS]
    if bad or not names:
        msg = f"must be a comma list of {', '.join(ALGORITHMS)}"
        raise argparse.ArgumentTypeError(msg)
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro bench``."""
    parser.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile names")
    parser.add_argument("--algorithms", type=_algorithms, default=list(ALGORITHMS),
                        help="comma list (default AR,DFLASH,DDTREE)")
    parser.add_argument("--budgets", type=comma_list(NONNEGATIVE_INT, "integers >= 0"), default=[],
                        help="DDTREE budgets, comma list (default: the profile's budget or schedule)")
    parser.add_argument("--schedules", type=_schedule, nargs="+", action="extend", default=[], metavar="SCHEDULE",
                        help="DDTREE budget schedules, each a server of its own (e.g. 1:63,4:31,16:15)")
    parser.add_argument("--concurrency", type=comma_list(POSITIVE_INT, "integers >= 1"), default=None,
                        help="closed-loop clients, comma list (default 1,4,16; none with --request-rate)")
    parser.add_argument("--request-rate", type=comma_list(number(above=0), "finite numbers > 0"), default=[],
                        metavar="R", help="open loop: Poisson arrivals per second, comma list (a cell each)")
    parser.add_argument("--max-concurrency", type=POSITIVE_INT, default=None,
                        help="open loop: most requests in flight, later arrivals waiting (default --num-prompts)")
    parser.add_argument("--seed", type=NONNEGATIVE_INT, default=1, help="of the open-loop arrivals (default 1)")
    parser.add_argument("--temperatures", type=comma_list(number(at_least=0), "finite numbers >= 0"),
                        default=[0.0], help="sampling temperatures, comma list (default 0)")
    parser.add_argument("--prompts", default="humaneval",
                        help="humaneval, humaneval-distinct (no tokenizer: each prompt ends on its own token) or a .jsonl")
    parser.add_argument("--num-prompts", type=POSITIVE_INT, default=32,
                        help="requests per cell (default 32)")
    parser.add_argument("--max-new-tokens", type=POSITIVE_INT, default=256)
    parser.add_argument("--max-prompt-tokens", type=POSITIVE_INT, default=1024,
                        help="cut token-id prompts to their last N ids (default 1024)")
    parser.add_argument("--warmup", type=NONNEGATIVE_INT, default=2,
                        help="unrecorded warm-up rounds per server, each at every --concurrency "
                             "(and --max-concurrency)")
    parser.add_argument("-o", "--output", type=Path, default=Path("results/bench.jsonl"))
    parser.add_argument("--resume", action="store_true", help="continue the --output file")
    parser.add_argument("--time-limit", type=SECONDS, default=None, metavar="S",
                        help=f"stop starting work after S seconds (exit {INCOMPLETE}; then --resume)")
    parser.add_argument("--url", type=_url, help="bench this running server (one PROFILE) instead")
    parser.add_argument("--api", choices=APIS, default="native",
                        help="native: SGLang's /generate (default); openai: /v1/completions, streamed")
    parser.add_argument("--flush-cache", action="store_true",
                        help="empty the server's prefix cache (POST /flush_cache) before each cell")
    parser.add_argument("--interleave", action="store_true",
                        help="start every server at once and measure them in turns of one wave "
                             "(c requests) each, so a noisy host's swings fall on all alike; each "
                             "profile needs max-total-tokens, or mem-fraction-static summing to at "
                             f"most {SHARED_MEMORY}")
    parser.add_argument("--port", type=PORT, default=None, help="server port (default: a free one)")
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=Path("results/logs"))
    parser.add_argument("--start-timeout", type=SECONDS, default=None, metavar="S")
    parser.add_argument("--request-timeout", type=SECONDS, default=600.0, metavar="S")
    parser.add_argument("--profile-file", type=Path, default=None, help="another profiles.toml")


def _check(args: argparse.Namespace) -> None:
    """What the flag types cannot check alone (each flag's own range is its type's); the defaults
    that follow from other flags."""
    if args.concurrency is None:
        args.concurrency = [] if args.request_rate else [1, 4, 16]
    for flag, values in (("--concurrency", args.concurrency), ("--max-concurrency", [args.max_concurrency or 0])):
        if max(values, default=0) > args.num_prompts:
            msg = f"--num-prompts must be >= the largest {flag} ({max(values)}) (got {args.num_prompts})"
            raise UsageError(msg)
    if args.max_concurrency is not None and not args.request_rate:
        msg = "--max-concurrency caps open-loop cells: it needs --request-rate"
        raise UsageError(msg)
    args.max_concurrency = args.max_concurrency or args.num_prompts
    if args.url and len(args.profiles) != 1:
        msg = f"--url takes exactly one PROFILE (got {len(args.profiles)})"
        raise UsageError(msg)
    if args.url and args.interleave:
        msg = "--interleave starts the servers it measures; it cannot take --url"
        raise UsageError(msg)
    if args.log_dir.exists() and not args.log_dir.is_dir():
        msg = f"--log-dir: {args.log_dir} is not a directory"
        raise UsageError(msg)


def _schedule(text: str) -> str:
    try:
        return BudgetSchedule.parse(text).text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _variants(profile: Profile, algorithms: list[str], budgets: list[int], schedules: list[str]) -> list[Profile]:
    """The profile once per algorithm, and once per budget and schedule for DDTREE (neither given:
    the profile's own)."""
    out = []
    for algorithm in algorithms:
        if not budgeted(algorithm):
            out.append(profile.with_algorithm(algorithm))
            continue
        if not budgets and not schedules and profile.budget is None and not profile.budget_schedule:
            msg = f"--budgets or --schedules is needed: profile {profile.name!r} sets no budget"
            raise UsageError(msg)
        if not budgets and not schedules:
            out.append(profile.with_algorithm(DDTREE))
        out += [profile.with_algorithm(DDTREE, b) for b in budgets]
        out += [profile.with_algorithm(DDTREE, schedule=s) for s in schedules]
    return out


def request_inputs(prompt_set: PromptSet, profile: Profile, root: Path, max_tokens: int) -> list[dict[str, Any]]:
    """The input part of every request body, as this profile's server takes it."""
    needs_vocab = profile.tokenizer == "none" and any(p.ids is None for p in prompt_set.prompts)
    vocab = vocab_size(model_path(profile.model, root)) if needs_vocab else None
    return [request_input(p, tokenizer=profile.tokenizer, vocab_size=vocab, max_tokens=max_tokens)
            for p in prompt_set.prompts]


def api_client(args: argparse.Namespace, url: str) -> Client:
    """The client that measures the server at ``url`` through ``--api``."""
    return (OpenAIClient if args.api == "openai" else Client)(url, timeout=args.request_timeout)


def _cells(profile: Profile, prompt_set: PromptSet, args: argparse.Namespace) -> list[Cell]:
    """Closed-loop cells at every concurrency, then open-loop ones at every request rate, per temperature."""
    return [Cell(profile.name, profile.algorithm, profile.budget, c, t, prompt_set.name, args.max_new_tokens,
                 schedule=profile.budget_schedule, request_rate=rate, api=None if args.api == "native" else args.api)
            for t in args.temperatures
            for c, rate in [(c, None) for c in args.concurrency] + [(args.max_concurrency, r) for r in args.request_rate]]


def _widths(args: argparse.Namespace) -> list[int]:
    """Every cap on requests in flight the cells have: each concurrency, and the open-loop cap."""
    return args.concurrency + ([args.max_concurrency] if args.request_rate else [])


def _jobs(profiles: list[Profile], root: Path, prompt_set: PromptSet,
          args: argparse.Namespace) -> list[Job]:
    """A job per server to start, each checked (models present) before anything runs."""
    jobs = []
    for variant in (v for p in profiles for v in _variants(p, args.algorithms, args.budgets, args.schedules)):
        check_models(variant, root)
        inputs = request_inputs(prompt_set, variant, root, args.max_prompt_tokens)
        jobs.append(Job(variant, _cells(variant, prompt_set, args), inputs,
                        runconfig.managed(variant, root, inputs)))
    return jobs


def lockstep_note(jobs: list[Job], args: argparse.Namespace) -> str | None:
    """A warning when a server without a tokenizer (a planted target, whose greedy continuation
    follows the last token alone) gets prompts that all end on one token at c > 1: its requests
    would decode one sequence in lockstep, and an MoE target's batch read one token's experts."""
    if max(_widths(args)) < 2:
        return None
    for job in jobs:
        ends = {tuple(body.get("input_ids") or [None])[-1] for body in job.inputs[:args.num_prompts]}
        if job.profile.tokenizer == "none" and min(len(job.inputs), args.num_prompts) > 1 and len(ends) == 1:
            return (f"bench: note: every prompt of {args.prompts} ends on token {ends.pop()}, and {job.profile.name} "
                    f"has no tokenizer: a planted target's requests decode one sequence in lockstep at c > 1 "
                    f"(--prompts humaneval-distinct ends each on its own)")
    return None


def _check_shared_memory(jobs: list[Job]) -> None:
    """A UsageError unless the servers ``--interleave`` runs at once leave each other room: every
    profile caps its KV cache (``max-total-tokens``), or every profile sets mem-fraction-static and
    they sum to at most ``SHARED_MEMORY``. SGLang takes the fraction of the memory free when the
    server starts, so fractions compose only while the weights are small next to the GPU: servers
    with large targets need the cap (each leaves the others what its own weights and cap take)."""
    if all("max-total-tokens" in job.profile.sglang for job in jobs):
        return
    fractions = []
    for job in jobs:
        fraction = job.profile.sglang.get("mem-fraction-static")
        if not isinstance(fraction, int | float) or isinstance(fraction, bool):
            msg = (f"--interleave runs {len(jobs)} servers on the same GPUs at once: profile "
                   f"{job.profile.name!r} needs a max-total-tokens or a mem-fraction-static "
                   f"(their sum at most {SHARED_MEMORY})")
            raise UsageError(msg)
        fractions.append(float(fraction))
    if sum(fractions) > SHARED_MEMORY + 1e-9:
        msg = (f"--interleave runs {len(jobs)} servers on the same GPUs at once: their mem-fraction-static "
               f"sum to {sum(fractions):.2f} (at most {SHARED_MEMORY}); lower it, cap each KV cache with "
               f"max-total-tokens in the profile, or bench fewer")
        raise UsageError(msg)


def _url_job(client: Client, profile: Profile, root: Path, prompt_set: PromptSet,
             args: argparse.Namespace) -> Job:
    """The job of a running server, labelled with what its ``/server_info`` says it serves (an
    OpenAI-compatible server without one: with the profile's algorithm, saying so)."""
    try:
        info = client.server_info()
    except ReproError as exc:
        if args.api == "native":
            raise
        print(f"bench: note: {exc}; the cells are labelled {profile.label} from profile {profile.name}, "
              f"not read from the server", file=sys.stderr)
        info = {}
    else:
        profile = runconfig.from_server_info(profile, info)
    inputs = request_inputs(prompt_set, profile, root, args.max_prompt_tokens)
    return Job(profile, _cells(profile, prompt_set, args), inputs,
               runconfig.running(info, inputs), info)


def main(args: argparse.Namespace) -> int:
    """Run every missing cell of every profile; print the summary table."""
    _check(args)
    known = load_profiles(args.profile_file)
    missing = [name for name in args.profiles if name not in known]
    if missing:
        msg = f"PROFILE must be one of {', '.join(known)} (got {missing[0]!r})"
        raise UsageError(msg)
    profiles = [known[name] for name in args.profiles]
    root = models_dir(args.models_dir)
    prompt_set = load_prompts(args.prompts)
    records = existing_records(args.output, resume=args.resume)
    client = api_client(args, args.url) if args.url else None
    jobs = [_url_job(client, profiles[0], root, prompt_set, args)] if client else \
        _jobs(profiles, root, prompt_set, args)
    runconfig.check_resumable(records, {c.key: (c, job.config) for job in jobs for c in job.cells},
                              args.output)
    check_arrivals(records, {c.key: c for job in jobs for c in job.cells}, args.seed, args.output)
    if note := lockstep_note(jobs, args):
        print(note, file=sys.stderr)
    if args.interleave:
        _check_shared_memory(jobs)
    done = finished(records)
    work = [(c.key, i) for job in jobs for c in job.cells for i in range(args.num_prompts)]
    session = uuid.uuid4().hex
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    writer = ResultsWriter(args.output, resume=args.resume)
    runner = Runner(writer, session, progress_bar(len(work), sum(1 for w in work if w in done)),
                    deadline, args.seed, flush=args.flush_cache)
    try:
        with sigterm_as_interrupt():
            writer.append(runconfig.run_record(session, profiles))
            todos = [(job, {c: [i for i in range(args.num_prompts) if (c.key, i) not in done]
                            for c in job.cells}) for job in jobs]
            work_left = [(job, todo) for job, todo in todos if any(todo.values())]
            if args.interleave:
                if work_left:
                    _bench_interleaved(runner, work_left, root, args)
            else:
                _bench_in_turn(runner, client, work_left, root, args)
    finally:
        runner.progress.close()
        writer.close()
    _print_tables(summarize(read_records(args.output)))
    print(f"results: {args.output}")
    if runner.stopped:
        print(f"repro bench: stopped at --time-limit {args.time_limit:g} s; rerun the same command "
              f"with --resume to finish", file=sys.stderr)
        return INCOMPLETE
    return 0


def _print_tables(summaries: list[Any]) -> None:
    """The summary table, the latency table, and the open-loop latency ratios where there are any."""
    print(format_table(HEADERS, table_rows(summaries), markdown=False))
    print(f"\n{SPREAD_NOTE}")
    print(format_table(LATENCY_HEADERS, latency_rows(summaries), markdown=False))
    if ratios := latency_ratios(summaries):
        print("\nopen loop: latency over the baseline at the same rate, with its 95% interval")
        print(format_table(RATIO_HEADERS, ratio_rows(ratios), markdown=False))


def _server(runner: Runner, job: Job, root: Path, args: argparse.Namespace, port: int) -> SGLangServer:
    """The (not yet started) server of ``job``, logging under ``--log-dir``."""
    profile = job.profile
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", profile.label.replace("=", ""))  # "DDTREE-S1-63-16-15"
    log = args.log_dir / f"{profile.name}-{slug}-{runner.session[:8]}.log"
    server = SGLangServer(profile, port=port, models_root=root, log_path=log)
    server.client.timeout = args.request_timeout
    print(f"bench: starting {profile.name} ({profile.label}), log {log}", file=sys.stderr)
    return server


def _ready(runner: Runner, job: Job, server: SGLangServer, args: argparse.Namespace) -> None:
    """Wait for the started ``server`` to be healthy, record it, warm it up."""
    took = server.wait_healthy(args.start_timeout or job.profile.start_timeout)
    runner.slowest_start = max(runner.slowest_start, took)
    runner.writer.append({"kind": "server", "session": runner.session, "profile": job.profile.name,
                          "label": job.profile.label, "start_s": took, "config": job.config,
                          "server_info": server.client.server_info()})
    try:
        warm_up(api_client(args, server.url), job, args.warmup, _widths(args), args.num_prompts)
    except ReproError as exc:
        msg = f"failed its warm-up request: {exc}"
        raise server.failure(msg) from None


def _bench_in_turn(runner: Runner, client: Client | None, work: list[tuple[Job, dict[Cell, list[int]]]],
                   root: Path, args: argparse.Namespace) -> None:
    """One server after the other (or the ``--url`` server), each through all its cells."""
    for job, todo in work:
        if runner.out_of_time(margin=1.5 * runner.slowest_start):  # room for a start
            runner.stopped = True
        if runner.stopped:
            return
        if client:
            _bench_url(runner, client, job, args, todo)
        else:
            _bench_server(runner, job, root, args, todo)


def _bench_server(runner: Runner, job: Job, root: Path, args: argparse.Namespace,
                  todo: dict[Cell, list[int]]) -> None:
    with _server(runner, job, root, args, args.port or free_port()) as server:
        _ready(runner, job, server, args)
        for cell, indices in todo.items():
            if indices and not runner.stopped:
                runner.run_cell(api_client(args, server.url), job, cell, indices, server)


def _ports(count: int, first: int | None) -> list[int]:
    """``count`` distinct ports: from ``first`` on, or free ones."""
    if first is not None:
        return [first + i for i in range(count)]
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _bench_interleaved(runner: Runner, work: list[tuple[Job, dict[Cell, list[int]]]], root: Path,
                       args: argparse.Namespace) -> None:
    """Every job's server at once; then cell by cell (the jobs' cells share an order), turns of one
    wave (``c`` requests; an open-loop cell whole) per server, the first server of a turn rotating."""
    if runner.out_of_time():
        runner.stopped = True
        return
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(_server(runner, job, root, args, port))
                   for (job, _), port in zip(work, _ports(len(work), args.port), strict=True)]
        for (job, _), server in zip(work, servers, strict=True):
            _ready(runner, job, server, args)
        for position in range(len(work[0][0].cells)):
            lanes = []
            for (job, todo), server in zip(work, servers, strict=True):
                cell, indices = list(todo.items())[position]
                size = len(indices) if cell.request_rate is not None else cell.concurrency
                waves = [indices[i : i + size] for i in range(0, len(indices), max(size, 1))]
                lanes.append((job, server, cell, waves))
            for turn in range(max(len(lane[3]) for lane in lanes)):
                for job, server, cell, waves in lanes[turn % len(lanes):] + lanes[: turn % len(lanes)]:
                    if turn < len(waves) and not runner.stopped:
                        runner.run_cell(api_client(args, server.url), job, cell, waves[turn], server, turn=turn)


def _bench_url(runner: Runner, client: Client, job: Job, args: argparse.Namespace,
               todo: dict[Cell, list[int]]) -> None:
    runner.writer.append({"kind": "server", "session": runner.session, "profile": job.profile.name,
                          "label": job.profile.label, "start_s": None, "config": job.config,
                          "server_info": job.info})
    warm_up(client, job, args.warmup, _widths(args), args.num_prompts)
    for cell, indices in todo.items():
        if indices and not runner.stopped:
            runner.run_cell(client, job, cell, indices, None)
