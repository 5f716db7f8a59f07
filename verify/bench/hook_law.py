"""What the drafter test hook makes a served request accept: its rounds and tau, exactly.

    python -m verify.bench.hook_law RESULTS... [--models-dir MODELS] [--population]

A planted target decodes greedily by ``successor`` (its next token is a function of the last one),
and the hook's rows are a pure function of (seed, root, prefix length, depth)
(``repro.drafter_hook.hook``). So at T = 0 the rounds of a served request follow from its
prompt alone: the first token comes from the prefill; each round drafts from the last committed
token (the root) at the committed length minus one, accepts tau tokens (DFLASH: 1 + the leading
rows whose rank-0 token is the correct one; DDTREE: ``repro.ddtree``'s walk over the tree of the
same rows), and the request stops at ``max_new_tokens``. SGLang reports the rounds as
``spec_verify_ct`` and tau as completion tokens / rounds.

For every T = 0 DFLASH and DDTREE request of the bench files this compares the law's round count
with the served one: any difference means a served round accepted other than the law says (exit
1). Per cell it prints the served tau, the law's tau on the same requests (equal when nothing
differs), and with ``--population`` the law's tau over the whole prompt set: a bench of a few
prompts measures its prompts' tau, which can sit several percent from the set's (16 humaneval
prompts x 256 tokens: DFLASH 8.44 on the paper profile, against 8.00 over all 164).

Acceptance depends on the rows' ranks and logits only, not on the vocabulary, so the law builds
its trees over ``rank_rows``: the hook's rows over R + 1 tokens, the correct one token 0
(``test_hook_law`` checks them against the full rows at Qwen3's vocabulary). That holds while
no tree reaches a token the rows leave at -30 (their order among themselves is the vocabulary's):
with the calibrated profiles' 32 ranks no budget up to 512 does; ``round_lengths`` refuses a tree
that would.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from repro.ddtree import build_trees, walk
from repro.ddtree.types import NO_PARENT
from repro.drafter_hook.hook import ENV_VAR, DrafterTestHook
from repro.drafter_hook.profiles import OFF_LOGIT
from repro.errors import UsageError
from repro.evidence.prompts import load_prompts, request_input
from repro.evidence.results import Cell, completed, load_records
from repro.serving.profiles import model_path, models_dir

DEFAULT_MAX_PROMPT_TOKENS = 1024  # repro bench --max-prompt-tokens


def rank_rows(hook: DrafterTestHook, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """[n, L, R + 1] the hook's rows for ``roots`` at ``prefix_lens`` over R + 1 tokens: the correct
    token is 0 (at its drawn rank, or absent), the decoys 1 + j; the same logits by rank."""
    level, rank = hook.draws(roots, prefix_lens)
    n_ranks = hook.tables.ranks
    j = torch.arange(n_ranks)
    tokens = torch.where(j == rank[..., None], 0, 1 + j)
    out = torch.full((*rank.shape, n_ranks + 1), OFF_LOGIT, dtype=torch.float32)
    return out.scatter_(2, tokens, hook.tables.logits[level])


def round_lengths(hook: DrafterTestHook, roots: torch.Tensor, prefix_lens: torch.Tensor,
                  budget: int | None) -> torch.Tensor:
    """[n] tau of one round per (root, prefix length): DFLASH's chain (``budget`` None) or DDTREE's
    walk over the tree of ``budget`` nodes."""
    if budget is None:
        hits = (hook.ranks(roots, prefix_lens) == 0).long()
        return 1 + hits.cumprod(1).sum(1)
    rows = rank_rows(hook, roots, prefix_lens)
    tree = build_trees(rows, budget, torch.zeros_like(roots))
    node_logit = rows[torch.arange(rows.shape[0])[:, None], (tree.depths - 1).clamp(min=0), tree.tokens.clamp(min=0)]
    if bool(((tree.parents != NO_PARENT) & (node_logit == OFF_LOGIT)).any()):
        msg = (f"a tree of budget {budget} reaches tokens the hook's rows leave at {OFF_LOGIT:g}, whose order is "
               f"the vocabulary's: the law is not defined there (a profile with more ranks, or a smaller budget)")
        raise ValueError(msg)
    return walk(tree, torch.zeros_like(tree.tokens)).accept_len


def request_rounds(hook: DrafterTestHook, prompts: list[list[int]], max_new_tokens: int,
                   budget: int | None) -> list[int]:
    """The rounds each prompt's greedy request takes (SGLang's ``spec_verify_ct``)."""
    succ = hook.successor.cpu()
    last = torch.tensor([ids[-1] for ids in prompts], dtype=torch.int64)
    root = succ[last]  # the prefill's token
    prefix = torch.tensor([len(ids) for ids in prompts], dtype=torch.int64)
    made = torch.ones(len(prompts), dtype=torch.int64)
    rounds = torch.zeros(len(prompts), dtype=torch.int64)
    while bool((live := made < max_new_tokens).any()):
        tau = torch.minimum(round_lengths(hook, root[live], prefix[live], budget), max_new_tokens - made[live])
        moved = root[live]
        for step in range(int(tau.max())):
            moved = torch.where(tau > step, succ[moved], moved)
        root[live], prefix[live], made[live], rounds[live] = moved, prefix[live] + tau, made[live] + tau, rounds[live] + 1
    return rounds.tolist()


@dataclass(frozen=True)
class Served:
    """Where a profile's hook and prompts come from."""

    hook: DrafterTestHook
    prompts: list[list[int]]


