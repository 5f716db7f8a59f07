"""Fitting the model on one-GPU measurements, and checking it against the ones it was not fitted on.

Two acceptance checks of the TP / EP model, each a function of measurement rows (so CPU tests run
them on synthetic data, and the real check runs on docs/perf):

- ``check_shares``: the per-GPU compute model, fitted on some (T, share) points of the one-GPU share
  measurements (verify/bench/share_cost.py: the fused-MoE layer of the ``k26-tp8`` and ``k26-ep8``
  shares; verify/bench/verify_cost.py: a share's whole forward), reproduces every held-out point
  within ``SHARE_TOLERANCE`` (10%).
- ``check_served``: its step time for one GPU (TP1 of a planted target: GPU time + host time fitted
  on some served cells) matches every other served round (``repro bench`` results) within
  ``SERVED_TOLERANCE`` (15%).

Inputs are plain rows: a share row ``{"share", "t", "experts", "pairs", "us"}`` (one MoE layer: the
experts and token-expert pairs the measured GPU read and ran), a forward row ``{"tokens",
"distinct", "ms"}`` and a served row ``{"algorithm", "budget", "concurrency", "round_ms"}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from repro.algorithms import AR, DFLASH
from repro.errors import UsageError
from repro.topology.compute import (
    BF16,
    ROOFLINE,
    Calibration,
    Drafter,
    MoeEfficiency,
    Target,
    _inverse,
    block_m,
    dense_us,
    drafter_work,
    fit_linear,
    fit_moe,
    forward_us,
    moe_layer_us,
    relative_errors,
    target_work,
)
from repro.topology.model import HostTime

SHARE_TOLERANCE = 0.10
SERVED_TOLERANCE = 0.15
SHARES = {  # the one-GPU shares of Kimi-K2.6 at 8 GPUs: (global experts, local experts, slice width)
    "k26-tp8": (384, 384, 256),
    "k26-ep8": (384, 48, 2048),
}
HIDDEN, TOPK = 7168, 8


@dataclass(frozen=True)
class Check:
    """A fit and its held-out errors."""

    name: str
    fitted: int
    held_out: list[dict[str, Any]]  # each point with "predicted", "measured", "error"
    tolerance: float

    @property
    def worst(self) -> float:
        """The largest |relative error| held out."""
        return max((abs(p["error"]) for p in self.held_out), default=0.0)

    @property
    def passed(self) -> bool:
        """Every held-out point within the tolerance."""
        return bool(self.held_out) and self.worst <= self.tolerance

    @property
    def within(self) -> int:
        """Held-out points within the tolerance."""
        return sum(abs(p["error"]) <= self.tolerance for p in self.held_out)

    def summary(self) -> str:
        """One line."""
        within = self.within
        return (f"{self.name}: {within} of {len(self.held_out)} held-out points within {self.tolerance:.0%} "
                f"(worst {self.worst:.1%}; fitted on {self.fitted})")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "fitted": self.fitted, "tolerance": self.tolerance, "worst": self.worst,
                "passed": self.passed, "held_out": self.held_out}


def share_point(row: dict[str, Any]) -> dict[str, float]:
    """A share row's expert bytes (each picked expert once), its pairs' FLOPs and, when SGLang's default
    config runs 64-row M tiles (block_m), their FLOPs padding included (``tiles64`` as recorded)."""
    try:
        _, local, width = SHARES[row["share"]]
        one = 3 * HIDDEN * width
        bm = block_m(int(row["t"]), local)
        pad = 2.0 * float(row.get("tiles64", row["pairs"] / 64)) * 64 * one if bm == 64 else 0.0
        return {"bytes": row["experts"] * one * BF16, "flops": 2.0 * row["pairs"] * one, "pad_flops": pad,
                "us": float(row["us"])}
    except (KeyError, TypeError) as exc:
        msg = f"a share row needs share ({'/'.join(SHARES)}), t, experts, pairs and us (got {row!r:.120}: {exc})"
        raise UsageError(msg) from None


def fit_share_moe(rows: list[dict[str, Any]], hbm_tb_s: float, tflops: float) -> MoeEfficiency:
    """The fused-MoE constants of one share's layer rows."""
    return fit_moe([share_point(r) for r in rows], hbm_tb_s, tflops)


