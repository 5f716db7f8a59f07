"""What a served round costs: AR, DFLASH and DDTREE side by side on one GPU, in one process.

Each named configuration in turn gets a real SGLang server (verify/sglang/harness.py flags:
graphs and overlap on unless named otherwise), alone on the GPU, serving the planted target with
the drafter test hook; then:

1. **first requests**: straight after each server's "ready", one batch of ``bs`` requests of
   ``--tokens`` tokens at each ``--batch`` size: time per round (wall / verify rounds) before any
   other work;
2. **steady state**: ``--reps`` more batches per size: tok/s and time per round;
3. **the round** (``--profile-steps``): SGLang's torch profiler over that many rounds of one
   request: host kernel launches, CPU ops and GPU busy time per round, from the Chrome trace.

Writes one JSON line per measurement to ``OUT/served.jsonl``. GPU machine only::

    python3 -m verify.bench.served_round --models /tmp/models --out $OUT ar dflash ddtree-b32
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repro.testmodels.planted import greedy_continuation
from verify.bench.verify_cost import busy_time
from verify.sglang import harness

CONFIGS = {  # name: (algorithm, budget, graphs, overlap)
    "ar": (None, None, True, True),
    "dflash": ("DFLASH", None, True, True),
    **{f"ddtree-b{b}": ("DDTREE", b, True, True) for b in (1, 8, 16, 32, 64, 128)},
    "ddtree-b32-eager": ("DDTREE", 32, False, True),
    "ddtree-b32-sync": ("DDTREE", 32, True, False),
}


def prompts(count: int, salt: int) -> list[list[int]]:
    """Distinct prompts of 40..100 token ids (the planted target reads only the last one)."""
    return [[(i * 131 + j * 17 + salt * 7919) % 4000 + 10 for j in range(40 + (i * 13) % 60)] for i in range(count)]


def _batch(url: str, bs: int, tokens: int, salt: int, planted: dict) -> dict[str, Any]:
    """One batch of ``bs`` greedy requests: wall time, rounds, tokens, and how many responses
    are exactly the planted target's greedy continuation."""
    params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    batch = prompts(bs, salt)
    t0 = time.perf_counter()
    out = harness.generate(url, batch, params, timeout=600)
    wall = time.perf_counter() - t0
    metas = [r["meta_info"] for r in out]
    rounds = max(m.get("spec_verify_ct") or m["completion_tokens"] for m in metas)
    toks = sum(m["completion_tokens"] for m in metas)
    tau = toks / sum(m.get("spec_verify_ct") or m["completion_tokens"] for m in metas)
    exact = sum(r["output_ids"] == greedy_continuation(planted, p[-1], tokens)
                for r, p in zip(out, batch, strict=True))
    return {"bs": bs, "wall_s": wall, "rounds": rounds, "tokens": toks, "tok_s": toks / wall,
            "ms_per_round": 1000 * wall / rounds, "tau": tau, "exact": exact}


def _post(url: str, path: str, body: dict) -> None:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),  # noqa: S310 - our loopback server
                                 headers={"Content-Type": "application/json"})
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120).read()


def read_trace(trace: Path) -> list[dict[str, Any]]:
    """The events of a torch-profiler Chrome trace, gzipped or not."""
    data = json.loads(gzip.decompress(trace.read_bytes()) if trace.suffix == ".gz" else trace.read_bytes())
    return data.get("traceEvents", data) if isinstance(data, dict) else data


def trace_counts(trace: Path, steps: int, top: int = 40) -> dict[str, Any]:
    """:func:`counts_of` the events of a trace file."""
    return counts_of(read_trace(trace), steps, top)


