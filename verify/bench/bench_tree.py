"""Benchmark the DDTree tree build on one device and write JSON: reference vs batched paths.

    python -m verify.bench.bench_tree --out results/bench_tree.json            # defaults below
    python -m verify.bench.bench_tree --bs 1 8 32 64 --budget 16 64 256 512

For each (bs, B) at L = 15 and V = 163840 (Kimi's vocabulary) with bf16 drafter logits:
- reference: torch top-K on the device, then the per-request best-first heap in Python
  (``repro.ddtree.reference.heap_tree``), host wall time;
- batched eager: ``topk_logprobs`` + ``build_trees_from_topk`` + ``verify_tensors``, CUDA events;
- batched graph: the same captured once in a CUDA graph and replayed;
- fused (GPU, B <= 256): Triton top-K + lse, the one-launch tree kernel and the one-launch verify
  tensor kernel, and the three together, each in a graph, the four timed in turn (replayed
  round-robin, so clock drift falls on all alike);
plus the split of the batched path into top-K / tree / verify tensors. All in one run, so the
ratios are side by side. Absolute times are only meaningful on the GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from repro.ddtree import TopK, build_trees_from_topk, topk_logprobs, verify_tensors
from repro.ddtree.reference import heap_tree
from repro.kernels.tree_build import MAX_BUDGET, _build_trees_fused_flagged, build_trees_fused, verify_tensors_fused
from repro.stack.pins import git_revision
from verify.bench.bench_topk import time_interleaved


def time_events(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Median microseconds of ``fn`` on the current CUDA stream (or wall time on CPU)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``fn`` run once (compiles, allocator warm-up), then captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_graph(fn: Callable[[], object], iters: int) -> float:
    """Median microseconds of one replay of ``fn`` captured in a CUDA graph."""
    return time_events(capture(fn).replay, iters)


def time_host(fn: Callable[[], object], iters: int) -> float:
    """Median wall microseconds of ``fn`` including a device sync."""
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


DISTRIBUTIONS = ("randn", "peaked")
"""Drafter logits: ``randn`` (N(0, 1): a flat, unsure drafter, so the best nodes sit near the
root) or ``peaked`` (one token per position 14 above N(0, 1), about 80 % likely: a confident
drafter, so the best nodes run deep and every depth of the tree has work)."""


def draft_logits(bs: int, horizon: int, vocab: int, dist: str, device: str) -> torch.Tensor:
    """Seeded bf16 drafter logits [bs, horizon, vocab] of one of ``DISTRIBUTIONS``."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(bs, horizon, vocab, device=device, generator=g)
    if dist == "peaked":
        hot = torch.randint(0, vocab, (bs, horizon, 1), device=device, generator=g)
        x.scatter_add_(2, hot, torch.full(hot.shape, 14.0, device=device))
    return x.to(torch.bfloat16)


