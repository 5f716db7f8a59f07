"""Reading acceptance recordings (:mod:`repro.recording`) and the tau they imply.

For a round whose accepted path holds node ids ``a_1 < a_2 < ...`` (root excluded), the tree of
any budget B' <= B is the first B' + 1 rows of the recorded tree, and the target's token at a node
depends only on the node's path, so the walk on the B' tree accepts exactly the path nodes with
id <= B': ``tau(B') = 1 + #(a_i <= B')`` (:func:`tau_at`). The DFLASH chain's tau on the same
rows is decided, or bounded, by the chain fields (:func:`chain_tau`). A server with a budget
schedule records each round at its own budget: tau(B') then comes from the rounds whose budget is
at least B' (a round of a smaller tree says nothing about a larger one).

Estimates average tau over recorded rounds, which is tokens per round of a decode at B' (a
decode's tau is total tokens over total rounds). Their 95% intervals treat each request as one
independent unit: rounds of one request share its prompt and context and are correlated, requests
are not. The estimator is the ratio sum(tau)/sum(rounds) over requests, with the linearised
(cluster) variance ``sum_i (y_i - R x_i)^2 / (n (n - 1) xbar^2)`` (Cochran, Sampling Techniques,
§6.3); a normal interval needs a few dozen requests to be honest.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from repro.errors import UsageError
from repro.files import parse_json, read_text
from repro.recording import HEADER, NO_PROMPTS, ROUND, SCHEMA

Z95 = 1.959964  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Round:
    """One request's round in a recording."""

    step: int
    req: str
    prompts: str
    bs: int
    path: tuple[int, ...]  # accepted node ids, root excluded, increasing
    rank0: tuple[int, ...] | None  # per path node: 1 if it holds its depth's rank-0 token
    chain: int | None  # depths of the all-rank-0 chain present in the tree
    budget: int | None = None  # the round's own budget (None: the recording's; a schedule runs several)
    graph: bool | None = None  # whether the round's verify replayed a CUDA graph (None: not recorded)


@dataclass
class Recording:
    """One recording: its header and its rounds, in file order."""

    rec: str
    algorithm: str
    budget: int
    horizon: int
    digest: str
    header: dict[str, Any]
    rounds: list[Round] = field(default_factory=list)


def tau_at(path: Sequence[int], budget: int) -> int:
    """Tau the tree of ``budget`` accepts on a round whose recorded path is ``path``."""
    return 1 + bisect.bisect_right(path, budget)


def chain_run(rank0: Sequence[int]) -> int:
    """Leading path nodes on the rank-0 chain."""
    run = 0
    while run < len(rank0) and rank0[run]:
        run += 1
    return run


def chain_tau(r: Round, horizon: int) -> tuple[int, int]:
    """(low, high) of the DFLASH chain's tau on the round's rows; equal when determined.

    With j leading path nodes on the chain: the chain accepts exactly j if the path left the
    chain after them (the target's token at node j is not the chain's), if the chain's next node
    is in the tree and was not accepted, or if j = L. Otherwise (the tree held the chain only j
    deep and the path ended there) the round is censored: 1 + j <= tau <= 1 + L.
    """
    assert r.rank0 is not None, "round recorded without chain fields"
    assert r.chain is not None, "round recorded without chain fields"
    j = chain_run(r.rank0)
    if j < len(r.path) or r.chain > j or j == horizon:
        return 1 + j, 1 + j
    return 1 + j, 1 + horizon


@dataclass(frozen=True)
class Estimate:
    """A tau estimate with its 95% interval over requests (the point when under 2 requests)."""

    value: float
    low: float
    high: float
    rounds: int
    requests: int

    def as_dict(self) -> dict[str, float | int]:
        """JSON-ready form."""
        return {"tau": self.value, "low": self.low, "high": self.high, "rounds": self.rounds,
                "requests": self.requests}


