"""Benchmark the fused top-K + lse kernel against torch and the HBM floor; write JSON.

    python -m verify.bench.bench_topk --out results/bench_topk.json           # the issue-6 table
    python -m verify.bench.bench_topk --sweep --out results/bench_topk.json   # tune first, then the table
    python -m verify.bench.bench_topk --bs 8 --k 256 --vocab 163840           # one shape
    python -m verify.bench.bench_topk --replot results/bench_topk.json        # its figure again (no GPU)

Rows are ``[bs * 15, V]`` drafter logits (bf16, N(0, 3²) unless ``--kind``). For each (bs, K, V),
side by side in one run: the fused kernel (``topk_lse``, and its two launches apart),
``torch.topk(x, K)``, ``torch.topk(log_softmax(x.float()), K)``, repro.ddtree's torch path
(``topk_logprobs``), a read-once kernel (``torch.amax(x, -1)``) and the HBM floor (bytes / 4.3e12).
Every op is timed per call as CUDA-graph replays and as eager launches (CUDA events, medians),
cycling through copies of the input (>= 256 MB in all) so that L2 does not serve the reads. The
fused result is checked exact against a stable sort before it is timed.

``--sweep`` first searches the kernel's tunables (``TopKConfig``) stage by stage at V 163840,
K 256 over the ``--bs`` values, keeps the config with the best worst-case time/target ratio, and
uses it for the table. The stages (``SWEEP_STAGES``, pick with ``--stages``; each varies a few
fields on top of the best config so far, or the defaults for the stages left out): ``stream``
(tile, stream warps, programs), ``select`` (select warps, gather, search pivots, register cap),
``keys`` (group size, scan block), ``tail`` (scan_tail off/on: the group keys in one padded
tile, or a head and a tail tile), ``super`` (group keys per super key of the threshold search,
with auto or 8 select warps), ``split`` (the select in one launch per row, or two: the
threshold per row, then the gather over several programs per row), ``stages`` (tiles in flight
per stream program: 1, 3, 4 or 6), ``gather`` (tokens per gather step: auto, 2048 or 4096),
``regs`` (the select's register cap: 64 to 128 per thread).
``--adversarial`` adds rows for tie-heavy and sorted inputs (slow path). Every row records the
config it ran. Beside the JSON it draws a ``.png``: time against bs per (K, V), the columns above
and the issue's targets (``repro.handoff.plots.topk_vs_batch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from repro.ddtree import topk_logprobs
from repro.kernels.topk_lse import TopKConfig, prepare, topk_lse
from repro.stack.pins import git_revision
from verify.kernel_cases import make_logits

HORIZON = 15
HBM_BYTES_PER_S = 4.3e12
ROTATE_BYTES = 256 << 20
TARGETS_US = {1: 20.0, 8: 28.0, 32: 75.0, 64: 150.0}  # the latency targets, at V 163840 and K <= 256 (docs/PERFORMANCE.md)
TARGET_VOCAB, TARGET_K = 163840, 256
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_inputs(bs: int, vocab: int, dtype: torch.dtype, kind: str, seed: int = 0) -> list[torch.Tensor]:
    """Copies of one [bs * 15, V] logits tensor on the GPU, together >= ROTATE_BYTES."""
    rows = bs * HORIZON
    if kind == "random":
        g = torch.Generator(device="cuda").manual_seed(seed)
        base = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(dtype)
    else:
        base = make_logits(kind, rows, vocab, dtype, k=TARGET_K, seed=seed).cuda()
    copies = min(64, max(1, -(-ROTATE_BYTES // (base.numel() * base.element_size()))))
    return [base] + [base.clone() for _ in range(copies - 1)]


def _runner(calls: list[Callable[[], object]], *, graph: bool) -> Callable[[], None]:
    """All ``calls`` back to back: warmed up, and captured in one CUDA graph if ``graph``."""
    for call in calls:
        call()  # compile, allocator warm-up
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for call in calls:
                call()
        run = g.replay
    else:
        def run() -> None:
            for call in calls:
                call()
    run()
    return run


def _elapsed_us(run: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def time_us(calls: list[Callable[[], object]], *, graph: bool, reps: int = 20) -> float:
    """Median microseconds per call, over ``reps`` runs of all ``calls`` back to back."""
    run = _runner(calls, graph=graph)
    return statistics.median(_elapsed_us(run) for _ in range(reps)) / len(calls)


def time_interleaved(call_sets: list[list[Callable[[], object]]], reps: int = 20) -> list[float]:
    """Median microseconds per call of each set of calls, as CUDA-graph replays taken in turn
    (set 0, 1, ..., then again ``reps`` times): clock and thermal drift fall on every set alike,
    so differences of a few percent between sets are real (sequential timing swung 3 % at bs 64)."""
    runs = [_runner(calls, graph=True) for calls in call_sets]
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(reps):
        for run, out in zip(runs, samples, strict=True):
            out.append(_elapsed_us(run))
    return [statistics.median(out) / len(calls) for out, calls in zip(samples, call_sets, strict=True)]


def reference(x: torch.Tensor, k: int) -> dict:
    """Stable-sort top-k and torch.logsumexp of ``x`` on the GPU, with the float32 ulp of each lse."""
    xf = x.float()
    ref = torch.sort(xf, dim=-1, descending=True, stable=True)
    lse = torch.logsumexp(xf, dim=-1)
    ulp = torch.nextafter(lse.abs(), torch.full_like(lse, float("inf"))) - lse.abs()
    return {"logits": ref.values[:, :k].clone(), "ids": ref.indices[:, :k].clone(), "lse": lse, "ulp": ulp}


def check_exact(x: torch.Tensor, k: int, config: TopKConfig | None, ref: dict) -> dict:
    """Compare one fused call with the reference: exact top-k, and the lse error."""
    logits, ids, lse = topk_lse(x, k, config=config)
    err = (lse - ref["lse"]).abs()
    return {
        "exact": bool(torch.equal(ids, ref["ids"]) and torch.equal(logits, ref["logits"])),
        "lse_max_abs_err": err.max().item(),
        "lse_max_ulps": (err / ref["ulp"]).max().item(),
    }


def bench_shape(inputs: list[torch.Tensor], bs: int, k: int, config: TopKConfig | None, reps: int) -> dict:
    """Every comparison for one (bs, K, V) over the same rotating inputs."""
    x0 = inputs[0]
    nbytes = x0.numel() * x0.element_size()
    row = {"bs": bs, "rows": x0.shape[0], "vocab": x0.shape[1], "k": k, "dtype": str(x0.dtype)[6:],
           "bytes": nbytes, "floor_us": nbytes / HBM_BYTES_PER_S * 1e6,
           "config": dataclasses.asdict(config or TopKConfig())}
    row.update(check_exact(x0, k, config, reference(x0, k)))
    preps = [prepare(x, k, config=config) for x in inputs]
    ops: dict[str, list[Callable[[], object]]] = {
        "fused": [lambda x=x: topk_lse(x, k, config=config) for x in inputs],
        "fused_stream": [p[0] for p in preps],
        "fused_select": [p[1] for p in preps],
        "read_once": [lambda x=x: torch.amax(x, dim=-1) for x in inputs],
        "torch_topk": [lambda x=x: torch.topk(x, k, dim=-1) for x in inputs],
        "log_softmax_topk": [lambda x=x: torch.topk(torch.log_softmax(x.float(), -1), k, dim=-1) for x in inputs],
        "ddtree_topk_logprobs": [lambda x=x: topk_logprobs(x.view(bs, HORIZON, -1), k) for x in inputs],
    }
    for p in preps:
        p[0]()  # the select launches read the stream kernel's group keys
    for name, calls in ops.items():
        for mode in ("graph", "eager") if not name.startswith("fused_") else ("graph",):
            try:
                row[f"{name}_{mode}_us"] = time_us(calls, graph=mode == "graph", reps=reps)
            except Exception as e:  # noqa: BLE001 - e.g. an op that cannot be captured: keep the other columns
                row[f"{name}_{mode}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                row[f"{name}_{mode}_us"] = float("nan")
    row["fused_over_floor"] = row["fused_graph_us"] / row["floor_us"]
    row["fused_over_read_once"] = row["fused_graph_us"] / row["read_once_graph_us"]
    row["torch_topk_over_fused"] = row["torch_topk_graph_us"] / row["fused_graph_us"]
    if row["vocab"] == TARGET_VOCAB and k <= TARGET_K and bs in TARGETS_US:
        row["target_us"] = TARGETS_US[bs]
        row["meets_target"] = row["exact"] and row["fused_graph_us"] <= TARGETS_US[bs]
    return row


def copy_bandwidth() -> float:
    """Device-to-device copy rate in bytes/s (bytes read + written) on 2 GiB."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    us = time_us([lambda: dst.copy_(src)], graph=False, reps=10)
    return 2 * src.numel() * src.element_size() / (us * 1e-6)


