"""Typed access to the packaged TOML tables (``repro/data/``) that profiles and thresholds are
read from: every error is one UsageError naming the file, the table and the key."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.files import is_finite_number, read_toml


def data_file(name: str) -> Path:
    """The packaged ``repro/data/NAME``."""
    return Path(str(resources.files("repro") / "data" / name))


def packaged(name: str) -> dict[str, Any]:
    """The packaged TOML file ``repro/data/NAME``, read."""
    return read_toml(data_file(name), f"repro/data/{name}")


class Table:
    """Typed key access on one TOML table; every error names file, table and key."""

    def __init__(self, where: str, data: dict[str, Any], allowed: set[str]) -> None:
        self.where, self.data = where, data
        unknown = sorted(set(data) - allowed)
        if unknown:
            self.fail(unknown[0], f"is not a known key (known: {', '.join(sorted(allowed))})")

    def fail(self, key: str, problem: str) -> None:
        """Raise the UsageError of ``key``: ``FILE: TABLE: key 'KEY' PROBLEM``."""
        shown = f"'{key}'" if key.isprintable() else repr(key)  # a key with a newline stays on one line
        msg = f"{self.where}: key {shown} {problem}"
        raise UsageError(msg)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None, *,
            required: bool = False) -> Any:
        """``key``'s value of type ``kind`` (floats finite), else ``default`` (or an error if ``required``)."""
        if key not in self.data:
            if required:
                self.fail(key, "is required")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            self.fail(key, f"must be {names} (got {value!r})")
        if isinstance(value, float) and not is_finite_number(value):
            self.fail(key, f"must be a finite number (got {value!r})")
        return value

    def positive_int(self, key: str, default: int | None = None, *, required: bool = False) -> Any:
        """``key`` as an integer >= 1."""
        value = self.get(key, int, default, required=required)
        if value is not None and value < 1:
            self.fail(key, f"must be an integer >= 1 (got {value})")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None, *,
               required: bool = False) -> Any:
        """``key`` as one of ``choices``."""
        value = self.get(key, str, default, required=required)
        if value is not None and value not in choices:
            self.fail(key, f"must be one of {', '.join(choices)} (got {value!r})")
        return value