def ratio_estimates(y: np.ndarray, x: np.ndarray) -> list[Estimate]:
    """Estimates of sum(y)/sum(x) per column of ``y`` [requests, columns] over ``x`` [requests] (or
    [requests, columns]: each column its own denominators); a request with x = 0 in a column does
    not count there, and a column no request reaches is NaN."""
    x = np.broadcast_to(x[:, None] if x.ndim == 1 else x, y.shape)
    out = []
    for col in range(y.shape[1]):
        keep = x[:, col] > 0
        yc, xc = y[keep, col], x[keep, col]
        n, total_x = len(xc), float(xc.sum())
        if not n:
            out.append(Estimate(float("nan"), float("nan"), float("nan"), 0, 0))
            continue
        ratio = float(yc.sum()) / total_x
        half = 0.0 if n < 2 else Z95 * float(np.sqrt(((yc - ratio * xc) ** 2).sum() / (n * (n - 1)))) / (total_x / n)
        out.append(Estimate(ratio, ratio - half, ratio + half, int(total_x), n))
    return out


def _by_request(rounds: Sequence[Round]) -> dict[str, list[Round]]:
    out: dict[str, list[Round]] = {}
    for r in rounds:
        out.setdefault(r.req, []).append(r)
    return out


def budget_taus(rounds: Sequence[Round], budget: int) -> list[Estimate]:
    """Tau for every B' in 0..``budget`` (index B') over the ``rounds`` whose budget is at least B'."""
    groups = list(_by_request(rounds).values())
    y = np.zeros((len(groups), budget + 1))
    x = np.zeros((len(groups), budget + 1))
    for i, group in enumerate(groups):
        for r in group:
            reach = (budget if r.budget is None else min(r.budget, budget)) + 1  # B' < reach: subtrees of its tree
            counts = np.bincount(np.asarray(r.path, dtype=np.int64), minlength=budget + 1)[:reach]
            y[i, :reach] += 1 + np.cumsum(counts)  # 1 + #(ids <= B')
            x[i, :reach] += 1
    return ratio_estimates(y, x)


def budgets_run(rounds: Sequence[Round]) -> dict[int, int]:
    """{budget: rounds} of the rounds (one entry for a fixed-budget server)."""
    out: dict[int, int] = {}
    for r in rounds:
        if r.budget is not None:
            out[r.budget] = out.get(r.budget, 0) + 1
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class ChainEstimate:
    """DFLASH's tau on the recorded rows: censored rounds at their lower and upper bounds."""

    low: Estimate
    high: Estimate
    censored: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"low": self.low.value, "high": self.high.value, "ci_low": self.low.low,
                "ci_high": self.high.high, "censored": self.censored, "rounds": self.low.rounds}


def chain_estimate(rounds: Sequence[Round], horizon: int) -> ChainEstimate | None:
    """The chain's tau bounds over ``rounds``, or None if they carry no chain fields."""
    if not rounds or any(r.rank0 is None for r in rounds):
        return None
    groups = list(_by_request(rounds).values())
    y = np.zeros((len(groups), 2))
    x = np.zeros(len(groups))
    censored = 0
    for i, group in enumerate(groups):
        for r in group:
            low, high = chain_tau(r, horizon)
            y[i] += (low, high)
            censored += low != high
        x[i] = len(group)
    low, high = ratio_estimates(y, x)
    return ChainEstimate(low, high, censored)


def read_recordings(path: Path, what: str = "RECORDING") -> list[Recording]:
    """Every recording of a JSONL file, validated; any problem is one UsageError naming the line."""
    lines = read_text(path, what, "an acceptance recording (JSONL)").split("\n")
    recordings: dict[str, Recording] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = parse_json(line)
        except ValueError:
            if number == len(lines):  # a torn last line (no newline after it)
                break
            msg = f"{path}:{number}: not a JSON record"
            raise UsageError(msg) from None
        try:
            _add(data, recordings)
        except ValueError as exc:
            msg = f"{path}:{number}: {exc}"
            raise UsageError(msg) from None
    if not recordings:
        msg = f"{path}: holds no recording (no line of kind {HEADER!r}; see repro/recording.py)"
        raise UsageError(msg)
    return list(recordings.values())