def sweep_stages() -> list[list[dict]]:
    """Tunable sets tried in order; each stage varies a few fields around the best so far."""
    stream = [{"tile": t, "stream_warps": w, "programs": p}
              for t in (2048, 4096, 8192, 16384) for w in (4, 8, 16) for p in (256, 1024, 4096)]
    select = [{"select_warps": w, "gather": g, "search_pivots": u, "select_maxnreg": r}
              for w, g, r in ((4, 2048, 0), (4, 2048, 128), (8, 2048, 0), (8, 2048, 128))
              for u in (16, 32)]  # 2 and 16 warps, other gathers: slower on the H200 (docs/perf/sweep_select_*)
    keys = [{"group": g, "scan_block": b} for g, b in ((16, 16384), (32, 2048), (32, 8192), (64, 1024), (64, 4096))]
    tail = [{"scan_tail": t} for t in (False, True)]
    supers = [{"super_keys": r, "select_warps": w} for r in (1, 4, 8) for w in (0, 8)]
    split = [{"split_rows": r} for r in (0, 1 << 30)]
    stages = [{"stream_stages": n} for n in (1, 3, 4, 6)]
    gather = [{"gather": g} for g in (0, 2048, 4096)]
    regs = [{"select_maxnreg": r} for r in (64, 80, 96, 128)]
    return [stream, select, keys, tail, supers, split, stages, gather, regs]


