"""The rows of ``experiments.toml``: one GPU experiment each, validated on load.

A row is a table ``[experiments.NAME]`` with a ``kind`` (what it runs, :data:`KINDS`), an ``about``
line and the keys that kind takes (:data:`KEYS`); ``extends = "OTHER"`` starts from another row's
keys. Every mistake is one :class:`~repro.errors.UsageError` naming the file, the row and the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.files import check_name, read_toml
from repro.schedule import BudgetSchedule

EXPERIMENTS = Path(__file__).with_name("experiments.toml")

_BENCH = {"profiles", "algorithms", "budgets", "schedules", "concurrency", "request-rates", "temperatures",
          "prompts", "num-prompts", "max-new-tokens", "warmup", "side-by-side", "kv-cap", "profile-variants",
          "record", "time-limit", "start-timeout"}
_RUN = {"gpus", "env", "stack", "timeout", "needs", "dir"}
KINDS: dict[str, set[str]] = {
    "setup": {"target"},  # the stack and models ready, the GPU described, the MoE share's router spread
    "doctor": set(),  # install twice, doctor, patch, doctor, in a site of its own
    "greedy": {"target", "select"},
    "cost": {"target", "batch-sizes"},
    "busy": {"profiles", "algorithms", "concurrency", "max-new-tokens", "with-stack", "settle", "kv-cap",
             "side-by-side", "profile-variants"},
    "bench": _BENCH,
    "tune": {"profiles", "results-from", "fit", "holdout", "prompts", "confirm"},
    "report": {"inputs"},
    "pytest": {"tests", "args", "parallel"},
    "module": {"module", "args"},
    "ncu": {"module", "kernels"},
}


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


def _ints(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in v)


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


def _env(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _tables(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, dict) for x in v.values())


def _schedules(v: Any) -> bool:
    if not _strings(v):
        return False
    try:
        for text in v:
            BudgetSchedule.parse(text)
    except ValueError:
        return False
    return True


# key -> (check, what it must be)
KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "kind": (lambda v: v in KINDS, f"one of {', '.join(KINDS)}"),
    "about": (_text, "a non-empty string"),
    "extends": (_text, "a row name"),
    "dir": (_text, "a folder name"),
    "target": (_text, "a full-size model name"),
    "profiles": (lambda v: _strings(v) and bool(v), "a non-empty list of profile names"),
    "algorithms": (lambda v: _strings(v) and bool(v), "a non-empty list of algorithm names"),
    "budgets": (_ints, "a non-empty list of integers >= 0"),
    "schedules": (_schedules, 'a list of budget schedules such as "1:63,4:31,16:15"'),
    "concurrency": (lambda v: _ints(v) and min(v) >= 1, "a non-empty list of integers >= 1"),
    "request-rates": (lambda v: _numbers(v) and min(v) > 0, "a non-empty list of numbers > 0"),
    "temperatures": (_numbers, "a non-empty list of numbers >= 0"),
    "prompts": (_text, 'a prompt set name, or "served-round" (planted token ids)'),
    "num-prompts": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
    "max-new-tokens": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
    "warmup": (_count, "an integer >= 0"),
    "side-by-side": (_flag, "true or false"),
    "kv-cap": (lambda v: _count(v) and v >= 1, "an integer >= 1 (KV-cache tokens a server)"),
    "profile-variants": (_tables, "a table of profile tables"),
    "record": (_flag, "true or false"),
    "time-limit": (_positive, "seconds > 0"),
    "start-timeout": (_positive, "seconds > 0"),
    "timeout": (_positive, "seconds > 0"),
    "needs": (_positive, "seconds > 0"),
    "gpus": (_text, "a CUDA_VISIBLE_DEVICES value"),
    "env": (_env, "a table of strings"),
    "stack": (_flag, "true or false"),
    "select": (_strings, "a list of test-id parts (AR, DDTREE, DDTREE-B512)"),
    "batch-sizes": (lambda v: _ints(v) and min(v) >= 1, "a non-empty list of integers >= 1"),
    "with-stack": (_flag, "true or false"),
    "settle": (_positive, "seconds > 0"),
    "results-from": (_text, "a bench row's name"),
    "fit": (_ints, "a non-empty list of budgets"),
    "holdout": (_ints, "a non-empty list of budgets"),
    "confirm": (_flag, "true or false (measure the recommended budgets the source did not serve)"),
    "inputs": (lambda v: _strings(v) and bool(v), "a non-empty list of row names"),
    "tests": (lambda v: _strings(v) and bool(v), "a non-empty list of test paths"),
    "args": (_strings, "a list of strings"),
    "parallel": (_flag, "true or false"),
    "module": (_text, "a dotted module name"),
    "kernels": (_text, "a kernel-name regex"),
}
STACK_KINDS = {"setup", "greedy", "cost", "busy", "bench", "pytest"}  # kinds that run on the installed SGLang


@dataclass(frozen=True)
class Row:
    """One experiment: its name, kind and keys (``extends`` resolved)."""

    name: str
    kind: str
    about: str
    keys: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a TOML key of the row), else ``default``."""
        return self.keys.get(key, default)

    @property
    def dir(self) -> str:
        """Its results folder under the build folder (``dir``, default the row's name)."""
        return self.keys.get("dir", self.name)

    @property
    def stack(self) -> bool:
        """Whether it runs on the installed, patched SGLang (the setup first): the serving kinds, and a tune
        row that confirms its picks (it starts servers)."""
        return self.keys.get("stack", self.kind in STACK_KINDS or (self.kind == "tune" and bool(self.get("confirm"))))