def _need(data: dict[str, Any], key: str, kind: type, low: int | None = None) -> Any:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        msg = f"key {key!r} must be {kind.__name__} (got {value!r})"
        raise ValueError(msg)
    if low is not None and value < low:
        msg = f"key {key!r} must be >= {low} (got {value})"
        raise ValueError(msg)
    return value


def _add(data: Any, recordings: dict[str, Recording]) -> None:
    if not isinstance(data, dict) or data.get("kind") not in (HEADER, ROUND):
        msg = f"a record must be an object of kind {HEADER!r} or {ROUND!r}"
        raise ValueError(msg)
    rec = _need(data, "rec", str)
    if data["kind"] == HEADER:
        if data.get("schema") != SCHEMA:
            msg = f"schema {data.get('schema')!r} is not supported (this reader knows {SCHEMA})"
            raise ValueError(msg)
        recordings[rec] = Recording(rec, _need(data, "algorithm", str), _need(data, "budget", int, 0),
                                    _need(data, "horizon", int, 1), _need(data, "digest", str), data)
        return
    if rec not in recordings:
        msg = f"round of recording {rec!r} comes before that recording's header"
        raise ValueError(msg)
    owner = recordings[rec]
    owner.rounds.append(_round(data, owner))


def _round(data: dict[str, Any], owner: Recording) -> Round:
    path = tuple(_need(data, "path", list))
    budget = _need(data, "budget", int, 0) if "budget" in data else owner.budget
    if budget > owner.budget:
        msg = f"'budget' must be at most the recording's {owner.budget} (got {budget})"
        raise ValueError(msg)
    graph = data.get("graph")
    if graph is not None and not isinstance(graph, bool):
        msg = f"'graph' must be true or false (got {graph!r})"
        raise ValueError(msg)
    deepest = min(owner.horizon, budget)
    if any(isinstance(a, bool) or not isinstance(a, int) for a in path) or len(path) > deepest \
            or list(path) != sorted(set(path)) or (path and not 1 <= path[0] <= path[-1] <= budget):
        msg = f"'path' must be at most {deepest} increasing node ids in 1..{budget} (got {list(path)})"
        raise ValueError(msg)
    rank0, chain = data.get("rank0"), data.get("chain")
    if (rank0 is None) != (chain is None):
        msg = "'rank0' and 'chain' come together or not at all"
        raise ValueError(msg)
    if rank0 is not None:
        if not isinstance(rank0, list) or len(rank0) != len(path) or any(v not in (0, 1) for v in rank0):
            msg = f"'rank0' must be one 0/1 per path node ({len(path)}) (got {rank0!r})"
            raise ValueError(msg)
        run = chain_run(rank0)
        if isinstance(chain, bool) or not isinstance(chain, int) or not run <= chain <= deepest:
            msg = f"'chain' must be an integer in {run}..{deepest} (got {chain!r})"
            raise ValueError(msg)
        rank0 = tuple(rank0)
    return Round(step=_need(data, "step", int, 0), req=_need(data, "req", str),
                 prompts=data.get("prompts") or NO_PROMPTS, bs=_need(data, "bs", int, 1),
                 path=path, rank0=rank0, chain=chain, budget=budget, graph=graph)


def prompt_sets(recording: Recording) -> dict[str, list[Round]]:
    """Rounds per prompt set, plus ``"all"`` pooled when there are several."""
    sets: dict[str, list[Round]] = {}
    for r in recording.rounds:
        sets.setdefault(r.prompts, []).append(r)
    if len(sets) > 1:
        sets["all"] = list(recording.rounds)
    return sets
