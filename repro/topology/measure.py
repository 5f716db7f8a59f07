"""`repro topology --measure`: this box's all-reduce (and all-gather) at the decode sizes, through
torch.distributed with NCCL, eager and inside a CUDA graph.

One process a local GPU (torch.multiprocessing), rendezvous on 127.0.0.1 only, the machine's own
``NCCL_*`` variables left as they are (and recorded). Message sizes are SGLang's decode all-reduce,
[T, 7168] bf16 = 14 KB x T, for T = bs x N over the verify widths; the all-gather is the logits'
[T, V / p] per rank. Each size: ``warmup`` calls, then ``reps`` timed with CUDA events (eager: one event
pair around the reps; graph: the reps captured in one CUDA graph, replayed), the slowest rank's
median of ``trials`` kept (a collective ends when the last rank does). The result is a JSON whose
``figures`` replace the collectives table's for this box (``--predict PROFILE --collectives FILE``).

The timing loop takes any ``Group`` (``TorchGroup`` wraps an initialised torch.distributed process
group), so the CPU tests run it on torch's fake backend.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

HIDDEN = 7168
BF16 = 2
TOKENS = (1, 2, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 513, 1028, 2052, 4112, 8208)
GATHER_VOCAB = 163840  # Kimi-K2.6's vocabulary: the logits all-gather's [T, V] bf16 output
GATHER_TOKENS = (1, 4, 16, 64, 129, 513)


class Group(Protocol):
    """What the timing loop needs of a process group."""

    rank: int
    world: int
    graphs: bool  # CUDA graphs available

    def buffer(self, nbytes: int) -> Any:
        """A message buffer of ``nbytes`` (bf16)."""

    def all_reduce(self, buf: Any) -> None:
        """One all-reduce of ``buf`` in place."""

    def all_gather(self, out: Any, buf: Any) -> None:
        """One all-gather of ``buf`` into ``out``."""

    def time_us(self, fn: Any, reps: int, *, graph: bool) -> float:
        """Microseconds a call of ``fn`` takes on this rank."""

    def slowest(self, value: float) -> float:
        """The largest ``value`` over the ranks."""


@dataclass
class TorchGroup:
    """The default torch.distributed process group of this process (NCCL on CUDA; any backend, e.g.
    torch's ``fake`` one, on CPU)."""

    rank: int
    world: int
    device: str
    graphs: bool

    @classmethod
    def current(cls) -> TorchGroup:
        """The initialised default group."""
        import torch
        import torch.distributed as dist

        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        return cls(dist.get_rank(), dist.get_world_size(), device, device.startswith("cuda"))

    def buffer(self, nbytes: int) -> Any:
        """A bf16 tensor of ``nbytes``."""
        import torch

        return torch.ones(max(nbytes // BF16, 1), dtype=torch.bfloat16, device=self.device)

    def all_reduce(self, buf: Any) -> None:
        """One all-reduce (sum) in place."""
        import torch.distributed as dist

        dist.all_reduce(buf)

    def all_gather(self, out: Any, buf: Any) -> None:
        """One all-gather of ``buf`` into ``out`` (world x its size)."""
        import torch.distributed as dist

        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, buf)

    def time_us(self, fn: Any, reps: int, *, graph: bool) -> float:
        """Microseconds a call of ``fn`` takes, over ``reps`` calls (inside one CUDA graph if ``graph``)."""
        import torch

        if not self.device.startswith("cuda"):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps * 1e6
        if graph:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()  # warm the communicator on the capture stream
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(reps):
                    fn()
            g.replay()
            run = g.replay
        else:
            def run() -> None:
                for _ in range(reps):
                    fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / reps

    def slowest(self, value: float) -> float:
        """The largest ``value`` over the ranks."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())


def time_op(group: Group, op: str, nbytes: int, *, graph: bool, reps: int, warmup: int, trials: int) -> float:
    """Median over ``trials`` of the slowest rank's microseconds per ``op`` of ``nbytes``."""
    if op == "all-reduce":
        buf = group.buffer(nbytes)

        def fn() -> None:
            group.all_reduce(buf)
    else:
        part = group.buffer(max(nbytes // group.world, BF16))
        out = group.buffer(max(nbytes // group.world, BF16) * group.world)

        def fn() -> None:
            group.all_gather(out, part)
    for _ in range(warmup):
        fn()
    return statistics.median(group.slowest(group.time_us(fn, reps, graph=graph)) for _ in range(trials))


def measure_figures(group: Group, *, tokens: tuple[int, ...] = TOKENS, gather_tokens: tuple[int, ...] = GATHER_TOKENS,
                    reps: int = 20, warmup: int = 5, trials: int = 3,
                    progress: Any = None) -> list[dict[str, Any]]:
    """The figures of one box: all-reduce at 14 KB x T eager and in a graph, the logits all-gather."""
    figures = []
    modes = (False, True) if group.graphs else (False,)
    for graph in modes:
        points = []
        for t in tokens:
            nbytes = HIDDEN * BF16 * t
            us = time_op(group, "all-reduce", nbytes, graph=graph, reps=reps, warmup=warmup, trials=trials)
            points.append([nbytes, us])
            if progress:
                progress(f"all-reduce {'graph' if graph else 'eager'} T {t}: {nbytes} B {us:.1f} us")
        figures.append({"op": "all-reduce", "impl": "nccl", "graph": graph, "gpus": group.world, "points": points})
    points = []
    for t in gather_tokens:
        nbytes = GATHER_VOCAB * BF16 * t
        us = time_op(group, "all-gather", nbytes, graph=modes[-1], reps=max(reps // 4, 1), warmup=2, trials=trials)
        points.append([nbytes, us])
        if progress:
            progress(f"all-gather T {t}: {nbytes} B {us:.1f} us")
    figures.append({"op": "all-gather", "impl": "nccl", "graph": modes[-1], "gpus": group.world, "points": points})
    return figures


def nccl_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ``NCCL_*`` variables in force (kept as they are; recorded beside the figures)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, out_path: str, options: dict[str, Any]) -> None:
    """One rank: join the 127.0.0.1 group, time, and (rank 0) write the figures."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device(f"cuda:{rank}"))
    try:
        group = TorchGroup.current()
        progress = (lambda line: print(f"[measure] {line}", flush=True)) if rank == 0 else None
        figures = measure_figures(group, progress=progress, **options)
        if rank == 0:
            Path(out_path).write_text(json.dumps({"figures": figures, "nccl": torch.cuda.nccl.version()}))
    finally:
        dist.destroy_process_group()


def run_local(gpus: int, options: dict[str, Any] | None = None, tmp: str | None = None) -> dict[str, Any]:
    """Spawn one rank a local GPU and return rank 0's figures (and the NCCL version)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(dir=tmp) as d:
        out = Path(d) / "figures.json"
        mp.spawn(_worker, args=(gpus, free_port(), str(out), options or {}), nprocs=gpus, join=True)
        return json.loads(out.read_text())


def result(figures: list[dict[str, Any]], *, box: dict[str, Any], fabric: str | None, nccl: Any,
           environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The --measure JSON: what was measured, where, with which NCCL settings."""
    return {"kind": "repro-topology-measure", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "box": box, "fabric": fabric, "nccl_version": nccl, "nccl_env": nccl_environment(environ),
            "hidden": HIDDEN, "figures": figures}
