"""Read ``uv.lock``: the locked version of each distribution and the sha256 of each of its wheels.

Only what the offline tools need is read: ``[[package]]`` tables with ``name``, ``version`` and
``wheels = [{url, hash, size}, ...]``. A wheel is identified by its file name (the last part of the
URL), which is unique on a package index.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from repro.files import read_text
from repro.stack.pins import REPO_ROOT

UV_LOCK = REPO_ROOT / "uv.lock"


def normalize(name: str) -> str:
    """A distribution name in its canonical form (PEP 503): ``Typing_Extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockedWheel:
    """One wheel file the lock accepts."""

    filename: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class LockedPackage:
    """One distribution at one version, with every wheel file the lock knows for it."""

    name: str
    version: str
    wheels: tuple[LockedWheel, ...]


@dataclass(frozen=True)
class Lock:
    """The packages of a ``uv.lock``, indexed by canonical name and by wheel file name."""

    path: Path
    packages: dict[str, tuple[LockedPackage, ...]]  # canonical name -> every locked version
    files: dict[str, LockedWheel]  # wheel file name -> its entry

    def package(self, name: str) -> LockedPackage:
        """The single locked version of ``name``; ValueError when absent or locked twice."""
        found = self.packages.get(normalize(name), ())
        if not found:
            msg = f"{self.path.name} has no package {name!r}: add it and re-lock"
            raise ValueError(msg)
        if len(found) > 1:
            versions = ", ".join(p.version for p in found)
            msg = f"{self.path.name} locks {name!r} at several versions ({versions}): pin one"
            raise ValueError(msg)
        return found[0]

    def wheel(self, filename: str) -> LockedWheel | None:
        """The lock's entry for a wheel file name, or None if the lock does not list that file."""
        return self.files.get(filename)


def parse_lock(text: str, path: Path = UV_LOCK) -> Lock:
    """Parse ``uv.lock`` text; ValueError naming the first malformed package."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = f"{path.name}: not valid TOML ({exc})"
        raise ValueError(msg) from None
    tables = data.get("package", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        msg = f"{path.name}: [[package]] must be an array of tables"
        raise ValueError(msg)
    packages: dict[str, list[LockedPackage]] = {}
    for index, table in enumerate(tables):
        name, version = table.get("name"), table.get("version")
        if not isinstance(name, str) or not isinstance(version, str):
            msg = f"{path.name}: package #{index} needs a name and a version (got {table.get('name')!r})"
            raise ValueError(msg)
        wheels = []
        entries = table.get("wheels", [])
        for wheel in entries if isinstance(entries, list) else [entries]:
            if not isinstance(wheel, dict) or not isinstance(wheel.get("url"), str):
                msg = f"{path.name}: {name} {version} has a wheel without a url ({wheel!r:.80})"
                raise ValueError(msg)
            algo, _, digest = str(wheel.get("hash", "")).partition(":")
            if algo != "sha256" or len(digest) != 64:
                msg = f"{path.name}: {name} {version} has a wheel without a sha256 hash ({wheel!r})"
                raise ValueError(msg)
            wheels.append(LockedWheel(str(wheel["url"]).rsplit("/", 1)[-1], digest, wheel.get("size")))
        packages.setdefault(normalize(name), []).append(LockedPackage(name, version, tuple(wheels)))
    files = {w.filename: w for group in packages.values() for p in group for w in p.wheels}
    return Lock(path, {k: tuple(v) for k, v in packages.items()}, files)


def load_lock(path: Path = UV_LOCK) -> Lock:
    """The lock at ``path`` (the repository's ``uv.lock`` unless told otherwise)."""
    if not path.exists():
        msg = f"lock file {path} does not exist: generate it with `uv lock`"
        raise ValueError(msg)
    return parse_lock(read_text(path, "--lock", "a uv.lock file"), path)
