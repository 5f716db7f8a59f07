"""Drafter test-hook profiles: the TOML tables (``repro/data/drafter_profiles.toml``) and what
they compile to (``HookTables``: each level's logits, the correct rank's and the next level's
thresholds), read by ``repro.drafter_hook.hook.DrafterTestHook``.

**Profiles** (``repro/data/drafter_profiles.toml``, with the figures each was fitted to):

- ``fixed``: one level, rank j at logit -j for j < len(rank_probs), the correct rank drawn from
  ``rank_probs`` on and off the path. ``default`` (0.6 / 0.2 / 0.1) is the lossless tests' hook
  (DFLASH τ ≈ 2.5).
- ``calibrated``: a drafter that is sharp where the text is easy and flat where it is not, and
  knows it. A level has ``choices`` n: ranks 0..n-1 share its mass (logit -spread·j), then a
  ``gap`` and a tail falling ``slope`` per rank. A row keeps the previous row's level with
  probability ``stay``, else draws one by the levels' ``weight``. On the path the correct rank is
  drawn from the row's own softmax (calibrated), except that with the level's ``miss`` it is
  absent (confidently wrong: no tree recovers it). Off the path it is also absent with
  probability ``miss_off``: the drafter wrote the block's later rows for the continuation it
  expected (per-position marginals), so once the text departs they are right less often, which
  is what limits how deep a tree's side branches pay.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PROFILES_PATH = Path(__file__).resolve().parents[1] / "data" / "drafter_profiles.toml"
OFF_LOGIT = -30.0
U_BITS = 24
"""Bits of each row's uniforms: a threshold ``ceil(cdf * 2**24)`` turns a CDF into integer compares."""
ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KINDS = ("fixed", "calibrated")
_KEYS = {
    "fixed": {"rank_probs"},
    "calibrated": {"ranks", "spread", "gap", "slope", "stay", "miss_off", "levels"},
}
_COMMON_KEYS = {"kind", "name", "description", "fit", "sources"}  # documentation and the fit's targets
_LEVEL_KEYS = {"choices", "weight", "miss"}


@dataclass(frozen=True)
class HookTables:
    """A compiled profile: K levels, R ranks."""

    logits: torch.Tensor  # [K, R] float32; rank j's logit, OFF_LOGIT past the level's ranked tokens
    rank_thresholds: torch.Tensor  # [2, K, R] int64; on / off the path: correct rank = #(u >= t) (R: absent)
    level_thresholds: torch.Tensor  # [K + 1, K - 1] int64; level = #(u' >= t[previous]); row K: depth 1

    @property
    def levels(self) -> int:
        """K."""
        return self.logits.shape[0]

    @property
    def ranks(self) -> int:
        """R."""
        return self.logits.shape[1]

    def to(self, device: torch.device | str) -> HookTables:
        """The tables on ``device``."""
        return HookTables(*(t.to(device) for t in (self.logits, self.rank_thresholds, self.level_thresholds)))




def load_profiles(path: Path = PROFILES_PATH) -> dict[str, dict[str, Any]]:
    """The ``[profiles.NAME]`` tables of a drafter-profiles TOML file (unvalidated)."""
    with Path(path).open("rb") as f:
        data = tomllib.load(f)
    profiles = data.get("profiles")
    if not isinstance(profiles, dict):
        msg = f"{path}: needs [profiles.NAME] tables"
        raise ValueError(msg)
    return profiles


def named_profile(name: str, path: Path = PROFILES_PATH) -> dict[str, Any]:
    """Profile ``name``'s table as a hook file carries it inline: its parameters and its name."""
    known = load_profiles(path)
    if name not in known:
        msg = f"{path.name}: no profile {name!r} (known: {', '.join(sorted(known))})"
        raise ValueError(msg)
    return {"name": name} | {k: v for k, v in known[name].items() if k not in ("fit", "sources")}


def hook_profile(spec: dict[str, Any], path: Path) -> tuple[str, dict[str, Any]]:
    """(name, profile table) of a hook file: a named or inline profile, or bare rank_probs."""
    profile = spec.get("profile")
    if profile is None:
        if "rank_probs" not in spec:
            msg = f"{path}: needs 'profile' (a name of drafter_profiles.toml or a table) or 'rank_probs'"
            raise ValueError(msg)
        return "fixed", {"kind": "fixed", "rank_probs": spec["rank_probs"]}
    if isinstance(profile, str):
        known = load_profiles()
        if profile not in known:
            msg = f"{path}: 'profile' must name a profile of drafter_profiles.toml ({', '.join(sorted(known))}; got {profile!r})"
            raise ValueError(msg)
        return profile, named_profile(profile)
    if isinstance(profile, dict):
        return str(profile.get("name", "inline")), profile
    msg = f"{path}: 'profile' must be a profile name or a table (got {type(profile).__name__})"
    raise ValueError(msg)