def _fail(where: str, name: str, problem: str) -> UsageError:
    return UsageError(f"{where}: experiment '{name}': {problem}")


def _resolve(name: str, tables: dict[str, Any], where: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    table = tables[name]
    if not isinstance(table, dict):
        raise _fail(where, name, f"must be a table (got {table!r})")
    parent = table.get("extends")
    if parent is None:
        return dict(table)
    if parent not in tables:
        raise _fail(where, name, f"key 'extends' names no experiment (got {parent!r})")
    if parent in (*seen, name):
        raise _fail(where, (*seen, name)[0], f"key 'extends' makes a cycle ({' -> '.join((*seen, name, parent))})")
    merged = {k: v for k, v in _resolve(parent, tables, where, (*seen, name)).items() if k != "about"}
    return {**merged, **{k: v for k, v in table.items() if k != "extends"}}


def _row(name: str, table: dict[str, Any], where: str) -> Row:
    try:
        check_name(name, "name")
    except UsageError as exc:
        raise _fail(where, name, str(exc)) from None
    for key in ("kind", "about"):
        if key not in table:
            raise _fail(where, name, f"key '{key}' is required")
    for key, value in table.items():
        if key not in KEYS:
            raise _fail(where, name, f"key '{key}' is not a known key")
        check, expected = KEYS[key]
        if not check(value):
            raise _fail(where, name, f"key '{key}' must be {expected} (got {value!r})")
    kind = table["kind"]
    allowed = KINDS[kind] | _RUN | {"kind", "about"}
    extra = sorted(set(table) - allowed)
    if extra:
        raise _fail(where, name, f"key '{extra[0]}' does not apply to kind '{kind}' "
                                 f"(its keys: {', '.join(sorted(KINDS[kind] | _RUN))})")
    return Row(name, kind, table["about"], {k: v for k, v in table.items() if k not in ("kind", "about")})


def _check_links(rows: dict[str, Row], where: str) -> None:
    """``results-from`` names a bench row, ``inputs`` rows that write results; required keys set."""
    required = {"greedy": ("target",), "cost": ("target",), "busy": ("profiles",), "bench": ("profiles",),
                "tune": ("profiles", "results-from"), "report": ("inputs",), "pytest": ("tests",),
                "module": ("module",), "ncu": ("module", "kernels")}
    for row in rows.values():
        for key in required.get(row.kind, ()):
            if key not in row.keys:
                raise _fail(where, row.name, f"key '{key}' is required for kind '{row.kind}'")
        source = row.get("results-from")
        if source is not None and (source not in rows or rows[source].kind != "bench"):
            raise _fail(where, row.name, f"key 'results-from' must name a bench experiment (got {source!r})")
        for name in row.get("inputs", []):
            if name not in rows or rows[name].kind not in ("bench", "tune", "cost"):
                raise _fail(where, row.name, f"key 'inputs' must name bench, tune or cost experiments (got {name!r})")
        if row.kind == "bench" and row.get("side-by-side") and row.get("kv-cap") is None:
            raise _fail(where, row.name, "key 'kv-cap' is required with side-by-side (servers started "
                                         "together share the GPU's memory)")


def load_rows(path: Path = EXPERIMENTS) -> dict[str, Row]:
    """Every experiment of ``path``, validated, in file order."""
    where = str(path)
    data = read_toml(path, "experiments file")
    if set(data) != {"experiments"} or not isinstance(data["experiments"], dict):
        msg = f"{where}: must hold [experiments.NAME] tables only (got keys {sorted(data)})"
        raise UsageError(msg)
    tables = data["experiments"]
    rows = {name: _row(name, _resolve(name, tables, where), where) for name in tables}
    _check_links(rows, where)
    return rows
