"""``repro install-offline DIR``: install a ``repro wheelhouse`` with no network, and prove it.

Checks every archive's sha256 against ``manifest.json`` and, when ``uv.lock`` is at hand, every
wheel's sha256 against the lock; extracts only what is not already in place; then checks every
installed file's sha256. Running it again changes nothing: missing files are restored, and files
changed since (``repro patch apply`` edits sglang in place) are reported and kept unless ``--force``.
All or nothing: every file is extracted and checked in a staging directory inside the site before
the first one is moved into place, so a truncated or corrupt archive leaves the site as it was.
Installs into ``--site DIR`` (put it on ``PYTHONPATH``) or, by default, this interpreter's
site-packages; it refuses to overwrite another version of a distribution, and installs a stub only
where no real package of that name exists.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import lzma
import re
import shutil
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

from repro.errors import ReproError, UsageError
from repro.files import check_inside
from repro.stack import offline
from repro.stack.lockfile import UV_LOCK, load_lock, normalize

_DIST_INFO = re.compile(r"^(?P<name>.+)-(?P<version>[^-]+)\.dist-info$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro install-offline``."""
    parser.add_argument("directory", type=Path, help="a directory written by `repro wheelhouse`")
    parser.add_argument("--site", type=Path,
                        help="install into this directory (then add it to PYTHONPATH) instead of site-packages")
    parser.add_argument("--lock", type=Path, default=UV_LOCK,
                        help="uv.lock to re-check the wheel hashes against (skipped when absent)")
    parser.add_argument("--force", action="store_true",
                        help="also restore installed files that differ from the wheelhouse "
                             "(undoes `repro patch apply`)")


def _check_archives(directory: Path, manifest: offline.Manifest) -> None:
    for archive in manifest.archives:
        path = directory / archive.archive
        if not path.is_file():
            msg = f"{path} is missing: copy the whole wheelhouse directory"
            raise ReproError(msg)
        if path.stat().st_size != archive.bytes or offline.sha256_file(path) != archive.sha256:
            msg = f"{path} does not match manifest.json (corrupt or partial copy)"
            raise ReproError(msg)


def _check_lock(lock_path: Path, manifest: offline.Manifest) -> str:
    """One line on wheel provenance; ReproError when a wheel's hash differs from the lock's."""
    if not lock_path.exists():
        return f"{lock_path} not found: wheel hashes not re-checked against uv.lock"
    try:
        lock = load_lock(lock_path)
    except ValueError as exc:
        raise UsageError(f"--lock: {exc}" if not isinstance(exc, UsageError) else str(exc)) from None
    wheels = [a for a in manifest.archives if a.wheel]
    for archive in wheels:
        locked = lock.wheel(archive.wheel or "")
        if locked is None or locked.sha256 != archive.wheel_sha256:
            msg = f"{archive.wheel}: its sha256 in manifest.json is not the one {lock_path.name} pins"
            raise ReproError(msg)
    return f"all {len(wheels)} wheels match {lock_path.name}"


def _installed_versions(site: Path) -> dict[str, str]:
    """Canonical distribution name -> version, from the ``*.dist-info`` directories in ``site``."""
    found = {}
    for entry in site.glob("*.dist-info") if site.is_dir() else ():
        match = _DIST_INFO.match(entry.name)
        if match:
            found[normalize(match["name"])] = match["version"]
    return found


def _check_versions(site: Path, manifest: offline.Manifest) -> None:
    """Refuse to overwrite another version of a distribution the wheelhouse holds."""
    installed = _installed_versions(site)
    for archive in manifest.archives:
        have = installed.get(normalize(archive.distribution or ""))
        if archive.distribution and have not in (None, archive.version):
            msg = (
                f"{site} holds {archive.distribution} {have}, the wheelhouse has {archive.version}: "
                "uninstall it or choose another --site"
            )
            raise ReproError(msg)


def _real_module_elsewhere(name: str, site: Path) -> str | None:
    """Where a real (non-stub) top-level module ``name`` would be imported from, outside ``site``."""
    path = [p for p in sys.path if p and Path(p).resolve() != site.resolve()]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    return spec.origin if spec and spec.origin else None


def _wanted_files(archive: offline.Archive, site: Path, notes: list[str]) -> dict[str, str]:
    """The files of an archive to install: all of them, less stubs shadowing a real package."""
    files = dict(archive.files)
    for stub in archive.stubs:
        real = _real_module_elsewhere(stub, site)
        if real:
            notes.append(f"stub {stub}: not installed, the real package is at {real}")
            files = {k: v for k, v in files.items() if not k.startswith(f"{stub}/")}
    return files


