"""The commands an experiment row runs: one :class:`Step` list per kind, built from the row's keys.

Paths are relative to the repository root (the results' recorded argv then names no machine path);
each row writes into its own folder under the build folder (``Paths.build``).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from repro.errors import UsageError
from repro.testmodels.configs import read_model
from verify.device.rows import Row
from verify.device.variants import apply_variants, kv_cap

STEP_TIMEOUT = 570.0  # seconds: one step inside one 10-minute device command
BENCH_MARGIN = {False: 150.0, True: 50.0}  # after --time-limit: in-flight requests, servers stopping


@dataclass(frozen=True)
class Paths:
    """Where an experiment reads and writes (``runner.paths`` fills it from the environment)."""

    build: Path
    models: Path
    site: Path
    wheelhouse: Path
    carry: Path
    python: str = sys.executable

    def dir(self, row: Row) -> Path:
        """The row's results folder."""
        return self.build / row.dir


@dataclass(frozen=True)
class Write:
    """A file written just before a step's command: its path, what it is, and its text."""

    path: Path
    about: str
    text: Callable[[], str]


@dataclass(frozen=True)
class Step:
    """One command of a row. ``log`` (relative to the row's folder) takes its output, ``err`` its
    stderr if apart; ``time_limit`` is ``repro bench --time-limit`` (the runner shortens it to fit);
    steps of one ``group`` run at once; a ``rerun`` step runs every time (no GPU, seconds);
    a step that need not pass (``must_pass`` false) is recorded, not judged."""

    name: str
    argv: tuple[str, ...]
    log: str
    timeout: float = STEP_TIMEOUT
    env: dict[str, str] = field(default_factory=dict)
    err: str | None = None
    time_limit: float | None = None
    writes: tuple[Write, ...] = ()
    group: str | None = None
    rerun: bool = False
    must_pass: bool = True

    def command(self, time_limit: float | None = None) -> tuple[str, ...]:
        """The argv, with ``--time-limit`` (``time_limit``, else the step's own) for a bench."""
        limit = self.time_limit if time_limit is None else time_limit
        return self.argv if limit is None else (*self.argv, "--time-limit", f"{limit:g}")


def _csv(values: list) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _repro(paths: Paths, *args: str) -> tuple[str, ...]:
    return (paths.python, "-m", "repro.cli", *args)


def _timeout(row: Row, default: float = STEP_TIMEOUT) -> float:
    return float(row.get("timeout", default))


