"""Threshold sets (`repro/data/thresholds.toml`): the floors a profile's benchmarks are judged
against (``[sets.NAME]``, named by a profile's ``thresholds`` key), each bound with its source."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from repro.algorithms import ALGORITHMS
from repro.files import read_toml
from repro.serving.table import Table, data_file, packaged


@dataclass(frozen=True)
class ThresholdSet:
    """Floors one profile is judged against; a None bound is recorded but not judged."""

    name: str
    at_concurrency: int = 1
    at_temperature: float = 0.0
    at_budget: int | None = None  # DDTREE's judged budget; None: the profile's own
    tau_floor: dict[str, float] = field(default_factory=dict)
    tau_source: str = ""
    speedup_floor: dict[str, float] = field(default_factory=dict)
    speedup_source: str = ""
    tp_over_ep_min: float | None = None
    tp_over_ep_max: float | None = None
    tp_over_ep_source: str = ""


def _floor_table(t: Table, key: str) -> tuple[dict[str, float], str]:
    table = t.get(key, dict, default=None)
    if table is None:
        return {}, ""
    sub = Table(f"{t.where}.{key}", table, {*ALGORITHMS, "DDTREE-over-DFLASH", "source"})
    source = sub.get("source", str, required=True)
    floors = {k: float(sub.get(k, (int, float))) for k in table if k != "source"}
    return floors, source


def load_thresholds(path: str | Path | None = None) -> dict[str, ThresholdSet]:
    """Every ``[sets.*]`` table of ``path`` (default: the packaged ``thresholds.toml``)."""
    data = read_toml(Path(path), "--thresholds-file") if path else packaged("thresholds.toml")
    path = Path(path) if path else data_file("thresholds.toml")
    top = Table(str(path), data, {"sets", "stats"})
    sets = top.get("sets", dict, required=True)
    result = {}
    for name, table in sets.items():
        if not isinstance(table, dict):
            top.fail(f"sets.{name}", f"must be a table (got {table!r})")
        t = Table(f"{path}: set '{name}'", table, {"at", "tau-floor", "speedup-floor",
                                                      "tp-over-ep"})
        at = Table(f"{path}: set '{name}'.at", t.get("at", dict, default={}),
                    {"concurrency", "temperature", "budget"})
        tau, tau_source = _floor_table(t, "tau-floor")
        speedup, speedup_source = _floor_table(t, "speedup-floor")
        ratio = t.get("tp-over-ep", dict, default=None)
        ratio_t = Table(f"{path}: set '{name}'.tp-over-ep", ratio or {}, {"min", "max", "source"})
        lo, hi = ratio_t.get("min", (int, float)), ratio_t.get("max", (int, float))
        temperature = at.get("temperature", (int, float), default=0.0)
        if temperature < 0:
            at.fail("temperature", f"must be >= 0 (got {temperature})")
        result[name] = ThresholdSet(
            name=name, at_concurrency=at.positive_int("concurrency", default=1),
            at_temperature=float(temperature),
            at_budget=at.positive_int("budget"),
            tau_floor=tau, tau_source=tau_source, speedup_floor=speedup,
            speedup_source=speedup_source,
            tp_over_ep_min=None if lo is None else float(lo),
            tp_over_ep_max=None if hi is None else float(hi),
            tp_over_ep_source=ratio_t.get("source", str, "", required=ratio is not None),
        )
    return result
