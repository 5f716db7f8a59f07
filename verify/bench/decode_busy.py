"""How busy a served decode keeps the GPU (torch profiler): is AR on a full-size target GPU-bound?

    python -m verify.bench.decode_busy full-h200-qwen3-8b --models-dir MODELS --out results/
    python -m verify.bench.decode_busy full-h200-qwen3-8b --algorithm DFLASH DDTREE-B63 --concurrency 1 16 \
        --max-total-tokens 65536 --models-dir MODELS --out results/      # four profiles, two servers
    python -m verify.bench.decode_busy --trace TRACE.json.gz        # a saved trace's figures (no GPU)
    python -m verify.bench.decode_busy --compare A.json B.json      # two results' rounds by kernel class (no GPU)

Starts the profile's server for each ``--algorithm`` (AR by default; ``DDTREE`` at the profile's
budget, ``DDTREE-B63`` at 63) together, with ``SGLANG_TORCH_PROFILER_DIR`` set (``--max-total-tokens``
caps each KV cache, so several fit: SGLang sizes its cache from the memory free at its start). Then,
one server and one concurrency at a time, keeps ``c`` clients sending long greedy requests one after
another (so a speculative decode, which finishes a request in a second or two, still covers the
profiled steps) and, once they decode, asks ``/start_profile`` for ``--steps`` forward steps of CPU
and GPU activity. In the Chrome trace SGLang writes, the GPU busy time is the union of the kernel
and memcpy/memset intervals, the window runs from the first to the last of them, and busy / window
is the fraction of the decode the GPU worked (the issue's acceptance asks >= 0.8 for AR). ms per
step is the window over the steps; ``kernels_by_name`` gives each kernel's launches and GPU µs per
step (the largest first), to set two algorithms' rounds side by side. Each run's result is
``--out``/busy-TARGET-LABEL-cC.json (``result_name``).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from repro.errors import ReproError, UsageError
from verify.bench.served_round import counts_of, read_trace
from verify.bench.verify_cost import busy_time

if TYPE_CHECKING:
    from repro.serving.sglang_server import SGLangServer

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
KERNEL_CLASSES = (
    ("attention", re.compile(r"_fwd_kernel|_fwd_grouped_kernel|attention|flash_fwd|fmha|BatchPrefill|BatchDecode")),
    ("GEMMs", re.compile(r"nvjet|gemm|cublas|cutlass|xmma|splitKreduce", re.IGNORECASE)),
)
"""Kernel classes by name, first match wins: SGLang's Triton attention (``_fwd_kernel``) and
FlashInfer's / FA3's; cuBLAS (``nvjet``), CUTLASS and split-K reductions."""


def trace_busy(path: Path) -> dict[str, float]:
    """GPU busy time, window (both ms) and their ratio in a (gzipped) Chrome trace."""
    return _busy_of(read_trace(path), path)


def _busy_of(events: list[dict], path: Path) -> dict[str, float]:
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
             if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    if not spans:
        msg = f"{path}: no GPU kernel events in the trace (was the GPU activity profiled?)"
        raise ValueError(msg)
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    busy = busy_time(spans)
    return {"busy_ms": busy / 1e3, "window_ms": window / 1e3, "busy_fraction": busy / window if window else 1.0,
            "kernels": len(spans)}


def kernels_by_name(events: list[dict], steps: int, top: int = 40) -> dict[str, list[float]]:
    """[launches, GPU µs] per step of the ``top`` kernels by GPU time (memcpy/memset by category)."""
    total: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES:
            name = e.get("name", "?") if e["cat"] == "kernel" else e["cat"]
            acc = total.setdefault(name, [0, 0.0])
            acc[0] += 1
            acc[1] += float(e.get("dur", 0.0))
    ranked = sorted(total.items(), key=lambda kv: -kv[1][1])[:top]
    return {name: [round(n / steps, 2), round(us / steps, 1)] for name, (n, us) in ranked}


def repro_kernel_names() -> frozenset[str]:
    """Names of the project's Triton kernels (``def NAME_kernel`` under ``@triton.jit`` in
    repro/**/_*_triton.py: repro/kernels and the drafter hook's), read as text: no triton import."""
    root = Path(__file__).resolve().parents[2] / "repro"
    pattern = re.compile(r"^@triton\.jit[^\n]*\ndef (\w+_kernel)\(", re.MULTILINE)
    return frozenset(n for f in sorted(root.rglob("_*_triton.py")) for n in pattern.findall(f.read_text()))