def _setup(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    return [
        Step("gpu", ("nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                     "--format=csv"), "gpu.txt", 60),
        Step("spread", _repro(paths, "testmodels", "--spread", row.get("target", "k26-tp8")), "router_spread.txt", 120),
    ]


def _doctor(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    site = paths.site.with_name(f"{paths.site.name}-pristine")  # not the experiments' site: a pristine install
    env = {"PYTHONPATH": str(site)}
    smi = "nvidia-smi"
    return [
        Step("query", (smi, "--query-gpu=index,name,compute_cap,driver_version,memory.total,pci.bus_id",
                       "--format=csv,noheader,nounits"), "fixtures/query.csv", 60),
        Step("topo", (smi, "topo", "-m"), "fixtures/topo.txt", 60),
        Step("smi", (smi,), "fixtures/nvidia-smi.txt", 60),
        Step("install", _repro(paths, "install-offline", str(paths.wheelhouse), "--site", str(site)), "install.log", 180),
        Step("install-again", _repro(paths, "install-offline", str(paths.wheelhouse), "--site", str(site)),
             "install-again.log", 120),
        Step("doctor-pristine", _repro(paths, "doctor", "--target", "sm90", "--json"), "doctor-pristine.json", 280,
             env, err="doctor-pristine.err", must_pass=False),
        Step("patch", _repro(paths, "patch", "apply", "--site", str(site)), "patch.log", 60),
        Step("doctor", _repro(paths, "doctor", "--target", "sm90"), "doctor.txt", 280, env),
        Step("doctor-json", _repro(paths, "doctor", "--target", "sm90", "--json"), "doctor.json", 280, env,
             err="doctor.err"),
    ]


def _greedy(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    out = paths.dir(row)
    steps = []
    for select in row.get("select", [""]):
        test_id = row.get("target") + (f"-{select}" if select else "")
        steps.append(Step(f"greedy-{test_id}", (
            paths.python, "-m", "pytest", "verify/sglang/test_fullsize_greedy.py", "-k", test_id, "-q", "-rfEs", "-s",
            "-p", "no:cacheprovider", f"--junitxml={out}/junit-greedy-{test_id}.xml"), f"greedy-{test_id}.log",
            _timeout(row)))
    return steps


def _cost(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    target = row.get("target")
    try:
        fraction = read_model(target, ("budget",))["budget"]["mem-fraction-static"]
    except (OSError, ValueError, KeyError) as exc:
        msg = f"experiment '{row.name}': target {target!r}: {exc}"
        raise UsageError(msg) from None
    return [Step("cost", (
        paths.python, "-m", "verify.bench.verify_cost", str(paths.models / target),
        "--bs", *map(str, row.get("batch-sizes", [1, 4])), "--tree-tokens", "--mem-fraction-static", str(fraction),
        "--out", f"{paths.dir(row)}/verify_cost_{target}.json"), f"cost-{target}.log", _timeout(row))]


def _variants(row: Row, paths: Paths, *, cap: bool) -> tuple[tuple[str, ...], tuple[Write, ...]]:
    """``--profile-file`` and the file it names when the row changes profiles (``cap``: its KV cap too)."""
    variants = dict(row.get("profile-variants", {}))
    if cap and row.get("kv-cap") is not None:
        for name, changes in kv_cap(row.get("profiles"), row.get("kv-cap")).items():
            variants[name] = {**variants.get(name, {}), "sglang": {**variants.get(name, {}).get("sglang", {}),
                                                                   **changes["sglang"]}}
    if not variants:
        return (), ()
    path = paths.dir(row) / "profiles.toml"
    where = f"experiment '{row.name}'"
    return ("--profile-file", str(path)), (Write(path, "the packaged profiles with the row's variants",
                                                 lambda: apply_variants(variants, where)),)


def _busy(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    profiles = row.get("profiles")
    if len(profiles) != 1:
        msg = f"experiment '{row.name}': a busy experiment profiles one profile (got {profiles})"
        raise UsageError(msg)
    flags, writes = _variants(row, paths, cap=False)
    together = row.get("side-by-side", False)
    algorithms = row.get("algorithms", ["AR"])
    groups = [algorithms] if together else [[a] for a in algorithms]
    steps = []
    for labels in groups:
        argv = [paths.python, "-m", "verify.bench.decode_busy", profiles[0], "--algorithm", *labels,
                "--concurrency", *map(str, row.get("concurrency", [1])),
                "--max-new-tokens", str(row.get("max-new-tokens", 2048)), "--models-dir", str(paths.models),
                "--out", str(paths.dir(row)), *flags]
        if row.get("with-stack"):
            argv.append("--with-stack")
        if row.get("settle") is not None:
            argv += ["--settle", f"{row.get('settle'):g}"]
        if together and row.get("kv-cap") is not None:
            argv += ["--max-total-tokens", str(row.get("kv-cap"))]
        name = "busy-" + "-".join(labels)
        steps.append(Step(name, tuple(argv), f"{name}.log", _timeout(row), writes=writes))
    return steps


def _served_round_prompts(count: int) -> str:
    from verify.bench.served_round import prompts

    return "".join(json.dumps({"input_ids": p}) + "\n" for p in prompts(count, 0))


def _bench(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    out = paths.dir(row)
    side = row.get("side-by-side", False)
    flags, writes = _variants(row, paths, cap=side)
    prompts = row.get("prompts", "humaneval")
    if prompts == "served-round":  # planted token ids (verify.bench.served_round's)
        count = row.get("num-prompts", 8)
        prompts = str(out / "prompts.jsonl")
        writes = (*writes, Write(out / "prompts.jsonl", f"{count} planted prompts of token ids",
                                 lambda: _served_round_prompts(count)))
    argv = [*_repro(paths, "bench"), *row.get("profiles")]
    lists = {"algorithms": "--algorithms", "budgets": "--budgets", "concurrency": "--concurrency",
             "request-rates": "--request-rate", "temperatures": "--temperatures"}
    for key, flag in lists.items():
        if row.get(key) is not None:
            argv += [flag, _csv(row.get(key))]
    if row.get("schedules"):
        argv += ["--schedules", *row.get("schedules")]
    argv += ["--prompts", prompts]
    for key in ("num-prompts", "max-new-tokens", "warmup", "start-timeout"):
        if row.get(key) is not None:
            argv += [f"--{key}", f"{row.get(key):g}"]
    if side:
        argv.append("--interleave")
    argv += ["--models-dir", str(paths.models), "--log-dir", str(out / "logs"), "--resume",
             "-o", str(out / "results.jsonl"), *flags]
    env = {"REPRO_DDTREE_RECORD": str(out / "recording.jsonl"),
           "REPRO_DDTREE_RECORD_PROMPTS": prompts} if row.get("record") else {}
    timeout = _timeout(row)
    limit = float(row.get("time-limit", timeout - BENCH_MARGIN[side]))
    return [Step("bench", tuple(argv), "bench.log", timeout, env, time_limit=limit, writes=writes)]


def _tune(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    source = paths.dir(rows[row.get("results-from")])
    argv = [*_repro(paths, "tune", row.get("profiles")[0]), "--results", str(source / "results.jsonl"),
            "--recording", str(source / "recording.jsonl"), "--budgets", _csv(row.get("fit", [16, 128, 512])),
            "--holdout", _csv(row.get("holdout", [32, 64, 256])), "--models-dir", str(paths.models),
            "-o", str(paths.dir(row) / "tune")]
    bench = rows[row.get("results-from")]
    prompts = row.get("prompts") or (bench.get("prompts") if row.get("confirm") else None)
    if prompts:
        argv += ["--prompts", prompts]
    if row.get("confirm"):  # the picks the source lacks, served as it served its budgets (side by side: in waves)
        argv += ["--confirm", "--concurrency", _csv(bench.get("concurrency", [1, 4, 16]))]
        argv += [arg for key in ("num-prompts", "max-new-tokens", "warmup") if bench.get(key) is not None
                 for arg in (f"--{key}", str(bench.get(key)))]
        side = bool(bench.get("side-by-side"))
        argv += [*_variants(bench, paths, cap=side)[0], *(["--interleave"] if side else [])]
    return [Step("tune", tuple(argv), "tune.log", _timeout(row, 480 if row.get("confirm") else 300), rerun=True)]


def _report(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    results, costs = [], []
    for name in row.get("inputs"):
        source = rows[name]
        where = paths.dir(source)
        if source.kind == "bench":
            results.append(str(where / "results.jsonl"))
        elif source.kind == "tune":
            results.append(str(where / "tune" / "tune.jsonl"))
        else:
            costs.append(str(where / f"verify_cost_{source.get('target')}.json"))
    argv = [*_repro(paths, "report"), *results, *(["--verify-cost", *costs] if costs else []),
            "-o", str(paths.dir(row) / "report")]
    return [Step("report", tuple(argv), "report.log", _timeout(row, 300), rerun=True)]


def _pytest(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    out = paths.dir(row)
    args = row.get("args", [])
    if not row.get("parallel"):
        return [Step("pytest", (paths.python, "-m", "pytest", *row.get("tests"), "-p", "no:cacheprovider", *args,
                                f"--junitxml={out}/junit.xml"), "pytest.log", _timeout(row))]
    steps = []
    for test in row.get("tests"):
        stem = Path(test).stem
        steps.append(Step(stem, (paths.python, "-m", "pytest", test, "-p", "no:cacheprovider", *args,
                                 f"--junitxml={out}/junit-{stem}.xml"), f"{stem}.log", _timeout(row),
                          {"REPRO_E2E_OUT": str(out / stem)}, group="tests"))
    return steps


def _args(row: Row, paths: Paths) -> list[str]:
    return [a.format(dir=paths.dir(row), models=paths.models) for a in row.get("args", [])]


def _module(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    module = row.get("module")
    name = module.rsplit(".", 1)[-1]
    return [Step(name, (paths.python, "-m", module, *_args(row, paths)), f"{name}.log", _timeout(row))]


def _ncu_path() -> str:
    found = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"))), None)
    return str(found or "ncu")


def _ncu(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    ncu, out = _ncu_path(), paths.dir(row)
    report = str(out / "profile.ncu-rep")
    sass, source = str(out / "source_sass.csv"), str(out / "source_py.csv")
    return [
        Step("profile", (ncu, "--clock-control", "none", "--set", "full", "--import-source", "yes",
                         "-k", f"regex:{row.get('kernels')}", "-f", "-o", str(out / "profile"),
                         paths.python, "-m", row.get("module")), "profile.log", _timeout(row, 450)),
        Step("details", (ncu, "--import", report, "--page", "details"), "ncu.txt", 120),
        Step("sass", (ncu, "--import", report, "--page", "source", "--csv", "--print-source", "sass"),
             "source_sass.csv", 120),
        Step("source", (ncu, "--import", report, "--page", "source", "--csv", "--print-source", "cuda"),
             "source_py.csv", 120),
        Step("xz", ("xz", "-T0", "-6", "-f", sass, source), "logs/xz.log", 120),
    ]


BUILDERS: dict[str, Callable[[Row, Paths, dict[str, Row]], list[Step]]] = {
    "setup": _setup, "doctor": _doctor, "greedy": _greedy, "cost": _cost, "busy": _busy, "bench": _bench,
    "tune": _tune, "report": _report, "pytest": _pytest, "module": _module, "ncu": _ncu,
}


def build_steps(row: Row, paths: Paths, rows: dict[str, Row]) -> list[Step]:
    """The steps of ``row``, in order (``rows``: every row, for the ones it reads)."""
    return BUILDERS[row.kind](row, paths, rows)
