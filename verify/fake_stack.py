"""Builders of fake stack pieces for the CPU tests of the doctor, cubins and offline-install tools.

``cuda_library`` writes a minimal 64-bit ELF whose ``.nv_fatbin`` section holds fatbin entries laid
out as nvcc lays them out; ``wheel`` writes a wheel with a correct RECORD; ``dist`` installs fake
distribution metadata into a site directory; ``fake_nvidia_smi`` puts an ``nvidia-smi`` on PATH that
prints recorded output; ``stack_text`` rewrites the real ``stack.toml`` for a test.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from repro.stack.fatbin import FATBIN_MAGIC, FLAG_ARCH_SPECIFIC, FLAG_ZSTD, KIND_PTX, KIND_SASS
from repro.stack.pins import STACK_TOML

FLAGS_64BIT_LINUX = 0x11  # the low flag bits every entry of the sglang-kernel wheel carries
FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class Entry:
    """One fatbin entry to write: SASS or PTX for an arch, with header flags and a payload."""

    arch: int
    kind: int = KIND_SASS
    flags: int = FLAGS_64BIT_LINUX
    payload: bytes = b"\x7fELF fake cubin"


def sass(arch: int, variant: str = "", *, compressed: bool = False) -> Entry:
    """A SASS entry as nvcc writes it: ``a`` sets the arch-specific flag; payload names the arch."""
    flags = FLAGS_64BIT_LINUX | (FLAG_ARCH_SPECIFIC if variant == "a" else 0) | (FLAG_ZSTD if compressed else 0)
    return Entry(arch, KIND_SASS, flags, f"... -arch sm_{arch}{variant} -m 64 ...".encode())


def ptx(arch: int) -> Entry:
    """A plain PTX entry for ``compute_<arch>``."""
    return Entry(arch, KIND_PTX, FLAGS_64BIT_LINUX, f".version 9.0\n.target sm_{arch}\n".encode())


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def fatbin_container(entries: list[Entry]) -> bytes:
    """One fatbin container: a 16-byte header, then 64-byte entry headers each followed by its payload."""
    body = b""
    for e in entries:
        payload = _pad8(e.payload)
        header = struct.pack("<HHIQIIIIIIQ", e.kind, 0x0101, 64, len(payload), len(e.payload), 0,
                             0x00080001, e.arch, 0, 0, e.flags)
        body += header.ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def cuda_library(path: Path, *containers: list[Entry]) -> Path:
    """A 64-bit little-endian ELF with a ``.nv_fatbin`` section holding the given containers."""
    fatbin = b"".join(_pad8(fatbin_container(c)) + b"\0" * 8 for c in containers)  # 8 bytes of padding between
    names = b"\0.nv_fatbin\0.shstrtab\0"
    fat_off = 64
    str_off = fat_off + len(fatbin)
    sh_off = str_off + len(_pad8(names))
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    sections = b"\0" * 64
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, fat_off, len(fatbin), 0, 0, 8, 0)
    sections += struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, str_off, len(names), 0, 0, 1, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + fatbin + _pad8(names) + sections)
    return path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(directory: Path, name: str, version: str, files: dict[str, bytes], tag: str = "py3-none-any",
          requires: tuple[str, ...] = ()) -> Path:
    """A wheel ``name-version-tag.whl`` holding ``files`` plus METADATA (``Requires-Dist`` each of
    ``requires``), WHEEL and a correct RECORD."""
    dist = re.sub(r"[-.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    members[f"{info}/METADATA"] = metadata.encode()
    members[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    record = "".join(f"{k},{_record_hash(v)},{len(v)}\n" for k, v in members.items()) + f"{info}/RECORD,,\n"
    members[f"{info}/RECORD"] = record.encode()
    path = directory / f"{dist}-{version}-{tag}.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            info_ = zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0))
            info_.external_attr = (0o755 if member.endswith(".so") else 0o644) << 16
            archive.writestr(info_, data)
    return path


def lock_text(packages: list[tuple[str, str, list[Path]]], depends: dict[str, list[str]] | None = None,
              gpu: list[str] | None = None) -> str:
    """A uv.lock listing each (name, version, wheel files) with the files' real sha256 and its
    ``depends`` (name -> names); with ``gpu``, the project, whose ``gpu`` extra names those."""
    out = ["version = 1", "revision = 3", 'requires-python = ">=3.11"', ""]
    if gpu is not None:
        out += ["[[package]]", 'name = "k26-ddtree-repro"', 'version = "0.1.0"', 'source = { editable = "." }', "",
                "[package.optional-dependencies]", "gpu = [", *(f'    {{ name = "{n}" }},' for n in gpu), "]", ""]
    for name, version, wheels in packages:
        out += ["[[package]]", f'name = "{name}"', f'version = "{version}"',
                'source = { registry = "https://example.invalid/simple" }',
                "dependencies = [", *(f'    {{ name = "{n}" }},' for n in (depends or {}).get(name, [])), "]", "wheels = ["]
        for w in wheels:
            digest = hashlib.sha256(w.read_bytes()).hexdigest()
            out.append(f'    {{ url = "https://example.invalid/{w.name}", hash = "sha256:{digest}", '
                       f"size = {w.stat().st_size} }},")
        out += ["]", ""]
    return "\n".join(out)


def dist(site: Path, name: str, version: str, files: dict[str, str | bytes] | None = None) -> None:
    """Install fake metadata (and files) for a distribution into ``site``."""
    info = site / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, data in (files or {}).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            (site / rel).write_bytes(data)
        else:
            (site / rel).write_text(data)


def fake_nvidia_smi(monkeypatch: pytest.MonkeyPatch, bin_dir: Path, query: Path, topo: Path | None = None,
                    exit_code: int = 0) -> None:
    """Put first on PATH an ``nvidia-smi`` that prints recorded output.

    ``--query-gpu`` prints ``query`` and ``topo -m`` prints ``topo``; with ``exit_code`` != 0 every
    call prints ``query`` and fails, as on a box whose driver is not loaded.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    if exit_code:
        body = f'cat "{query}"; exit {exit_code}'
    else:
        body = (f'case "$*" in *topo*) cat "{topo}";; *query-gpu*) cat "{query}";; *) exit 2;; esac')
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def stack_text(*, python: str | None = None, serve: list[str] | None = None, trim: list[str] | None = None) -> str:
    """The real stack.toml with ``python``, ``[wheelhouse] serve`` or ``trim`` replaced."""
    text = STACK_TOML.read_text()
    if python is not None:
        text = re.sub(r'(?m)^python = "[^"]*"', f'python = "{python}"', text)
    if serve is not None:
        text = re.sub(r"(?ms)^serve = \[.*?^\]", "serve = " + repr(serve).replace("'", '"'), text)
    if trim is not None:
        text = re.sub(r"(?ms)^trim = \[.*?^\]", "trim = " + repr(trim).replace("'", '"'), text)
    return text