def _predict_share(eff: MoeEfficiency, row: dict[str, Any], hbm_tb_s: float, tflops: float) -> float:
    pt = share_point(row)
    return (eff.fixed_us + pt["bytes"] / (eff.bw_eff * hbm_tb_s * 1e6) + pt["flops"] / (eff.flops_eff * tflops * 1e6)
            + pt["pad_flops"] / (eff.pad_eff * tflops * 1e6))


def check_shares(rows: list[dict[str, Any]], held_out: Callable[[dict[str, Any]], bool], hbm_tb_s: float,
                 tflops: float, tolerance: float = SHARE_TOLERANCE) -> list[Check]:
    """Per share (and spread): fit the MoE constants on the rows not ``held_out``, check the others."""
    out = []
    for share in sorted({r["share"] for r in rows}):
        mine = [r for r in rows if r["share"] == share]
        fit_rows = [r for r in mine if not held_out(r)]
        test_rows = [r for r in mine if held_out(r)]
        if len(fit_rows) < 3:
            msg = f"check_shares: {share} has {len(fit_rows)} rows to fit three constants on (need 3 or more)"
            raise UsageError(msg)
        eff = fit_share_moe(fit_rows, hbm_tb_s, tflops)
        points = []
        for r in test_rows:
            pred = _predict_share(eff, r, hbm_tb_s, tflops)
            points.append({**{k: r.get(k) for k in ("spread", "bs", "n", "t", "experts", "pairs")}, "predicted": pred,
                           "measured": r["us"], "error": relative_errors([pred], [r["us"]])[0]})
        out.append(Check(f"{share} MoE layer", len(fit_rows), points, tolerance))
    return out


def calibration_from_shares(rows: list[dict[str, Any]], gpu: str, hbm_tb_s: float, tflops: float,
                            base: Calibration = ROOFLINE) -> Calibration:
    """``base`` with the MoE constants fitted on every share row (narrow: k26-tp8, wide: k26-ep8)."""
    moe = dict(base.moe)
    for share, key in (("k26-tp8", "narrow"), ("k26-ep8", "wide")):
        mine = [r for r in rows if r["share"] == share]
        if len(mine) >= 3:
            moe[key] = fit_share_moe(mine, hbm_tb_s, tflops)
    return replace(base, device=gpu, moe=moe, source=f"MoE layer constants fitted on {len(rows)} one-GPU share rows ({gpu})")


def fit_layer_us(target: Target, points: Sequence[dict[str, Any]], cal: Calibration, hbm_tb_s: float, tflops: float,
                 spread: str = "planted") -> Calibration:
    """``cal`` (its MoE constants measured) with ``flops_eff`` and ``layer_us`` fitted on whole-forward rows."""
    fitted = fit_forward(target, points, hbm_tb_s, tflops, cal, spread, fit_moe_constants=False)
    return replace(fitted, source=f"{cal.source}; {fitted.source}")


