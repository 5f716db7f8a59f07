"""Which GPU architectures a CUDA shared library carries code for, read from its ELF and fatbins.

No CUDA tool is needed (``cuobjdump`` may be absent): the ``.nv_fatbin`` section of a 64-bit ELF
holds fatbin containers, each a 16-byte header and a run of entries (a header of its own, then a
payload that is a cubin (SASS) or PTX, often zstd-compressed). The entry header names the SM number
and flags; the variant (``a`` arch-specific, ``f`` family) is read from the ptxas command line in
the payload when the payload can be read (uncompressed, or zstd with a decoder on this machine) and
otherwise from the header's arch-specific flag. Layout and flag meanings were checked against the
sglang-kernel 0.4.5 wheel (every entry with the flag was built with ``-arch sm_XXa``).
"""

from __future__ import annotations

import mmap
import re
import shutil
import struct
import subprocess
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_SASS = 1, 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
_ELF_HEADER = 64  # bytes of a 64-bit ELF header
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY = struct.Struct("<HHIQIIIIIIQ")  # kind, ?, header size, payload size, compressed size,
#                                          ?, version, arch, name offset, name size, flags
_SASS_ARCH = re.compile(rb"-arch[ =](sm_\d+[af]?)\b")
_PTX_TARGET = re.compile(rb"\.target\s+(sm_\d+[af]?)\b")

Capability = tuple[int, int]


@dataclass(frozen=True, order=True)
class CudaCode:
    """One kind of device code in a library: SASS or PTX for one architecture and variant."""

    arch: int  # 90, 100, 103, 120
    variant: str  # "", "a" (arch-specific) or "f" (family)
    kind: str  # "sass" or "ptx"

    @property
    def label(self) -> str:
        """``sm_90a`` for SASS, ``compute_90a`` for PTX."""
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"

    @property
    def capability(self) -> Capability:
        """The compute capability the code was built for: 103 -> (10, 3)."""
        return divmod(self.arch, 10)

    def runs_on(self, cap: Capability) -> bool:
        """Whether a GPU of this capability can load the code (PTX: after JIT compilation).

        SASS runs on the same major and a minor at least as high; ``a`` code only on its exact
        capability; ``f`` code on its family (same major, minor at least as high); PTX compiles for
        any later capability unless it is ``a``/``f`` code.
        """
        own = self.capability
        if self.variant == "a":
            return cap == own
        if self.kind == "sass" or self.variant == "f":
            return cap[0] == own[0] and cap[1] >= own[1]
        return cap >= own


def _decompress_zstd(blob: bytes) -> bytes | None:
    try:
        from compression import zstd  # Python >= 3.14

        return zstd.decompress(blob)
    except ImportError:
        pass
    if shutil.which("zstd") is None:
        return None
    done = subprocess.run(["zstd", "-d", "-c", "-q"], input=blob, capture_output=True, check=False, timeout=60)
    return done.stdout if done.returncode == 0 else None


def _variant_from_payload(payload: bytes, kind: int) -> str | None:
    match = (_SASS_ARCH if kind == KIND_SASS else _PTX_TARGET).search(payload)
    if not match:
        return None
    name = match.group(1).decode()
    return name[-1] if name[-1] in "af" else ""


def _fatbin_section(data: mmap.mmap | bytes) -> tuple[int, int] | None:
    """(offset, size) of ``.nv_fatbin``; None when the ELF has none; ValueError if not an ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        msg = "not a 64-bit little-endian ELF file"
        raise ValueError(msg)
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    if not headers or shstrndx >= shnum:
        return None
    names = headers[shstrndx][4]
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.find(b"\0", names + name)
        if data[names + name : end] == b".nv_fatbin":
            return offset, size
    return None


def _entries(data: mmap.mmap | bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(kind, arch, flags, payload offset, payload bytes) of every fatbin entry in [start, end)."""
    pos = start
    while pos + _CONTAINER.size <= end:
        magic, _version, header_size, size = _CONTAINER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; skip padding
            continue
        entry, stop = pos + header_size, min(pos + header_size + size, end)
        while entry + _ENTRY.size <= stop:
            kind, _, ehs, payload_size, csize, _, _, arch, _, _, flags = _ENTRY.unpack_from(data, entry)
            if ehs < _ENTRY.size:
                break
            stored = csize if flags & (FLAG_LZ4 | FLAG_ZSTD) else payload_size
            yield kind, arch, flags, entry + ehs, stored
            entry += ehs + payload_size
        pos = max(stop, pos + 8)