def kernel_classes(result: dict, repro_kernels: frozenset[str]) -> dict[str, list[float]]:
    """[launches, GPU µs] per step of a decode_busy ``result`` by class: KERNEL_CLASSES, ``repro``
    (``repro_kernels``), ``copies`` (memcpy / memset), ``rest`` of the listed kernels, ``unlisted``
    (GPU busy time past the listed ones, launches unknown) and ``all`` (busy time, every launch)."""
    steps = result["steps"]
    classes = {name: [0.0, 0.0] for name, _ in KERNEL_CLASSES} | {k: [0.0, 0.0] for k in ("repro", "copies", "rest")}
    for name, (launches, us) in result["kernels_by_name"].items():
        if name in repro_kernels:
            key = "repro"
        elif name in ("gpu_memcpy", "gpu_memset"):
            key = "copies"
        else:
            key = next((c for c, pattern in KERNEL_CLASSES if pattern.search(name)), "rest")
        classes[key][0] += launches
        classes[key][1] += us
    busy_us = result["busy_ms"] * 1e3 / steps
    listed = sum(us for _, us in classes.values())
    classes["unlisted"] = [float("nan"), max(busy_us - listed, 0.0)]
    classes["all"] = [result["kernels"] / steps, busy_us]
    return {k: [round(n, 1), round(us, 1)] for k, (n, us) in classes.items()}


def compare_table(a: dict, b: dict) -> str:
    """Markdown: two decode_busy results' GPU µs (launches) per step by kernel class, and B - A."""
    names = repro_kernel_names()
    ca, cb = kernel_classes(a, names), kernel_classes(b, names)

    def cell(v: list[float]) -> str:
        return f"{v[1]:,.0f}" + ("" if v[0] != v[0] else f" ({v[0]:g})")

    rows = [f"| kernels | {a['algorithm']} | {b['algorithm']} | difference |", "|---|---|---|---|"]
    rows += [f"| {k} | {cell(ca[k])} | {cell(cb[k])} | {cb[k][1] - ca[k][1]:+,.0f} |" for k in ca]
    return "\n".join(rows)


def trace_functions(path: Path, steps: int, top: int = 30) -> dict[str, float]:
    """Inclusive host ms per step of the ``top`` most expensive Python functions of a trace
    recorded with stacks (``python_function`` events; a recursive function counts each level)."""
    return _functions_of(read_trace(path), steps, top)


def _functions_of(events: list[dict], steps: int, top: int = 30) -> dict[str, float]:
    total: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "python_function":
            total[e.get("name", "?")] = total.get(e.get("name", "?"), 0.0) + float(e.get("dur", 0.0))
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return {name: round(us / 1e3 / steps, 4) for name, us in ranked}


def _post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def parse_run(label: str) -> tuple[str, int | None]:
    """``AR``, ``DFLASH``, ``DDTREE`` (the profile's budget) or ``DDTREE-B63``: (algorithm, budget)."""
    algorithm, sep, budget = label.upper().partition("-B")
    if sep and not (algorithm == "DDTREE" and budget.isdigit()):
        msg = f"--algorithm takes AR, DFLASH, DDTREE or DDTREE-B<budget> (got {label!r})"
        raise UsageError(msg)
    return algorithm, int(budget) if budget else None


def result_name(profile: str, label: str, concurrency: int) -> str:
    """The file a run's result is written to: ``busy-TARGET-LABEL-cC.json`` (``full-h200-`` dropped)."""
    target = profile.removeprefix("full-h200-")
    return f"busy-{target}-{label.replace(' B=', '-B')}-c{concurrency}.json"