SWEEP_STAGES = ("stream", "select", "keys", "tail", "super", "split", "stages", "gather", "regs")


def sweep(bss: list[int], dtype: torch.dtype, reps: int, stages: tuple[str, ...] = SWEEP_STAGES) -> dict:
    """Stage-wise search of TopKConfig at V 163840, K 256: minimise max over bs of time/target.

    ``stages`` names the stages of ``sweep_stages`` to run (in their order); the others keep the
    defaults."""
    inputs = {bs: make_inputs(bs, TARGET_VOCAB, dtype, "random", seed=bs) for bs in bss}
    refs = {bs: reference(inputs[bs][0], TARGET_K) for bs in bss}
    best, trials = TopKConfig(), []
    best_score = float("inf")
    for stage, variants in enumerate(sweep_stages()):
        if SWEEP_STAGES[stage] not in stages:
            continue
        base, timed = best, []
        for fields in variants:
            trial = {"stage": stage, "config": {**dataclasses.asdict(base), **fields}, "us": {}}
            try:
                config = dataclasses.replace(base, **fields)
                trial["exact"] = all(check_exact(inputs[bs][0], TARGET_K, config, refs[bs])["exact"] for bs in bss)
                for bs in bss:  # compile and capture once here, so a variant that cannot is recorded alone
                    time_us([lambda c=config, x=inputs[bs][0]: topk_lse(x, TARGET_K, config=c)], graph=True, reps=1)
                timed.append((trial, config))
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is recorded, not fatal
                trial["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            trials.append(trial)
        for bs in bss:  # the stage's variants timed in turn, one bs at a time
            sets = [[lambda x=x, c=config: topk_lse(x, TARGET_K, config=c) for x in inputs[bs]] for _, config in timed]
            for (trial, _), us in zip(timed, time_interleaved(sets, reps), strict=True):
                trial["us"][bs] = us
        for trial, config in timed:
            trial["score"] = max(trial["us"][bs] / TARGETS_US.get(bs, trial["us"][bs]) for bs in bss)
            print(json.dumps(trial), flush=True)
            if trial["exact"] and trial["score"] < best_score:
                best, best_score = config, trial["score"]
    exact = [t for t in trials if t.get("exact")]
    per_bs = {bs: min(exact, key=lambda t: t["us"][bs])["config"] for bs in bss} if exact else {}
    return {"best": dataclasses.asdict(best), "best_score": best_score, "best_per_bs": per_bs, "trials": trials}




def _print_table(rows: list[dict]) -> None:
    print(f"{'bs':>3} {'K':>4} {'V':>6} {'kind':>10} {'exact':>5} {'fused':>8} {'eager':>8} {'stream':>8} "
          f"{'topk':>8} {'lsm+topk':>9} {'read1':>7} {'floor':>6} {'x floor':>7} {'target':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['bs']:>3} {r['k']:>4} {r['vocab']:>6} {r['kind']:>10} ERROR {r['error']}")
            continue
        print(f"{r['bs']:>3} {r['k']:>4} {r['vocab']:>6} {r.get('kind', ''):>10} {r['exact']!s:>5} "
              f"{r['fused_graph_us']:8.1f} {r.get('fused_eager_us', 0):8.1f} "
              f"{r['fused_stream_graph_us']:8.1f} {r['torch_topk_graph_us']:8.1f} "
              f"{r['log_softmax_topk_graph_us']:9.1f} {r['read_once_graph_us']:7.1f} {r['floor_us']:6.1f} "
              f"{r['fused_over_floor']:7.2f} {r.get('target_us', float('nan')):6.0f}"
              + ("  MISS" if r.get("meets_target") is False else ""))


def _draw(rows: list[dict], path: Path) -> None:
    from repro.handoff import plots

    why_not = plots.topk_vs_batch(rows, path)
    print(f"figure not drawn: {why_not}" if why_not else f"wrote {path}")


def _replot(path: Path) -> int:
    """Draw the figure of a saved bench_topk JSON beside it; 2 on a file that is not one."""
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench_topk: --replot needs a bench_topk JSON with 'rows' ({path}: {type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    _draw(rows, path.with_suffix(".png"))
    return 0


def _revision() -> str:
    """Short git revision of the code under test ("unknown" outside a checkout)."""
    rev = git_revision()
    return rev["revision"][:7] if rev else "unknown"


def main(argv: list[str] | None = None) -> int:
    """Optionally sweep, then time every (bs, K, V), print a table and write JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--k", type=int, nargs="+", default=[16, 64, 256, 512])
    p.add_argument("--vocab", type=int, nargs="+", default=[151936, 163840])
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--kind", default="random", help="input rows (verify.kernel_cases.KINDS)")
    p.add_argument("--sweep", action="store_true", help="tune TopKConfig first and use the best")
    p.add_argument("--stages", default=",".join(SWEEP_STAGES),
                   help=f"with --sweep: comma-separated stages to search (of {','.join(SWEEP_STAGES)})")
    p.add_argument("--adversarial", action="store_true", help="add slow-path rows at bs 8, K 256")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path("results/bench_topk.json"))
    p.add_argument("--replot", type=Path, metavar="JSON", help="only draw the figure of a saved result (no GPU)")
    args = p.parse_args(argv)
    if args.replot:
        return _replot(args.replot)
    stages = tuple(s for s in args.stages.split(",") if s)
    if not stages or set(stages) - set(SWEEP_STAGES):
        p.error(f"--stages takes a comma-separated subset of {','.join(SWEEP_STAGES)} (got {args.stages!r})")
    if not torch.cuda.is_available():
        print("bench_topk: needs a CUDA GPU (got none)", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": _revision(),
        "device": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "command": "python -m verify.bench.bench_topk " + " ".join(sys.argv[1:] if argv is None else argv),
        "copy_bytes_per_s": copy_bandwidth(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = None
    if args.sweep:
        result["sweep"] = sweep(args.bs, dtype, args.reps, stages)
        config = TopKConfig(**result["sweep"]["best"])
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    result["config"] = dataclasses.asdict(config or TopKConfig())
    rows = []
    shapes = [(bs, k, v, args.kind) for v in args.vocab for bs in args.bs for k in args.k]
    if args.adversarial:
        shapes += [(8, TARGET_K, TARGET_VOCAB, kind) for kind in ("flat", "tied", "ascending", "boundary", "peaked")]
    for bs, k, vocab, kind in shapes:
        row = {"kind": kind, "bs": bs, "k": k, "vocab": vocab}
        try:
            inputs = make_inputs(bs, vocab, dtype, kind)
            row.update(bench_shape(inputs, bs, k, config, args.reps))
            del inputs
        except Exception as e:  # noqa: BLE001 - record and go on: one broken shape must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        result["rows"] = rows
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        torch.cuda.empty_cache()
    print(f"copy bandwidth {result['copy_bytes_per_s'] / 1e12:.2f} TB/s; config {result['config']}")
    _print_table(rows)
    print(f"wrote {args.out}")
    _draw(rows, args.out.with_suffix(".png"))
    return 0 if all(r.get("exact") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
