"""``repro install-offline DIR``: install a ``repro wheelhouse`` with no network, and prove it.

Checks every archive's sha256 against ``manifest.json`` and, when ``uv.lock`` is at hand, every
wheel's sha256 against the lock; extracts only what is not already in place; then checks every
installed file's sha256. Running it again changes nothing: missing files are restored, and files
changed since (``repro patch apply`` edits sglang in place) are reported and kept unless ``--force``.
Installs into ``--site DIR`` (put it on ``PYTHONPATH``) or, by default, this interpreter's
site-packages; it refuses to overwrite another version of a distribution, and installs a stub only
where no real package of that name exists.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import re
import sys
import sysconfig
import tarfile
from pathlib import Path

from repro import offline
from repro.errors import ReproError, UsageError
from repro.lockfile import UV_LOCK, load_lock, normalize

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
    if not lock_path.is_file():
        return f"{lock_path} not found: wheel hashes not re-checked against uv.lock"
    try:
        lock = load_lock(lock_path)
    except ValueError as exc:
        raise ReproError(str(exc)) from None
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


def main(args: argparse.Namespace) -> int:  # noqa: C901, PLR0912 - the install steps in order
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
    site.mkdir(parents=True, exist_ok=True)
    installed = _installed_versions(site)
    for archive in manifest.archives:
        have = installed.get(normalize(archive.distribution or ""))
        if archive.distribution and have not in (None, archive.version):
            msg = (
                f"{site} holds {archive.distribution} {have}, the wheelhouse has {archive.version}: "
                "uninstall it or choose another --site"
            )
            raise ReproError(msg)

    notes: list[str] = []
    print(f"install-offline: {args.directory} -> {site} (target {manifest.target}"
          f"{', trimmed' if manifest.trim else ''}); {provenance}")
    kept = 0
    for archive in manifest.archives:
        files = _wanted_files(archive, site, notes)
        if not files:
            continue
        missing, changed = offline.compare_files(site, files)
        todo = set(missing) | (set(changed) if args.force else set())
        if todo:
            with tarfile.open(args.directory / archive.archive, "r:xz") as tar:
                tar.extractall(site, members=[m for m in tar.getmembers() if m.name in todo], filter="data")
            still_missing, still_changed = offline.compare_files(site, {k: files[k] for k in todo})
            if still_missing or still_changed:
                bad = (still_missing + still_changed)[0]
                msg = f"{archive.archive}: {bad} does not match manifest.json after extraction"
                raise ReproError(msg)
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