def measure(args: argparse.Namespace) -> list[dict]:
    """Start every ``--algorithm``'s server at once, then in turn decode and profile each at each
    ``--concurrency`` (one at a time: the GPU is shared); one result per (algorithm, c)."""
    from repro.serving.profiles import get_profile, models_dir
    from repro.serving.sglang_server import SGLangServer, free_port

    base = get_profile(args.profile, args.profile_file)
    if args.max_total_tokens:  # several servers share the memory free at their start
        base = dataclasses.replace(base, sglang={**base.sglang, "max-total-tokens": args.max_total_tokens})
    profiles = [base.with_algorithm(*parse_run(label)) for label in args.algorithm]
    results: list[dict] = []
    with ExitStack() as stack:
        servers = []
        for algo in profiles:
            tag = algo.label.replace(" B=", "-B")
            trace_dir = (args.out / f"trace-{args.profile}-{tag}").resolve()
            trace_dir.mkdir(parents=True, exist_ok=True)
            profile = dataclasses.replace(algo, env={**algo.env, "SGLANG_TORCH_PROFILER_DIR": str(trace_dir)})
            port = free_port()
            log = args.out / f"srv-busy-{args.profile}-{tag}.log"
            servers.append((profile, port, trace_dir, stack.enter_context(
                SGLangServer(profile, port=port, models_root=models_dir(args.models_dir), log_path=log))))
        starts = [server.wait_healthy(profile.start_timeout) for profile, _, _, server in servers]
        for (profile, port, trace_dir, server), start_s in zip(servers, starts, strict=True):
            for concurrency in args.concurrency:
                result = {"profile": args.profile, "algorithm": profile.label, "concurrency": concurrency,
                          "steps": args.steps, "start_s": start_s, "max_new_tokens": args.max_new_tokens,
                          **_profile_decode(args, server, port, trace_dir, concurrency)}
                path = args.out / result_name(args.profile, profile.label, concurrency)
                path.write_text(json.dumps(result, indent=1) + "\n")
                print(f"decode_busy: {profile.label} c {concurrency}: {result['ms_per_step']:.2f} ms a step, "
                      f"busy {result['busy_fraction']:.0%} -> {path}", flush=True)
                results.append(result)
    return results


def _profile_decode(args: argparse.Namespace, server: SGLangServer, port: int, trace_dir: Path, concurrency: int) -> dict:
    """``concurrency`` clients decoding on ``server``, ``args.steps`` steps profiled; the figures."""
    stop = threading.Event()
    clients = start_decoding(lambda k: server.client.generate(busy_payload(k, args.max_new_tokens)), concurrency, stop)
    try:
        time.sleep(args.settle)  # past the prefill, into steady decoding
        earlier = set(trace_dir.glob("*.json.gz"))  # an earlier run's traces in the same directory
        status, body = _post(port, "/start_profile", {"output_dir": str(trace_dir), "num_steps": args.steps,
                                                      "activities": ["CPU", "GPU"], "with_stack": args.with_stack})
        if status != 200:
            msg = f"POST /start_profile returned HTTP {status}: {body[:200]!r}"
            raise RuntimeError(msg)
        trace, figures = _finished_trace(trace_dir, time.monotonic() + 180, earlier)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=150)  # the next concurrency starts on an idle server
    if all(c.failed for c in clients):  # every client gave up
        msg = f"the server failed every request ({clients[0].failed})"
        raise RuntimeError(msg)
    events = read_trace(trace)
    host = {"host": counts_of(events, args.steps), "functions": _functions_of(events, args.steps)} \
        if args.with_stack else {}
    return {"trace": str(trace.relative_to(args.out.resolve())), "ms_per_step": figures["window_ms"] / args.steps, **figures,
            "kernels_by_name": kernels_by_name(events, args.steps), **host}


