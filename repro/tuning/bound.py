"""What τ and the measured verify cost allow: AR, DFLASH and DDTREE tok/s when the GPU bounds them.

Input: a ``verify/bench/verify_cost.py`` result for a full-size planted target (its forward's
GPU busy time against N tokens per request, at each batch size) and the τ its drafter test hook
gives by exact simulation (``repro/data/drafter_profiles_fit.json``, the hook profile of
``repro/data/models/NAME.toml``). A round is one drafter forward plus one target verify, so its
steady-state tokens per ms per request are τ / (drafter + verify(N)): N = B + 1 for DDTREE at
budget B, the block size for DFLASH, 1 for AR (τ = 1, no drafter). Host cost is left out: this is
the limit a served run approaches when the target's forward dominates the round. The drafter's
cost is its weight bytes (its layers plus the target's LM head, which it reads) over the HBM copy
rate; 0 gives the lower end of the bound, and the τ ratio alone is its upper end (a free verify).

``repro report --verify-cost JSON`` prints it beside the measured ratios of the same target.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.algorithms import AR, DDTREE, DFLASH
from repro.errors import UsageError
from repro.evidence.prompts import DISTINCT
from repro.tuning.costs import interpolate

if TYPE_CHECKING:
    from repro.testmodels.fullsize import FullSizeModel

COPY_TB_S = 4.20
"""The H200's measured HBM copy rate, TB/s (docs/PERFORMANCE.md, fused top-K)."""
TOKENS = {  # verify_cost's inputs (its "tokens"), as the section names them
    "random": "random tokens: on an MoE target an upper bound for a tree, whose tokens repeat",
    "tree": "each request's tokens the tree the hook drafts",
    "tree-one-root": ("each request's tokens the tree the hook drafts on a humaneval prompt: every one ends on "
                      "the same token, so at bs > 1 the trees share their root (on an MoE target they read fewer "
                      "experts than distinct requests would)"),
}


def drafter_ms(model: FullSizeModel, copy_tb_s: float = COPY_TB_S) -> float:
    """The drafter forward at its HBM floor: its own weights plus the target's LM head."""
    from repro.testmodels import fullsize  # torch: only when a verify-cost result is read

    head = model.target["vocab_size"] * model.target["hidden_size"] * 2
    return (fullsize.weight_bytes(model.drafter) + head) / (copy_tb_s * 1e12) * 1e3


def verify_ms(points: list[tuple[float, float]], bs: int, n: int) -> float:
    """The verify cost at N, interpolated over the measured (N, ms) points of one batch size."""
    got = interpolate(points, float(n))
    if got is None:
        msg = f"the verify-cost rows at bs {bs} do not reach N = {n} (they span {points[0][0]:g}-{points[-1][0]:g})"
        raise ValueError(msg)
    return got


def bound(rows: list[dict[str, Any]], taus: dict[str, float], block: int, draft_ms: float) -> list[dict[str, Any]]:
    """Per batch size: AR, DFLASH and every DDTREE budget of ``taus`` with the round's cost, the
    tokens per ms per request and the ratios to DFLASH and AR (verify cost interpolated over N)."""
    out = []
    for bs in sorted({r["bs"] for r in rows}):
        pts = sorted((float(r["n"]), float(r["gpu_busy_ms"])) for r in rows if r["bs"] == bs)
        ar_ms, dflash_ms = verify_ms(pts, bs, 1), draft_ms + verify_ms(pts, bs, block)
        cells = [(AR, None, 1, 1.0, ar_ms), (DFLASH, None, block, taus["dflash"], dflash_ms)]
        cells += [(DDTREE, b, b + 1, taus[str(b)], draft_ms + verify_ms(pts, bs, b + 1))
                  for b in sorted(int(k) for k in taus if k != "dflash")]
        dflash = taus["dflash"] / dflash_ms
        out += [{"bs": bs, "algorithm": a, "budget": b, "n": n, "tau": t, "round_ms": ms, "tok_per_ms": t / ms,
                 "over_dflash": t / ms / dflash, "over_ar": t / ms * ar_ms} for a, b, n, t, ms in cells]
    return out


def allowed(path: Path, copy_tb_s: float = COPY_TB_S) -> dict[str, Any]:
    """The bound of one verify_cost JSON: its target, the drafter's cost and the rows of
    :func:`bound`; a UsageError (one line) for a file that is not a full-size target's result."""
    from repro.testmodels import fullsize

    try:
        result = json.loads(path.read_text())
        model = fullsize.load_model(result["model"])
        fit = json.loads(resources.files("repro.data").joinpath("drafter_profiles_fit.json").read_text())
        taus = fit["profiles"][model.hook_profile]["check"]["tau"]
        draft = drafter_ms(model, copy_tb_s)
        rows = bound(result["rows"], taus, int(model.drafter["block_size"]), draft)
    except (OSError, ValueError, KeyError, TypeError) as e:
        msg = f"--verify-cost: {path} is not a verify_cost result of a full-size target ({type(e).__name__}: {e})"
        raise UsageError(msg) from None
    return {"model": model.name, "file": str(path), "device": result.get("device"), "drafter_ms": draft,
            "hook_profile": model.hook_profile, "rows": rows, "cost_rows": result["rows"],
            "tokens": _tokens(result)}