def fit_forward(target: Target, points: Sequence[dict[str, Any]], hbm_tb_s: float, tflops: float,
                base: Calibration = ROOFLINE, spread: str = "planted", *, fit_moe_constants: bool = True) -> Calibration:
    """Constants fitted on a share's whole-forward rows: ``flops_eff`` (the non-expert GEMMs' roofline,
    searched), ``layer_us`` and, with ``fit_moe_constants``, the narrow MoE's bandwidth and FLOPs
    efficiency (least squares); ``dense_eff`` kept from ``base``. A dense target fits the first two."""
    works = [(target_work(target, "tp", 1, int(r["distinct"]), context=0, spread_kind=spread), r["ms"] * 1e3)
             for r in points]
    best: tuple[float, Calibration] | None = None
    for step in range(10, 101):
        cal = replace(base, flops_eff=step / 100, layer_us=0.0)
        rows = []
        for w, y in works:
            rest = dense_us(cal, w, hbm_tb_s, tflops)
            if fit_moe_constants and w.moe_layers:
                x = [float(w.layers), w.moe_layers * w.expert_bytes / (hbm_tb_s * 1e6),
                     w.moe_layers * w.expert_flops / (tflops * 1e6), w.moe_layers * w.expert_pad_flops / (tflops * 1e6)]
                rows.append((x, y - rest))
            else:
                moe = w.moe_layers * moe_layer_us(cal, w, hbm_tb_s, tflops) if w.moe_layers else 0.0
                rows.append(([float(w.layers)], y - rest - moe))
        coef = fit_linear(rows)
        layer_us = max(coef[0], 0.0)
        if len(coef) > 1:
            _, inv_bw, inv_f, inv_p = coef
            cal = replace(cal, moe={**base.moe, "narrow": MoeEfficiency(0.0, _inverse(inv_bw), _inverse(inv_f),
                                                                         _inverse(inv_p))})
        cal = replace(cal, layer_us=layer_us)
        err = sum(((forward_us(cal, w, hbm_tb_s, tflops) - y) / y) ** 2 for w, y in works)
        if best is None or err < best[0]:
            best = (err, cal)
    assert best is not None
    what = "flops_eff, layer_us and the 256-wide MoE" if fit_moe_constants and target.experts else "flops_eff and layer_us"
    return replace(best[1], source=f"{what} fitted on {len(works)} whole-forward rows of {target.name}")


def forward_ms(target: Target, cal: Calibration, tokens: int, hbm_tb_s: float, tflops: float,
               spread: str = "planted") -> float:
    """The model's whole-forward ms of a one-GPU share (no context: verify_cost's fresh requests)."""
    return forward_us(cal, target_work(target, "tp", 1, tokens, context=0, spread_kind=spread), hbm_tb_s, tflops) / 1e3


def check_forward(target: Target, points: list[dict[str, Any]], held_out: Callable[[dict[str, Any]], bool],
                  hbm_tb_s: float, tflops: float, *, base: Calibration = ROOFLINE,
                  tolerance: float = SHARE_TOLERANCE) -> tuple[Calibration, Check]:
    """Fit on the whole-forward rows not held out; the held-out rows' errors."""
    fit_rows = [r for r in points if not held_out(r)]
    cal = fit_forward(target, fit_rows, hbm_tb_s, tflops, base)
    held = []
    for r in points:
        if held_out(r):
            pred = forward_ms(target, cal, int(r["distinct"]), hbm_tb_s, tflops)
            held.append({"tokens": r["tokens"], "distinct": r["distinct"], "predicted": pred, "measured": r["ms"],
                         "error": (pred - r["ms"]) / r["ms"]})
    return cal, Check(f"{target.name} whole forward", len(fit_rows), held, tolerance)


