"""The collectives SGLang 0.5.17 runs for a DeepseekV3 / Kimi-K2.6 forward under TP, TP + EP and
DeepEP, and what they cost on each fabric of ``repro/data/collectives.toml``.

Per target forward of T tokens (H hidden, V vocabulary, L layers, bf16), with
``--moe-a2a-backend none`` (``tp`` and ``ep`` alike: expert parallelism without an all-to-all keeps
every all-reduce of TP, and the MoE's all-reduce sums each rank's partial output instead of its
slice's):

- the embedding's all-reduce of [T, H] (vocab_parallel_embedding.py:569-574);
- per layer, after attention: o_proj is row-parallel and unreduced (deepseek_v2.py:1774-1878), so
  the layer communicator all-reduces [T, H] before the post-attention RMSNorm
  (layers/communicator.py:1087-1167); on sm90 / sm100 FlashInfer fuses it with the norm up to 2048
  tokens (communicator.py:162-180, arg_groups/overrides.py:1886-1907): still one all-reduce;
- per layer, after the MLP: the MoE's all-reduce of [T, H] (deepseek_v2.py:1183-1191; for EP the
  standard dispatcher's partial sums, token_dispatcher/standard.py:241-254), or fused into the next
  layer's input norm (deepseek_v2.py:2457-2499, communicator.py:575-612): one all-reduce either way;
- the logits all-gather of [T, V] (logits_processor.py:730-734): every verified row's logits.

With DeepEP (``deepep``; ``--moe-a2a-backend deepep`` forces EP = TP): the MoE runs SCATTERED
(communicator.py:386-398), so after attention a reduce-scatter to [T / p, H] (communicator.py:
1170-1189), the MoE's dispatch of each rank's T / p tokens x top-k and its combine (low-latency
kernels inside CUDA graphs, at most 128 tokens a rank: environ.py:754, moe/utils.py:189-196,
deepep.py:980-989), and before the next attention an all-gather back to [T, H] (communicator.py:
932-967); the shared expert is whole on every rank (deepseek_v2.py:724-745). DeepEP needs NVLink
between every pair (DeepEP README) and T % p == 0 inside graphs (base_cuda_graph_runner.py:74-89).

The DFlash drafter (Qwen3 layers, dflash.py:114-262: QKV / gate-up column-parallel, o_proj / down
row-parallel) adds two all-reduces of [c x block, H] a layer and its embedding's; DFLASH's greedy
draft takes two all-gathers of [c x (block - 1)] maxima and ids (dflash_worker_v2.py:1003-1004), a
DDTREE tail three all-gathers of the shard's top-K logits, ids and lse (repro/round.py:140).

Which all-reduce runs (parallel_state.py:560-620, 880-971): CustomAllReduceV2 (default,
environ.py:878) on full NVLink, captured in CUDA graphs: one-shot up to ``oneshot-max-kb``, two-shot
up to the 16 MB workspace (environ.py:886), NCCL above; on PCIe with more than two GPUs the custom
kernels refuse (custom_all_reduce_utils.py:512-518, custom_all_reduce.py:260-282): pynccl in graphs,
torch.distributed (NCCL) eager.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from repro.algorithms import AR, DFLASH
from repro.errors import UsageError

OPS = ("all-reduce", "all-gather", "reduce-scatter", "dispatch", "combine")
BF16 = 2


@dataclass(frozen=True)
class Figure:
    """One measured (or derived) curve: time against message bytes."""

    op: str
    impl: str
    graph: bool
    gpus: int
    points: tuple[tuple[float, float], ...]
    busbw_gb_s: float | None
    source: str
    derived: str = ""

    def bus_factor(self) -> float:
        """nccl-tests' bus-bandwidth factor: bytes a rank moves per message byte."""
        p = self.gpus
        return 2 * (p - 1) / p if self.op == "all-reduce" else (p - 1) / p

    def time_us(self, nbytes: float) -> float:
        """Microseconds for a message of ``nbytes``: log-log interpolation between the points' running
        maximum (a larger message never costs less; the published dips are noise), the bus bandwidth
        past the last one, below the first the first."""
        pts = tuple(zip([m for m, _ in self.points], _running_max([t for _, t in self.points]), strict=True))
        if not pts:
            return nbytes * self.bus_factor() / (self.busbw_gb_s * 1e3)
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (m0, t0), (m1, t1) in itertools.pairwise(pts):
            if nbytes <= m1:
                f = math.log(nbytes / m0) / math.log(m1 / m0)
                return math.exp(math.log(t0) + f * math.log(t1 / t0))
        m_last, t_last = pts[-1]
        if self.busbw_gb_s:
            return t_last + (nbytes - m_last) * self.bus_factor() / (self.busbw_gb_s * 1e3)
        if len(pts) >= 2:  # the last segment's slope
            (m0, t0), (m1, t1) = pts[-2], pts[-1]
            return t_last + (nbytes - m_last) * max(t1 - t0, 0.0) / (m1 - m0)
        return t_last