def compile_profile(profile: dict[str, Any], *, vocab_size: int, where: str = "profile") -> HookTables:
    """The tables of a profile table (schema: drafter_profiles.toml)."""
    kind = profile.get("kind")
    if kind not in KINDS:
        msg = f"{where}: 'kind' must be one of {', '.join(KINDS)} (got {kind!r})"
        raise ValueError(msg)
    _check_keys(profile, _KEYS[kind] | _COMMON_KEYS, where)
    logits, laws, level_probs = (_fixed if kind == "fixed" else _calibrated)(profile, where)
    n_ranks = logits.shape[1]
    if n_ranks + 1 >= vocab_size:
        msg = f"{where}: needs fewer than {vocab_size - 1} ranks for a vocabulary of {vocab_size} (got {n_ranks})"
        raise ValueError(msg)
    _check_rows(logits, where)
    return HookTables(
        logits=logits.float(),
        rank_thresholds=_thresholds(laws.cumsum(-1)),
        level_thresholds=_thresholds(level_probs.cumsum(1)[:, :-1]),
    )


def _fixed(profile: dict[str, Any], where: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    probs = profile.get("rank_probs")
    if (not isinstance(probs, list) or not probs or not all(_is_number(p) for p in probs)
            or any(p < 0 for p in probs) or sum(probs) > 1 + 1e-9):
        msg = f"{where}: 'rank_probs' must be non-negative and sum to <= 1 (got {probs})"
        raise ValueError(msg)
    logits = -torch.arange(len(probs), dtype=torch.float64)[None, :]
    law = torch.tensor([probs], dtype=torch.float64)
    return logits, torch.stack([law, law]), torch.ones(2, 1, dtype=torch.float64)


def _calibrated(profile: dict[str, Any], where: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ranks = _number(profile, "ranks", where, lo=2, integer=True)
    spread = _number(profile, "spread", where, lo=0)
    gap = _number(profile, "gap", where, lo=0)
    slope = _number(profile, "slope", where, lo=0)
    stay = _number(profile, "stay", where, lo=0, hi=1)
    miss_off = _number(profile, "miss_off", where, lo=0, hi=1)
    levels = profile.get("levels")
    if not isinstance(levels, list) or not levels or not all(isinstance(lv, dict) for lv in levels):
        msg = f"{where}: 'levels' must be a non-empty list of tables (got {levels!r})"
        raise ValueError(msg)
    rows, weights, hits = [], [], []
    j = torch.arange(ranks, dtype=torch.float64)
    for i, level in enumerate(levels):
        at = f"{where}: levels[{i}]"
        _check_keys(level, _LEVEL_KEYS, at)
        choices = _number(level, "choices", at, lo=1, hi=ranks, integer=True)
        weights.append(_number(level, "weight", at, lo=0))
        hits.append(1 - _number(level, "miss", at, lo=0, hi=1))
        tail = -spread * (choices - 1) - gap - slope * (j - choices)
        rows.append(torch.where(j < choices, -spread * j, tail).clamp(min=OFF_LOGIT))
    if sum(weights) <= 0:
        msg = f"{where}: the levels' 'weight' must not all be 0"
        raise ValueError(msg)
    logits = torch.stack(rows).to(torch.bfloat16).double()  # exact in every row dtype
    on = torch.softmax(logits, 1) * torch.tensor(hits, dtype=torch.float64)[:, None]  # calibrated, less misses
    pi = torch.tensor(weights, dtype=torch.float64) / sum(weights)
    n = len(levels)
    next_level = stay * torch.eye(n, dtype=torch.float64) + (1 - stay) * pi[None, :]
    return logits, torch.stack([on, on * (1 - miss_off)]), torch.cat([next_level, pi[None, :]])


def _check_rows(logits: torch.Tensor, where: str) -> None:
    """Rank 0 at 0 is the unique maximum; the logits above OFF strictly decrease and are exact."""
    for k, row in enumerate(logits):
        on = row > OFF_LOGIT
        ok = row[0] == 0 and bool((row[~on] == OFF_LOGIT).all()) and bool((on[1:] <= on[:-1]).all())
        ok = ok and bool((row[on][1:] < row[on][:-1]).all())
        exact = all(torch.equal(row.to(dt).double(), row) for dt in ROW_DTYPES)
        if not (ok and exact):
            msg = (f"{where}: level {k}'s logits must start at 0, strictly decrease until {OFF_LOGIT} and be exact "
                   f"in bfloat16 and float16 (got {row.tolist()}); widen 'spread' or 'slope'")
            raise ValueError(msg)


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        msg = f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        raise ValueError(msg)


def _thresholds(cdf: torch.Tensor) -> torch.Tensor:
    """int64 thresholds t = ceil(cdf * 2^24): for a 24-bit u, u >= t exactly when u / 2^24 >= cdf."""
    return torch.ceil(cdf * float(1 << U_BITS)).to(torch.int64)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _number(
    table: dict[str, Any], key: str, where: str, *, lo: float, hi: float | None = None, integer: bool = False
) -> float:
    value = table.get(key)
    ok = _is_number(value) and value >= lo and (hi is None or value <= hi) and (not integer or value == int(value))
    if not ok:
        what = "an integer" if integer else "a number"
        bounds = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        msg = f"{where}: '{key}' must be {what} {bounds} (got {value!r})"
        raise ValueError(msg)
    return int(value) if integer else float(value)
