"""A DDTREE budget schedule: the tree budget B as a function of the running batch size.

A server takes one schedule; each round takes B from its batch size padded to the decode CUDA-graph
bucket it replays (the smallest captured batch size at or above it, the batch size itself when it
runs eagerly), then the largest key at or below that. Keys are batch sizes, values budgets; key 1
is required, so every batch size has a budget. Written ``1:63,4:31,16:15`` (the canonical text,
also the server flag's value), as JSON ``{"1": 63, "4": 31, "16": 15}`` or as a TOML table
``budget-schedule = { 1 = 63, 4 = 31, 16 = 15 }`` of a profile.

A fixed budget B is the schedule ``1:B``. Stdlib only: the SGLang worker, the profiles, `repro
tune` and the results all read this one module.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetSchedule:
    """Budgets by batch size: ``keys[i] <= bs < keys[i + 1]`` runs ``budgets[i]``."""

    keys: tuple[int, ...]  # ascending batch sizes, keys[0] == 1
    budgets: tuple[int, ...]  # the budget from each key on

    def __post_init__(self) -> None:
        if not self.keys or len(self.keys) != len(self.budgets):
            msg = f"a budget schedule needs one budget per key (got keys {self.keys}, budgets {self.budgets})"
            raise ValueError(msg)
        if self.keys[0] != 1 or list(self.keys) != sorted(set(self.keys)):
            msg = f"a budget schedule's batch sizes must be ascending distinct integers from 1 (got {list(self.keys)})"
            raise ValueError(msg)
        if any(b < 0 for b in self.budgets):
            msg = f"a budget schedule's budgets must be integers >= 0 (got {list(self.budgets)})"
            raise ValueError(msg)

    @classmethod
    def fixed(cls, budget: int) -> BudgetSchedule:
        """Budget ``budget`` at every batch size."""
        return cls((1,), (budget,))

    @classmethod
    def from_mapping(cls, table: Mapping[object, object]) -> BudgetSchedule:
        """From {batch size: budget}; keys may be strings of digits (JSON, TOML)."""
        pairs = []
        for key, value in table.items():
            size = _integer(key, "batch size")
            budget = _integer(value, f"budget of batch size {size}")
            pairs.append((size, budget))
        pairs.sort()
        if len({k for k, _ in pairs}) != len(pairs):
            msg = f"a budget schedule names a batch size twice (got {sorted(k for k, _ in pairs)})"
            raise ValueError(msg)
        if not pairs:
            msg = "a budget schedule needs at least the key 1 (got an empty one)"
            raise ValueError(msg)
        return cls(tuple(k for k, _ in pairs), tuple(b for _, b in pairs))

    @classmethod
    def parse(cls, text: str) -> BudgetSchedule:
        """From ``1:63,4:31,16:15`` or the JSON object ``{"1": 63, "4": 31}``; ValueError naming the problem."""
        text = text.strip()
        if text.startswith("{"):
            try:
                table = json.loads(text)
            except json.JSONDecodeError as exc:
                msg = f"a budget schedule in JSON must be an object of batch size: budget ({exc.msg})"
                raise ValueError(msg) from None
            if not isinstance(table, dict):
                msg = f"a budget schedule in JSON must be an object (got {text!r:.60})"
                raise ValueError(msg)
            return cls.from_mapping(table)
        table: dict[object, object] = {}
        for item in (part.strip() for part in text.split(",")):
            key, sep, value = item.partition(":")
            if not sep or key.strip() in table:
                msg = f"a budget schedule is BS:B pairs separated by commas, e.g. 1:63,4:31,16:15 (got {text!r:.60})"
                raise ValueError(msg)
            table[key.strip()] = value.strip()
        return cls.from_mapping(table)

    def budget(self, bs: int) -> int:
        """The budget of a round at (padded) batch size ``bs``: the largest key at or below it."""
        if bs < 1:
            msg = f"a batch size must be >= 1 (got {bs})"
            raise ValueError(msg)
        return self.budgets[bisect.bisect_right(self.keys, bs) - 1]

    def route(self, bs: int, captured: Sequence[int] = ()) -> int:
        """The budget of a round of ``bs`` requests on a server that captured ``captured`` batch
        sizes: ``bs`` padded to its graph bucket (unchanged when none holds it: eager)."""
        return self.budget(pad(bs, captured))

    @property
    def distinct(self) -> tuple[int, ...]:
        """The budgets it uses, ascending."""
        return tuple(sorted(set(self.budgets)))

    @property
    def max_budget(self) -> int:
        """The largest budget: what the server's KV reserve and eager buffers are sized for."""
        return max(self.budgets)

    @property
    def is_fixed(self) -> bool:
        """One budget at every batch size."""
        return len(set(self.budgets)) == 1

    def captured_for(self, budget: int, captured: Sequence[int]) -> list[int]:
        """The captured batch sizes whose rounds run ``budget``: its verify graphs' capture list."""
        return [b for b in captured if self.budget(b) == budget]

    def used(self, captured: Sequence[int]) -> tuple[int, ...]:
        """The budgets some captured batch size runs, ascending (all of them without graphs)."""
        return tuple(sorted({self.budget(b) for b in captured})) if captured else self.distinct

    def max_verify_tokens(self, captured: Sequence[int]) -> int:
        """The widest captured verify, max of bs x (B(bs) + 1): the shared logits buffer's rows."""
        return max(b * (self.budget(b) + 1) for b in captured)

    @property
    def text(self) -> str:
        """The canonical form, ``1:63,4:31,16:15`` (also the server flag's value)."""
        return ",".join(f"{k}:{b}" for k, b in zip(self.keys, self.budgets, strict=True))

    def as_json(self) -> str:
        """The JSON object form, ``{"1": 63, "4": 31}``."""
        return json.dumps({str(k): b for k, b in zip(self.keys, self.budgets, strict=True)})

    def toml(self) -> str:
        """The profile key, ``budget-schedule = { 1 = 63, 4 = 31 }``."""
        inner = ", ".join(f"{k} = {b}" for k, b in zip(self.keys, self.budgets, strict=True))
        return f"budget-schedule = {{ {inner} }}"

    def __str__(self) -> str:
        return self.text


def pad(bs: int, captured: Sequence[int]) -> int:
    """``bs`` padded to the smallest captured batch size at or above it (itself when none is)."""
    bigger = [b for b in captured if b >= bs]
    return min(bigger) if bigger else bs


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool):
        value = repr(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        msg = f"a budget schedule's {what} must be an integer (got {value!r:.40})"
        raise ValueError(msg)
    return value
