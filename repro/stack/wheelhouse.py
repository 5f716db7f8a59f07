"""``repro wheelhouse --target smXX DIR``: an offline install set for an air-gapped GPU host.

Downloads (with pip, into a cache) cp312 manylinux wheels at the versions ``uv.lock`` pins and
checks each wheel's sha256 against ``uv.lock``. By default DIR gets the unmodified wheels of the
project's dependencies and its ``gpu`` extra (every package ``uv export --extra gpu`` lists, for
CPython 3.12 on Linux x86_64) and ``requirements.txt`` pinning each with its sha256, installed with
no network by ``pip install --no-index --find-links DIR --require-hashes -r DIR/requirements.txt``.

``--trim`` is the size option (one device carry is 64 MiB): the wheels of ``[wheelhouse] serve`` in
``stack.toml`` only (what a host that has torch and triton lacks), each unpacked as a site tree
trimmed to the target (only the ``sgl_kernel`` libraries it loads, minus ``[wheelhouse] trim``
members) and packed as a reproducible ``.tar.xz``, plus one archive of the stub packages in
``repro/data/stubs``; ``repro install-offline DIR`` installs it.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from repro.argtypes import number
from repro.errors import ReproError, UsageError
from repro.files import atomic_output, write_atomic
from repro.stack import offline
from repro.stack.lockfile import UV_LOCK, LockedPackage, LockedWheel, load_lock, normalize
from repro.stack.pins import Stack, Target, load_stack

STUBS_DIR = Path(__file__).parents[1] / "data" / "stubs"
REQUIREMENTS = "requirements.txt"
EXTRA = "gpu"  # the pyproject.toml extra a full wheelhouse installs
STUBS_ARCHIVE = "serve-stubs.tar.xz"
MIB = 1 << 20


def _default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "repro" / "wheels"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro wheelhouse``."""
    parser.add_argument("directory", type=Path, help="output directory (created, or updated in place)")
    parser.add_argument("--target", required=True, help="SM target of stack.toml (sm90, sm100, sm120)")
    parser.add_argument("--trim", action="store_true",
                        help="the size option: archives of [wheelhouse] serve with only the sgl_kernel libraries the "
                             "target loads and without [wheelhouse] trim members, for `repro install-offline`")
    parser.add_argument("--cache", type=Path, default=_default_cache(),
                        help="download cache for wheels (default: %(default)s)")
    parser.add_argument("--lock", type=Path, default=UV_LOCK, help="uv.lock with the sha256 of every wheel")
    parser.add_argument("--max-mib", type=number(above=0),
                        help="fail when the archives exceed this many MiB (64 = one device carry)")


def drop_rule(stack: Stack, target: Target) -> Callable[[str], bool]:
    """Which site-tree paths ``--trim`` leaves out: other sgl_kernel libraries and trim patterns."""
    kernel_dirs = {lib.split("/", 1)[0] + "/" for lib in target.sgl_kernel_libs}

    def drop(path: str) -> bool:
        if any(fnmatch.fnmatch(path, pattern) for pattern in stack.wheelhouse.trim):
            return True
        is_library = path.endswith(".so") or ".so." in path.rsplit("/", 1)[-1]
        return is_library and path.startswith(tuple(kernel_dirs)) and path not in target.sgl_kernel_libs

    return drop


def _candidates(package: LockedPackage, stack: Stack) -> list[LockedWheel]:
    """The lock's wheels of a package that fit the host, best first."""
    ranked = []
    for wheel in package.wheels:
        rank = offline.wheel_rank(wheel.filename, stack.python, stack.wheelhouse.manylinux)
        if rank is not None:
            ranked.append((rank, wheel.filename, wheel))
    if not ranked:
        msg = (
            f"uv.lock lists no cp{stack.python.replace('.', '')} manylinux_{stack.wheelhouse.manylinux} "
            f"x86_64 wheel of {package.name} {package.version}"
        )
        raise ReproError(msg)
    return [wheel for _, _, wheel in sorted(ranked)]


def _cached(package: LockedPackage, stack: Stack, cache: Path) -> LockedWheel | None:
    return next((w for w in _candidates(package, stack) if (cache / w.filename).is_file()), None)