def counts_of(events: list[dict[str, Any]], steps: int, top: int = 40) -> dict[str, Any]:
    """Per-round host launches, CPU ops, GPU kernels and GPU busy ms of a torch-profiler trace's
    events, plus the most frequent CPU ops (count and total host µs per round)."""
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    launches = sum(1 for e in runtime if "Launch" in e.get("name", ""))
    graph_launches = sum(1 for e in runtime if "GraphLaunch" in e.get("name", ""))
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events if e.get("cat") == "kernel"]
    busy = busy_time(kernels)  # concurrent streams count once
    ops: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            acc = ops.setdefault(e.get("name", "?"), [0, 0.0])
            acc[0] += 1
            acc[1] += float(e.get("dur", 0))
    timed = [e for e in events if "ts" in e and e.get("ph") == "X"]
    window = (max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - min(float(e["ts"]) for e in timed)) if timed else 0
    common = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return {"launches": launches / steps, "graph_launches": graph_launches / steps, "kernels": len(kernels) / steps,
            "cpu_ops": sum(c for c, _ in ops.values()) / steps, "gpu_busy_ms": busy / 1000 / steps,
            "window_ms_per_round": window / 1000 / steps,
            "launch_names": sorted({e.get("name", "") for e in runtime if "Launch" in e.get("name", "")}),
            "top_ops": {name: [round(c / steps, 2), round(t / steps, 1)] for name, (c, t) in common}}


def _profile(url: str, prof_dir: Path, steps: int, tokens: int, planted: dict) -> dict[str, Any]:
    """Profile ``steps`` rounds in the middle of one long request (4x --tokens, so the request
    outlasts the profiled rounds at any tau)."""
    before = set(prof_dir.glob("**/*.json*"))
    done = threading.Event()

    def run() -> None:
        _batch(url, 1, 4 * tokens, salt=99, planted=planted)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    time.sleep(0.15)
    _post(url, "/start_profile", {"output_dir": str(prof_dir), "num_steps": steps, "activities": ["CPU", "GPU"]})
    done.wait(600)
    deadline = time.time() + 60
    while time.time() < deadline:
        new = sorted(set(prof_dir.glob("**/*.json*")) - before)
        if new:
            time.sleep(2)  # the trace is written after the steps end
            return trace_counts(new[-1], steps)
        time.sleep(1)
    return {"error": "no trace"}


def _server_env(name: str, models: Path, out: Path) -> tuple[list[str], dict[str, str], Path]:
    algo, budget, graphs, overlap = CONFIGS[name]
    prof_dir = out / f"prof_{name}"
    prof_dir.mkdir(parents=True, exist_ok=True)
    env = {"SGLANG_TORCH_PROFILER_DIR": str(prof_dir)}
    if algo is not None:
        env["SGLANG_DDTREE_TEST_DRAFTER"] = str(models / "hook.json")
    server_args = harness.server_args(models / "planted", algo=algo, drafter=models / "dflash" if algo else None,
                                      budget=budget, graphs=graphs, overlap=overlap)
    return server_args, env, prof_dir


def measure(name: str, models: Path, out: Path, args: argparse.Namespace, port: int,
            emit: Callable[[dict], None]) -> None:
    """Every measurement of one configuration's server (the only server on the GPU: servers
    running side by side slowed each other's rounds by up to 40%, docs/PERFORMANCE.md)."""
    planted = json.loads((models / "planted" / "planted.json").read_text())
    server_args, env, prof_dir = _server_env(name, models, out)
    with harness.server(name, server_args, port=port, env=env, timeout=args.start_timeout) as url:
        for bs in args.batch:  # straight after "ready", before any other request
            emit({"config": name, "phase": "first", **_batch(url, bs, args.tokens, bs, planted)})
        for rep in range(args.reps):
            for bs in args.batch:
                emit({"config": name, "phase": "steady", "rep": rep, **_batch(url, bs, args.tokens, 100 + rep, planted)})
        if args.profile_steps:
            emit({"config": name, "phase": "profile", **_profile(url, prof_dir, args.profile_steps, args.tokens, planted)})


def main(argv: list[str] | None = None) -> int:
    """Measure the named configurations side by side; one JSONL record per measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", choices=sorted(CONFIGS))
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile-steps", type=int, default=30)
    parser.add_argument("--start-timeout", type=float, default=300)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "served.jsonl"

    def emit(row: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    for k, name in enumerate(args.configs):
        try:
            measure(name, args.models, args.out, args, 32000 + k, emit)
        except Exception as exc:  # noqa: BLE001 - keep the other configurations' evidence
            emit({"config": name, "phase": "error", "error": repr(exc)[:3000]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
