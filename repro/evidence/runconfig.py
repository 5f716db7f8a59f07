"""What a benchmark cell is measured with, as short digests stored in every request record.

A cell is keyed by its profile's *name*; ``repro bench --resume`` compares these digests so an
edited profile, a swapped model or a changed prompt file cannot pass old numbers off as new:

- ``command``: the resolved server command line and the environment the profile adds, with the
  port, the interpreter and the models directory left out (they change between runs and
  machines, not what is measured; the models' contents are the next digest), or for ``--url``
  the server's own ``/server_info`` settings;
- ``models``: each model directory's file names and sizes and its ``config.json`` bytes;
- ``prompts``: the request inputs exactly as sent (text or token ids, cut to their limit).

Beside them: the run record (where the numbers come from: the stack fingerprint, the GPU topology,
the profiles as run) and, for ``--url``, the profile as the running server serves it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from repro.algorithms import ALGORITHMS, AR, drafts
from repro.errors import ReproError, UsageError
from repro.evidence.results import Cell
from repro.serving.profiles import Profile, model_path
from repro.serving.sglang_server import server_argv
from repro.stack import gpuinfo
from repro.stack.pins import fingerprint

PARTS = {"command": "server command", "models": "model set", "prompts": "prompt set"}
# /server_info settings that decide what a --url server measures (host, port and the live
# internal_states are left out: they change between launches of the same configuration).
URL_SETTINGS = ("model_path", "tokenizer_path", "served_model_name", "dtype", "quantization",
                "kv_cache_dtype", "tp_size", "ep_size", "dp_size", "pp_size", "attention_backend",
                "moe_a2a_backend", "mem_fraction_static", "max_running_requests", "page_size",
                "context_length", "chunked_prefill_size", "skip_tokenizer_init", "version")
URL_PREFIXES = ("speculative_", "cuda_graph_")


def digest(value: Any) -> str:
    """16 hex digits of the sha256 of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _model_listing(path: Path) -> dict[str, Any]:
    """File names and sizes of a model directory, and its config.json bytes (hashed)."""
    if not path.is_dir():
        return {"missing": str(path)}
    files = sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file())
    config = path / "config.json"
    return {"files": files,
            "config": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None}


def managed(profile: Profile, root: Path, inputs: list[dict[str, Any]]) -> dict[str, str]:
    """The digests of a server ``repro bench`` starts for ``profile``."""
    argv = server_argv(profile, 0, Path("{models}"), python="python")
    models = [profile.model] + ([profile.drafter] if drafts(profile.algorithm) and profile.drafter
                                else [])
    return {"command": digest([argv, profile.env]),
            "models": digest({m: _model_listing(model_path(m, root)) for m in models}),
            "prompts": digest(inputs)}


def running(info: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, str]:
    """The digests of a server measured with ``--url`` (from its ``/server_info``)."""
    settings = {k: v for k, v in info.items() if k in URL_SETTINGS or k.startswith(URL_PREFIXES)}
    models = {k: info.get(k) for k in ("model_path", "speculative_draft_model_path")}
    return {"command": digest(settings), "models": digest(models), "prompts": digest(inputs)}


def check_resumable(records: list[dict[str, Any]], planned: dict[str, tuple[Cell, dict[str, str]]],
                    path: Path) -> None:
    """A UsageError when a request of a planned cell (key -> cell, configuration now) was
    recorded with another configuration, or without one."""
    for r in records:
        key = Cell(**r["cell"]).key if r["kind"] == "request" else None
        if key not in planned:
            continue
        cell, config = planned[key]
        changed = differences(r.get("config"), config)
        if changed:
            what = (f"measured with a different {' and '.join(changed)} than this run would use"
                    if "config" in r else "without a configuration digest (an older repro bench "
                    "wrote them), so they cannot be matched to this run")
            msg = (f"--resume: {path} holds {cell.profile} {cell.label} {cell.load} "
                   f"T={cell.temperature:g} results {what}; write to a new -o file")
            raise UsageError(msg)


def differences(recorded: Any, now: dict[str, str]) -> list[str]:
    """What differs between a recorded configuration and ``now``, in words (``PARTS``' values)."""
    if not isinstance(recorded, dict):
        return list(PARTS.values())
    return [name for part, name in PARTS.items() if recorded.get(part) != now[part]]


def from_server_info(profile: Profile, info: dict[str, Any]) -> Profile:
    """The profile as the running server actually serves it."""
    algorithm = info.get("speculative_algorithm") or AR
    budget = info.get("speculative_ddtree_budget")
    schedule = info.get("speculative_ddtree_budget_schedule")
    if not isinstance(algorithm, str) or algorithm.upper() not in ALGORITHMS:
        msg = f"the server at --url runs {algorithm!r:.40}, not one of {', '.join(ALGORITHMS)}"
        raise ReproError(msg)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        msg = f"the server at --url reports speculative_ddtree_budget {budget!r:.40}, not an integer >= 0"
        raise ReproError(msg)
    if schedule is not None and not isinstance(schedule, str):
        msg = f"the server at --url reports speculative_ddtree_budget_schedule {schedule!r:.40}, not a schedule"
        raise ReproError(msg)
    try:
        return profile.with_algorithm(algorithm, budget, schedule)
    except UsageError as exc:
        msg = f"the server at --url serves what repro cannot label: {exc}"
        raise ReproError(msg) from None


def run_record(session: str, profiles: list[Profile]) -> dict[str, Any]:
    """Where the numbers come from: stack fingerprint, GPU topology, the profiles as run."""
    stack = fingerprint()
    text, why = gpuinfo.run_tool(["nvidia-smi", "topo", "-m"])
    topology: dict[str, Any] = {"error": why}
    if text is not None:
        try:
            links = gpuinfo.parse_topology(text)
            topology = {"interconnect": gpuinfo.interconnect(links, len(stack.get("gpus") or [])),
                        "links": {f"{i}-{j}": link for (i, j), link in sorted(links.items())}}
        except ValueError as exc:
            topology = {"error": f"cannot parse `nvidia-smi topo -m`: {exc}"}
    return {"kind": "run", "session": session, "time": time.time(), "argv": sys.argv[1:],
            "fingerprint": stack, "topology": topology,
            "profiles": {p.name: p.to_dict() for p in profiles}}