def _download(packages: list[LockedPackage], stack: Stack, cache: Path) -> None:
    """``pip download`` the exact locked files (pip checks the hashes too)."""
    cache.mkdir(parents=True, exist_ok=True)
    platforms = [t for t in offline.platform_tags(stack.wheelhouse.manylinux) if t != "any"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        for package in packages:
            hashes = " ".join(f"--hash=sha256:{w.sha256}" for w in _candidates(package, stack))
            requirements.write(f"{package.name}=={package.version} {hashes}\n")
        requirements.flush()
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--require-hashes", "--python-version", stack.python, "--implementation", "cp",
            *(arg for tag in platforms for arg in ("--platform", tag)),
            "--dest", str(cache), "--requirement", requirements.name,
        ]
        if subprocess.run(command, check=False).returncode != 0:
            msg = "pip download failed (its output is above)"
            raise ReproError(msg)


def _verified_wheel(package: LockedPackage, stack: Stack, cache: Path) -> tuple[Path, str]:
    wheel = _cached(package, stack, cache)
    if wheel is None:
        msg = f"no wheel of {package.name} {package.version} in {cache} after downloading"
        raise ReproError(msg)
    path = cache / wheel.filename
    digest = offline.sha256_file(path)
    if digest != wheel.sha256:
        msg = f"{path} has sha256 {digest}, uv.lock says {wheel.sha256}: delete it and run again"
        raise ReproError(msg)
    return path, digest


def _pack_wheel(package: LockedPackage, wheel: Path, digest: str, out_dir: Path,
                drop: Callable[[str], bool]) -> offline.Archive:
    name = f"{normalize(package.name)}-{package.version}.tar.xz"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files, dropped = offline.unpack_wheel(wheel, Path(tmp), drop)
        except ValueError as exc:
            raise ReproError(str(exc)) from None
        offline.write_archive(Path(tmp), files, out_dir / name)
    out = out_dir / name
    return offline.Archive(
        archive=name, sha256=offline.sha256_file(out), bytes=out.stat().st_size,
        distribution=package.name, version=package.version, wheel=wheel.name,
        wheel_sha256=digest, dropped=dropped, files=files,
    )


def _pack_stubs(stack: Stack, out_dir: Path) -> offline.Archive:
    with tempfile.TemporaryDirectory() as tmp:
        files: dict[str, str] = {}
        for stub in stack.wheelhouse.stubs:
            if not (STUBS_DIR / stub).is_dir():
                msg = f"stack.toml [wheelhouse] stubs lists {stub!r} but {STUBS_DIR / stub} is missing"
                raise ReproError(msg)
            files |= {f"{stub}/{k}": v for k, v in offline.copy_tree(STUBS_DIR / stub, Path(tmp) / stub).items()}
        offline.write_archive(Path(tmp), files, out_dir / STUBS_ARCHIVE)
    out = out_dir / STUBS_ARCHIVE
    return offline.Archive(
        archive=STUBS_ARCHIVE, sha256=offline.sha256_file(out), bytes=out.stat().st_size,
        distribution=None, version=None, wheel=None, wheel_sha256=None,
        stubs=list(stack.wheelhouse.stubs), files=files,
    )


def _reusable(previous: offline.Manifest | None, manifest_key: tuple, out_dir: Path) -> dict[str, offline.Archive]:
    """Archives of the previous build with the same target, trim and stack file, still intact."""
    if previous is None or (previous.target, previous.trim, previous.stack_sha256) != manifest_key:
        return {}
    return {
        a.wheel_sha256: a for a in previous.archives
        if a.wheel_sha256 and (out_dir / a.archive).is_file()
        and offline.sha256_file(out_dir / a.archive) == a.sha256
    }


def install_command(directory: Path) -> list[str]:
    """The command that installs a full wheelhouse with no network, every wheel hash-checked."""
    return ["python3", "-m", "pip", "install", "--no-index", "--find-links", str(directory), "--require-hashes",
            "-r", str(directory / REQUIREMENTS)]