def _running_max(values: list[float]) -> list[float]:
    out, top = [], float("-inf")
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


@dataclass(frozen=True)
class GpuClass:
    """One [gpus.*] table."""

    key: str
    name: str
    match: tuple[str, ...]
    arch: str
    hbm_tb_s: float
    bf16_tflops: float
    source: str


@dataclass(frozen=True)
class Fabric:
    """One [fabrics.*] table (its figures possibly replaced by a --measure result)."""

    key: str
    description: str
    gpu_classes: tuple[str, ...]
    nvlink: bool
    p2p: bool
    custom_ar: bool
    oneshot_max_kb: int
    custom_max_kb: int
    deepep: bool
    figures: tuple[Figure, ...]
    measured: str = ""  # the --measure file whose figures replaced the table's

    def figure(self, op: str, impl: str, *, graph: bool) -> Figure | None:
        """The figure of ``op`` by ``impl``, in graph mode if asked and there, else the other mode."""
        found = [f for f in self.figures if f.op == op and f.impl == impl]
        same = [f for f in found if f.graph == graph]
        return (same or found or [None])[0]

    def all_reduce(self, nbytes: float, *, graph: bool = True) -> tuple[float, str]:
        """(microseconds, which all-reduce) SGLang 0.5.17 runs for ``nbytes`` on this fabric."""
        nccl = self.figure("all-reduce", "nccl", graph=graph)
        if nccl is None:
            msg = f"fabric {self.key} has no NCCL all-reduce figure"
            raise UsageError(msg)
        if self.custom_ar and nbytes <= self.custom_max_kb * 1024:
            fig = self.figure("all-reduce", "custom", graph=graph)
            if fig is not None:
                kind = "one-shot" if nbytes <= self.oneshot_max_kb * 1024 else "two-shot"
                # SGLang's size limits were chosen where its kernels beat NCCL (configs/custom_all_reduce_v2.py):
                # past the custom figures' last point their extrapolation is capped at NCCL's time
                return min(fig.time_us(nbytes), nccl.time_us(nbytes)), f"custom {kind}"
        return nccl.time_us(nbytes), "pynccl" if graph else "NCCL"

    def all_gather(self, nbytes_total: float, *, graph: bool = True) -> float:
        """An all-gather whose output is ``nbytes_total``: the NCCL all-reduce's latency and half its
        bandwidth term (no public small-message all-gather figure on these boxes), unless measured."""
        fig = self.figure("all-gather", "nccl", graph=graph)
        if fig is not None:
            return fig.time_us(nbytes_total)
        ar = self.figure("all-reduce", "nccl", graph=graph)
        if ar is None:
            msg = f"fabric {self.key} has no NCCL all-reduce figure"
            raise UsageError(msg)
        small = ar.time_us(min(nbytes_total, ar.points[0][0] if ar.points else 0.0))
        return max(small, ar.time_us(nbytes_total) - (ar.time_us(nbytes_total) - small) / 2)

    def reduce_scatter(self, nbytes_total: float, *, graph: bool = True) -> float:
        """A reduce-scatter of ``nbytes_total`` input: as :meth:`all_gather`."""
        fig = self.figure("reduce-scatter", "nccl", graph=graph)
        return fig.time_us(nbytes_total) if fig is not None else self.all_gather(nbytes_total, graph=graph)

    def deepep_us(self, op: str, tokens_per_rank: float, nbytes: float) -> float:
        """DeepEP ``dispatch`` / ``combine``: low-latency kernels up to 128 tokens a rank (the
        128-token figure: an upper bound below), the normal kernels' bandwidth above."""
        if tokens_per_rank <= 128:
            fig = self.figure(op, "deepep-ll", graph=True)
            if fig is not None:
                return fig.time_us(tokens_per_rank)
        fig = self.figure(op, "deepep-normal", graph=False)
        if fig is None:
            msg = f"fabric {self.key} has no DeepEP {op} figure"
            raise UsageError(msg)
        return fig.time_us(nbytes)


