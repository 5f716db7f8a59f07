"""`repro demo`: an end-to-end DDTree decode on the CPU with the built-in toy target and drafter.

Prints the first rounds' trees, tau per budget (checked token-for-token against plain
autoregressive decoding) and the time the tree steps take. Needs no GPU and no download.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from repro.errors import UsageError

if TYPE_CHECKING:
    from repro.recording import Recorder
    from repro.toy import ToyDrafter, ToyRound

DEFAULT_BUDGETS = "0,1,4,16,64,256"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `repro demo`."""
    parser.add_argument("--budgets", default=DEFAULT_BUDGETS, help="comma-separated tree budgets B (default %(default)s)")
    parser.add_argument("--batch", type=int, default=4, help="requests decoded together (default %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0, help="target sampling temperature; 0 = greedy")
    parser.add_argument("--show-rounds", type=int, default=2, help="print the trees of this many first rounds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the toy models, prompts and sampling")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="append an acceptance recording of each DDTree decode to FILE (read it with `repro tau`)")


def _budgets(text: str) -> list[int]:
    try:
        budgets = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        msg = f"--budgets must be comma-separated integers (got {text!r})"
        raise UsageError(msg) from None
    if not budgets or min(budgets) < 0:
        msg = f"--budgets must be integers >= 0 (got {text!r})"
        raise UsageError(msg)
    return budgets


def _check(args: argparse.Namespace) -> list[int]:
    flags = (("--batch", args.batch, 1), ("--new-tokens", args.new_tokens, 1), ("--show-rounds", args.show_rounds, 0))
    for flag, value, low in flags:
        if value < low:
            msg = f"{flag} must be >= {low} (got {value})"
            raise UsageError(msg)
    if args.temperature < 0 or not math.isfinite(args.temperature):
        msg = f"--temperature must be a finite number >= 0 (got {args.temperature})"
        raise UsageError(msg)
    return _budgets(args.budgets)


def main(args: argparse.Namespace) -> int:
    """Run the demo; exit 1 if any DDTree decode differs from autoregressive decoding."""
    budgets = _check(args)
    import torch

    from repro.toy import Sampling, ToyDrafter, ToyTarget, decode_ar, decode_ddtree

    torch.manual_seed(args.seed)
    target = ToyTarget(seed=args.seed)
    drafter = ToyDrafter(target, seed=args.seed + 1)
    prompts = torch.randint(0, target.vocab, (args.batch, 12), generator=torch.Generator().manual_seed(args.seed + 2))
    sampling = Sampling(temperature=args.temperature)
    greedy = args.temperature == 0
    print(
        f"toy target: 1 attention layer, V={target.vocab}, H={target.dim}, float64 | drafter: greedy rollout "
        f"+ Gumbel noise, L={drafter.horizon} | {args.batch} prompts x {args.new_tokens} new tokens, "
        f"T={args.temperature:g}"
    )
    t0 = time.perf_counter()
    ar = decode_ar(target, prompts, args.new_tokens, sampling, seed=args.seed)
    ar_s = time.perf_counter() - t0

    shown = budgets[-1] if budgets else 0
    rows, ok = [], True
    for budget in budgets:
        recorder = _recorder(args, budget, drafter) if args.record else None
        t0 = time.perf_counter()
        dd = decode_ddtree(target, drafter, prompts, args.new_tokens, budget, sampling, seed=args.seed,
                           keep_trees=args.show_rounds if budget == shown else 0,
                           on_round=None if recorder is None else functools.partial(_record, recorder))
        wall = time.perf_counter() - t0
        if recorder is not None:
            recorder.close()
        taus = [t for rnd in dd.taus for t in rnd]
        same = dd.tokens == ar.tokens
        ok &= same or not greedy
        rows.append((budget, sum(taus) / len(taus), len(dd.taus), same, wall, _tree_time_us(drafter, budget)))
        if dd.trees:
            _print_trees(dd.trees, budget)

    print("\n  B | mean tau | rounds | == AR decode | decode s | tree build+walk us/round (bs x L x V)")
    for budget, tau, rounds, same, wall, us in rows:
        verdict = ("yes" if same else "NO") if greedy else ("yes" if same else "n/a (T>0)")
        print(f"{budget:>4} | {tau:8.2f} | {rounds:6d} | {verdict:>12} | {wall:8.2f} | {us:10.0f}")
    print(f"   AR decode: {ar_s:.2f} s, tau = 1 by definition")
    if greedy:
        print("lossless: every DDTree decode equals greedy AR decoding" if ok else "LOSSLESS CHECK FAILED")
    if args.record:
        print(f"acceptance recording: {args.record} (`repro tau {args.record}`)")
    return 0 if ok else 1


def _recorder(args: argparse.Namespace, budget: int, drafter: ToyDrafter) -> Recorder:
    from repro.recording import Recorder

    config = {"engine": "toy", "seed": args.seed, "batch": args.batch, "temperature": args.temperature,
              "vocab": drafter.target.vocab, "noise": drafter.noise}
    return Recorder(args.record, budget=budget, horizon=drafter.horizon, config=config, prompts="toy", source="toy")


def _record(recorder: Recorder, rnd: ToyRound) -> None:
    """One toy round into the recording; request ids name the prompt set ("toy/3")."""
    from repro.ddtree import topk_logprobs

    rank0_ids = topk_logprobs(rnd.draft_logits, 1).ids[..., 0]
    recorder.record_round([f"toy/{i}" for i in rnd.requests], rnd.out.tree, rank0_ids, rnd.out.walk)


def _tree_time_us(drafter: ToyDrafter, budget: int) -> float:
    """Median CPU time of build_trees + walk on one round's shapes (4 x L x V)."""
    import torch

    from repro.ddtree import build_trees, walk

    logits = torch.randn(4, drafter.horizon, drafter.target.vocab, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        tree = build_trees(logits, budget, torch.zeros(4, dtype=torch.int64), check_finite=False)
        walk(tree, tree.tokens)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _print_trees(trees: list, budget: int, limit: int = 24) -> None:
    """Request 0's tree of each kept round, depth-first; '*' marks the accepted path."""
    for rnd, (tree, result) in enumerate(trees):
        n = int(tree.num_nodes[0])
        path = set(result.accept_index[0, : int(result.accept_len[0])].tolist())
        toks, parents, scores = tree.tokens[0].tolist(), tree.parents[0].tolist(), tree.scores[0].tolist()
        shown = min(n, limit)  # nodes 0..shown-1: closed under parents since parent < child
        children: dict[int, list[int]] = {}
        for i in range(1, shown):
            children.setdefault(parents[i], []).append(i)
        print(f"\nround {rnd + 1}, request 0, B={budget}: {n} nodes, tau={int(result.accept_len[0])}, "
              f"bonus={int(result.bonus[0])} (best {shown} nodes, depth-first; q = prefix probability)")
        stack = [(0, 0)]
        while stack:
            i, depth = stack.pop()
            mark = "*" if i in path else " "
            label = "root" if i == 0 else f"node {i:>3}"
            print(f"  {mark} {'  ' * depth}{label} token {toks[i]:>4}  q={math.exp(scores[i]):.3f}")
            stack.extend((c, depth + 1) for c in reversed(children.get(i, [])))
