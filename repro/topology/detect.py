"""What box this is: the GPUs ``nvidia-smi`` lists, how they are linked, and which fabric of the
collectives table (``repro/data/collectives.toml``) that is.

``nvidia-smi topo -m`` (run here, or saved to a file) classifies the GPUs as ``nvlink`` (every pair
NV#), ``pcie`` (no NV# pair), ``mixed`` or ``single``; ``--query-gpu`` names them, and the name picks
the GPU class (H100, H200, B200, B300, RTX PRO 6000). A machine with no GPU or one GPU gets a one-line
answer: there is nothing to split. No torch here: the text parsers take the tool's output, so tests
feed them recorded outputs (or a fake ``nvidia-smi`` on PATH).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from repro.errors import UsageError
from repro.stack import gpuinfo

_NVLINK = re.compile(r"^NV(\d+)$")


@dataclass(frozen=True)
class Box:
    """The GPUs of one machine and their links, as ``nvidia-smi`` reports them."""

    gpus: int
    interconnect: str  # single | nvlink | pcie | mixed (gpuinfo.interconnect)
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # --query-gpu names, when known
    capability: str | None = None  # "9.0", "10.3", "12.0" of GPU 0, when known
    why_none: str | None = None  # why no GPU is visible (nvidia-smi missing, no driver)

    @property
    def link_summary(self) -> str:
        """``"NV18 on 28 pairs"``, ``"PIX on 4 pairs, NODE on 8 pairs, ..."``."""
        return ", ".join(f"{k} on {n} pair{'s' * (n > 1)}" for k, n in Counter(self.links.values()).most_common())

    @property
    def nvlinks_per_pair(self) -> int | None:
        """The NV# link count every NVLinked pair shares (None when none or they differ)."""
        counts = {int(m[1]) for link in self.links.values() if (m := _NVLINK.match(link))}
        return counts.pop() if len(counts) == 1 else None

    @property
    def pairs_without_nvlink(self) -> int:
        """GPU pairs whose link is not NV#."""
        return sum(1 for link in self.links.values() if not _NVLINK.match(link))

    @property
    def name(self) -> str | None:
        """The GPU name when every GPU has the same one."""
        return self.names[0] if self.names and len(set(self.names)) == 1 else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (links as ``"0-1": "NV18"``)."""
        return {"gpus": self.gpus, "interconnect": self.interconnect, "gpu_name": self.name,
                "capability": self.capability, "links": self.link_summary or None}


def parse_topology(text: str) -> tuple[int, dict[tuple[int, int], str]]:
    """(GPU count, links) of ``nvidia-smi topo -m`` text; a UsageError naming what is wrong."""
    try:
        gpus, links = gpuinfo.topology_matrix(text)
    except ValueError as exc:
        msg = f"cannot parse the `nvidia-smi topo -m` table, so no recommendation: {exc}"
        raise UsageError(msg) from None
    if gpus == 0:
        msg = "the topology text has no GPU matrix (expected `nvidia-smi topo -m` output)"
        raise UsageError(msg)
    return gpus, links


def box_from_text(topo: str, query: str | None = None) -> Box:
    """The box of saved ``nvidia-smi topo -m`` text (and, optionally, ``--query-gpu`` CSV text)."""
    gpus, links = parse_topology(topo)
    names: tuple[str, ...] = ()
    capability = None
    if query:
        try:
            listed, _ = gpuinfo.parse_gpu_query(query)
        except ValueError as exc:
            msg = f"cannot parse the `nvidia-smi --query-gpu` rows: {exc}"
            raise UsageError(msg) from None
        names = tuple(g.name for g in listed)
        cap = listed[0].capability if listed else None
        capability = f"{cap[0]}.{cap[1]}" if cap else None
    return Box(gpus, gpuinfo.interconnect(links, gpus), links, names, capability)


def local_box() -> Box:
    """The box of this machine: no GPU (with the reason) when ``nvidia-smi`` is missing or lists none."""
    query = gpuinfo.query_gpus()
    if not query.gpus:
        return Box(0, "none", why_none=query.error or "nvidia-smi lists no GPU")
    names = tuple(g.name for g in query.gpus)
    cap = query.gpus[0].capability
    capability = f"{cap[0]}.{cap[1]}" if cap else None
    if len(query.gpus) == 1:
        return Box(1, "single", names=names, capability=capability)
    text, why = gpuinfo.run_tool(["nvidia-smi", "topo", "-m"])
    if text is None:
        msg = (f"{len(query.gpus)} GPUs but no topology: {why} (run `nvidia-smi topo -m` by hand, or pass "
               f"--from FILE with its saved output)")
        raise UsageError(msg)
    gpus, links = parse_topology(text)
    return Box(gpus, gpuinfo.interconnect(links, gpus), links, names, capability)


def one_line(box: Box) -> str | None:
    """The whole answer for a box with nothing to split (no GPU, one GPU); None for 2 or more."""
    if box.gpus == 0:
        return (f"GPUs: 0 - no GPU visible here ({box.why_none}): nothing to split; pass --from FILE (a saved "
                f"`nvidia-smi topo -m`), or --predict PROFILE for a box you do not have")
    if box.gpus == 1:
        gpu = f" ({box.name})" if box.name else ""
        return (f"GPUs: 1{gpu} - one GPU: nothing to split, serve with --tp-size 1 (TP and EP need 2 or more "
                f"GPUs; --predict PROFILE predicts an 8-GPU box)")
    return None
