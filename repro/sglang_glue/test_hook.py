"""Test-only drafter hook: drafter rows [bs, L, V] with a controlled rank for the correct token.

Off by default. The patched DFLASH and DDTREE workers build it only when the environment
variable ``SGLANG_DDTREE_TEST_DRAFTER`` names a JSON file (written by ``repro.testmodels``)::

    {"successor": [V ints], "profile": "NAME" | {profile table}, "seed": 0}
    {"successor": [V ints], "rank_probs": [p0, p1, ...], "seed": 0}   # the "fixed" kind

``successor[t]`` is the planted target's greedy next token after ``t``: the target's greedy
continuation of a root ``r`` is ``succ(r), succ(succ(r)), ...``, so the correct token at depth
``d`` is ``c_d = succ^d(root)`` and acceptance is a pure function of the hook's rows.

**A row.** Each row (request b, depth d = 1..L) has a *level* k (its shape) and gives rank
``j < R`` the logit ``logits[k, j]`` (rank 0 is 0, a unique maximum; the values strictly decrease,
are exact in float32, bfloat16 and float16, and stop at -30), every other token -30. The correct
token ``c_d`` sits at rank ``j`` with probability ``law[k, j]`` (absent with the rest); decoys
``(c_d + 1 + j) mod V`` fill the other ranks.

**The draws.** Everything is a deterministic hash of (seed, root, prefix length, depth): two
24-bit uniforms per row (one for the level, one for the rank), identical on every TP rank, no
generator state. Levels follow a Markov chain along the block, so difficulty persists as text
difficulty does. The rank law has two rows per level: *on* the drafter's path (every earlier
correct token was its rank 0) and *off* it (the text has left the path the drafter expected).

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

DFLASH proposes each row's argmax (rank 0); DDTREE builds its tree from the same rows, so side
branches really get accepted. ``DrafterTestHook.logits`` is the torch reference (the spec);
``DrafterTestHook.rows`` writes the same values (and ``top1`` the argmax alone) in one Triton
launch on CUDA (``repro.kernels.hook_rows``: no host sync, no allocation when the outputs are
given, so capturable in a CUDA graph).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ENV_VAR = "SGLANG_DDTREE_TEST_DRAFTER"
PROFILES_PATH = Path(__file__).resolve().parents[1] / "data" / "drafter_profiles.toml"
OFF_LOGIT = -30.0
U_BITS = 24
"""Bits of each row's uniforms: a threshold ``ceil(cdf * 2**24)`` turns a CDF into integer compares."""
_MASK24 = (1 << U_BITS) - 1
# the row hash: an int64 of (root, prefix length, depth, seed), mixed twice (wraps mod 2^64)
ROOT_MULT, PREFIX_MULT, DEPTH_MULT, SEED_MULT = 1_000_003, 7_919, 104_729, 15_485_863
MIX_MULTS = (0x45D9F3B, 0x2C1B3C6D)
LEVEL_SALT = 0x2545F4914F6CDD1D
"""Added to the row hash's input for the level uniform (the rank uniform has none)."""
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