def scan_library(path: Path) -> frozenset[CudaCode]:
    """Every (arch, variant, kind) of device code in one ELF shared library; a ValueError naming
    the file and the problem for anything that is not a well-formed 64-bit ELF file."""
    size = path.stat().st_size
    problem = f"not a 64-bit little-endian ELF file ({size} bytes)"
    if size >= _ELF_HEADER:
        try:
            return _scan_library(path)
        except (struct.error, OverflowError, IndexError):
            problem = "a truncated or corrupt ELF file"
        except ValueError as exc:
            problem = str(exc)
    msg = f"{path}: {problem}"
    raise ValueError(msg)


def _scan_library(path: Path) -> frozenset[CudaCode]:
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        section = _fatbin_section(data)
        if section is None:
            return frozenset()
        learned: dict[tuple[int, int, int], CudaCode] = {}
        start, size = section
        for kind, arch, flags, payload, stored in _entries(data, start, start + size):
            key = (kind, arch, flags)
            if key in learned or kind not in (KIND_PTX, KIND_SASS):
                continue
            blob: bytes | None = bytes(data[payload : payload + stored])
            if flags & FLAG_ZSTD:
                blob = _decompress_zstd(blob)
            elif flags & FLAG_LZ4:
                blob = None
            variant = _variant_from_payload(blob, kind) if blob else None
            if variant is None:
                variant = "a" if flags & FLAG_ARCH_SPECIFIC else ""
            learned[key] = CudaCode(arch, variant, "sass" if kind == KIND_SASS else "ptx")
    return frozenset(learned.values())


def _is_library(name: str) -> bool:
    return name.endswith(".so") or ".so." in Path(name).name


def scan_tree(root: Path) -> dict[str, frozenset[CudaCode]]:
    """Device code of every ``*.so`` under a directory, keyed by path relative to ``root``.

    Given a package directory itself (``.../sgl_kernel``), paths stay relative to its parent so
    they read ``sgl_kernel/...`` either way.
    """
    base = root.parent if not (root / "sgl_kernel").is_dir() and root.name == "sgl_kernel" else root
    return {
        path.relative_to(base).as_posix(): scan_library(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and _is_library(path.name)
    }


def scan_wheel(wheel: Path) -> dict[str, frozenset[CudaCode]]:
    """Device code of every shared library in a wheel, keyed by member name (one at a time on disk)."""
    try:
        return _scan_wheel(wheel)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        msg = f"{wheel}: not a readable wheel (zip) file ({exc})"
        raise ValueError(msg) from None


def _scan_wheel(wheel: Path) -> dict[str, frozenset[CudaCode]]:
    found: dict[str, frozenset[CudaCode]] = {}
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        for member in sorted(archive.namelist()):
            if not _is_library(member):
                continue
            copy = Path(tmp) / "lib.so"
            with archive.open(member) as src, copy.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 24)
            found[member] = scan_library(copy)
            copy.unlink()
    return found


def scan(path: Path) -> dict[str, frozenset[CudaCode]]:
    """Device code per library of a wheel, a directory or a single ``.so`` file."""
    if path.is_dir():
        return scan_tree(path)
    if path.suffix == ".whl":
        return scan_wheel(path)
    return {path.name: scan_library(path)}


@dataclass(frozen=True)
class Coverage:
    """Whether one library can run on one capability, and with which code."""

    capability: Capability
    library: str
    present: bool  # the library exists at all
    sass: tuple[str, ...]  # SASS labels that run on the capability
    ptx: tuple[str, ...]  # PTX labels that could be JIT-compiled for it

    @property
    def verdict(self) -> str:
        """``ok`` (SASS), ``jit`` (PTX only: slow first load) or ``missing``."""
        return "ok" if self.sass else ("jit" if self.ptx else "missing")


def coverage(
    libraries: Mapping[str, frozenset[CudaCode]], required: tuple[str, ...], caps: tuple[Capability, ...]
) -> list[Coverage]:
    """For each capability and each required library: the code in it that runs there."""
    result = []
    for cap in caps:
        for lib in required:
            codes = sorted(c for c in libraries.get(lib, frozenset()) if c.runs_on(cap))
            result.append(Coverage(
                capability=cap, library=lib, present=lib in libraries,
                sass=tuple(c.label for c in codes if c.kind == "sass"),
                ptx=tuple(c.label for c in codes if c.kind == "ptx"),
            ))
    return result