def _extract(directory: Path, archive: offline.Archive, wanted: dict[str, str], staging: Path) -> None:
    """Extract ``wanted`` members of one archive into ``staging`` and check each one's sha256."""
    path = directory / archive.archive
    try:
        with tarfile.open(path, "r:xz") as tar:
            members = [m for m in tar.getmembers() if m.name in wanted]
            odd = next((m.name for m in members if not m.isfile()), None)
            if odd:
                msg = f"{path}: member {odd} is not a regular file; nothing was installed"
                raise ReproError(msg)
            tar.extractall(staging, members=members, filter="data")
    except (tarfile.TarError, EOFError, lzma.LZMAError, OSError) as exc:
        msg = (f"{path} cannot be extracted ({type(exc).__name__}: {exc}); nothing was installed "
               f"(copy the wheelhouse again)")
        raise ReproError(msg) from None
    missing, changed = offline.compare_files(staging, wanted)
    if missing or changed:
        bad = (missing + changed)[0]
        msg = f"{archive.archive}: {bad} does not match manifest.json after extraction; nothing was installed"
        raise ReproError(msg)


def _check_destination(site: Path, name: str) -> Path:
    """Where ``name`` goes under ``site``: inside it once symlinks are resolved, with no file
    or directory in the way (checked for every file before the first one is moved)."""
    dest = check_inside(site / name, site, "--site")
    blocker = next((p for p in dest.parents if p != site and p.exists() and not p.is_dir()), None)
    if blocker is not None or (dest.exists() and not dest.is_file()):
        msg = f"{blocker or dest} is in the way of {name}: remove it or choose another --site"
        raise ReproError(msg)
    return dest


def _install(args: argparse.Namespace, manifest: offline.Manifest, site: Path,
             notes: list[str]) -> list[tuple[offline.Archive, dict[str, str], set[str], list[str]]]:
    """Install every archive all or nothing: extract and check everything in a staging directory
    inside ``site``, then move the files into place; per archive (files, installed, changed)."""
    plan = []
    staging = Path(tempfile.mkdtemp(dir=site, prefix=".repro-install-"))
    try:
        for archive in manifest.archives:
            files = _wanted_files(archive, site, notes)
            if not files:
                continue
            missing, changed = offline.compare_files(site, files)
            todo = set(missing) | (set(changed) if args.force else set())
            if todo:
                _extract(args.directory, archive, {k: files[k] for k in todo}, staging)
            plan.append((archive, files, todo, changed))
        moves = [(staging / name, _check_destination(site, name)) for _, _, todo, _ in plan
                 for name in sorted(todo)]
        for staged, dest in moves:
            dest.parent.mkdir(parents=True, exist_ok=True)
            staged.replace(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return plan


def main(args: argparse.Namespace) -> int:
    """Install the wheelhouse; print what was installed, what was already there, and where."""
    try:
        manifest = offline.read_manifest(args.directory)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != manifest.python:
        msg = f"the wheelhouse is for Python {manifest.python}, this interpreter is {running}"
        raise ReproError(msg)
    _check_archives(args.directory, manifest)
    provenance = _check_lock(args.lock, manifest)

    site: Path = args.site or Path(sysconfig.get_paths()["purelib"])
    if site.exists() and not site.is_dir():
        msg = f"--site: {site} is not a directory"
        raise UsageError(msg)
    site.mkdir(parents=True, exist_ok=True)
    _check_versions(site, manifest)

    notes: list[str] = []
    print(f"install-offline: {args.directory} -> {site} (target {manifest.target}"
          f"{', trimmed' if manifest.trim else ''}); {provenance}")
    kept = 0
    for archive, files, todo, changed in _install(args, manifest, site, notes):
        if len(todo) == len(files):
            left_out = f", {len(archive.dropped)} left out by the wheelhouse" if archive.dropped else ""
            print(f"  installed          {archive.title} ({len(files)} files{left_out})")
        elif todo:
            print(f"  repaired           {archive.title} ({len(todo)} of {len(files)} files restored)")
        else:
            print(f"  already installed  {archive.title} ({len(files)} files)")
        if changed and not args.force:
            kept += len(changed)
            notes.append(f"{archive.title}: kept {len(changed)} changed files, e.g. {changed[0]} "
                         "(--force restores them)")
    for note in notes:
        print(f"  {note}")
    changed_note = f", except {kept} changed files kept as they are" if kept else ""
    print(f"every installed file matches manifest.json's sha256{changed_note}")
    if str(site) not in sys.path and str(site.resolve()) not in sys.path:
        print(f"use it with: PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}}")
    return 0
