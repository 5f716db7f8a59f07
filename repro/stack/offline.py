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
from pathlib import Path
from typing import Any

from repro.files import atomic_output, read_json, safe_relative, write_atomic

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

    Accepts ``cpXY-cpXY``, ``cpXW-abi3`` (W <= Y) and ``py3``/``pyXW``-``none`` (W <= Y) wheels whose
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
        or ("none" in abi_tags and py_tags & {f"py{major}", cp, *(f"py{major}{m}" for m in range(minor + 1))})
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
        write_atomic(directory / MANIFEST, json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")


def read_manifest(directory: Path) -> Manifest:
    """``directory/manifest.json``; ValueError naming the problem when absent or malformed.

    Every field is type-checked and every file name must be a plain relative path (no ``..``,
    no absolute path), so nothing a manifest says can make an install write outside its site.
    """
    path = directory / MANIFEST
    if not path.is_file():
        msg = f"{directory} is not a wheelhouse: {MANIFEST} is missing"
        raise ValueError(msg)
    data = read_json(path, "wheelhouse manifest")
    problem = _manifest_problem(data)
    if problem:
        msg = f"{path} is malformed: {problem}"
        raise ValueError(msg)
    archives = [Archive(**a) for a in data.pop("archives")]
    return Manifest(archives=archives, **data)


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOP = {"target": str, "python": str, "trim": bool, "stack_sha256": str, "format": int}
_ARCHIVE = {"archive": str, "sha256": str, "bytes": int, "distribution": (str, type(None)),
            "version": (str, type(None)), "wheel": (str, type(None)),
            "wheel_sha256": (str, type(None)), "dropped": list, "stubs": list, "files": dict}
_ARCHIVE_OPTIONAL = {"dropped", "stubs", "files"}


def _manifest_problem(data: Any) -> str | None:  # noqa: C901, PLR0911 - one check per field
    """What is wrong with a parsed manifest, or None."""
    if isinstance(data, dict) and data.get("format") != FORMAT:
        return f"format must be {FORMAT} (got {data.get('format')!r:.20})"
    if not isinstance(data, dict) or set(data) != {*_TOP, "archives"}:
        return f"must be an object with the keys {', '.join(sorted({*_TOP, 'archives'}))}"
    for key, kind in _TOP.items():
        if not isinstance(data[key], kind) or (kind is int and isinstance(data[key], bool)):
            return f"{key} must be {kind.__name__} (got {data[key]!r:.40})"
    if not isinstance(data["archives"], list):
        return "archives must be a list"
    for i, a in enumerate(data["archives"]):
        where = f"archives[{i}]"
        if not isinstance(a, dict) or not set(_ARCHIVE) - _ARCHIVE_OPTIONAL <= set(a) <= set(_ARCHIVE):
            return f"{where} must be an object with the keys {', '.join(sorted(_ARCHIVE))}"
        bad = next((k for k, kind in _ARCHIVE.items() if k in a and (
            not isinstance(a[k], kind) or isinstance(a[k], bool))), None)
        if bad:
            return f"{where}.{bad} has the wrong type (got {a[bad]!r:.40})"
        if "/" in a["archive"] or not safe_relative(a["archive"]) or not _HEX64.match(a["sha256"]):
            return f"{where} needs a plain archive file name and a hex sha256"
        names = [*a.get("files", {}), *a.get("dropped", [])]
        if not all(safe_relative(n) for n in names) or not all(
                isinstance(v, str) and _HEX64.match(v) for v in a.get("files", {}).values()):
            return f"{where}.files must map plain relative paths to hex sha256"
        if not all(isinstance(n, str) and n.isidentifier() for n in a.get("stubs", [])):
            return f"{where}.stubs must be import names"
    return None


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
            if not safe_relative(path):
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
    """A reproducible ``tar.xz`` of ``files`` (relative to ``root``): sorted, mtime 0, owner root;
    written whole (a temporary file renamed into place)."""
    with atomic_output(out) as tmp, tarfile.open(tmp, "w:xz", preset=6) as tar:
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