def _served(run: dict[str, Any], profile_name: str, prompts: str, root: Path) -> Served:
    """The hook and the request prompts of ``profile_name`` as the bench run ``run`` served them."""
    profile = (run.get("profiles") or {}).get(profile_name)
    if not isinstance(profile, dict) or ENV_VAR not in (profile.get("env") or {}):
        msg = f"profile {profile_name!r} of the results serves no drafter test hook (${ENV_VAR})"
        raise UsageError(msg)
    hook_path = Path(profile["env"][ENV_VAR].replace("{models}", str(root)))
    target, drafter = model_path(profile["model"], root), model_path(profile["drafter"], root)
    for path in (hook_path, target / "config.json", drafter / "config.json"):
        if not path.exists():
            msg = f"{path} does not exist (write the test models: repro testmodels {root})"
            raise UsageError(msg)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    horizon = json.loads((drafter / "config.json").read_text())["block_size"] - 1
    hook = DrafterTestHook.from_file(hook_path, horizon=horizon, vocab_size=vocab, device="cpu")
    argv = run.get("argv") or []
    cut = int(argv[argv.index("--max-prompt-tokens") + 1]) if "--max-prompt-tokens" in argv else DEFAULT_MAX_PROMPT_TOKENS
    ids = [request_input(p, tokenizer=profile.get("tokenizer", "none"), vocab_size=vocab, max_tokens=cut)["input_ids"]
           for p in load_prompts(prompts).prompts]
    return Served(hook, ids)


def check(records: list[dict[str, Any]], root: Path, *, population: bool) -> tuple[list[dict[str, Any]], int]:
    """One row per T = 0 DFLASH / DDTREE cell (served tau, the law's, mismatching requests, and the
    prompt set's tau with ``population``) and the number of requests the law does not match."""
    runs = {r.get("session"): r for r in records if r.get("kind") == "run"}
    cells: dict[Cell, list[dict[str, Any]]] = {}
    for r in records:
        if completed(r) and r["cell"]["temperature"] == 0 and r["cell"]["algorithm"] != "AR":
            cells.setdefault(Cell(**r["cell"]), []).append(r)
    served: dict[tuple[str, str], Served] = {}  # by (profile, prompt set): one hook and prompt list each
    law: dict[tuple[str, str, int | None, int], list[int]] = {}
    rows, wrong = [], 0
    for cell in sorted(cells, key=lambda c: (c.profile, c.budget or 0, c.concurrency)):
        reqs = cells[cell]
        run = runs.get(reqs[0].get("session"))
        if run is None:
            msg = f"no run record for the session of {cell.label} c={cell.concurrency} (a results file cut short?)"
            raise UsageError(msg)
        if (cell.profile, cell.prompts) not in served:
            served[cell.profile, cell.prompts] = _served(run, cell.profile, cell.prompts, root)
        ctx = served[cell.profile, cell.prompts]
        memo = (cell.profile, cell.prompts, cell.budget, cell.max_new_tokens)
        if memo not in law:
            try:
                law[memo] = request_rounds(ctx.hook, ctx.prompts, cell.max_new_tokens, cell.budget)
            except ValueError as e:
                msg = f"{cell.profile} {cell.label}: {e}"
                raise UsageError(msg) from None
        counts = law[memo]
        mine = [counts[r["index"] % len(counts)] for r in reqs]  # the law's rounds of each request
        missed = [r["index"] for r, n in zip(reqs, mine, strict=True) if r.get("spec_verify_ct") != n]
        wrong += len(missed)
        taus = [r["tau"] for r in reqs if r.get("tau")]
        rows.append({
            "profile": cell.profile, "label": cell.label, "concurrency": cell.concurrency, "requests": len(reqs),
            "served_tau": statistics.fmean(taus) if taus else None,
            "law_tau": statistics.fmean(cell.max_new_tokens / n for n in mine),
            "mismatched": missed,
            "population_tau": statistics.fmean(cell.max_new_tokens / n for n in counts) if population else None,
            "population_prompts": len(counts),
        })
    return rows, wrong


def _checked(args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """:func:`check` of the files named, with their usage errors."""
    missing = [p for p in args.results if not p.exists()]
    if missing:
        msg = f"{missing[0]} does not exist"
        raise UsageError(msg)
    rows, wrong = check(load_records(args.results), models_dir(args.models_dir), population=args.population)
    if not rows:
        msg = "the results hold no T = 0 DFLASH or DDTREE request"
        raise UsageError(msg)
    return rows, wrong


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    """Print the law's check of every T = 0 speculative request; exit 1 on a mismatch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS", help="repro bench JSONL files")
    parser.add_argument("--models-dir", type=Path, default=None, help="the test models (repro testmodels DIR)")
    parser.add_argument("--population", action="store_true", help="also the law's tau over the whole prompt set")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    args = parser.parse_args(argv)
    try:
        rows, wrong = _checked(args)
    except UsageError as e:
        print(f"hook_law: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'profile':<20} {'cell':<13} {'c':>3} {'n':>4} {'served tau':>10} {'law tau':>8} "
              f"{'set tau':>8}  mismatched")
        for r in rows:
            print(f"{r['profile']:<20} {r['label']:<13} {r['concurrency']:>3} {r['requests']:>4} "
                  f"{_fmt(r['served_tau']):>10} {_fmt(r['law_tau']):>8} {_fmt(r['population_tau']):>8}  "
                  f"{len(r['mismatched']) or 'none'}")
        total = sum(r["requests"] for r in rows)
        print(f"{total - wrong} of {total} requests took exactly the law's rounds"
              + (f" (set tau over {rows[0]['population_prompts']} prompts)" if args.population else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
