"""The offline wheelhouse format, shared by ``repro wheelhouse`` (writer) and ``repro install-offline``.

A wheelhouse directory holds one ``.tar.xz`` per distribution (the wheel unpacked as a site tree,
minus trimmed members: xz of the tree is ~40% smaller than the wheels), one archive of stub
packages, and ``manifest.json``::

    {"format": 1, "target": "sm90", "python": "3.12", "trim": true, "stack_sha256": "...",
     "archives": [{"archive": "sglang-0.5.17.tar.xz", "sha256": "...", "bytes": 123,
                   "distribution": "sglang", "version": "0.5.17",
                   "wheel": "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
                   "wheel_sha256": "...",            # equal to uv.lock's
                   "dropped": ["sglang/srt/grpc/_core.abi3.so", ...],
                   "stubs": [],                       # import names, for the stub archive
                   "files": {"sglang/__init__.py": "<sha256>", ...}}, ...]}
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 1
_DATA_DIR = re.compile(r"^[^/]+\.data/(purelib|platlib|scripts|headers|data)/(.+)$")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def platform_tags(manylinux: str, machine: str = "x86_64") -> list[str]:
    """Platform tags a host with glibc ``manylinux`` (e.g. ``2_34``) accepts, most specific first."""
    major, minor = (int(x) for x in manylinux.split("_"))
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    for glibc_minor, name in legacy.items():
        if major == 2 and minor >= glibc_minor:
            tags.insert(tags.index(f"manylinux_2_{glibc_minor}_{machine}") + 1, f"{name}_{machine}")
    return [*tags, "any"]


def wheel_rank(filename: str, python: str, manylinux: str) -> int | None:
    """How well a wheel fits a CPython ``python`` host (lower is better), or None if it does not.

    Accepts ``cpXY-cpXY``, ``cpXW-abi3`` (W <= Y) and ``py3``/``pyXY``-``none`` wheels whose
    platform tag is one of ``platform_tags(manylinux)``.
    """
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) < 5:
        return None
    py_tags, abi_tags, plat_tags = (set(p.split(".")) for p in parts[-3:])
    major, minor = (int(x) for x in python.split("."))
    cp = f"cp{major}{minor}"
    abi3 = {f"cp{major}{m}" for m in range(2, minor + 1)}
    python_ok = (
        (cp in py_tags and cp in abi_tags)
        or ("abi3" in abi_tags and py_tags & abi3)
        or ("none" in abi_tags and py_tags & {f"py{major}", f"py{major}{minor}", cp})
    )
    if not python_ok:
        return None
    ranks = [i for i, tag in enumerate(platform_tags(manylinux)) if tag in plat_tags]
    return min(ranks) if ranks else None


@dataclass
class Archive:
    """One archive of a wheelhouse and everything needed to check it (see the module docstring)."""

    archive: str
    sha256: str
    bytes: int
    distribution: str | None
    version: str | None
    wheel: str | None
    wheel_sha256: str | None
    dropped: list[str] = field(default_factory=list)
    stubs: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """``sglang 0.5.17`` or ``stubs IPython, xgrammar``."""
        if self.distribution:
            return f"{self.distribution} {self.version}"
        return "stubs " + ", ".join(self.stubs)


@dataclass
class Manifest:
    """``manifest.json`` of a wheelhouse."""

    target: str
    python: str
    trim: bool
    stack_sha256: str
    archives: list[Archive]
    format: int = FORMAT

    def write(self, directory: Path) -> None:
        """Write ``directory/manifest.json`` (stable key order, so rebuilds diff cleanly)."""
        (directory / MANIFEST).write_text(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")


def read_manifest(directory: Path) -> Manifest:
    """``directory/manifest.json``; ValueError naming the problem when absent or malformed."""
    path = directory / MANIFEST
    if not path.is_file():
        msg = f"{directory} is not a wheelhouse: {MANIFEST} is missing"
        raise ValueError(msg)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            msg = f"format must be {FORMAT} (got {data.get('format')!r})"
            raise ValueError(msg)  # noqa: TRY301 - reported below as a malformed manifest
        archives = [Archive(**a) for a in data.pop("archives")]
        return Manifest(archives=archives, **data)
    except (TypeError, KeyError, json.JSONDecodeError, ValueError) as exc:
        msg = f"{path} is malformed: {exc}"
        raise ValueError(msg) from None


def _record_hashes(archive: zipfile.ZipFile) -> dict[str, str]:
    """Hex sha256 of each member as the wheel's own ``*.dist-info/RECORD`` states it."""
    records = [n for n in archive.namelist() if re.match(r"^[^/]+\.dist-info/RECORD$", n)]
    if len(records) != 1:
        msg = f"a wheel must hold one .dist-info/RECORD (found {len(records)})"
        raise ValueError(msg)
    hashes = {}
    for row in csv.reader(io.TextIOWrapper(archive.open(records[0]), encoding="utf-8")):
        if len(row) >= 2 and row[1].startswith("sha256="):
            raw = base64.urlsafe_b64decode(row[1][7:] + "=" * (-len(row[1][7:]) % 4))
            hashes[row[0]] = raw.hex()
    return hashes


def unpack_wheel(wheel: Path, dest: Path, drop: Callable[[str], bool]) -> tuple[dict[str, str], list[str]]:
    """Unpack a wheel as a site tree into ``dest``, skipping members ``drop`` selects.

    ``.data/purelib|platlib`` go to the root; scripts, headers and data are not installed (the
    server runs as ``python -m``). Returns (kept path -> sha256, dropped paths). Every kept member
    must match the wheel's RECORD: ValueError otherwise.
    """
    kept: dict[str, str] = {}
    dropped: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        record = _record_hashes(archive)
        for info in archive.infolist():
            if info.is_dir():
                continue
            name = info.filename
            data_dir = _DATA_DIR.match(name)
            if data_dir and data_dir[1] not in ("purelib", "platlib"):
                dropped.append(name)
                continue
            path = data_dir[2] if data_dir else name
            if PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
                msg = f"{wheel.name}: member {name!r} escapes the install directory"
                raise ValueError(msg)
            if drop(path):
                dropped.append(path)
                continue
            out = dest / path
            out.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with archive.open(info) as src, out.open("wb") as dst:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    dst.write(chunk)
            out.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
            if name in record and record[name] != digest.hexdigest():
                msg = f"{wheel.name}: member {name!r} does not match the wheel's RECORD"
                raise ValueError(msg)
            kept[path] = digest.hexdigest()
    return kept, sorted(dropped)


def write_archive(root: Path, files: Iterable[str], out: Path) -> None:
    """A reproducible ``tar.xz`` of ``files`` (relative to ``root``): sorted, mtime 0, owner root."""
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for name in sorted(files):
            info = tar.gettarinfo(str(root / name), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with (root / name).open("rb") as handle:
                tar.addfile(info, handle)


def compare_files(root: Path, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """(missing, changed): files of ``files`` absent under ``root``, and present with another sha256."""
    missing, changed = [], []
    for name, expected in sorted(files.items()):
        path = root / name
        if not path.is_file():
            missing.append(name)
        elif sha256_file(path) != expected:
            changed.append(name)
    return missing, changed


def copy_tree(src: Path, dest: Path) -> dict[str, str]:
    """Copy a directory of plain files; returns relative path -> sha256 of each copied file."""
    copied = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = path.relative_to(src).as_posix()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
        copied[rel] = sha256_file(path)
    return copied