def verify_cost_rows(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """(device, rows) of a verify_cost.py JSON of random tokens: tokens = bs x N, all distinct."""
    try:
        result = json.loads(path.read_text())
        rows = [{"tokens": r["bs"] * r["n"], "distinct": r["bs"] * r["n"], "bs": r["bs"], "n": r["n"],
                 "ms": float(r["gpu_busy_ms"])} for r in result["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        msg = f"{path}: not a verify_cost result ({type(exc).__name__}: {exc})"
        raise UsageError(msg) from None
    if result.get("tokens", "random") != "random":
        msg = f"{path}: its tokens are {result.get('tokens')!r}; the forward fit takes random (distinct) tokens"
        raise UsageError(msg)
    return str(result.get("device", "")), rows


def share_cost_rows(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """(device, rows) of a verify/bench/share_cost.py JSON."""
    try:
        result = json.loads(path.read_text())
        rows = list(result["rows"])
        for r in rows:
            share_point(r)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        msg = f"{path}: not a share_cost result ({type(exc).__name__}: {exc})"
        raise UsageError(msg) from None
    return str(result.get("device", "")), rows


# ---- host time and the served one-GPU round ------------------------------------------------------------


def served_gpu_ms(target: Target, drafter: Drafter | None, cal: Calibration, row: dict[str, Any], hbm_tb_s: float,
                  tflops: float, *, distinct: Callable[[dict[str, Any]], int], context: int = 1024) -> float:
    """The model's GPU ms of one served round at TP1: the verify of c x N tokens (the experts of the
    ``distinct`` ones: the planted router routes by token) and the drafter's forward (DFLASH / DDTREE)."""
    c = int(row["concurrency"])
    n = {AR: 1, DFLASH: drafter.block if drafter else 1}.get(row["algorithm"], int(row.get("budget") or 0) + 1)
    w = target_work(target, "tp", 1, c * n, context=context, requests=c, spread_kind="planted",
                    distinct=max(int(distinct(row)), 1))
    us = forward_us(cal, w, hbm_tb_s, tflops)
    if row["algorithm"] != AR and drafter is not None:
        us += forward_us(cal, drafter_work(drafter, target, 1, c, context=context), hbm_tb_s, tflops)
    return us / 1e3


def _tokens(row: dict[str, Any], block: int) -> int:
    """c x N of a served row (N: 1, the block, or B + 1)."""
    n = {AR: 1, DFLASH: block}.get(row["algorithm"], int(row.get("budget") or 0) + 1)
    return int(row["concurrency"]) * n


def fit_host(rows: list[dict[str, Any]], gpu_ms: Callable[[dict[str, Any]], float], block: int,
             *, per_root: bool = False) -> HostTime:
    """Host ms per algorithm: a base each (the mean of served round - the model's GPU time), and with
    ``per_root`` one ms per square root of the verified tokens shared by all (non-negative least
    squares; model.HostTime)."""
    algorithms = sorted({r["algorithm"] for r in rows})
    fit = [([1.0 * (r["algorithm"] == a) for a in algorithms] + ([math.sqrt(_tokens(r, block))] if per_root else []),
            r["round_ms"] - gpu_ms(r)) for r in rows]
    coef = fit_linear(fit, scale=[r["round_ms"] for r in rows])  # errors relative to the round
    slope = coef[-1] if per_root else 0.0
    ms = {a: (round(coef[i], 4), round(slope, 6)) for i, a in enumerate(algorithms)}
    return HostTime(ms, source=f"fitted on {len(rows)} served rounds")


def check_served(name: str, rows: list[dict[str, Any]], fit: Callable[[dict[str, Any]], bool],
                 gpu_ms: Callable[[dict[str, Any]], float], *, block: int, per_root: bool = False,
                 tolerance: float = SERVED_TOLERANCE) -> tuple[HostTime, Check]:
    """Fit host time on the ``fit`` rows; every other row's round against GPU + host."""
    host = fit_host([r for r in rows if fit(r)], gpu_ms, block, per_root=per_root)
    held = []
    for r in rows:
        if fit(r) or r["algorithm"] not in host.ms:
            continue
        pred = gpu_ms(r) + host.at(r["algorithm"], _tokens(r, block))
        held.append({"algorithm": r["algorithm"], "budget": r.get("budget"), "concurrency": r["concurrency"],
                     "predicted": pred, "measured": r["round_ms"], "gpu_ms": gpu_ms(r),
                     "error": (pred - r["round_ms"]) / r["round_ms"]})
    return host, Check(f"{name} served round", sum(fit(r) for r in rows), held, tolerance)


def served_rows(paths: Sequence[Path], profile: str, prompts: str | None = None) -> list[dict[str, Any]]:
    """Served rounds of ``profile`` at T 0 from bench results (repro.tuning.costs), latest file last wins;
    ``prompts`` keeps one prompt set's cells (the one-root humaneval cells at c > 1 decode in lockstep)."""
    from repro.evidence.results import load_records
    from repro.tuning.costs import cell_costs

    out: dict[tuple[str, int | None, int], dict[str, Any]] = {}
    for path in paths:
        records = load_records([path])
        if prompts is not None:
            records = [r for r in records if r.get("kind") != "request" or r["cell"]["prompts"] == prompts]
        for c in cell_costs(records, profile, 0.0):
            out[(c.algorithm, c.budget, c.concurrency)] = {"algorithm": c.algorithm, "budget": c.budget,
                                                           "concurrency": c.concurrency, "round_ms": c.round_ms,
                                                           "tau": c.tau, "file": path.name}
    return list(out.values())