def _tokens(result: dict[str, Any]) -> str:
    """Which tokens a verify_cost result's costs are of (a TOKENS key): its trees grew from one root
    at every batch size unless drafted on prompts of their own (``humaneval-distinct``)."""
    tokens = result.get("tokens", "random")
    return "tree-one-root" if tokens == "tree" and result.get("prompts") != DISTINCT else tokens


def served_round_ms(summary: Any) -> float | None:
    """A served cell's steady round: c x τ (1 for AR) over its decode tok/s, in ms."""
    tau = 1.0 if summary.cell.algorithm == AR else summary.tau_mean
    if tau is None or not summary.decode_tok_s:
        return None
    return summary.cell.concurrency * tau * 1e3 / summary.decode_tok_s


def _matches(section: dict[str, Any], prompts: str) -> bool:
    """Whether cells served on ``prompts`` batch requests as the section's verify cost does."""
    return (prompts == DISTINCT) != (section["tokens"] == "tree-one-root")


def add_measured(section: dict[str, Any], summaries: list[Any], models: dict[str, str]) -> None:
    """Beside each bound row, the served round and the measured ratio over DFLASH at concurrency =
    bs, T = 0, from the bench summaries of profiles serving this target (``models``: profile name ->
    model name): the summaries' side-by-side ratios (``results.summarize``). A cell served on several
    prompt sets is taken from the one whose batches the verify cost's tokens match: humaneval-distinct
    (each request its own last token), unless the cost's trees shared one root."""
    chosen: dict[tuple[str, int | None, int], Any] = {}
    for s in summaries:
        c = s.cell
        if models.get(c.profile) != section["model"] or c.temperature != 0:
            continue
        key = (c.algorithm, c.budget, c.concurrency)
        if key not in chosen or (_matches(section, c.prompts) and not _matches(section, chosen[key].cell.prompts)):
            chosen[key] = s
    over: dict[tuple[str, int | None, int], float | None] = {}
    served = {key: served_round_ms(s) for key, s in chosen.items()}
    for (algorithm, budget, c), s in chosen.items():
        if algorithm == AR:
            continue
        over[(algorithm, budget, c)] = 1.0 if algorithm == DFLASH else s.over_dflash
        if algorithm == DFLASH and s.speedup:  # over AR, so AR over DFLASH is its inverse
            over[(AR, None, c)] = 1 / s.speedup
    for row in section["rows"]:
        key = (row["algorithm"], row["budget"], row["bs"])
        row["measured_over_dflash"], row["served_round_ms"] = over.get(key), served.get(key)
        row["served_prompts"] = chosen[key].cell.prompts if key in chosen else None


def markdown(section: dict[str, Any]) -> list[str]:
    """A target's table: the bound and, where measured, the served ratio and its share of the bound."""
    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    out = [f"### {section['model']}", "",
           (f"From `{section['file']}` ({section['device']}, {TOKENS[section['tokens']]}); "
            f"τ of hook profile `{section['hook_profile']}`; "
            f"drafter {section['drafter_ms']:.2f} ms a round (its HBM floor)."), "",
           ("| bs | algorithm | N | τ | round ms | served round ms (c = bs, T 0) | allowed x DFLASH | allowed x AR "
            "| measured x DFLASH (c = bs, T 0) | measured / allowed |"), "|---|---|---|---|---|---|---|---|---|---|"]
    batched = [r for r in section["rows"] if r["bs"] > 1 and r.get("served_prompts")]  # bs 1: no batch to differ
    others = sorted({r["served_prompts"] for r in batched if not _matches(section, r["served_prompts"])})
    mixed = bool(others) and any(_matches(section, r["served_prompts"]) for r in batched)
    for r in section["rows"]:
        name = r["algorithm"] + (f" B {r['budget']}" if r["budget"] else "")
        got = r.get("measured_over_dflash")
        share = "-" if got is None or r["algorithm"] != DDTREE else f"{got / r['over_dflash']:.0%}"
        mark = " †" if mixed and r in batched and r["served_prompts"] in others else ""
        out.append(f"| {r['bs']} | {name} | {r['n']} | {r['tau']:.2f} | {r['round_ms']:.2f} | "
                   f"{ms(r.get('served_round_ms'))}{mark} | {ratio(r['over_dflash'])} | {ratio(r['over_ar'])} | "
                   f"{ratio(got)}{mark} | {share} |")
    out.append("\nround ms: the bound's (drafter floor + verify at N); served: c x τ over the cell's steady decode "
               "tok/s, host time and the served verify path included. A measured / allowed above 100% means "
               "DFLASH's served round sits further above its bound than DDTREE's.")
    if mixed:
        out.append(f"\n†: served on {', '.join(f'`{p}`' for p in others)} only, whose batches differ from the "
                   "verify cost's (its ratio is over DFLASH on the same prompts).")
    for bs in sorted({r["bs"] for r in section["rows"]}):
        best = max((r for r in section["rows"] if r["bs"] == bs and r["algorithm"] == DDTREE),
                   key=lambda r: r["tok_per_ms"])
        out.append(f"\nbs {bs}: the bound's best budget is {best['budget']}, {best['over_dflash']:.2f}x DFLASH "
                   f"and {best['over_ar']:.2f}x AR.")
    return out
