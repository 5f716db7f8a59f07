"""Benchmark DDTREE's drafter tail on the test hook's rows, kernel by kernel; write JSON.

    python -m verify.bench.bench_hook_tail --bs 1 16 --out results/bench_hook_tail.json
    python -m verify.bench.bench_hook_tail --decoy-stride 2048   # the hook's rows at another stride
    python -m verify.bench.bench_hook_tail --budget 63 --flat-floor   # K 63 on the old flat floor

What a served DDTREE round runs between the drafter's LM head and the verify, on Qwen3-8B's shape
(V 151936, hidden 4096, L 15, B 15 or ``--budget``, the paper profile's hook): each piece captured in one CUDA
graph and replayed (µs a replay, CUDA events), and the GPU time of each kernel in it (torch
profiler over 20 replays):

- ``rows``: the hook's rows (``DrafterTestHook.rows``, bf16, as served);
- ``topk``: ``topk_lse`` on those rows (K = B);
- ``head+rows+tail``: the LM head GEMM, the rows, then ``repro.round.DraftTail`` (top-K, tree,
  verify inputs), the served order;
- ``head+topk``: the GEMM's own rows through the top-K (rows of no structure: the reference).

``--decoy-stride`` replaces the hook's decoy stride: a power of two there sends the top-K down its
slow path (docs/ROUND-HOST.md); ``--flat-floor`` adds ``topk-flat-floor``, the top-K on the rows with
every unranked token at -30 (the hook before ``floor_logits``: past K 32, its slow path). GPU machine only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

VOCAB, HIDDEN, HORIZON = 151936, 4096, 15
PROFILE = "paper-qwen3-8b-math500"


def graph_time(fn: Callable[[], object], reps: int = 200) -> dict:
    """µs a replay of ``fn`` captured in a CUDA graph, and each kernel's GPU µs a replay."""
    from torch.profiler import ProfilerActivity, profile

    from verify.bench.bench_tree import capture

    graph = capture(fn)
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
    kernels = {ev.key[:60]: round(ev.device_time_total / 20, 1) for ev in prof.key_averages()
               if ev.device_time_total > 0}
    return {"us": round(start.elapsed_time(end) * 1e3 / reps, 1), "kernels": kernels}


def hook(stride: int | None):
    """The paper profile's hook on a random successor table (optionally at another decoy stride)."""
    from repro.drafter_hook.hook import DrafterTestHook
    from repro.drafter_hook.profiles import load_profiles

    cls = DrafterTestHook
    if stride is not None:
        cls = type("StrideHook", (DrafterTestHook,), {"decoy_stride": property(lambda self: stride)})
    succ = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))
    return cls.build(succ, load_profiles()[PROFILE], horizon=HORIZON, device="cuda", name=PROFILE)


def measure(bs: int, test_hook, head: torch.Tensor, budget: int, *, flat_floor: bool) -> dict:
    """Every piece at ``bs`` requests; checks the kernel's rows against the hook's reference."""
    from repro.drafter_hook.profiles import OFF_LOGIT
    from repro.kernels.topk_lse import topk_lse
    from repro.round import DraftTail

    gen = torch.Generator(device="cuda").manual_seed(bs)
    roots = torch.randint(0, VOCAB, (bs,), device="cuda", generator=gen)
    prefix = torch.randint(300, 500, (bs,), device="cuda", generator=gen)
    hidden = torch.randn(bs * HORIZON, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    rows = torch.empty(bs, HORIZON, VOCAB, dtype=torch.bfloat16, device="cuda")
    head_rows = torch.empty(bs * HORIZON, VOCAB, dtype=torch.bfloat16, device="cuda")
    tail = DraftTail(budget, HORIZON, VOCAB)
    mask = torch.zeros(bs * tail.n * (512 + tail.n), dtype=torch.bool, device="cuda")
    test_hook.rows(roots, prefix, out=rows)
    exact = torch.equal(rows, test_hook.logits(roots, prefix).to(torch.bfloat16))

    def lm_head() -> None:
        torch.matmul(hidden, head.t(), out=head_rows)

    pieces = {
        "rows": lambda: test_hook.rows(roots, prefix, out=rows),
        "topk": lambda: topk_lse(rows, tail.k),
        "head+rows+tail": lambda: (lm_head(), test_hook.rows(roots, prefix, out=rows), tail(rows, roots, prefix, mask)),
        "head+topk": lambda: (lm_head(), topk_lse(head_rows.view(bs, HORIZON, VOCAB), tail.k)),
    }
    if flat_floor:
        flat = rows.clamp(min=OFF_LOGIT)
        pieces["topk-flat-floor"] = lambda: topk_lse(flat, tail.k)
    return {"bs": bs, "rows_exact": exact, **{name: graph_time(fn) for name, fn in pieces.items()}}


def main(argv: list[str] | None = None) -> int:
    """Time every piece at every ``--bs`` and write the rows as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 16])
    p.add_argument("--decoy-stride", type=int, help="replace the hook's decoy stride (default: the hook's own)")
    p.add_argument("--budget", type=int, default=HORIZON, help="DDTREE's budget B, the top-K's K (default: 15)")
    p.add_argument("--flat-floor", action="store_true", help="also time the top-K with every unranked token at -30")
    p.add_argument("--out", type=Path, default=Path("results/bench_hook_tail.json"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_hook_tail: needs a CUDA GPU", file=sys.stderr)
        return 2
    from repro.stack.pins import git_revision

    test_hook = hook(args.decoy_stride)
    head = (torch.randn(VOCAB, HIDDEN, device="cuda") * 0.02).to(torch.bfloat16)
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": git_revision(),
              "device": torch.cuda.get_device_name(), "decoy_stride": test_hook.decoy_stride, "budget": args.budget,
              "command": "python -m verify.bench.bench_hook_tail " + " ".join(sys.argv[1:] if argv is None else argv),
              "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for bs in args.bs:
        row = measure(bs, test_hook, head, args.budget, flat_floor=args.flat_floor)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["rows_exact"] for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
