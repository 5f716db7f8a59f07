"""The files a user names, read with one-line errors, and files written whole or not at all.

``read_text``/``read_toml``/``read_json`` raise :class:`~repro.errors.UsageError` naming the flag
(or argument) and the path when the file is missing, a directory, unreadable, binary, not UTF-8 or
malformed, so no verb turns a wrong path into a traceback; a name ending in ``.gz`` is read through
gzip (archived results: ``gzip -9 run.jsonl``). ``atomic_output`` and
``write_atomic`` write through a temporary file in the same directory and rename it into place,
so a crash or a full disk never leaves a partial file that looks complete; the rename replaces
a symlink at the destination instead of writing through it. ``check_name`` and ``check_inside``
keep names used in paths, and paths derived from untrusted files, inside their tree.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import re
import tempfile
import tomllib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from repro.errors import UsageError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def read_bytes(path: Path, what: str, expected: str = "a file") -> bytes:
    """The bytes of ``path``; a UsageError naming ``what`` (a flag or argument) when it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        msg = f"{what}: {path} does not exist (expected {expected})"
    except IsADirectoryError:
        msg = f"{what}: {path} is a directory (expected {expected})"
    except PermissionError:
        msg = f"{what}: {path} cannot be read (permission denied)"
    except OSError as exc:
        msg = f"{what}: {path} cannot be read ({exc.strerror or exc})"
    raise UsageError(msg)


def decode_text(data: bytes, path: Path, what: str, expected: str) -> str:
    """``data`` as UTF-8 text; a UsageError when it holds NUL bytes or is not UTF-8."""
    bad = data.find(b"\0")
    if bad < 0:
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            bad = exc.start
    msg = f"{what}: {path} is binary or not UTF-8 text (byte {bad}; expected {expected})"
    raise UsageError(msg)


def read_text(path: Path, what: str, expected: str = "a text file") -> str:
    """The UTF-8 text of ``path``, gunzipped when its name ends in ``.gz`` (see :func:`read_bytes`
    and :func:`decode_text`)."""
    data = read_bytes(path, what, expected)
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            msg = f"{what}: {path} is not a whole gzip file ({exc}; expected {expected}, gzipped)"
            raise UsageError(msg) from None
    return decode_text(data, path, what, expected)


def read_toml(path: Path, what: str, expected: str = "a TOML file") -> dict[str, Any]:
    """The parsed TOML of ``path``; a UsageError naming ``what`` when it is not valid TOML."""
    try:
        return tomllib.loads(read_text(path, what, expected))
    except tomllib.TOMLDecodeError as exc:
        msg = f"{what}: {path} is not valid TOML ({exc})"
        raise UsageError(msg) from None


def _no_constant(name: str) -> None:
    msg = f"{name} is not a JSON number"
    raise ValueError(msg)


def parse_json(text: str) -> Any:
    """Strict JSON: ``NaN``/``Infinity`` are rejected (ValueError) rather than read as floats."""
    return json.loads(text, parse_constant=_no_constant)


def read_json(path: Path, what: str, expected: str = "a JSON file") -> Any:
    """The parsed JSON of ``path``; a UsageError naming ``what`` when it is not valid JSON."""
    text = read_text(path, what, expected)
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        msg = f"{what}: {path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except ValueError as exc:
        msg = f"{what}: {path} is not valid JSON ({exc})"
    raise UsageError(msg)


def is_finite_number(value: Any) -> bool:
    """True for an int or a finite float (never a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_name(name: str, what: str) -> str:
    """``name`` if it is safe as one path component (letters, digits, ``.``, ``_``, ``-``; no ``..``)."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        msg = (f"{what} must be letters, digits, '.', '_' or '-', starting with a letter or digit "
               f"(got {name!r})")
        raise UsageError(msg)
    return name


def safe_relative(name: object) -> bool:
    """Whether ``name`` is a plain relative POSIX path: no ``..``, ``.``, empty or absolute part."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    return not name.startswith("/") and all(p not in ("", ".", "..") for p in name.split("/"))


def check_inside(path: Path, root: Path, what: str) -> Path:
    """``path`` if it stays inside ``root`` once symlinks are resolved; else a UsageError."""
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        msg = f"{what}: {path} resolves to {real}, outside {root}; refusing to write there"
        raise UsageError(msg)
    return path


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path``; renamed onto ``path`` if the block succeeds, else removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with Path(tmp).open("rb+") as f:
            os.fsync(f.fileno())
        mode = path.stat().st_mode & 0o777 if path.is_file() and not path.is_symlink() else 0o644
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole: a temporary file, then a rename."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