def bench_one(bs: int, horizon: int, vocab: int, budget: int, iters: int, device: str,
              tree_warps: tuple[int, ...] = (), dist: str = "randn") -> dict:
    """All timings for one shape (``tree_warps``: extra warp counts to time the tree kernel at)."""
    logits = draft_logits(bs, horizon, vocab, dist, device)
    roots = torch.zeros(bs, dtype=torch.int64, device=device)
    lens = torch.full((bs,), 1000, device=device)
    lens_sum = 1000 * bs
    k = min(budget, vocab)
    topk = topk_logprobs(logits, k)
    tree = build_trees_from_topk(topk, budget, roots)

    def reference() -> None:
        t = topk_logprobs(logits, k)
        vals, ids, lse = t.logits.tolist(), t.ids.tolist(), t.lse.tolist()
        for b in range(bs):
            heap_tree(vals[b], ids[b], lse[b], budget, 0)

    def whole() -> None:
        verify_tensors(build_trees_from_topk(topk_logprobs(logits, k), budget, roots), lens, lens_sum)

    parts = {
        "topk": lambda: topk_logprobs(logits, k),
        "tree_from_topk": lambda: build_trees_from_topk(topk, budget, roots),
        "verify_tensors": lambda: verify_tensors(tree, lens, lens_sum),
    }
    row = {"bs": bs, "horizon": horizon, "vocab": vocab, "budget": budget, "dist": dist,
           "tree_depth": int(tree.depths.max())}
    row["reference_us"] = time_host(reference, max(1, iters // 10))
    row["batched_eager_us"] = time_events(whole, iters)
    if device == "cuda":
        row["batched_graph_us"] = time_graph(whole, iters)
        row.update({f"{name}_graph_us": time_graph(fn, iters) for name, fn in parts.items()})
    row.update({f"{name}_eager_us": time_events(fn, iters) for name, fn in parts.items()})
    best = row.get("batched_graph_us", row["batched_eager_us"])
    row["reference_over_batched"] = row["reference_us"] / best
    if device == "cuda" and budget <= MAX_BUDGET:
        row.update(_fused(logits, topk, tree, roots, lens, lens_sum, budget, k, iters, tree_warps))
        row["reference_over_fused"] = row["reference_us"] / row["fused_whole_graph_us"]
    return row


def _fused(logits, topk, tree, roots, lens, lens_sum, budget, k, iters, tree_warps=()) -> dict:
    """Timings of the GPU-resident path: fused top-K + lse, fused tree, fused verify tensors; and
    the tree kernel alone at each other warp count of ``tree_warps``."""
    from repro.kernels.topk_lse import topk_lse

    def fused_topk() -> TopK:
        vals, ids, lse = topk_lse(logits, k)
        return TopK(vals, ids, lse, logits.shape[-1])

    def whole() -> None:
        verify_tensors_fused(build_trees_fused(fused_topk(), budget, roots), lens, lens_sum)

    _tree, flags = _build_trees_fused_flagged(topk, budget, roots)
    parts = {  # timed in turn: each captured once, then replayed round-robin, so drift falls on all alike
        "topk": fused_topk,
        "tree": lambda: build_trees_fused(topk, budget, roots),
        "verify": lambda: verify_tensors_fused(tree, lens, lens_sum),
        "whole": whole,
    }
    timed = time_interleaved([[fn] for fn in parts.values()], reps=iters)
    return {
        "fused_enum_requests": int((flags == 0).sum()) if flags is not None else 0,  # the rest: frontier kernel
        **{f"fused_{name}_graph_us": us for name, us in zip(parts, timed, strict=True)},
        "fused_whole_eager_us": time_events(whole, iters),
        **{f"fused_tree_warps{w}_graph_us": time_graph(lambda w=w: build_trees_fused(topk, budget, roots, num_warps=w), iters)
           for w in tree_warps},
    }




def _revision() -> str:
    """Short git revision of the code under test ("unknown" outside a checkout)."""
    rev = git_revision()
    return rev["revision"][:7] if rev else "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, print a table and write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=[32])
    p.add_argument("--budget", type=int, nargs="+", default=[256])
    p.add_argument("--horizon", type=int, default=15)
    p.add_argument("--vocab", type=int, default=163840)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--tree-warps", type=int, nargs="*", default=[], choices=(1, 2, 4, 16, 32),
                   help="also time the fused tree kernel at these warp counts (default: 8 only)")
    p.add_argument("--dist", nargs="+", default=["randn"], choices=DISTRIBUTIONS,
                   help="drafter logit distributions to time (see DISTRIBUTIONS)")
    p.add_argument("--out", type=Path, default=Path("results/bench_tree.json"))
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for dist in args.dist:
        for bs in args.bs:
            for budget in args.budget:
                row = bench_one(bs, args.horizon, args.vocab, budget, args.iters, device, tuple(args.tree_warps), dist)
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": _revision(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "command": "python -m verify.bench.bench_tree " + " ".join(sys.argv[1:] if argv is None else argv),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