def busy_payload(client: int, max_new_tokens: int) -> dict:
    """Client ``client``'s request: 256 prompt ids inside every served vocabulary (the 4-layer
    targets': 4096), the last one the client's own (a planted target's greedy continuation follows
    the last token alone: clients with one prompt would decode one token sequence in lockstep, and
    an MoE target's batch would read one token's experts)."""
    prompt = [(17 * i) % 4000 + 10 for i in range(255)] + [4010 + client % 86]
    return {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens,
                                                     "ignore_eos": True}}


class _Client(threading.Thread):
    """Sends requests one after another until ``stop`` is set; ``failed`` holds the last error."""

    def __init__(self, index: int, send: Callable[[int], object], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.index, self.send, self.stop, self.failed = index, send, stop, ""

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.send(self.index)
            except ReproError as e:  # a server stopping after the trace, or one that failed
                self.failed = str(e)
                return


def start_decoding(send: Callable[[int], object], concurrency: int, stop: threading.Event) -> list[_Client]:
    """``concurrency`` clients, client k sending ``send(k)`` again as soon as its request ends,
    until ``stop``: the decode runs steadily however fast one request finishes."""
    clients = [_Client(k, send, stop) for k in range(concurrency)]
    for c in clients:
        c.start()
    return clients


def _finished_trace(trace_dir: Path, deadline: float, earlier: set[Path] = frozenset()) -> tuple[Path, dict[str, float]]:
    """The trace SGLang writes into ``trace_dir`` (not one of ``earlier``) and its figures, once
    the file reads whole (it appears before the profiler has finished writing it; the server must
    stay up till then)."""
    while time.monotonic() < deadline:
        for trace in sorted(set(trace_dir.glob("*.json.gz")) - earlier, reverse=True):
            with suppress(EOFError, OSError, json.JSONDecodeError):
                return trace, trace_busy(trace)
        time.sleep(1)
    msg = f"no whole trace in {trace_dir} within 180 s of /start_profile"
    raise RuntimeError(msg)


def _read_saved(args: argparse.Namespace) -> int:
    """``--trace`` or ``--compare``: the figures of saved files, printed (no GPU); 2 if unreadable."""
    if args.trace:
        try:
            print(json.dumps(trace_busy(args.trace)))
        except (OSError, ValueError, KeyError) as e:
            print(f"decode_busy: --trace needs a Chrome trace with GPU events ({args.trace}: {e})", file=sys.stderr)
            return 2
        return 0
    try:
        a, b = (json.loads(path.read_text()) for path in args.compare)
        print(compare_table(a, b))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"decode_busy: --compare needs two decode_busy results with kernels_by_name ({e})", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Measure a served decode, or read a saved trace; print and write the figures as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", nargs="?", help="a profile of repro/data/profiles.toml")
    p.add_argument("--algorithm", nargs="+", default=["AR"], metavar="LABEL",
                   help="AR, DFLASH, DDTREE (the profile's budget) or DDTREE-B<budget>; several start together")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1], help="each profiled in turn")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="cap each server's KV cache (several servers starting together)")
    p.add_argument("--steps", type=int, default=30, help="forward steps to profile")
    p.add_argument("--settle", type=float, default=5.0, help="seconds of decoding before profiling")
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--profile-file", type=Path, default=None, help="another profiles.toml")
    p.add_argument("--with-stack", action="store_true", help="also where the host's time goes (Python stacks)")
    p.add_argument("--out", type=Path, default=Path("results"),
                   help="a folder: busy-TARGET-LABEL-cC.json for each run, the traces, the servers' logs")
    p.add_argument("--trace", type=Path, metavar="TRACE", help="only read the figures of a saved trace")
    p.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"),
                   help="only set two saved results (--out files) side by side by kernel class")
    args = p.parse_args(argv)
    if args.compare or args.trace:
        return _read_saved(args)
    if not args.profile:
        p.error("PROFILE is required (or --trace TRACE)")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        measure(args)
    except UsageError as e:
        print(f"decode_busy: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, ValueError) as e:  # a ReproError, a server that failed, a bad trace
        print(f"decode_busy: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