@dataclass(frozen=True)
class Table:
    """collectives.toml: GPU classes, fabrics, and the observations it records."""

    gpus: dict[str, GpuClass]
    fabrics: dict[str, Fabric]
    observations: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparisons: tuple[dict[str, Any], ...] = ()  # observed figures beside the model's cell (repro.topology.page)

    def gpu_for(self, name: str) -> GpuClass | None:
        """The GPU class whose ``match`` occurs in an ``nvidia-smi`` name (longest match wins)."""
        hits = [(len(m), g) for g in self.gpus.values() for m in g.match if m.lower() in name.lower()]
        return max(hits, key=lambda h: h[0])[1] if hits else None


def _figure(raw: dict[str, Any], where: str) -> Figure:
    unknown = set(raw) - {"op", "impl", "graph", "gpus", "points", "busbw-gb-s", "source", "derived"}
    if unknown or raw.get("op") not in OPS or not (raw.get("source") or raw.get("derived")):
        msg = (f"{where}: a figure needs op in {OPS}, impl, graph, gpus, points and/or busbw-gb-s, and a source or "
               f"derived (unknown keys {sorted(unknown)})")
        raise UsageError(msg)
    points = tuple((float(m), float(t)) for m, t in raw.get("points", []))
    busbw = raw.get("busbw-gb-s")
    if (not points and not busbw) or any(m <= 0 or t <= 0 for m, t in points) or \
            any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        msg = f"{where}: points must be increasing [bytes, us] pairs > 0 (or give busbw-gb-s)"
        raise UsageError(msg)
    return Figure(raw["op"], str(raw["impl"]), bool(raw["graph"]), int(raw["gpus"]), points,
                  None if busbw is None else float(busbw), raw.get("source", ""), raw.get("derived", ""))


def load_table(path: Path | None = None) -> Table:
    """The packaged collectives.toml (or ``path``), checked; a UsageError naming what is wrong."""
    where = str(path) if path else "repro/data/collectives.toml"
    try:
        text = path.read_text() if path else (resources.files("repro") / "data" / "collectives.toml").read_text()
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        msg = f"{where}: cannot read the collectives table ({exc})"
        raise UsageError(msg) from None
    try:
        gpus = {k: GpuClass(k, g["name"], tuple(g["match"]), g["arch"], float(g["hbm-tb-s"]), float(g["bf16-tflops"]),
                            g["source"]) for k, g in data["gpus"].items()}
        fabrics = {}
        for k, f in data["fabrics"].items():
            figures = tuple(_figure(raw, f"{where}: fabrics.{k}.figures[{i}]") for i, raw in enumerate(f["figures"]))
            fabrics[k] = Fabric(k, f["description"], tuple(f["gpu-classes"]), bool(f["nvlink"]), bool(f["p2p"]),
                                bool(f["custom-ar"]), int(f["oneshot-max-kb"]), int(f["custom-max-kb"]),
                                bool(f["deepep"]), figures)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"{where}: malformed table ({type(exc).__name__}: {exc})"
        raise UsageError(msg) from None
    return Table(gpus, fabrics, data.get("observations", {}), tuple(data.get("comparisons", ())))


def with_measured(fabric: Fabric, measured: dict[str, Any], path: str) -> Fabric:
    """``fabric`` with its NCCL all-reduce (and any other measured op) replaced by a ``repro topology
    --measure`` result (its ``figures``: op, impl, graph, gpus, points)."""
    new = [_figure({**raw, "source": raw.get("source") or f"repro topology --measure ({path})"}, f"{path}: figures[{i}]")
           for i, raw in enumerate(measured.get("figures", []))]
    if not new:
        msg = f"{path}: no figures in this --measure result"
        raise UsageError(msg)
    replaced = {(f.op, f.impl, f.graph) for f in new}
    kept = tuple(f for f in fabric.figures if (f.op, f.impl, f.graph) not in replaced)
    return replace(fabric, figures=(*new, *kept), measured=path)


