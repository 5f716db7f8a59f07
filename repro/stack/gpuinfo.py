"""What ``nvidia-smi`` says about this machine's GPUs: inventory, driver and interconnect.

Only ``nvidia-smi`` is asked (never torch), with a timeout, so this is cheap and safe on a CPU-only
machine: there ``query_gpus()`` returns no GPUs and says why. The parsers take the tool's text, so
tests feed them recorded output.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

QUERY_FIELDS = "index,name,compute_cap,driver_version,memory.total,pci.bus_id"
_GPU = re.compile(r"^GPU\d+$")
_NVLINK = re.compile(r"^NV\d+$")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")  # the legend of `nvidia-smi topo -m`
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # some nvidia-smi versions underline the header


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi --query-gpu`` lists it."""

    index: int
    name: str
    capability: tuple[int, int] | None  # None when the driver does not report it
    memory_mib: int | None
    bus_id: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (capability as "9.0")."""
        cap = f"{self.capability[0]}.{self.capability[1]}" if self.capability else None
        return {"index": self.index, "name": self.name, "capability": cap,
                "memory_mib": self.memory_mib, "bus_id": self.bus_id}


@dataclass(frozen=True)
class GpuQuery:
    """The GPUs found, the driver version, and why none were found if so."""

    gpus: list[Gpu] = field(default_factory=list)
    driver: str | None = None
    error: str | None = None  # e.g. "nvidia-smi not found"


def run_tool(argv: list[str], timeout: float = 30) -> tuple[str | None, str | None]:
    """Run a tool; ``(stdout, None)`` on success, ``(None, why)`` if missing, failing or hung."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} not found on PATH"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:.0f}s"
    except OSError as exc:
        return None, f"{argv[0]} could not run: {exc}"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        return None, f"{argv[0]} exited {done.returncode}: {last[-1] if last else 'no output'}"
    return done.stdout, None


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_gpu_query(text: str) -> tuple[list[Gpu], str | None]:
    """Parse ``--query-gpu=QUERY_FIELDS --format=csv,noheader,nounits`` output."""
    gpus: list[Gpu] = []
    drivers: set[str] = set()
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != len(QUERY_FIELDS.split(",")):
            msg = f"nvidia-smi query rows must have 6 fields (got {row!r})"
            raise ValueError(msg)
        index, name, cap, driver, memory, bus = (cell.strip() for cell in row)
        match = re.match(r"^(\d+)\.(\d+)$", cap)
        gpus.append(Gpu(int(index), name, (int(match[1]), int(match[2])) if match else None,
                        _int_or_none(memory), bus))
        drivers.add(driver)
    return gpus, ",".join(sorted(drivers)) or None


def query_gpus() -> GpuQuery:
    """The GPUs ``nvidia-smi`` reports; no GPUs and a reason when it is absent or fails."""
    out, why = run_tool(["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits"])
    if out is None:
        return GpuQuery(error=why)
    try:
        gpus, driver = parse_gpu_query(out)
    except ValueError as exc:
        return GpuQuery(error=str(exc))
    return GpuQuery(gpus=gpus, driver=driver, error=None if gpus else "nvidia-smi lists no GPU")


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """Links between GPU pairs from ``nvidia-smi topo -m``: ``{(0, 1): "NV18", ...}`` (i < j)."""
    return topology_matrix(text)[1]


def topology_matrix(text: str) -> tuple[int, dict[tuple[int, int], str]]:
    """(GPU count, links per pair i < j) of ``nvidia-smi topo -m`` output.

    ``(0, {})`` when the text has no GPU matrix; a ValueError when it has one that is incomplete
    (a truncated table, a row short of cells, an unknown or asymmetric link), so a partial table
    never passes for a smaller or a mixed machine.
    """
    n = 0
    rows: dict[int, list[str]] = {}
    for line in _ANSI.sub("", text).splitlines():
        tokens = line.split()
        if not n and line[:1].isspace() and tokens and _GPU.match(tokens[0]):
            n = sum(1 for t in tokens if _GPU.match(t))  # the header row: "\tGPU0\tGPU1\t..."
        elif n and tokens and _GPU.match(tokens[0]):
            i = int(tokens[0][3:])
            cells = tokens[1 : n + 1]
            if i >= n or i in rows or len(cells) < n or cells[i] != "X" or \
                    not all(_LINK.match(c) for c in cells):
                msg = f"the GPU{i} row does not fit a {n}-GPU matrix: {line.strip()!r:.80}"
                raise ValueError(msg)
            rows[i] = cells
    if len(rows) != n:
        missing = ", ".join(f"GPU{i}" for i in range(n) if i not in rows)
        msg = f"the table is truncated: the header names {n} GPUs but there is no row for {missing}"
        raise ValueError(msg)
    for i in range(n):
        for j in range(i + 1, n):
            if rows[i][j] != rows[j][i]:
                msg = f"GPU{i}-GPU{j} reads {rows[i][j]} one way and {rows[j][i]} the other"
                raise ValueError(msg)
    return n, {(i, j): rows[i][j] for i in range(n) for j in range(i + 1, n)}


def interconnect(links: dict[tuple[int, int], str], gpu_count: int) -> str:
    """``single`` (one GPU), ``nvlink`` (every pair NV#), ``pcie`` (no NV# pair) or ``mixed``."""
    if gpu_count <= 1:
        return "single"
    nv = sum(1 for link in links.values() if _NVLINK.match(link))
    if nv == 0:
        return "pcie"
    return "nvlink" if nv == gpu_count * (gpu_count - 1) // 2 else "mixed"