@dataclass(frozen=True)
class ServeSet:
    """A fake serving stack: a test stack.toml text, a wheel cache and a uv.lock locking it."""

    stack_text: str
    cache: Path
    lock: Path
    wheels: dict[str, Path]


def serve_set(root: Path) -> ServeSet:
    """Two fake distributions standing in for sglang-kernel and sglang, cached and locked.

    ``fakekernel`` carries ``sgl_kernel`` with the libraries of every target plus an unused one;
    ``fakeserver`` has a ``multimodal_gen`` subpackage the test stack's trim patterns drop, and
    depends on ``fakekernel``; the project's ``gpu`` extra names ``fakeserver``.
    """
    libs = root / "libs"
    kernel_files = {
        "sgl_kernel/__init__.py": b"",
        "sgl_kernel/sm90/common_ops.abi3.so": cuda_library(libs / "a.so", [sass(90), sass(90, "a")]).read_bytes(),
        "sgl_kernel/sm100/common_ops.abi3.so": cuda_library(
            libs / "b.so", [sass(100, "a"), sass(103, "a"), sass(120, "a")]).read_bytes(),
        "sgl_kernel/spatial_ops.abi3.so": cuda_library(
            libs / "c.so", [sass(90, "a"), sass(100, "a"), sass(103, "a"), sass(120, "a")]).read_bytes(),
        "sgl_kernel/flash_ops.abi3.so": cuda_library(libs / "d.so", [sass(90, "a")]).read_bytes(),
    }
    server_files = {"fakeserver/__init__.py": b"VERSION = '1.0'\n",
                    "fakeserver/multimodal_gen/__init__.py": b"big = True\n"}
    cache = root / "cache"
    wheels = {"fakekernel": wheel(cache, "fakekernel", "0.4.5", kernel_files, "cp310-abi3-manylinux2014_x86_64"),
              "fakeserver": wheel(cache, "fakeserver", "1.0", server_files, requires=("fakekernel",))}
    lock = root / "uv.lock"
    lock.write_text(lock_text([("fakekernel", "0.4.5", [wheels["fakekernel"]]),
                               ("fakeserver", "1.0", [wheels["fakeserver"]])],
                              depends={"fakeserver": ["fakekernel"]}, gpu=["fakeserver"]))
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    text = stack_text(python=python, serve=["fakekernel", "fakeserver"], trim=["fakeserver/multimodal_gen/*"])
    return ServeSet(text, cache, lock, wheels)