def _write_wheels(wheels: list[tuple[LockedPackage, Path, str]], out_dir: Path, target: Target) -> int:
    """Copy the wheels into ``out_dir`` (dropping other wheels there) and write requirements.txt;
    the bytes written."""
    keep = {path.name for _, path, _ in wheels}
    for stale in out_dir.glob("*.whl"):
        if stale.name not in keep:
            stale.unlink()
    for _, path, digest in wheels:
        if not (out_dir / path.name).is_file() or offline.sha256_file(out_dir / path.name) != digest:
            with atomic_output(out_dir / path.name) as tmp:
                shutil.copyfile(path, tmp)
    lines = [f"# repro wheelhouse --target {target.name}: the {EXTRA} extra of uv.lock, unmodified wheels.",
             "# No network: " + shlex.join(install_command(Path("DIR"))),
             *(f"{p.name}=={p.version} --hash=sha256:{digest}" for p, _, digest in wheels)]
    write_atomic(out_dir / REQUIREMENTS, "\n".join(lines) + "\n")
    return sum((out_dir / name).stat().st_size for name in [*keep, REQUIREMENTS])


def _fetch(packages: list[LockedPackage], stack: Stack, cache: Path) -> list[tuple[Path, str]]:
    """Each package's wheel in the cache (downloaded where missing) and its sha256, checked against uv.lock."""
    missing = [p for p in packages if _cached(p, stack, cache) is None]
    if missing:
        print(f"downloading {len(missing)} wheels into {cache}", flush=True)
        _download(missing, stack, cache)
    return [_verified_wheel(p, stack, cache) for p in packages]


def main(args: argparse.Namespace) -> int:
    """Build the wheelhouse; print what it holds and its total size."""
    stack = load_stack()
    for flag, path in (("DIR", args.directory), ("--cache", args.cache)):
        if path.exists() and not path.is_dir():
            msg = f"{flag}: {path} is not a directory"
            raise UsageError(msg)
    try:
        target = stack.target(args.target)
        lock = load_lock(args.lock)
        packages = ([lock.package(name) for name in stack.wheelhouse.serve] if args.trim
                    else lock.install_set([EXTRA], stack.python))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    wheels = _fetch(packages, stack, args.cache)
    out_dir: Path = args.directory
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.trim:
        total = _write_archives(packages, wheels, out_dir, stack, target)
    else:
        total = _write_wheels([(p, *w) for p, w in zip(packages, wheels, strict=True)], out_dir, target)
        print(f"wheelhouse for {target.name} in {out_dir}: {len(packages)} wheels and {REQUIREMENTS}")
        print(f"install it with no network: {shlex.join(install_command(out_dir))}")
    print(f"total {total / MIB:.1f} MiB; all {len(packages)} wheels matched uv.lock sha256")
    if args.max_mib is not None and total > args.max_mib * MIB:
        hint = "" if args.trim else " (try --trim)"
        msg = f"the wheelhouse is {total / MIB:.1f} MiB, over --max-mib {args.max_mib:g}{hint}"
        raise ReproError(msg)
    return 0


def _write_archives(packages: list[LockedPackage], wheels: list[tuple[Path, str]], out_dir: Path, stack: Stack,
                    target: Target) -> int:
    """The ``--trim`` wheelhouse: an archive per wheel, the stubs' archive and manifest.json; the bytes written."""
    try:
        previous = offline.read_manifest(out_dir)
    except ValueError:
        previous = None
    reuse = _reusable(previous, (target.name, True, stack.sha256), out_dir)
    drop = drop_rule(stack, target)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = [
            pool.submit(lambda a=reuse[digest]: a) if digest in reuse
            else pool.submit(_pack_wheel, package, path, digest, out_dir, drop)
            for package, (path, digest) in zip(packages, wheels, strict=True)
        ]
        archives = [job.result() for job in jobs]
    archives.append(_pack_stubs(stack, out_dir))
    manifest = offline.Manifest(target.name, stack.python, True, stack.sha256, archives)
    manifest.write(out_dir)
    if previous is not None:
        for stale in {a.archive for a in previous.archives} - {a.archive for a in archives}:
            (out_dir / stale).unlink(missing_ok=True)
    print(f"wheelhouse for {target.name} (trimmed) in {out_dir}:")
    for a in archives:
        note = f"  ({len(a.dropped)} members left out)" if a.dropped else ""
        print(f"  {a.title:<44} {a.bytes / MIB:7.1f} MiB{note}")
    return sum(a.bytes for a in archives) + (out_dir / offline.MANIFEST).stat().st_size