@dataclass(frozen=True)
class DrafterTestHook:
    """Controlled drafter rows [bs, L, V] for the planted target (see module docstring)."""

    successor: torch.Tensor  # [V] int64
    tables: HookTables
    seed: int
    horizon: int  # L
    profile: str = "default"
    powers: torch.Tensor = field(init=False, repr=False)  # [L, V] int32; powers[d-1, t] = succ^d(t)

    def __post_init__(self) -> None:
        succ = self.successor.to(torch.int32)
        rows, cur = [], succ
        for _ in range(self.horizon):
            rows.append(cur)
            cur = succ[cur.long()]
        object.__setattr__(self, "powers", torch.stack(rows).contiguous())

    @property
    def vocab_size(self) -> int:
        """V."""
        return self.successor.shape[0]

    @classmethod
    def from_env(cls, *, horizon: int, vocab_size: int, device: torch.device | str) -> DrafterTestHook:
        """Load the hook named by ``SGLANG_DDTREE_TEST_DRAFTER``; ValueError if it is malformed."""
        return cls.from_file(Path(os.environ[ENV_VAR]), horizon=horizon, vocab_size=vocab_size, device=device)

    @classmethod
    def from_file(
        cls, path: Path, *, horizon: int, vocab_size: int, device: torch.device | str
    ) -> DrafterTestHook:
        """Load a hook file; one ValueError naming the field for each malformed entry."""
        spec = json.loads(Path(path).read_text())
        succ = spec.get("successor")
        if not isinstance(succ, list) or len(succ) != vocab_size:
            got = len(succ) if isinstance(succ, list) else type(succ).__name__
            msg = f"{path}: 'successor' must list {vocab_size} token ids (got {got})"
            raise ValueError(msg)
        seed = spec.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 31:
            msg = f"{path}: 'seed' must be an integer in [0, 2^31) (got {seed!r})"
            raise ValueError(msg)
        name, profile = _hook_profile(spec, path)
        return cls.build(succ, profile, horizon=horizon, seed=seed, device=device, name=name, where=f"{path}: {name}")

    @classmethod
    def build(
        cls,
        successor: list[int] | torch.Tensor,
        profile: dict[str, Any],
        *,
        horizon: int,
        seed: int = 0,
        device: torch.device | str = "cpu",
        name: str = "inline",
        where: str = "profile",
    ) -> DrafterTestHook:
        """The hook for a successor table and a profile table (the TOML schema)."""
        succ = torch.as_tensor(successor, dtype=torch.int64).cpu()
        if succ.dim() != 1 or (succ.numel() and not 0 <= int(succ.min()) <= int(succ.max()) < succ.numel()):
            msg = f"{where}: 'successor' must hold token ids in [0, {succ.numel()})"
            raise ValueError(msg)
        tables = compile_profile(profile, vocab_size=succ.shape[0], where=where)
        return cls(succ.to(device), tables.to(device), seed, horizon, name)

    def correct_tokens(self, roots: torch.Tensor) -> torch.Tensor:
        """[bs, L] the planted target's greedy continuation of each root."""
        out, cur = [], roots.to(torch.int64)
        for _ in range(self.horizon):
            cur = self.successor[cur]
            out.append(cur)
        return torch.stack(out, 1)

    def levels(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L] int64 each row's level (its shape)."""
        return self._draw(roots, prefix_lens)[0]

    def ranks(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L] int64 rank of the correct token at each depth; R means absent."""
        return self._draw(roots, prefix_lens)[1]

    def logits(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, L, V] float32 rows for roots [bs] at committed lengths [bs]: the reference."""
        vocab, n_ranks = self.vocab_size, self.tables.ranks
        correct = self.correct_tokens(roots)  # [bs, L]
        level, rank = self._draw(roots, prefix_lens)
        j = torch.arange(n_ranks, device=roots.device)
        decoys = (correct[..., None] + 1 + j) % vocab  # [bs, L, R], never the correct token
        tokens = torch.where(j == rank[..., None], correct[..., None], decoys)
        out = torch.full((*correct.shape, vocab), OFF_LOGIT, dtype=torch.float32, device=roots.device)
        out.scatter_(2, tokens, self.tables.logits[level])
        return out

    def rows(
        self,
        roots: torch.Tensor,
        prefix_lens: torch.Tensor,
        out: torch.Tensor | None = None,
        top1_out: torch.Tensor | None = None,
        *,
        vocab_start: int = 0,
        vocab_end: int | None = None,
    ) -> torch.Tensor:
        """The rows' columns ``vocab_start:vocab_end`` [bs, L, W], equal to ``logits`` there.

        ``roots`` [bs] int64 (a strided view is fine), ``prefix_lens`` [bs] int32/int64. ``out``
        (float32, bfloat16 or float16, last dim contiguous; default float32) receives them;
        ``top1_out`` [bs, L] int64, if given, each whole row's argmax (the rank-0 token, a unique
        maximum). On CUDA one Triton launch, no host sync, no allocation when ``out`` is given
        (``REPRO_DDTREE_KERNELS=torch`` takes the reference; ``fused`` the kernel anywhere, CPU
        under TRITON_INTERPRET=1).
        """
        end = self.vocab_size if vocab_end is None else vocab_end
        bs = roots.shape[0]
        self._check_rows_args(roots, prefix_lens, out, top1_out, vocab_start, end)
        if out is None:
            out = torch.empty((bs, self.horizon, end - vocab_start), dtype=torch.float32, device=roots.device)
        if bs == 0:
            return out
        if _use_kernel(roots.device):
            from repro.kernels.hook_rows import hook_rows

            hook_rows(self, roots, prefix_lens, out, top1_out, vocab_start)
            return out
        full = self.logits(roots, prefix_lens)
        out.copy_(full[..., vocab_start:end])
        if top1_out is not None:
            top1_out.copy_(full.argmax(-1))
        return out

    def top1(self, roots: torch.Tensor, prefix_lens: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[bs, L] int64 each row's argmax (DFLASH's proposals) without writing the rows.

        The same path as ``rows`` (one launch of bs * L programs on CUDA); ``out`` receives it.
        """
        bs = roots.shape[0]
        self._check_rows_args(roots, prefix_lens, None, out, 0, self.vocab_size)
        if out is None:
            out = torch.empty((bs, self.horizon), dtype=torch.int64, device=roots.device)
        if bs == 0:
            return out
        if _use_kernel(roots.device):
            from repro.kernels.hook_rows import hook_rows

            hook_rows(self, roots, prefix_lens, None, out)
            return out
        return out.copy_(self.logits(roots, prefix_lens).argmax(-1))

    def _check_rows_args(
        self,
        roots: torch.Tensor,
        prefix_lens: torch.Tensor,
        out: torch.Tensor | None,
        top1_out: torch.Tensor | None,
        start: int,
        end: int,
    ) -> None:
        bs = roots.shape[0]
        if roots.dim() != 1 or roots.dtype != torch.int64 or prefix_lens.shape != (bs,):
            got = f"{roots.dtype} {tuple(roots.shape)}, {tuple(prefix_lens.shape)}"
            msg = f"rows: roots must be [bs] int64 and prefix_lens [bs] (got {got})"
            raise ValueError(msg)
        if prefix_lens.dtype not in (torch.int32, torch.int64):
            msg = f"rows: prefix_lens must be int32 or int64 (got {prefix_lens.dtype})"
            raise ValueError(msg)
        if not 0 <= start < end <= self.vocab_size:
            msg = f"rows: vocab_start:vocab_end must satisfy 0 <= start < end <= {self.vocab_size} (got {start}:{end})"
            raise ValueError(msg)
        want = (bs, self.horizon, end - start)
        if out is not None and (tuple(out.shape) != want or out.dtype not in ROW_DTYPES or out.stride(-1) != 1):
            got = f"{out.dtype} {tuple(out.shape)} strides {out.stride()}"
            msg = f"rows: out must be {list(want)} float32/bfloat16/float16 with a contiguous last dim (got {got})"
            raise ValueError(msg)
        if top1_out is not None and (tuple(top1_out.shape) != want[:2] or top1_out.dtype != torch.int64):
            msg = f"rows: top1_out must be {list(want[:2])} int64 (got {top1_out.dtype} {tuple(top1_out.shape)})"
            raise ValueError(msg)
        for name, t in (("prefix_lens", prefix_lens), ("out", out), ("top1_out", top1_out)):
            if t is not None and t.device != roots.device:
                msg = f"rows: {name} must be on {roots.device} like roots (got {t.device})"
                raise ValueError(msg)

    def _draw(self, roots: torch.Tensor, prefix_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(levels, ranks) [bs, L]: the level chain, then the correct ranks on / off the path."""
        u_level = self._uniforms(roots, prefix_lens, LEVEL_SALT)
        u_rank = self._uniforms(roots, prefix_lens, 0)
        level = torch.full_like(u_level[:, 0], self.tables.levels)  # the start row of level_thresholds
        off = torch.zeros_like(level)  # 1 once an earlier correct token was not rank 0
        levels, ranks = [], []
        for d in range(self.horizon):
            level = (u_level[:, d, None] >= self.tables.level_thresholds[level]).sum(-1)
            rank = (u_rank[:, d, None] >= self.tables.rank_thresholds[off, level]).sum(-1)
            off = off | (rank != 0).long()
            levels.append(level)
            ranks.append(rank)
        return torch.stack(levels, 1), torch.stack(ranks, 1)

    def _uniforms(self, roots: torch.Tensor, prefix_lens: torch.Tensor, salt: int) -> torch.Tensor:
        """[bs, L] int64 in [0, 2^24): each row's hash of (seed, root, prefix length, depth) + salt."""
        depth = torch.arange(1, self.horizon + 1, device=roots.device, dtype=torch.int64)
        h = roots.to(torch.int64)[:, None] * ROOT_MULT + prefix_lens.to(torch.int64)[:, None] * PREFIX_MULT
        h = h + depth * DEPTH_MULT + (self.seed * SEED_MULT + salt)
        for mult in MIX_MULTS:  # integer mixing (wraps mod 2^64, deterministic)
            h = (h ^ (h >> 16)) * mult
        return (h >> 20) & _MASK24


def _use_kernel(device: torch.device) -> bool:
    from repro.round import use_kernels  # the one place that picks kernels or torch

    return use_kernels(device, fits=True)


# ---- profiles -------------------------------------------------------------------------------


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


def _hook_profile(spec: dict[str, Any], path: Path) -> tuple[str, dict[str, Any]]:
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
