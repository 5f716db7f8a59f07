"""What τ and the measured verify cost allow: DDTREE / DFLASH / AR tok/s on a full-size target.

    python -m verify.bench.round_bound docs/perf/verify_cost_qwen3-8b_h200_2026-12-02.json [--json]

Reads a ``verify/bench/verify_cost.py`` result (the target's forward GPU busy time against N at
each batch size) and the τ its drafter test hook gives by exact simulation
(``repro/data/drafter_profiles_fit.json``, the profile named by the target's
``repro/data/models/NAME.toml``). A round is one drafter forward plus one target verify; its
steady-state tokens per ms per request are τ / (drafter + verify(N)), with N = B + 1 for DDTREE
at budget B, the block size for DFLASH, and 1 for AR (τ = 1, no drafter). Host cost is left out:
this is the GPU-bound limit a served run approaches when the target's forward dominates.

The drafter's cost is taken at its weight bytes (its layers plus the target's LM head it reads)
over the HBM copy rate (``--copy-tb-s``, the device's measured rate); ``--drafter-ms 0`` gives the
lower end (a free drafter), and the τ ratio alone is the upper end (a free verify).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from repro.testmodels import fullsize
from repro.tuning.costs import interpolate

FIT = Path(__file__).resolve().parents[2] / "repro" / "data" / "drafter_profiles_fit.json"
COPY_TB_S = 4.20  # the H200's measured copy rate (docs/PERFORMANCE.md, fused top-K)


def drafter_ms(model: fullsize.FullSizeModel, copy_tb_s: float) -> float:
    """The drafter forward at its HBM floor: its own weights plus the target's LM head."""
    head = model.target["vocab_size"] * model.target["hidden_size"] * 2
    return (fullsize.weight_bytes(model.drafter) + head) / (copy_tb_s * 1e12) * 1e3


def _verify_ms(pts: list[tuple[float, float]], bs: int, n: int) -> float:
    """The verify cost at N, interpolated over the measured points of one batch size."""
    got = interpolate(pts, float(n))
    if got is None:
        msg = f"the verify-cost rows at bs {bs} do not reach N = {n} (they span {pts[0][0]:g}-{pts[-1][0]:g})"
        raise ValueError(msg)
    return got


def bound(result: dict[str, Any], taus: dict[str, float], block: int, draft_ms: float) -> list[dict[str, Any]]:
    """Per batch size: AR, DFLASH and every DDTREE budget of ``taus`` with their tokens per ms
    per request and their ratios to DFLASH and AR (the verify cost interpolated over N)."""
    out = []
    for bs in sorted({r["bs"] for r in result["rows"]}):
        pts = sorted((float(r["n"]), float(r["gpu_busy_ms"])) for r in result["rows"] if r["bs"] == bs)
        ar_ms, dflash_ms = _verify_ms(pts, bs, 1), draft_ms + _verify_ms(pts, bs, block)
        rows = [("AR", None, 1, 1.0, ar_ms), ("DFLASH", None, block, taus["dflash"], dflash_ms)]
        rows += [("DDTREE", b, b + 1, taus[str(b)], draft_ms + _verify_ms(pts, bs, b + 1))
                 for b in sorted(int(k) for k in taus if k != "dflash")]
        dflash = taus["dflash"] / dflash_ms
        out += [{"bs": bs, "algorithm": a, "budget": b, "n": n, "tau": t, "round_ms": ms, "tok_per_ms": t / ms,
                 "over_dflash": t / ms / dflash, "over_ar": t / ms * ar_ms} for a, b, n, t, ms in rows]
    return out


def _table(rows: list[dict[str, Any]], draft_ms: float) -> str:
    lines = [f"drafter {draft_ms:.2f} ms a round (at its HBM floor unless --drafter-ms)",
             "| bs | algorithm | N | tau | round ms | x DFLASH | x AR |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["algorithm"] + (f" B {r['budget']}" if r["budget"] else "")
        lines.append(f"| {r['bs']} | {name} | {r['n']} | {r['tau']:.2f} | {r['round_ms']:.2f} | "
                     f"{r['over_dflash']:.2f}x | {r['over_ar']:.2f}x |")
    for bs in sorted({r["bs"] for r in rows}):
        best = max((r for r in rows if r["bs"] == bs and r["algorithm"] == "DDTREE"), key=lambda r: r["tok_per_ms"])
        lines.append(f"bs {bs}: best budget {best['budget']}, {best['over_dflash']:.2f}x DFLASH, "
                     f"{best['over_ar']:.2f}x AR")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the bound of a verify_cost result as a Markdown table (or JSON); 2 on bad input."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("verify_cost", type=Path, help="a verify/bench/verify_cost.py JSON of a full-size target")
    p.add_argument("--drafter-ms", type=float, default=None, help="the drafter's cost a round (default: its HBM floor)")
    p.add_argument("--copy-tb-s", type=float, default=COPY_TB_S)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        result = json.loads(args.verify_cost.read_text())
        model = fullsize.load_model(result["model"])
        taus = json.loads(FIT.read_text())["profiles"][model.hook_profile]["check"]["tau"]
        block = int(model.drafter["block_size"])
        draft_ms = drafter_ms(model, args.copy_tb_s) if args.drafter_ms is None else args.drafter_ms
        rows = bound(result, taus, block, draft_ms)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"round_bound: {args.verify_cost}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"drafter_ms": draft_ms, "rows": rows}, indent=1) if args.json else _table(rows, draft_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
