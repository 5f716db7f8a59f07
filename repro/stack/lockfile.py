"""Read ``uv.lock``: the locked version of each distribution, the sha256 of each of its wheels and
its dependencies.

Only what the offline tools need is read: ``[[package]]`` tables with ``name``, ``version``,
``wheels = [{url, hash, size}, ...]``, ``dependencies`` and ``optional-dependencies``, and which
one is the project itself (``source = { editable = "." }``). A wheel is identified by its file name
(the last part of the URL), which is unique on a package index.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import Marker

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
class Requirement:
    """One dependency of a locked package: a name, the version where the lock holds several, the
    marker that guards it and the extras it asks for."""

    name: str
    version: str | None = None
    marker: str | None = None
    extras: tuple[str, ...] = ()


@dataclass(frozen=True)
class LockedPackage:
    """One distribution at one version, with every wheel file the lock knows for it and its
    dependencies (``optional``: per extra)."""

    name: str
    version: str
    wheels: tuple[LockedWheel, ...]
    dependencies: tuple[Requirement, ...] = ()
    optional: dict[str, tuple[Requirement, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Lock:
    """The packages of a ``uv.lock``, indexed by canonical name and by wheel file name."""

    path: Path
    packages: dict[str, tuple[LockedPackage, ...]]  # canonical name -> every locked version
    files: dict[str, LockedWheel]  # wheel file name -> its entry
    project: LockedPackage | None = None  # the editable package: the project the lock is for

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

    def resolve(self, requirement: Requirement) -> LockedPackage:
        """The locked package a dependency names (its version, where the lock holds several)."""
        found = [p for p in self.packages.get(normalize(requirement.name), ())
                 if requirement.version in (None, p.version)]
        if len(found) != 1:
            msg = f"{self.path.name}: cannot tell which {requirement.name} a dependency means ({len(found)} candidates)"
            raise ValueError(msg)
        return found[0]

    def install_set(self, extras: Sequence[str], python: str) -> list[LockedPackage]:
        """Every package that installing the project with ``extras`` brings on Linux x86_64 CPython
        ``python`` (the project itself left out; markers evaluated for that host), sorted by name."""
        if self.project is None:
            msg = f'{self.path.name} has no editable project package (source = {{ editable = "." }})'
            raise ValueError(msg)
        missing = [e for e in extras if e not in self.project.optional]
        if missing:
            msg = f"{self.path.name}: the project has no extra {missing[0]!r}"
            raise ValueError(msg)
        env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}
        todo = [*self.project.dependencies, *(r for e in extras for r in self.project.optional[e])]
        found: dict[str, LockedPackage] = {}
        expanded: set[tuple[str, str]] = set()
        while todo:
            requirement = todo.pop()
            if requirement.marker and not Marker(requirement.marker).evaluate(env):
                continue
            package = self.resolve(requirement)
            if found.setdefault(normalize(package.name), package) is not package:
                msg = f"{self.path.name}: the install set needs {package.name} at two versions"
                raise ValueError(msg)
            for extra in ("", *requirement.extras):
                if (normalize(package.name), extra) not in expanded:
                    expanded.add((normalize(package.name), extra))
                    todo += package.optional.get(extra, ()) if extra else package.dependencies
        return [found[k] for k in sorted(found)]


def _requirements(entries: Any, where: str) -> tuple[Requirement, ...]:
    """The dependency entries of a package table; ValueError when one is malformed."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
        msg = f"{where}: dependencies must be a list of tables with a name"
        raise ValueError(msg)
    return tuple(Requirement(e["name"], e.get("version"), e.get("marker"), tuple(e.get("extra", ()))) for e in entries)


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
    project = None
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
        where = f"{path.name}: {name} {version}"
        optional = table.get("optional-dependencies", {})
        if not isinstance(optional, dict):
            msg = f"{where}: optional-dependencies must be a table"
            raise ValueError(msg)
        package = LockedPackage(name, version, tuple(wheels), _requirements(table.get("dependencies", []), where),
                                {extra: _requirements(deps, where) for extra, deps in optional.items()})
        if isinstance(table.get("source"), dict) and table["source"].get("editable") == ".":
            project = package
            continue
        packages.setdefault(normalize(name), []).append(package)
    files = {w.filename: w for group in packages.values() for p in group for w in p.wheels}
    return Lock(path, {k: tuple(v) for k, v in packages.items()}, files, project)


def load_lock(path: Path = UV_LOCK) -> Lock:
    """The lock at ``path`` (the repository's ``uv.lock`` unless told otherwise)."""
    if not path.exists():
        msg = f"lock file {path} does not exist: generate it with `uv lock`"
        raise ValueError(msg)
    return parse_lock(read_text(path, "--lock", "a uv.lock file"), path)
