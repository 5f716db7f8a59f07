"""`repro topology [--from FILE] [--json]`: classify the GPU interconnect and recommend TP or EP.

Reads ``nvidia-smi topo -m`` (run here, or saved to FILE), classifies the GPUs as ``nvlink`` (every
pair NV#), ``pcie`` (no NV# pair), ``mixed`` or ``single``, and recommends how to split a MoE target
such as Kimi K2.6, with the reason and the SGLang arguments. With DFLASH/DDTREE, "EP" means
``--tp-size N --ep-size N``: attention stays tensor-parallel (DP attention is forbidden for DFlash)
and each rank holds 1/N of the routed experts.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from repro.errors import ReproError, UsageError
from repro.files import read_text
from repro.stack import gpuinfo

_NVLINK = re.compile(r"^NV\d+$")
SEED_PCIE = ("the seed measured EP8 ~65 tok/s vs TP8 ~26 tok/s for one request on 8x RTX PRO 6000 "
             "over PCIe")
SEED_NVLINK = "the seed expects TP8 to win on 8x B300 with NV18"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``repro topology``."""
    parser.add_argument("--from", dest="source", type=Path, default=None, metavar="FILE",
                        help="saved `nvidia-smi topo -m` output (default: run nvidia-smi)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def recommend(text: str) -> dict[str, Any]:
    """The classification and recommendation for one ``nvidia-smi topo -m`` output."""
    try:
        gpus, links = gpuinfo.topology_matrix(text)
    except ValueError as exc:
        msg = f"cannot parse the `nvidia-smi topo -m` table, so no recommendation: {exc}"
        raise UsageError(msg) from None
    if gpus == 0:
        msg = "the topology text has no GPU matrix (expected `nvidia-smi topo -m` output)"
        raise UsageError(msg)
    kind = gpuinfo.interconnect(links, gpus)
    kinds = ", ".join(f"{k} on {n} pair{'s' * (n > 1)}"
                      for k, n in Counter(links.values()).most_common())
    split = ["--tp-size", str(gpus)]
    if kind == "single":
        return _answer(gpus, kind, "tp", "one GPU: there is nothing to split", split)
    if kind == "nvlink":
        return _answer(gpus, kind, "tp", f"every GPU pair has NVLink ({kinds}), so TP's per-layer "
                       f"all-reduces stay on NVLink and every GPU works on every token; "
                       f"{SEED_NVLINK}", split)
    ep = [*split, "--ep-size", str(gpus)]
    if kind == "pcie":
        return _answer(gpus, kind, "ep", f"no GPU pair has NVLink ({kinds}), so every TP all-reduce "
                       f"crosses PCIe; EP keeps whole experts on each GPU; {SEED_PCIE}", ep)
    slow = sum(1 for link in links.values() if not _NVLINK.match(link))
    return _answer(gpus, kind, "ep", f"{slow} of {len(links)} GPU pairs lack NVLink ({kinds}) and a "
                   f"TP all-reduce runs at the pace of its slowest hop, so treat it as PCIe; "
                   f"{SEED_PCIE}", ep)


def _answer(gpus: int, kind: str, choice: str, reason: str, args: list[str]) -> dict[str, Any]:
    return {"gpus": gpus, "interconnect": kind, "recommended": choice, "reason": reason,
            "sglang_args": args}


def main(args: argparse.Namespace) -> int:
    """Print the classification and recommendation (or JSON)."""
    if args.source is not None:
        text = read_text(args.source, "--from", "saved `nvidia-smi topo -m` output")
    else:
        text, why = gpuinfo.run_tool(["nvidia-smi", "topo", "-m"])
        if text is None:
            msg = (
                f"cannot read the GPU topology: {why} (run on the GPU host, or pass "
                f"--from FILE with saved `nvidia-smi topo -m` output)"
            )
            raise ReproError(msg)
    answer = recommend(text)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"GPUs: {answer['gpus']}  interconnect: {answer['interconnect']}")
        print(f"recommended: {answer['recommended']} - {answer['reason']}")
        print(f"SGLang arguments: {' '.join(answer['sglang_args'])}")
    return 0