@dataclass(frozen=True)
class Collective:
    """One kind of collective a forward runs: ``count`` of them, ``nbytes`` each."""

    op: str
    nbytes: float
    count: int
    where: str
    tokens_per_rank: float = 0.0  # DeepEP's


def target_collectives(config: str, *, hidden: int, vocab: int, layers: int, tokens: int, p: int,
                       topk: int = 8) -> list[Collective]:
    """What a target forward of ``tokens`` tokens runs under ``config`` on ``p`` GPUs (module docstring)."""
    if p <= 1:
        return []
    row = BF16 * hidden * tokens
    logits = Collective("all-gather", BF16 * vocab * tokens, 1, "logits (logits_processor.py:730-734)")
    if config in ("tp", "ep"):
        return [Collective("all-reduce", row, 1, "embedding (vocab_parallel_embedding.py:569-574)"),
                Collective("all-reduce", row, layers, "after attention (communicator.py:1087-1167)"),
                Collective("all-reduce", row, layers, "after the MLP / MoE (deepseek_v2.py:1183-1191)"),
                logits]
    if config != "deepep":
        msg = f"config must be tp, ep or deepep (got {config!r})"
        raise ValueError(msg)
    per_rank = tokens / p
    return [Collective("reduce-scatter", row, 1, "embedding, scattered (communicator.py:1170-1189)"),
            Collective("all-gather", row, layers, "before attention (communicator.py:932-967)"),
            Collective("reduce-scatter", row, layers, "after attention (communicator.py:1170-1189)"),
            Collective("dispatch", per_rank * topk * hidden * BF16, layers, "MoE dispatch (deepep.py:980-989)", per_rank),
            Collective("combine", per_rank * topk * hidden * BF16, layers, "MoE combine (deepep.py:980-989)", per_rank),
            Collective("all-gather", row, 1, "before the head (communicator.py:932-967)"),
            logits]


def drafter_collectives(algorithm: str, *, hidden: int, layers: int, requests: int, block: int, p: int,
                        budget: int = 0) -> list[Collective]:
    """What a DFlash drafter forward and its tail run on ``p`` GPUs (module docstring)."""
    if p <= 1 or algorithm == AR:
        return []
    tokens = requests * block
    row = BF16 * hidden * tokens
    out = [Collective("all-reduce", row, 1, "drafter embedding (vocab_parallel_embedding.py:569-574)"),
           Collective("all-reduce", row, 2 * layers, "drafter o_proj / down_proj (dflash.py:123, 262)")]
    rows = requests * (block - 1)
    if algorithm == DFLASH:
        out.append(Collective("all-gather", 2 * 8 * rows * p, 1, "greedy draft maxima + ids (dflash_worker_v2.py:1003-1004)"))
    else:
        k = max(budget, 1)  # the tail's top-K width is at most the budget
        out.append(Collective("all-gather", 3 * 8 * rows * k * p, 1, "DDTREE top-K logits, ids, lse (repro/round.py:140)"))
    return out


def collectives_us(fabric: Fabric, plan: list[Collective], *, graph: bool = True) -> tuple[float, list[dict[str, Any]]]:
    """Total microseconds of ``plan`` on ``fabric`` (serial, no overlap) and each kind's share."""
    total, parts = 0.0, []
    for c in plan:
        impl = ""
        if c.op == "all-reduce":
            each, impl = fabric.all_reduce(c.nbytes, graph=graph)
        elif c.op == "all-gather":
            each = fabric.all_gather(c.nbytes, graph=graph)
        elif c.op == "reduce-scatter":
            each = fabric.reduce_scatter(c.nbytes, graph=graph)
        else:
            each = fabric.deepep_us(c.op, c.tokens_per_rank, c.nbytes)
        total += each * c.count
        parts.append({"op": c.op, "impl": impl or c.op, "bytes": c.nbytes, "count": c.count, "us_each": each,
                      "us": each * c.count, "where": c.where})
    return total, parts
